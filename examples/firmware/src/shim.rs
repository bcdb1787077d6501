//! The firmware shim: a device without an OS, modelled on a DMA engine.
//!
//! - **Device memory** is a static 16 KiB RAM region ([`DEVICE_BYTES`]) seen by the engine at
//!   the bus address [`DEVICE_BASE`] (above the 32-bit host space, so a device address can never
//!   be mistaken for a host pointer). Pages are runs of 64-byte granules ([`GRANULE`]) handed out
//!   first-fit from a bitmap; the largest page is the whole region. A refused page is
//!   [`Fault::OutOfMemory`], a page larger than the region [`Fault::TooBig`].
//! - **Pinned host pages** come from a second, 1 KiB region ([`PINNED_BYTES`], standing for a
//!   DMA-coherent SRAM window). When it is full the request is refused and the core stages from
//!   the heap instead.
//! - **Copies and launches** are descriptors queued on a stream; nothing runs when they are
//!   enqueued. The engine runs descriptors only when it is *pumped*: [`FwShim::pump`] (the
//!   engine's clock: call it from the main loop or an idle hook, never from an interrupt: every
//!   shim call holds the engine's spin lock, which an interrupt would spin on forever) or
//!   [`Shim::event_wait`] (the host blocks, so it drives the engine until the event is reached).
//!   [`Shim::event_query`] pumps nothing: it reads the engine's progress like a status register,
//!   so a drop queue polled without pumping keeps its items, and the fences matter.
//! - **Events** are sequence numbers: an event is the number of descriptors enqueued on its
//!   stream when it was recorded, and it is reached once the stream has completed that many. The
//!   64-bit counters live under the engine's `spin::Mutex` (Cortex-M3 has no 64-bit atomics).
//!   [`Shim::stream_wait_event`] queues a wait descriptor the engine passes only once the other
//!   stream reached the event.
//! - **Kernels** are plain functions ([`FwKernel`]) run once per block of the grid when the engine
//!   reaches them. A kernel that fails is a device fault: the device is lost (like CUDA's sticky
//!   errors) and every later call reports it.
//! - **A DMA descriptor that fails** ([`FwShim::fail_next_upload`] injects one: a bus error on the
//!   next host-to-device copy) halts its stream's channel: the copy writes nothing, the stream's
//!   later descriptors are retired without running, and every event of the stream from that
//!   descriptor on reports [`status::DMA_FAULT`] ([`Fault::WorkFailed`]) once reached, as do the
//!   streams that wait on it. The device stays usable: other streams run on. These are the shim
//!   contract's rules for faults of work that ran, as the std shim keeps them.
//! - **Graphs** are not supported: every graph call fails with [`Fault::Unsupported`].
//!
//! Enqueueing allocates nothing once warm: a lane's descriptor queue keeps its capacity, and a
//! launch's spans and scalar bytes travel in storage the engine takes back after the kernel ran
//! and hands to the next launch.
//!
//! Every error is built by [`Shim::classify`] from a status of [`status`].

use alloc::collections::VecDeque;
use alloc::vec::Vec;
use core::cell::UnsafeCell;
use core::fmt;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicBool, Ordering};
use devcmd::{
    CopyLayout, DeviceAddr, DeviceFacts, DeviceSpan, Dim3, DriverError, Fault, HostMemory,
    KernelParam, LaunchDims, Shim, ShimOp,
};

/// Bytes of device memory.
pub const DEVICE_BYTES: usize = 16 * 1024;
/// Bytes of the pinned (DMA-coherent) host window.
pub const PINNED_BYTES: usize = 1024;
/// Allocation granule and page alignment of both regions.
pub const GRANULE: usize = 64;
/// The engine's bus address of the first byte of device memory.
pub const DEVICE_BASE: u64 = 0x1_0000_0000;
/// Streams the engine runs at once.
pub const MAX_STREAMS: usize = 4;
/// The byte device memory is filled with when a page is freed (catches use after free).
pub const FREED_BYTE: u8 = 0xA5;

/// The status codes of the engine, and how [`Shim::classify`] reads them.
pub mod status {
    /// No granule run is free for the page: [`devcmd::Fault::OutOfMemory`].
    pub const OUT_OF_MEMORY: i32 = 1;
    /// Larger than the region: [`devcmd::Fault::TooBig`].
    pub const TOO_BIG: i32 = 2;
    /// Graphs: [`devcmd::Fault::Unsupported`].
    pub const UNSUPPORTED: i32 = 3;
    /// A wait that nothing can ever satisfy (cyclic stream waits): [`devcmd::Fault::Failed`].
    pub const STALLED: i32 = 4;
    /// A descriptor outside the pages handed out: [`devcmd::Fault::Failed`].
    pub const BAD_ADDRESS: i32 = 5;
    /// Every stream slot is in use: [`devcmd::Fault::Failed`].
    pub const NO_STREAM_SLOT: i32 = 6;
    /// A launch whose buffers do not match the kernel: [`devcmd::Fault::Failed`].
    pub const BAD_LAUNCH: i32 = 7;
    /// A kernel failed while running: the device is lost, [`devcmd::Fault::DeviceLost`].
    pub const KERNEL_FAULT: i32 = 8;
    /// A DMA descriptor of the stream (or of one it waited on) failed while it ran, reported by
    /// the stream's events from that descriptor on: [`devcmd::Fault::WorkFailed`].
    pub const DMA_FAULT: i32 = 9;
}

// ---- the two static regions ----

#[repr(C, align(64))]
struct Region<const N: usize>(UnsafeCell<[u8; N]>);

// SAFETY: device memory is read and written only by the engine, with the engine's lock held; the
// pinned window only through the pages the engine handed out, which are disjoint, each owned by
// one holder (the core's pinned pool) or by the engine while a queued copy uses it.
unsafe impl<const N: usize> Sync for Region<N> {}

impl<const N: usize> Region<N> {
    fn base(&self) -> *mut u8 {
        self.0.get().cast()
    }
}

static DEVICE_MEM: Region<DEVICE_BYTES> = Region(UnsafeCell::new([0; DEVICE_BYTES]));
static PINNED_MEM: Region<PINNED_BYTES> = Region(UnsafeCell::new([0; PINNED_BYTES]));

/// A first-fit allocator of granules, one bit each.
struct Granules<const W: usize> {
    bits: [u32; W],
    used: usize,
}

impl<const W: usize> Granules<W> {
    const LEN: usize = W * 32;

    const fn new() -> Self {
        Self {
            bits: [0; W],
            used: 0,
        }
    }

    fn is_set(&self, i: usize) -> bool {
        self.bits[i / 32] & (1 << (i % 32)) != 0
    }

    fn set(&mut self, start: usize, n: usize, on: bool) {
        for i in start..start + n {
            if on {
                self.bits[i / 32] |= 1 << (i % 32);
            } else {
                self.bits[i / 32] &= !(1 << (i % 32));
            }
        }
    }

    /// The first run of `n` free granules, now taken.
    fn alloc(&mut self, n: usize) -> Option<usize> {
        let mut run = 0;
        for i in 0..Self::LEN {
            if self.is_set(i) {
                run = 0;
                continue;
            }
            run += 1;
            if run == n {
                let start = i + 1 - n;
                self.set(start, n, true);
                self.used += n;
                return Some(start);
            }
        }
        None
    }

    fn free(&mut self, start: usize, n: usize) {
        self.set(start, n, false);
        self.used -= n;
    }

    /// Whether every granule of `bytes` bytes from byte `offset` is taken.
    fn covers(&self, offset: usize, bytes: usize) -> bool {
        bytes == 0 || (offset / GRANULE..=(offset + bytes - 1) / GRANULE).all(|i| self.is_set(i))
    }
}

const DEVICE_WORDS: usize = DEVICE_BYTES / GRANULE / 32;
const PINNED_WORDS: usize = PINNED_BYTES.div_ceil(GRANULE * 32);

// ---- descriptors and the engine ----

/// One unit of queued work.
enum Desc {
    ToDevice {
        src: *const u8,
        dst: usize,
        layout: CopyLayout,
        /// An injected bus error: the engine fails this descriptor instead of copying.
        fail: bool,
    },
    ToHost {
        src: usize,
        dst: *mut u8,
        layout: CopyLayout,
    },
    OnDevice {
        src: usize,
        dst: usize,
        layout: CopyLayout,
    },
    Kernel {
        kernel: FwKernel,
        grid: Dim3,
        args: KernelArgs,
    },
    Wait {
        slot: usize,
        generation: u32,
        seq: u64,
    },
}

/// What a launch descriptor carries, in storage reused from launch to launch.
#[derive(Default)]
struct KernelArgs {
    /// Offsets and lengths in device memory, inputs then outputs.
    spans: Vec<(usize, usize)>,
    /// The scalar parameters' bytes, in order (the kernel reaches its buffers by index).
    bytes: Vec<u8>,
}

/// Launch storage the engine keeps for the next launches: as many launches as may be queued at
/// once without allocating.
const SPARE_KERNEL_ARGS: usize = 4;

// SAFETY: the firmware is single-core and the engine state is reached only through its lock; the
// raw pointers are host buffers the core keeps valid until a fence after the copy passes (the
// Shim contract), whichever context pumps the engine.
unsafe impl Send for Desc {}

/// A stream's queue in the engine.
struct Lane {
    live: bool,
    /// Bumped when the slot is released, so events of an older stream in the slot read as reached.
    generation: u32,
    queue: VecDeque<Desc>,
    enqueued: u64,
    completed: u64,
    /// The sequence number of the descriptor that failed (this lane's own, or a wait on a lane
    /// that had failed): the channel is halted from there on.
    fault: Option<u64>,
}

impl Lane {
    const fn new() -> Self {
        Self {
            live: false,
            generation: 0,
            queue: VecDeque::new(),
            enqueued: 0,
            completed: 0,
            fault: None,
        }
    }
}

/// What the engine has done, for reports and checks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Descriptors queued (copies, launches, waits).
    pub enqueued: u64,
    /// Descriptors the engine ran.
    pub completed: u64,
    /// Kernel blocks run.
    pub kernel_blocks: u64,
    /// Device pages handed out and not yet freed.
    pub pages_live: u32,
    /// Device pages freed.
    pub pages_freed: u64,
    /// Device page requests refused for want of room.
    pub pages_refused: u64,
    /// Device bytes in pages handed out (granule-rounded).
    pub device_bytes_used: u32,
    /// Pinned pages handed out and not yet freed.
    pub pinned_live: u32,
    /// Pinned page requests refused.
    pub pinned_refused: u64,
    /// DMA descriptors that failed while they ran.
    pub dma_faults: u64,
    /// Descriptors retired without running, on a halted channel.
    pub retired_unrun: u64,
}

struct Engine {
    device: Granules<DEVICE_WORDS>,
    pinned: Granules<PINNED_WORDS>,
    lanes: [Lane; MAX_STREAMS],
    /// Round-robin start of the next pump.
    next: usize,
    /// The status of the fault that lost the device.
    fault: Option<i32>,
    /// Arm the injected bus error for the next host-to-device copy enqueued.
    fail_next_upload: bool,
    /// Launch storage back from kernels that ran (at most [`SPARE_KERNEL_ARGS`]).
    spare: Vec<KernelArgs>,
    stats: EngineStats,
}

static ENGINE: spin::Mutex<Engine> = spin::Mutex::new(Engine {
    device: Granules::new(),
    pinned: Granules::new(),
    lanes: [const { Lane::new() }; MAX_STREAMS],
    next: 0,
    fault: None,
    fail_next_upload: false,
    spare: Vec::new(),
    stats: EngineStats {
        enqueued: 0,
        completed: 0,
        kernel_blocks: 0,
        pages_live: 0,
        pages_freed: 0,
        pages_refused: 0,
        device_bytes_used: 0,
        pinned_live: 0,
        pinned_refused: 0,
        dma_faults: 0,
        retired_unrun: 0,
    },
});

static TAKEN: AtomicBool = AtomicBool::new(false);

impl Engine {
    fn reached(&self, slot: usize, generation: u32, seq: u64) -> bool {
        let lane = &self.lanes[slot];
        lane.generation != generation || lane.completed >= seq
    }

    /// Whether a descriptor at or before `seq` of the lane failed (sticky: every later point of
    /// the lane reports it too). A slot reused by a newer stream says nothing of the old one.
    fn faulted_through(&self, slot: usize, generation: u32, seq: u64) -> bool {
        let lane = &self.lanes[slot];
        lane.generation == generation && lane.fault.is_some_and(|f| f <= seq)
    }

    fn device_offset(&self, addr: DeviceAddr, len: u64) -> Option<usize> {
        let off = addr.0.checked_sub(DEVICE_BASE)?;
        let end = off.checked_add(len)?;
        if end > DEVICE_BYTES as u64 {
            return None;
        }
        let (off, len) = (off as usize, len as usize);
        self.device.covers(off, len).then_some(off)
    }

    fn enqueue(&mut self, slot: usize, desc: Desc) {
        let lane = &mut self.lanes[slot];
        lane.queue.push_back(desc);
        lane.enqueued += 1;
        self.stats.enqueued += 1;
    }

    /// Runs one runnable descriptor, round robin over the streams. False when none can run.
    fn pump_one(&mut self) -> bool {
        if self.fault.is_some() {
            return false;
        }
        for k in 0..MAX_STREAMS {
            let slot = (self.next + k) % MAX_STREAMS;
            let runnable = match self.lanes[slot].queue.front() {
                None => false,
                Some(Desc::Wait {
                    slot: s,
                    generation,
                    seq,
                }) => self.reached(*s, *generation, *seq),
                Some(_) => true,
            };
            if !runnable {
                continue;
            }
            let desc = self.lanes[slot].queue.pop_front().expect("checked above");
            let seq = self.lanes[slot].completed + 1;
            if self.lanes[slot].fault.is_some() {
                // A halted channel retires what is left without running it.
                self.stats.retired_unrun += 1;
                self.recycle(desc);
            } else {
                self.run(desc, slot, seq);
            }
            self.lanes[slot].completed += 1;
            self.stats.completed += 1;
            self.next = (slot + 1) % MAX_STREAMS;
            return true;
        }
        false
    }

    /// Keeps a launch's storage for the next launch; drops everything else.
    fn recycle(&mut self, desc: Desc) {
        if let Desc::Kernel { args, .. } = desc
            && self.spare.len() < SPARE_KERNEL_ARGS
        {
            self.spare.push(args);
        }
    }

    /// Runs `desc`, the descriptor `seq` of lane `slot`.
    fn run(&mut self, desc: Desc, slot: usize, seq: u64) {
        let dev = DEVICE_MEM.base();
        match desc {
            Desc::ToDevice { fail: true, .. } => {
                error!(
                    "DMA: descriptor {} of channel {} (host to device) failed: bus error; the channel halts",
                    seq, slot
                );
                self.lanes[slot].fault = Some(seq);
                self.stats.dma_faults += 1;
            }
            Desc::ToDevice {
                src, dst, layout, ..
            } => {
                for (host, device, width) in rows(layout) {
                    // SAFETY: `src` holds `packed_bytes` readable bytes until a fence after this
                    // copy passes (the Shim contract); the device rows were checked to lie in
                    // pages handed out; the engine's lock is held, so nothing else touches them.
                    unsafe { core::ptr::copy(src.add(host), dev.add(dst + device), width) };
                }
            }
            Desc::ToHost { src, dst, layout } => {
                for (host, device, width) in rows(layout) {
                    // SAFETY: as above, with `dst` writable and untouched by the host until the
                    // fence passes.
                    unsafe { core::ptr::copy(dev.add(src + device), dst.add(host), width) };
                }
            }
            Desc::OnDevice { src, dst, layout } => {
                for (_, device, width) in rows(layout) {
                    // SAFETY: both spans were checked to lie in pages handed out; `copy` allows
                    // overlap, which the contract excludes anyway.
                    unsafe { core::ptr::copy(dev.add(src + device), dev.add(dst + device), width) };
                }
            }
            Desc::Kernel { kernel, grid, args } => {
                let ran = self.run_kernel(&kernel, grid, &args);
                self.recycle(Desc::Kernel { kernel, grid, args });
                if let Err(e) = ran {
                    error!(
                        "kernel `{}` faulted: {}; the device is lost",
                        kernel.name, e.0
                    );
                    self.lose(status::KERNEL_FAULT);
                }
            }
            Desc::Wait {
                slot: other,
                generation,
                seq: at,
            } => {
                // Work ordered after failed work inherits the failure (the contract's third rule).
                if self.faulted_through(other, generation, at) {
                    self.lanes[slot].fault = Some(seq);
                }
            }
        }
    }

    fn run_kernel(
        &mut self,
        kernel: &FwKernel,
        grid: Dim3,
        args: &KernelArgs,
    ) -> Result<(), KernelFault> {
        let first_out = args.spans.len() - kernel.outputs;
        for z in 0..grid.z {
            for y in 0..grid.y {
                for x in 0..grid.x {
                    let mut ctx = KernelCtx {
                        grid,
                        block: [x, y, z],
                        spans: &args.spans,
                        first_out,
                        args: &args.bytes,
                    };
                    (kernel.run)(&mut ctx)?;
                    self.stats.kernel_blocks += 1;
                }
            }
        }
        Ok(())
    }

    /// Loses the device: nothing runs again.
    fn lose(&mut self, status: i32) {
        self.fault.get_or_insert(status);
        for lane in &mut self.lanes {
            lane.queue.clear();
        }
    }
}

/// The rows of a copy: (host offset, device offset, width).
fn rows(layout: CopyLayout) -> impl Iterator<Item = (usize, usize, usize)> {
    // Offsets fit a usize: the spans were checked to lie in device memory when enqueued.
    layout
        .rows()
        .map(|r| (r.host as usize, r.device as usize, r.len as usize))
}

// ---- kernels ----

/// Why a kernel gave up; the engine then loses the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelFault(pub &'static str);

/// A kernel: a plain function run once per block of the launch grid.
pub type KernelFn = fn(&mut KernelCtx<'_>) -> Result<(), KernelFault>;

/// A kernel the engine can run: its function and how many of the launch's buffers (the last
/// ones) it writes.
#[derive(Clone, Copy)]
pub struct FwKernel {
    /// Its name, in every failure report of its launches (`Shim::kernel_name`).
    pub name: &'static str,
    /// The number of output buffers (they come after the inputs).
    pub outputs: usize,
    /// The function.
    pub run: KernelFn,
}

impl fmt::Debug for FwKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FwKernel")
            .field("name", &self.name)
            .field("outputs", &self.outputs)
            .finish()
    }
}

/// What a kernel sees of one block: the grid, the block's index, its buffers and arguments. The
/// buffers are views of device memory made on demand (no allocation per run).
#[derive(Debug)]
pub struct KernelCtx<'a> {
    /// The launch grid.
    pub grid: Dim3,
    /// This block's index (x, y, z).
    pub block: [u32; 3],
    /// Offsets and lengths in device memory: inputs, then outputs from `first_out`.
    spans: &'a [(usize, usize)],
    first_out: usize,
    args: &'a [u8],
}

impl<'a> KernelCtx<'a> {
    /// Input buffer `i`.
    pub fn input(&self, i: usize) -> Result<&'a [u8], KernelFault> {
        let &(offset, len) = self.spans[..self.first_out]
            .get(i)
            .ok_or(KernelFault("input index out of range"))?;
        // SAFETY: the span lies in pages handed out (checked at launch); no output overlaps it
        // (the `launch` contract, which the core enforces), so no mutable view aliases it; the
        // engine's lock is held while the kernel runs, so no copy runs meanwhile, and the host
        // never touches device memory directly.
        Ok(unsafe { core::slice::from_raw_parts(DEVICE_MEM.base().add(offset), len) })
    }

    /// Output buffer `i`.
    pub fn output(&mut self, i: usize) -> Result<&mut [u8], KernelFault> {
        let &(offset, len) = self.spans[self.first_out..]
            .get(i)
            .ok_or(KernelFault("output index out of range"))?;
        // SAFETY: as in `input`; the output overlaps no other span of the launch, and the
        // `&mut self` borrow keeps any other output view out while this one lives.
        Ok(unsafe { core::slice::from_raw_parts_mut(DEVICE_MEM.base().add(offset), len) })
    }

    /// The `i`-th little-endian `u32` of the scalar parameters' bytes, in order.
    pub fn arg_u32(&self, i: usize) -> Result<u32, KernelFault> {
        self.args
            .get(i * 4..i * 4 + 4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_le_bytes)
            .ok_or(KernelFault("argument out of range"))
    }
}

// ---- the shim ----

/// The firmware device. There is one (its memory is static): [`FwShim::take`] hands it out once.
#[derive(Debug)]
pub struct FwShim {
    _one: (),
}

/// A stream slot of the engine. Dropping it lets its queue finish, then frees the slot.
#[derive(Debug)]
pub struct FwStream {
    slot: usize,
    generation: u32,
}

impl Drop for FwStream {
    fn drop(&mut self) {
        let mut e = ENGINE.lock();
        while !e.lanes[self.slot].queue.is_empty() {
            if !e.pump_one() {
                // Lost device or a wait nothing can satisfy: the queue will never run.
                e.lanes[self.slot].queue.clear();
            }
        }
        let lane = &mut e.lanes[self.slot];
        lane.live = false;
        lane.generation = lane.generation.wrapping_add(1);
        // The slot may stay unused: give its queue's buffer back to the heap, and the launch
        // storage too once no stream is left (the engine is a static: it outlives the device).
        lane.queue = VecDeque::new();
        if e.lanes.iter().all(|l| !l.live) {
            e.spare = Vec::new();
        }
    }
}

/// A fence: reached once its stream completed `seq` descriptors.
#[derive(Debug, Clone, Copy)]
pub struct FwEvent {
    slot: usize,
    generation: u32,
    seq: u64,
}

/// A run of device granules.
#[derive(Debug)]
pub struct FwPage {
    offset: usize,
    granules: usize,
}

/// A run of pinned-window granules.
#[derive(Debug)]
pub struct FwHostPage {
    offset: usize,
    granules: usize,
}

/// What the engine has done, readable after the device was dropped (teardown checks).
pub fn engine_stats() -> EngineStats {
    ENGINE.lock().stats
}

/// Graphs are unsupported: no value of this type exists.
#[derive(Debug)]
pub enum FwGraph {}

impl FwShim {
    /// The device, the first time; `None` afterwards (its memory is one static region).
    pub fn take() -> Option<Self> {
        (!TAKEN.swap(true, Ordering::AcqRel)).then_some(Self { _one: () })
    }

    /// Runs at most `max` descriptors; returns how many ran. The engine's clock: call it from the
    /// main loop (or an idle hook; not an interrupt handler, which would spin forever on the lock
    /// the interrupted code holds) so work progresses while the host polls.
    pub fn pump(&self, max: usize) -> usize {
        let mut e = ENGINE.lock();
        (0..max).take_while(|_| e.pump_one()).count()
    }

    /// Runs descriptors until none can run; returns how many ran.
    pub fn pump_all(&self) -> usize {
        self.pump(usize::MAX)
    }

    /// Descriptors queued and not yet run, over every stream.
    pub fn queued(&self) -> usize {
        ENGINE.lock().lanes.iter().map(|l| l.queue.len()).sum()
    }

    /// What the engine has done.
    pub fn stats(&self) -> EngineStats {
        engine_stats()
    }

    /// Injects a bus error into the next host-to-device copy enqueued: its descriptor fails when
    /// the engine runs it, and its stream's channel halts (see the module documentation).
    pub fn fail_next_upload(&self) {
        ENGINE.lock().fail_next_upload = true;
    }

    fn enter(&self, e: &Engine, op: ShimOp) -> Result<(), DriverError> {
        match e.fault {
            Some(s) => Err(self.classify(op, s)),
            None => Ok(()),
        }
    }

    /// A reached event's answer: the fault of a failed descriptor at or before it, if any.
    fn reached_cleanly(&self, e: &Engine, event: &FwEvent, op: ShimOp) -> Result<(), DriverError> {
        if e.faulted_through(event.slot, event.generation, event.seq) {
            Err(self.classify(op, status::DMA_FAULT))
        } else {
            Ok(())
        }
    }

    fn check_stream(&self, e: &Engine, s: &FwStream, op: ShimOp) -> Result<(), DriverError> {
        self.enter(e, op)?;
        let lane = &e.lanes[s.slot];
        if lane.live && lane.generation == s.generation {
            Ok(())
        } else {
            Err(self.classify(op, status::NO_STREAM_SLOT))
        }
    }
}

impl Shim for FwShim {
    // No virtual memory: the core's granule pools compile out of the image.
    const VIRTUAL_MEMORY: bool = false;

    type Stream = FwStream;
    type Event = FwEvent;
    type DevicePage = FwPage;
    type HostPage = FwHostPage;
    type Kernel = FwKernel;
    type Registration = core::convert::Infallible;
    type Graph = FwGraph;
    type NativeStream = ();

    fn native_stream<'a>(&self, _stream: &'a Self::Stream) -> &'a () {
        &()
    }

    fn kernel_name(&self, kernel: &FwKernel) -> &'static str {
        kernel.name
    }

    fn facts(&self) -> DeviceFacts {
        DeviceFacts::new(DEVICE_BYTES as u64, GRANULE as u64)
    }

    fn classify(&self, op: ShimOp, status: i32) -> DriverError {
        let fault = match status {
            status::OUT_OF_MEMORY => Fault::OutOfMemory,
            status::TOO_BIG => Fault::TooBig,
            status::UNSUPPORTED => Fault::Unsupported,
            status::KERNEL_FAULT => Fault::DeviceLost,
            status::DMA_FAULT => Fault::WorkFailed,
            _ => Fault::Failed,
        };
        DriverError::new(op, status, fault)
    }

    fn create_stream(&self) -> Result<FwStream, DriverError> {
        let mut e = ENGINE.lock();
        self.enter(&e, ShimOp::StreamCreate)?;
        let Some(slot) = e.lanes.iter().position(|l| !l.live) else {
            error!(
                "engine: all {} stream slots are in use; raise shim::MAX_STREAMS (or use fewer streams: DeviceConfig::max_streams)",
                MAX_STREAMS
            );
            return Err(self.classify(ShimOp::StreamCreate, status::NO_STREAM_SLOT));
        };
        let lane = &mut e.lanes[slot];
        lane.live = true;
        lane.enqueued = 0;
        lane.completed = 0;
        lane.fault = None;
        Ok(FwStream {
            slot,
            generation: lane.generation,
        })
    }

    fn stream_wait_event(&self, stream: &FwStream, event: &FwEvent) -> Result<(), DriverError> {
        let mut e = ENGINE.lock();
        self.check_stream(&e, stream, ShimOp::StreamWaitEvent)?;
        // A wait on failed work is queued even when it is reached: it carries the failure.
        if !e.reached(event.slot, event.generation, event.seq)
            || e.faulted_through(event.slot, event.generation, event.seq)
        {
            let wait = Desc::Wait {
                slot: event.slot,
                generation: event.generation,
                seq: event.seq,
            };
            e.enqueue(stream.slot, wait);
        }
        Ok(())
    }

    fn record_event(&self, stream: &FwStream) -> Result<FwEvent, DriverError> {
        let e = ENGINE.lock();
        self.check_stream(&e, stream, ShimOp::EventRecord)?;
        Ok(FwEvent {
            slot: stream.slot,
            generation: stream.generation,
            seq: e.lanes[stream.slot].enqueued,
        })
    }

    fn event_query(&self, event: &FwEvent) -> Result<bool, DriverError> {
        // A status-register read: pumps nothing.
        let e = ENGINE.lock();
        self.enter(&e, ShimOp::EventQuery)?;
        if !e.reached(event.slot, event.generation, event.seq) {
            return Ok(false);
        }
        self.reached_cleanly(&e, event, ShimOp::EventQuery)?;
        Ok(true)
    }

    fn event_wait(&self, event: &FwEvent) -> Result<(), DriverError> {
        // The host blocks: it drives the engine until the event is reached.
        let mut e = ENGINE.lock();
        loop {
            self.enter(&e, ShimOp::EventWait)?;
            if e.reached(event.slot, event.generation, event.seq) {
                return self.reached_cleanly(&e, event, ShimOp::EventWait);
            }
            if !e.pump_one() {
                self.enter(&e, ShimOp::EventWait)?;
                return Err(self.classify(ShimOp::EventWait, status::STALLED));
            }
        }
    }

    fn device_alloc(&self, size: u64) -> Result<FwPage, DriverError> {
        let mut e = ENGINE.lock();
        self.enter(&e, ShimOp::DeviceAlloc)?;
        if size > DEVICE_BYTES as u64 {
            return Err(self.classify(ShimOp::DeviceAlloc, status::TOO_BIG));
        }
        let granules = (size as usize).div_ceil(GRANULE);
        if granules == 0 {
            return Ok(FwPage {
                offset: 0,
                granules: 0,
            });
        }
        match e.device.alloc(granules) {
            Some(start) => {
                e.stats.pages_live += 1;
                e.stats.device_bytes_used += (granules * GRANULE) as u32;
                Ok(FwPage {
                    offset: start * GRANULE,
                    granules,
                })
            }
            None => {
                e.stats.pages_refused += 1;
                Err(self.classify(ShimOp::DeviceAlloc, status::OUT_OF_MEMORY))
            }
        }
    }

    fn device_page_addr(&self, page: &FwPage) -> DeviceAddr {
        DeviceAddr(DEVICE_BASE + page.offset as u64)
    }

    unsafe fn device_free(&self, page: FwPage) {
        if page.granules == 0 {
            return;
        }
        let mut e = ENGINE.lock();
        let bytes = page.granules * GRANULE;
        // SAFETY: the page lies in the region (the engine handed it out) and no queued work uses
        // it (the caller's promise); the lock is held.
        unsafe { core::ptr::write_bytes(DEVICE_MEM.base().add(page.offset), FREED_BYTE, bytes) };
        e.device.free(page.offset / GRANULE, page.granules);
        e.stats.pages_live -= 1;
        e.stats.pages_freed += 1;
        e.stats.device_bytes_used -= bytes as u32;
    }

    fn host_alloc_pinned(&self, size: usize) -> Result<FwHostPage, DriverError> {
        let mut e = ENGINE.lock();
        self.enter(&e, ShimOp::HostAlloc)?;
        if size > PINNED_BYTES {
            e.stats.pinned_refused += 1;
            return Err(self.classify(ShimOp::HostAlloc, status::TOO_BIG));
        }
        let granules = size.div_ceil(GRANULE).max(1);
        match e.pinned.alloc(granules) {
            Some(start) => {
                e.stats.pinned_live += 1;
                Ok(FwHostPage {
                    offset: start * GRANULE,
                    granules,
                })
            }
            None => {
                e.stats.pinned_refused += 1;
                Err(self.classify(ShimOp::HostAlloc, status::OUT_OF_MEMORY))
            }
        }
    }

    fn host_page_ptr(&self, page: &FwHostPage) -> NonNull<u8> {
        // SAFETY: the offset lies inside the static window, whose base is not null.
        unsafe { NonNull::new_unchecked(PINNED_MEM.base().add(page.offset)) }
    }

    fn host_page_device_addr(&self, _page: &FwHostPage) -> Option<DeviceAddr> {
        None
    }

    unsafe fn host_free_pinned(&self, page: FwHostPage) {
        let mut e = ENGINE.lock();
        e.pinned.free(page.offset / GRANULE, page.granules);
        e.stats.pinned_live -= 1;
    }

    unsafe fn copy_to_device(
        &self,
        stream: &FwStream,
        src: *const u8,
        _src_memory: HostMemory,
        dst: DeviceAddr,
        layout: CopyLayout,
    ) -> Result<(), DriverError> {
        let op = ShimOp::CopyHostToDevice;
        let mut e = ENGINE.lock();
        self.check_stream(&e, stream, op)?;
        let dst = e
            .device_offset(dst, layout.device_span())
            .ok_or(self.classify(op, status::BAD_ADDRESS))?;
        let fail = core::mem::take(&mut e.fail_next_upload);
        e.enqueue(
            stream.slot,
            Desc::ToDevice {
                src,
                dst,
                layout,
                fail,
            },
        );
        Ok(())
    }

    unsafe fn copy_to_host(
        &self,
        stream: &FwStream,
        src: DeviceAddr,
        dst: *mut u8,
        _dst_memory: HostMemory,
        layout: CopyLayout,
    ) -> Result<(), DriverError> {
        let op = ShimOp::CopyDeviceToHost;
        let mut e = ENGINE.lock();
        self.check_stream(&e, stream, op)?;
        let src = e
            .device_offset(src, layout.device_span())
            .ok_or(self.classify(op, status::BAD_ADDRESS))?;
        e.enqueue(stream.slot, Desc::ToHost { src, dst, layout });
        Ok(())
    }

    unsafe fn copy_on_device(
        &self,
        stream: &FwStream,
        src: DeviceAddr,
        dst: DeviceAddr,
        layout: CopyLayout,
    ) -> Result<(), DriverError> {
        let op = ShimOp::CopyDeviceToDevice;
        let mut e = ENGINE.lock();
        self.check_stream(&e, stream, op)?;
        let span = layout.device_span();
        let bad = self.classify(op, status::BAD_ADDRESS);
        let src = e.device_offset(src, span).ok_or(bad)?;
        let dst = e.device_offset(dst, span).ok_or(bad)?;
        e.enqueue(stream.slot, Desc::OnDevice { src, dst, layout });
        Ok(())
    }

    unsafe fn launch(
        &self,
        stream: &FwStream,
        kernel: &FwKernel,
        dims: LaunchDims,
        buffers: &[DeviceSpan],
        params: &[KernelParam<'_>],
    ) -> Result<(), DriverError> {
        let op = ShimOp::Launch;
        let mut e = ENGINE.lock();
        self.check_stream(&e, stream, op)?;
        if buffers.len() < kernel.outputs {
            return Err(self.classify(op, status::BAD_LAUNCH));
        }
        let mut args = e.spare.pop().unwrap_or_default();
        args.spans.clear();
        args.bytes.clear();
        for b in buffers {
            let Some(off) = e.device_offset(b.addr, b.len) else {
                e.recycle(Desc::Kernel {
                    kernel: *kernel,
                    grid: dims.grid,
                    args,
                });
                return Err(self.classify(op, status::BAD_ADDRESS));
            };
            args.spans.push((off, b.len as usize));
        }
        // No output overlaps another buffer: the core refuses such a launch before it reaches a
        // shim (the `launch` contract), so the kernel may get each output as `&mut [u8]`.
        for p in params {
            if let KernelParam::Scalar(bytes) = p {
                args.bytes.extend_from_slice(bytes);
            }
        }
        let desc = Desc::Kernel {
            kernel: *kernel,
            grid: dims.grid,
            args,
        };
        e.enqueue(stream.slot, desc);
        Ok(())
    }

    fn begin_capture(&self, _stream: &FwStream) -> Result<(), DriverError> {
        Err(self.classify(ShimOp::GraphBegin, status::UNSUPPORTED))
    }

    fn end_capture(&self, _stream: &FwStream, _doomed: bool) -> Result<FwGraph, DriverError> {
        Err(self.classify(ShimOp::GraphEnd, status::UNSUPPORTED))
    }

    fn graph_upload(&self, graph: &FwGraph, _stream: &FwStream) -> Result<(), DriverError> {
        match *graph {}
    }

    unsafe fn graph_launch(&self, graph: &FwGraph, _stream: &FwStream) -> Result<(), DriverError> {
        match *graph {}
    }
}
