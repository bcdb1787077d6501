//! The job, the same on every board: the `Device`/`Command` work of the std host, over the
//! DMA-engine shim.
//!
//! It reserves a layer's weights in the persistent mode, stages an input, runs a 16x32 f32
//! matvec + bias + ReLU kernel, reads the result back and checks it against the CPU exactly; then
//! a drop-queue cycle, a reclaim after memory pressure, the allocations of the warm enqueue path
//! (none), the core's bookkeeping per allocation, and the memory report. Run with the argument
//! `fault` ([`Mode::Fault`]), a DMA descriptor fails mid-job instead of the second layer run: the
//! job checks that the failure is reported as on std, then the host exits with a clear message.

use crate::board::HEAP_BYTES;
use crate::heap::HEAP;
use crate::shim::{self, FwKernel, FwShim, KernelCtx, KernelFault};
use crate::{board, stack};
use alloc::vec;
use alloc::vec::Vec;
use devcmd::memory::{IdleGranules, MemoryConfig};
use devcmd::pinned::PinnedConfig;
use devcmd::staging::StagingPolicy;
use devcmd::{
    AllocationMode, CopyLayout, Device, DeviceConfig, DropPolicy, DropStats, Fault, Handle,
    HostBuffer, IoError, KernelParam, Launch, LaunchDims, ReadRequest, ServerError, StreamId,
};

/// The exit status of a verified run.
pub const EXIT_VERIFIED: u32 = 0;
/// The exit status of a failed check, an unexpected error or a panic.
pub const EXIT_FAILED: u32 = 1;
/// The exit status of a run stopped by a device fault that was reported as the failure rules say.
pub const EXIT_DEVICE_FAULT: u32 = 2;

const ROWS: usize = 16;
const COLS: usize = 32;

/// What the run does, from the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The whole job.
    Verify,
    /// The job up to its second layer run, which meets a failing DMA descriptor.
    Fault,
    /// A panic on purpose, first thing: the host must exit with [`EXIT_FAILED`].
    Panic,
}

impl Mode {
    /// `fault` among the command line's words selects [`Mode::Fault`], `panic` [`Mode::Panic`].
    pub fn of(cmdline: &str) -> Self {
        let has = |word| cmdline.split(' ').any(|w| w == word);
        if has("fault") {
            Self::Fault
        } else if has("panic") {
            Self::Panic
        } else {
            Self::Verify
        }
    }
}

// ---- the job's failure ----

/// Why the job stopped.
#[derive(Debug)]
enum Failure {
    /// An operation failed unexpectedly.
    Server(ServerError),
    /// A check failed.
    Check(&'static str),
    /// The injected device fault, reported as the failure rules say (fault mode).
    DeviceFault(ServerError),
}

impl From<ServerError> for Failure {
    fn from(e: ServerError) -> Self {
        Self::Server(e)
    }
}

macro_rules! check {
    ($cond:expr, $what:literal) => {
        if !$cond {
            return Err(Failure::Check($what));
        }
    };
}

// ---- the kernel ----

fn f32_at(bytes: &[u8], i: usize) -> Result<f32, KernelFault> {
    bytes
        .get(i * 4..i * 4 + 4)
        .and_then(|b| b.try_into().ok())
        .map(f32::from_le_bytes)
        .ok_or(KernelFault("f32 index out of the buffer"))
}

/// One block per output row: `y[r] = relu(b[r] + sum_c w[r][c] * x[c])`.
/// Buffers: w (rows x cols), b (rows), x (cols); output y (rows). Parameters: y, w, b, x (buffer
/// slots 3, 0, 1, 2), then rows, cols (u32 LE).
fn matvec_bias_relu(ctx: &mut KernelCtx<'_>) -> Result<(), KernelFault> {
    let (rows, cols) = (ctx.arg_u32(0)? as usize, ctx.arg_u32(1)? as usize);
    if (ctx.grid.x as usize) < rows {
        return Err(KernelFault("the grid has fewer blocks than rows"));
    }
    let r = ctx.block[0] as usize;
    if r >= rows {
        return Ok(());
    }
    let (w, b, x) = (ctx.input(0)?, ctx.input(1)?, ctx.input(2)?);
    let mut acc = f32_at(b, r)?;
    for c in 0..cols {
        acc += f32_at(w, r * cols + c)? * f32_at(x, c)?;
    }
    let y = ctx.output(0)?;
    y.get_mut(r * 4..r * 4 + 4)
        .ok_or(KernelFault("output row out of the buffer"))?
        .copy_from_slice(&acc.max(0.0).to_le_bytes());
    Ok(())
}

static MATVEC: FwKernel = FwKernel {
    name: "matvec_bias_relu",
    outputs: 1,
    run: matvec_bias_relu,
};

// ---- data and the CPU reference ----

fn weights() -> Vec<f32> {
    (0..ROWS * COLS)
        .map(|i| ((i / COLS * 7 + i % COLS * 3) % 11) as f32 * 0.125 - 0.5)
        .collect()
}

fn bias() -> Vec<f32> {
    (0..ROWS).map(|r| (r % 5) as f32 * 0.5 - 1.0).collect()
}

fn input(seed: usize) -> Vec<f32> {
    (0..COLS)
        .map(|c| ((c * 5 + seed) % 9) as f32 * 0.25 - 1.0)
        .collect()
}

fn reference(w: &[f32], b: &[f32], x: &[f32]) -> Vec<f32> {
    (0..ROWS)
        .map(|r| {
            let mut acc = b[r];
            for c in 0..COLS {
                acc += w[r * COLS + c] * x[c];
            }
            acc.max(0.0)
        })
        .collect()
}

fn to_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|f| f.to_le_bytes()).collect()
}

fn from_bytes(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Largest absolute difference; `None` when the lengths differ.
fn max_diff(a: &[f32], b: &[f32]) -> Option<f32> {
    (a.len() == b.len()).then(|| {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max)
    })
}

// ---- the job ----

const S0: StreamId = StreamId(0);
const S1: StreamId = StreamId(1);

fn config() -> DeviceConfig {
    DeviceConfig {
        memory: MemoryConfig {
            small_page_size: 1024,
            small_max_slice: 256,
            arena_min_page: 2048,
            arena_granule: 512,
            virtual_memory: false,
            spare_identities: 8,
            idle_granules: IdleGranules::UpToPeak,
            map_spans: false,
        },
        drops: DropPolicy {
            max_items: 8,
            max_bytes: 4096,
            fill_released: None,
        },
        // All SRAM is reachable by the engine: heap data is never staged through the pinned
        // window (a staging copy would double the heap it takes).
        // No pipeline either: the staging ring would hold pinned window memory per stream.
        staging: StagingPolicy {
            max_staged: 0,
            flush_after: 4096,
            pipeline_from: u64::MAX,
            chunk: 0,
            depth: 0,
            read_spread: 0,
        },
        pinned: PinnedConfig {
            page_size: 512,
            max_bytes: shim::PINNED_BYTES as u64,
            alignment: 64,
        },
        max_streams: 2,
        memory_budget: None,
        zero_copy: None,
    }
}

fn stats0(device: &Device<FwShim>) -> DropStats {
    device
        .drop_stats()
        .into_iter()
        .find(|(id, _)| *id == S0)
        .map(|(_, s)| s)
        .unwrap_or_default()
}

/// The weights of the layer, on the device.
struct Layer {
    w: Handle,
    b: Handle,
}

/// The scalar parameters of the layer's launch.
const DIMS: ([u8; 4], [u8; 4]) = ((ROWS as u32).to_le_bytes(), (COLS as u32).to_le_bytes());

/// Launches the layer on `x` into `y`.
fn launch_layer(
    device: &mut Device<FwShim>,
    layer: &Layer,
    x: &Handle,
    y: &Handle,
) -> Result<(), ServerError> {
    let (rows, cols) = (&DIMS.0, &DIMS.1);
    device.command(S0)?.launch(Launch {
        kernel: &MATVEC,
        dims: LaunchDims::linear(ROWS as u32, 1),
        inputs: &[&layer.w, &layer.b, x],
        outputs: &[y],
        // matvec(float *y, const float *w, const float *b, const float *x, u32 rows, u32 cols)
        params: &[
            KernelParam::Buffer(3),
            KernelParam::Buffer(0),
            KernelParam::Buffer(1),
            KernelParam::Buffer(2),
            KernelParam::Scalar(rows),
            KernelParam::Scalar(cols),
        ],
    })
}

/// Runs the layer on `x` and returns y, read back.
fn run_layer(
    device: &mut Device<FwShim>,
    layer: &Layer,
    x_data: &[f32],
) -> Result<Vec<f32>, Failure> {
    let mut cmd = device.command(S0)?;
    // The input goes through the pinned window (it fits a pinned page).
    let x = cmd.empty((COLS * 4) as u64)?;
    let mut staged = cmd.reserve_host(COLS * 4, true)?;
    check!(
        staged.origin() == devcmd::HostOrigin::Pinned,
        "the input was not served from the pinned window"
    );
    staged.as_mut_slice().copy_from_slice(&to_bytes(x_data));
    cmd.write(&x, staged)?;
    let y = cmd.empty((ROWS * 4) as u64)?;
    launch_layer(device, layer, &x, &y)?;
    let read = device.command(S0)?.read_async(&[ReadRequest::whole(&y)])?;
    // Nothing has run yet: the engine runs only when pumped (here by the wait below).
    let queued = device.shim().queued();
    check!(queued >= 3, "work ran before the engine was pumped");
    say!(
        "layer: {} descriptors queued, none run until pumped",
        queued
    );
    let out = read.wait()?;
    Ok(from_bytes(out[0].as_slice()))
}

fn drop_queue_cycle(device: &mut Device<FwShim>) -> Result<(), Failure> {
    let x = device.command(S0)?.empty(128)?;
    // Start from an empty queue: two flushes release everything pushed so far.
    device.command(S0)?.flush_drops()?;
    device.command(S0)?.flush_drops()?;
    let before = stats0(device);

    // Six uploads from heap buffers: each buffer waits in the queue until a fence covers it.
    let mut cmd = device.command(S0)?;
    for i in 0..6u8 {
        cmd.write(&x, HostBuffer::from_vec(vec![i; 128]))?;
    }
    cmd.flush_drops()?;
    check!(
        !cmd.poll_drops()?,
        "the fence passed before the engine ran the copies"
    );
    let ran = device.shim().pump(3);
    check!(
        !device.command(S0)?.poll_drops()?,
        "the fence passed with copies still queued"
    );
    let ran = ran + device.shim().pump_all();
    check!(
        device.command(S0)?.poll_drops()?,
        "the fence did not pass after the engine ran"
    );
    let mid = stats0(device);
    say!(
        "drops: 6 uploads flushed; poll before pumping: pending; pumped {} descriptors; poll: released {} items, {} bytes",
        ran,
        mid.items_released - before.items_released,
        mid.bytes_released - before.bytes_released
    );
    check!(mid.flushes == before.flushes + 1, "one flush expected");
    check!(
        mid.items_released - before.items_released == 6
            && mid.bytes_released - before.bytes_released == 6 * 128,
        "the polled fence released the wrong items"
    );
    check!(
        mid.fences_polled == before.fences_polled + 1,
        "one polled fence expected"
    );

    // A blocking cycle: the second flush waits (pumping) for the first one's fence.
    let mut cmd = device.command(S0)?;
    cmd.write(&x, HostBuffer::from_vec(vec![7; 128]))?;
    cmd.write(&x, HostBuffer::from_vec(vec![8; 128]))?;
    cmd.flush_drops()?;
    cmd.write(&x, HostBuffer::from_vec(vec![9; 128]))?;
    cmd.flush_drops()?;
    let read = cmd.read_async(&[ReadRequest::whole(&x)])?.wait()?;
    check!(
        read[0].as_slice().iter().all(|&b| b == 9),
        "the last upload did not land"
    );
    let after = stats0(device);
    check!(
        after.flushes == mid.flushes + 2,
        "two more flushes expected"
    );
    check!(
        after.fences_waited == mid.fences_waited + 1
            && after.bytes_released - mid.bytes_released == 2 * 128,
        "the waited fence released the wrong items"
    );
    say!(
        "drops: stats flushes={} fences_waited={} fences_polled={} items_released={} bytes_released={}",
        after.flushes,
        after.fences_waited,
        after.fences_polled,
        after.items_released,
        after.bytes_released
    );
    Ok(())
}

fn reclaim_after_pressure(device: &mut Device<FwShim>) -> Result<Handle, Failure> {
    const FILL: u64 = 256;
    const BIG: u64 = 8 * 1024;
    let mut fillers = Vec::new();
    let oom = loop {
        match device.command(S0)?.reserve(FILL) {
            Ok(h) => fillers.push(h),
            Err(e) => break e,
        }
        // Bounded: 16 KiB of device memory holds at most 64 such slices.
        check!(fillers.len() <= 64, "the device never ran out of memory");
    };
    check!(
        matches!(oom, ServerError::Io(IoError::OutOfMemory { .. })),
        "the pressure ended with another error than OutOfMemory"
    );
    let full = device.shim().stats();
    say!(
        "pressure: {} x {} B reserved, then OutOfMemory ({} of {} device bytes in pages)",
        fillers.len(),
        FILL,
        full.device_bytes_used,
        shim::DEVICE_BYTES
    );
    drop(fillers);
    // The fillers' pages are empty but still held by the small pool: the first attempt is
    // refused, the command makes room (drains, releases empty pages behind a fence) and retries.
    let before = device.shim().stats();
    let big = device.command(S0)?.reserve(BIG)?;
    let after = device.shim().stats();
    check!(
        after.pages_refused == before.pages_refused + 1,
        "the first attempt was not refused"
    );
    check!(
        after.pages_freed > before.pages_freed,
        "the reclaim freed no page"
    );
    say!(
        "reclaim: {} B reserved after 1 refusal; reclaim freed {} pages",
        BIG,
        after.pages_freed - before.pages_freed
    );
    // The room is usable: a round trip through its first 256 bytes.
    let mut cmd = device.command(S0)?;
    let pattern: Vec<u8> = (0..=255u8).collect();
    cmd.write_layout(
        &big,
        HostBuffer::from_vec(pattern.clone()),
        CopyLayout::linear(256),
    )?;
    let back = cmd
        .read_async(&[ReadRequest {
            handle: &big,
            layout: CopyLayout::linear(256),
        }])?
        .wait()?;
    check!(
        back[0].as_slice() == pattern.as_slice(),
        "the reclaimed room did not round-trip"
    );
    Ok(big)
}

/// Runs of each operation measured (two drop-queue batches: `max_items` is 8).
const RUNS: usize = 16;

/// Heap allocations made by [`RUNS`] runs of `op`, after runs that grow what it reuses (and cycle
/// the drop queue through its flushes).
fn allocations(mut op: impl FnMut() -> Result<(), Failure>) -> Result<usize, Failure> {
    const WARM: usize = 2 * RUNS;
    for _ in 0..WARM {
        op()?;
    }
    let before = HEAP.allocations();
    for _ in 0..RUNS {
        op()?;
    }
    Ok(HEAP.allocations() - before)
}

/// The enqueue path with warm pools makes no heap allocation (issue 11): a launch, a staged write,
/// a read into a kept buffer, a reserve and drop. `read_async`, which hands back a new vector of
/// buffers, is pinned at its two.
fn allocation_free_enqueue(device: &mut Device<FwShim>, layer: &Layer) -> Result<(), Failure> {
    let x_bytes = to_bytes(&input(2));
    let mut cmd = device.command(S0)?;
    let x = cmd.empty((COLS * 4) as u64)?;
    cmd.write_from(&x, &x_bytes)?;
    let y = cmd.empty((ROWS * 4) as u64)?;
    // The read's buffer, kept and reused: on the heap (the engine reaches all of SRAM), so the
    // pinned window is left to the staged writes.
    let mut kept = Some(HostBuffer::zeroed(ROWS * 4));
    // A 64-byte upload: sixteen of them, the most the drop queue's two batches hold at once, fill
    // the 1 KiB pinned window.
    let small = cmd.empty(64)?;
    let small_bytes = [0x5A_u8; 64];

    let launch = allocations(|| {
        launch_layer(device, layer, &x, &y)?;
        device.command(S0)?.sync()?.wait()?;
        Ok(())
    })?;
    let staged = allocations(|| {
        device.command(S0)?.write_from(&small, &small_bytes)?;
        Ok(())
    })?;
    let read = allocations(|| {
        let buffer = kept
            .take()
            .ok_or(Failure::Check("the kept buffer is gone"))?;
        let back = device
            .command(S0)?
            .read_to(ReadRequest::whole(&y), buffer)?
            .wait()?;
        kept = Some(back);
        Ok(())
    })?;
    let reserve = allocations(|| {
        let h = device.command(S0)?.reserve(64)?;
        drop(h);
        Ok(())
    })?;
    let read_async = allocations(|| {
        let out = device
            .command(S0)?
            .read_async(&[ReadRequest::whole(&y)])?
            .wait()?;
        check!(out[0].len() == ROWS * 4, "a short read");
        Ok(())
    })?;
    say!(
        "alloc: warm enqueue path, heap allocations in {} runs of each: launch+sync {}, staged write {}, read_to {}, reserve+drop {}; read_async {} (2 a read: its vectors of buffers and bindings)",
        RUNS,
        launch,
        staged,
        read,
        reserve,
        read_async
    );
    check!(
        launch == 0 && staged == 0 && read == 0 && reserve == 0,
        "a warm enqueue operation allocated"
    );
    check!(
        read_async == 2 * RUNS,
        "read_async no longer makes exactly two allocations"
    );
    // The kept buffer holds the layer's output: the kernel ran each time.
    let got = from_bytes(kept.as_ref().map_or(&[][..], HostBuffer::as_slice));
    let (w, b) = (weights(), bias());
    check!(
        max_diff(&got, &reference(&w, &b, &input(2))) == Some(0.0),
        "the reads into the kept buffer differ from the CPU's"
    );
    Ok(())
}

/// Heap bytes the core keeps per live allocation and per page, measured on stream 1 (`streams`:
/// the bytes the two streams took when they were created).
fn measure_bookkeeping(device: &mut Device<FwShim>, streams: usize) -> Result<(), Failure> {
    const N: usize = 32;
    const K: usize = 8;
    let mut cmd = device.command(S1)?;
    let mut live: Vec<Handle> = Vec::with_capacity(N);
    let u2 = HEAP.used();
    for _ in 0..N {
        live.push(cmd.reserve(64)?);
    }
    let u3 = HEAP.used();
    live.clear();
    let _ = cmd.memory_report(); // takes the returns in: the slices coalesce, pages stay held
    let u4 = HEAP.used();
    for _ in 0..N {
        live.push(cmd.reserve(64)?);
    }
    let u5 = HEAP.used();
    live.clear();
    let _ = cmd.memory_report();
    cmd.allocation_mode(AllocationMode::Persistent);
    let u6 = HEAP.used();
    for i in 0..K {
        live.push(cmd.reserve(64 * (i as u64 + 1))?);
    }
    let u7 = HEAP.used();
    cmd.allocation_mode(AllocationMode::Auto);
    live.clear();
    cmd.memory_cleanup()?;
    say!(
        "bookkeeping: 2 streams {} B; {} small allocations cold {} B ({} B each, pages and vectors grown); warm {} B ({} B each); {} whole pages {} B ({} B each); handle {} B",
        streams,
        N,
        u3 - u2,
        (u3 - u2) / N,
        u5 - u4,
        (u5 - u4) / N,
        K,
        u7 - u6,
        (u7 - u6) / K,
        core::mem::size_of::<Handle>()
    );
    Ok(())
}

/// A DMA descriptor fails mid-job (fault mode): the upload of the second run's input. Checks that
/// the failure is reported through the failure rules as on std, and returns the error the job saw.
fn fault_mid_job(device: &mut Device<FwShim>, layer: &Layer) -> Result<ServerError, Failure> {
    let x_bytes = to_bytes(&input(4));
    let before = stats0(device);
    let engine_before = device.shim().stats();
    device.shim().fail_next_upload();
    let mut cmd = device.command(S0)?;
    let x = cmd.empty((COLS * 4) as u64)?;
    // Staged through the pinned window: the staging buffer waits in the drop queue.
    cmd.write_from(&x, &x_bytes)?;
    let y = cmd.empty((ROWS * 4) as u64)?;
    launch_layer(device, layer, &x, &y)?;
    let read = device.command(S0)?.read_async(&[ReadRequest::whole(&y)])?;
    // The engine runs: the upload's descriptor fails, the channel halts, the kernel and the read
    // are retired without running.
    let ran = device.shim().pump_all();
    let engine = device.shim().stats();
    check!(
        engine.dma_faults == engine_before.dma_faults + 1,
        "the injected DMA fault did not fire"
    );
    // Nothing freed early: no fence after the failure was waited or polled, so what the failed
    // work used is still held (the staging buffer, the input's pages).
    let held = stats0(device);
    check!(
        held.items_released == before.items_released,
        "the drop queue released items before a fence passed"
    );
    check!(
        engine.pinned_live > 0 && engine.pages_freed == engine_before.pages_freed,
        "memory the failed work used was freed before a fence"
    );
    say!(
        "fault: bus error injected into the upload of the layer's input (stream 0): {} descriptors ran, 1 failed, {} retired unrun; nothing released before a fence",
        ran,
        engine.retired_unrun - engine_before.retired_unrun
    );
    let err = match read.wait() {
        Ok(_) => return Err(Failure::Check("the read after the failed upload succeeded")),
        Err(e) => e,
    };
    check!(
        matches!(
            &err,
            ServerError::StreamFaulted { stream: 0, cause, kernel: Some("matvec_bias_relu") }
                if cause.fault == Fault::WorkFailed && cause.status == shim::status::DMA_FAULT
        ),
        "the read did not report the stream's fault, naming the layer's kernel"
    );
    say!("fault: the read of the layer's output: {}", err);
    // The bytes the failed work touched, and everything else written on the stream, are refused.
    for (what, h) in [("input", &x), ("weights", &layer.w)] {
        match device.command(S0)?.read_async(&[ReadRequest::whole(h)]) {
            Err(ServerError::StreamFaulted { .. }) => {
                say!("fault: a read of the {} is refused", what)
            }
            _ => {
                return Err(Failure::Check(
                    "a read on the faulted stream was not refused",
                ));
            }
        }
    }
    // Other streams run on.
    let mut other = device.command(S1)?;
    let z = other.create(&[7u8; 64])?;
    let back = other.read_async(&[ReadRequest::whole(&z)])?.wait()?;
    check!(back[0].as_slice() == [7u8; 64], "stream 1 did not run on");
    say!("fault: stream 1 runs on (64 B round trip)");
    // Two flushes: the first covers the staged items with a fence, the second waits for it. It
    // completed (over failed work), so what it covered goes now; each flush reports the fault.
    for _ in 0..2 {
        let flushed = device.command(S0)?.flush_drops();
        check!(
            matches!(flushed, Err(ServerError::StreamFaulted { .. })),
            "a flush did not report the stream's fault"
        );
    }
    let after = stats0(device);
    check!(
        after.items_released > before.items_released,
        "the completed fence released nothing"
    );
    say!(
        "fault: the fence after the failure completed: the drop queue released {} items",
        after.items_released - before.items_released
    );
    Ok(err)
}

/// What the final line reports.
struct Summary {
    flushes: u64,
    bytes_released: u64,
}

fn job(mode: Mode) -> Result<Summary, Failure> {
    let shim = FwShim::take().ok_or(Failure::Check("the device was taken twice"))?;
    let mut device = Device::new(shim, config());
    // Both streams first: the device keeps them in one vector, which grows by reallocation.
    let before = HEAP.used();
    let _ = device.command(S1)?;
    let _ = device.command(S0)?;
    let streams = HEAP.used() - before;
    say!(
        "devcmd-firmware on {}: {} B device memory, {} B pinned window, {} B heap",
        board::NAME,
        shim::DEVICE_BYTES,
        shim::PINNED_BYTES,
        HEAP_BYTES
    );

    // Weights in the persistent mode: one exact-size page each, kept for reuse.
    let (w_data, b_data) = (weights(), bias());
    let mut cmd = device.command(S0)?;
    cmd.allocation_mode(AllocationMode::Persistent);
    let w = cmd.empty((ROWS * COLS * 4) as u64)?;
    let b = cmd.empty((ROWS * 4) as u64)?;
    cmd.allocation_mode(AllocationMode::Auto);
    cmd.write(&w, HostBuffer::from_vec(to_bytes(&w_data)))?;
    cmd.write(&b, HostBuffer::from_vec(to_bytes(&b_data)))?;
    let layer = Layer { w, b };

    let x_data = input(0);
    let y = run_layer(&mut device, &layer, &x_data)?;
    let diff = max_diff(&y, &reference(&w_data, &b_data, &x_data));
    check!(
        diff == Some(0.0),
        "the layer's output differs from the CPU's"
    );
    say!(
        "layer: y[0..4] = [{}, {}, {}, {}], matches the CPU reference (max |diff| 0)",
        y[0],
        y[1],
        y[2],
        y[3]
    );

    drop_queue_cycle(&mut device)?;
    let big = reclaim_after_pressure(&mut device)?;

    if mode == Mode::Fault {
        let err = fault_mid_job(&mut device, &layer)?;
        drop((big, layer));
        // Teardown after the fault: every stream's fence completed, so everything goes back.
        drop(device);
        let engine = shim::engine_stats();
        check!(
            engine.pages_live == 0 && engine.pinned_live == 0,
            "teardown after the fault left pages behind"
        );
        say!(
            "fault: teardown freed every page ({} device pages freed in all)",
            engine.pages_freed
        );
        return Err(Failure::DeviceFault(err));
    }

    // The weights survived the pressure and the reclaim: run the layer again on a new input.
    let x2 = input(4);
    let y2 = run_layer(&mut device, &layer, &x2)?;
    let diff2 = max_diff(&y2, &reference(&w_data, &b_data, &x2));
    check!(diff2 == Some(0.0), "the second run differs from the CPU's");
    drop(big);

    allocation_free_enqueue(&mut device, &layer)?;

    // Graphs are not supported by this device.
    {
        use devcmd::Shim;
        let stream = device.shim().create_stream().map_err(ServerError::from)?;
        let refused = device.shim().begin_capture(&stream);
        check!(
            matches!(refused, Err(e) if e.fault == Fault::Unsupported),
            "graph capture did not report Unsupported"
        );
    }

    measure_bookkeeping(&mut device, streams)?;

    device.command(S0)?.memory_cleanup()?;
    let report = device.memory_report();
    say!("memory report:\n{}", report);
    let engine = device.shim().stats();
    say!(
        "engine: {} descriptors run, {} kernel blocks, {} pages live, {} freed, {} refused; pinned refused {}; heap used {} B",
        engine.completed,
        engine.kernel_blocks,
        engine.pages_live,
        engine.pages_freed,
        engine.pages_refused,
        engine.pinned_refused,
        HEAP.used()
    );
    let drops = stats0(&device);
    drop(layer);
    drop(device);
    Ok(Summary {
        flushes: drops.flushes,
        bytes_released: drops.bytes_released,
    })
}

/// Runs the job, checks that it left no heap behind and kept off the statics, and returns the
/// exit status.
pub fn run(mode: Mode) -> u32 {
    if mode == Mode::Panic {
        panic!("on purpose (run with `panic`)");
    }
    let base = HEAP.used();
    let result = job(mode);
    let (used, size) = (stack::high_water(), stack::size());
    let left = HEAP.used() - base;
    say!(
        "ram: heap peak {} B of {} B, {} B left after teardown; stack {} B used at most, of {} B",
        HEAP.peak(),
        HEAP_BYTES,
        left,
        used,
        size
    );
    if left != 0 {
        say!("devcmd-firmware: FAILED: the device left heap memory behind");
        return EXIT_FAILED;
    }
    if used + 1024 >= size {
        say!("devcmd-firmware: FAILED: the stack came within 1 KiB of the statics");
        return EXIT_FAILED;
    }
    match result {
        Ok(summary) => {
            say!(
                "devcmd-firmware: VERIFIED 16x32 matvec+bias+relu (2 runs, max |diff| 0), drop queue flushes={} bytes_released={}, reclaim after pressure ok, warm enqueue path allocation-free",
                summary.flushes,
                summary.bytes_released
            );
            EXIT_VERIFIED
        }
        Err(Failure::DeviceFault(e)) => {
            say!(
                "devcmd-firmware: DEVICE FAULT: a DMA descriptor failed mid-job; the job stopped on {} (reported as on std: the read of the bytes it touched failed, nothing was freed before a fence, other streams ran on, teardown freed everything); exit status {}",
                e,
                EXIT_DEVICE_FAULT
            );
            EXIT_DEVICE_FAULT
        }
        Err(Failure::Server(e)) => {
            say!("devcmd-firmware: FAILED: {}", e);
            EXIT_FAILED
        }
        Err(Failure::Check(what)) => {
            say!("devcmd-firmware: FAILED: {}", what);
            EXIT_FAILED
        }
    }
}
