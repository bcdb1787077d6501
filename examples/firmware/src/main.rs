//! The firmware host: the same `Device`/`Command` job as the std host, on a Cortex-M3 without an
//! OS (QEMU lm3s6965evb), over the DMA-engine shim of [`shim`].
//!
//! It reserves a layer's weights in the persistent mode, stages an input, runs a 16x32 f32
//! matvec + bias + ReLU kernel, reads the result back and checks it against the CPU; then it runs
//! a drop-queue cycle, a reclaim after memory pressure, measures the core's bookkeeping per
//! allocation, prints the memory report and exits 0 through semihosting. Any mismatch, error or
//! panic exits 1.
#![no_std]
#![no_main]

extern crate alloc;

mod shim;
mod stack;

use alloc::vec;
use alloc::vec::Vec;
use core::alloc::{GlobalAlloc, Layout};
use core::sync::atomic::{AtomicUsize, Ordering};
use cortex_m_rt::entry;
use cortex_m_semihosting::{debug, hprintln};
use devcmd::copy::StagingPolicy;
use devcmd::memory::MemoryConfig;
use devcmd::pinned::PinnedConfig;
use devcmd::{
    AllocationMode, CopyLayout, Device, DeviceConfig, DropPolicy, DropStats, Handle, HostBuffer,
    IoError, KernelParam, Launch, LaunchDims, ReadRequest, ServerError, StreamId,
};
use embedded_alloc::LlffHeap;
use shim::{FwKernel, FwShim, KernelCtx, KernelFault};

// Names `cortex_m` so its critical-section implementation is linked.
use cortex_m as _;

/// The heap, with its high-water mark.
struct Heap {
    inner: LlffHeap,
    peak: AtomicUsize,
}

impl Heap {
    fn used(&self) -> usize {
        self.inner.used()
    }

    fn peak(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }
}

// SAFETY: every call is forwarded unchanged to the linked-list heap, which upholds the contract;
// the wrapper only reads how much is used.
unsafe impl GlobalAlloc for Heap {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is passed on.
        let p = unsafe { self.inner.alloc(layout) };
        self.peak.fetch_max(self.inner.used(), Ordering::Relaxed);
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract is passed on.
        unsafe { self.inner.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static HEAP: Heap = Heap {
    inner: LlffHeap::empty(),
    peak: AtomicUsize::new(0),
};

/// Heap bytes. RAM is 64 KiB: 16 KiB device memory + 1 KiB pinned window + this + the stack
/// (about 12 KiB, of which the job uses about 6).
const HEAP_BYTES: usize = 35 * 1024;

const ROWS: usize = 16;
const COLS: usize = 32;

// ---- logging: `log` over semihosting ----

struct SemihostingLogger;

impl log::Log for SemihostingLogger {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::Level::Debug
    }

    fn log(&self, record: &log::Record<'_>) {
        if self.enabled(record.metadata()) {
            hprintln!(
                "[{}] {}: {}",
                record.level(),
                record.target(),
                record.args()
            );
        }
    }

    fn flush(&self) {}
}

static LOGGER: SemihostingLogger = SemihostingLogger;

// ---- the job's failure ----

/// Why the job failed.
#[derive(Debug)]
enum Failure {
    Server(ServerError),
    Check(&'static str),
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
/// Buffers: w (rows x cols), b (rows), x (cols); output y (rows). Parameters: y, w, b, x (buffer slots 3, 0, 1, 2), then rows, cols (u32 LE).
fn matvec_bias_relu(ctx: &mut KernelCtx<'_, '_>) -> Result<(), KernelFault> {
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
            arena_slack: 512,
            arena_granule: 512,
            arena_classes: 2,
        },
        drops: DropPolicy {
            max_items: 8,
            max_bytes: 4096,
            fill_released: None,
        },
        // All SRAM is reachable by the engine: heap data is never staged through the pinned
        // window (a staging copy would double the heap it takes).
        staging: StagingPolicy {
            max_staged: 0,
            flush_after: 4096,
        },
        pinned: PinnedConfig {
            page_size: 512,
            max_bytes: shim::PINNED_BYTES as u64,
            alignment: 64,
        },
        max_streams: 2,
        memory_budget: None,
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
    let (rows, cols) = ((ROWS as u32).to_le_bytes(), (COLS as u32).to_le_bytes());
    cmd.launch(Launch {
        kernel: &MATVEC,
        name: MATVEC.name,
        dims: LaunchDims::linear(ROWS as u32, 1),
        inputs: &[&layer.w, &layer.b, &x],
        outputs: &[&y],
        // matvec(float *y, const float *w, const float *b, const float *x, u32 rows, u32 cols)
        params: &[
            KernelParam::Buffer(3),
            KernelParam::Buffer(0),
            KernelParam::Buffer(1),
            KernelParam::Buffer(2),
            KernelParam::Scalar(&rows),
            KernelParam::Scalar(&cols),
        ],
    })?;
    let read = cmd.read_async(&[ReadRequest::whole(&y)])?;
    // Nothing has run yet: the engine runs only when pumped (here by the wait below).
    let queued = device.shim().queued();
    check!(queued >= 3, "work ran before the engine was pumped");
    hprintln!(
        "layer: {} descriptors queued, none run until pumped",
        queued
    );
    let out = read.wait()?;
    let y_host = from_bytes(out[0].as_slice());
    Ok(y_host)
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
    hprintln!(
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
    hprintln!(
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
    hprintln!(
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
    hprintln!(
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
    hprintln!(
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

/// What the final line reports.
struct Summary {
    flushes: u64,
    bytes_released: u64,
}

fn job() -> Result<Summary, Failure> {
    let shim = FwShim::take().ok_or(Failure::Check("the device was taken twice"))?;
    let mut device = Device::new(shim, config());
    // Both streams first: the device keeps them in one vector, which grows by reallocation.
    let before = HEAP.used();
    let _ = device.command(S1)?;
    let _ = device.command(S0)?;
    let streams = HEAP.used() - before;
    hprintln!(
        "devcmd-firmware: {} B device memory, {} B pinned window, {} B heap",
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
    hprintln!(
        "layer: y[0..4] = {:?}, matches the CPU reference (max |diff| 0)",
        &y[..4]
    );

    drop_queue_cycle(&mut device)?;
    let big = reclaim_after_pressure(&mut device)?;

    // The weights survived the pressure and the reclaim: run the layer again on a new input.
    let x2 = input(4);
    let y2 = run_layer(&mut device, &layer, &x2)?;
    let diff2 = max_diff(&y2, &reference(&w_data, &b_data, &x2));
    check!(diff2 == Some(0.0), "the second run differs from the CPU's");
    drop(big);

    // Graphs are not supported by this device.
    {
        use devcmd::{Fault, Shim};
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
    hprintln!("memory report:\n{}", report);
    let engine = device.shim().stats();
    hprintln!(
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

/// Runs the job, then checks that it left no heap behind and kept off the statics.
fn run() -> Result<(), Failure> {
    let base = HEAP.used();
    let summary = job()?;
    let (used, size) = (stack::high_water(), stack::size());
    hprintln!(
        "ram: heap peak {} B of {} B, {} B left after teardown; stack {} B used at most, of {} B",
        HEAP.peak(),
        HEAP_BYTES,
        HEAP.used() - base,
        used,
        size
    );
    check!(HEAP.used() == base, "the device left heap memory behind");
    check!(
        used + 1024 < size,
        "the stack came within 1 KiB of the statics"
    );
    hprintln!(
        "devcmd-firmware: VERIFIED 16x32 matvec+bias+relu (2 runs, max |diff| 0), drop queue flushes={} bytes_released={}, reclaim after pressure ok",
        summary.flushes,
        summary.bytes_released
    );
    Ok(())
}

#[entry]
fn main() -> ! {
    stack::paint();
    {
        use core::mem::MaybeUninit;
        static mut HEAP_MEM: [MaybeUninit<u8>; HEAP_BYTES] = [MaybeUninit::uninit(); HEAP_BYTES];
        // SAFETY: runs once, before any allocation; nothing else uses HEAP_MEM.
        unsafe { HEAP.inner.init(&raw mut HEAP_MEM as usize, HEAP_BYTES) }
    }
    // `set_logger` fails only when a logger is set already: there is none.
    let _ = log::set_logger(&LOGGER);
    log::set_max_level(log::LevelFilter::Debug);

    match run() {
        Ok(()) => debug::exit(debug::EXIT_SUCCESS),
        Err(e) => {
            match e {
                Failure::Server(e) => hprintln!("devcmd-firmware: FAILED: {}", e),
                Failure::Check(what) => hprintln!("devcmd-firmware: FAILED: {}", what),
            }
            debug::exit(debug::EXIT_FAILURE);
        }
    }
    #[allow(clippy::empty_loop)]
    loop {}
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
    hprintln!("devcmd-firmware: PANIC: {}", info);
    debug::exit(debug::EXIT_FAILURE);
    #[allow(clippy::empty_loop)]
    loop {}
}
