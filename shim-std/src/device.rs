//! The device: its configuration, its shared state and the [`Shim`] implementation.

use crate::faults::{Effect, Injection, Stats, classify, status};
use crate::graph::StdGraph;
use crate::kernel::{KernelCtx, KernelFault, StdKernel};
use crate::memory::{Block, Quarantine, StdDevicePage, StdHostPage};
use crate::process::Process;
use crate::stream::{CopyOp, Op, StdEvent, StdStream};
use crate::vm::{self, Unmap, Vm};
use crate::{lock, wait};
use devcmd::workers::CopyWorkers;
use devcmd::{
    CopyLayout, DeviceAddr, DeviceFacts, DeviceSpan, DriverError, HostCopy, HostMemory,
    KernelParam, LaunchDims, Shim, ShimOp,
};
use std::alloc::Layout;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

/// Builds a [`StdShim`]. Every setting has a default; out-of-range values are normalised (see
/// each method) rather than refused.
#[derive(Debug, Clone)]
pub struct StdShimBuilder {
    total_memory: u64,
    memory_budget: Option<u64>,
    page_alignment: u64,
    max_page_size: Option<u64>,
    integrated: bool,
    lazy: bool,
    poison: bool,
    alloc_budget: Option<u64>,
    injections: Vec<Injection>,
    spare_launches: usize,
    vm_granule: u64,
    copy_threads: Option<usize>,
    process: Option<Process>,
}

impl Default for StdShimBuilder {
    fn default() -> Self {
        Self {
            total_memory: 1 << 30,
            memory_budget: None,
            page_alignment: 256,
            max_page_size: None,
            integrated: false,
            lazy: false,
            poison: false,
            alloc_budget: None,
            injections: Vec::new(),
            spare_launches: 8,
            vm_granule: vm::DEFAULT_VM_GRANULE,
            copy_threads: None,
            process: None,
        }
    }
}

impl StdShimBuilder {
    /// Makes the device one of `process`'s (default: a process of its own), so it follows
    /// CUDA's per-process rule for recordings with the other devices of that process (see
    /// [`Process`]).
    pub fn process(mut self, process: &Process) -> Self {
        self.process = Some(process.clone());
        self
    }

    /// Bytes of device memory in all (default 1 GiB): live device pages never exceed it.
    pub fn total_memory(mut self, bytes: u64) -> Self {
        self.total_memory = bytes;
        self
    }

    /// The budget reported in [`DeviceFacts::memory_budget`] for the core to keep (default none).
    /// The shim does not enforce it; see [`StdShimBuilder::alloc_budget`] for that.
    pub fn memory_budget(mut self, bytes: Option<u64>) -> Self {
        self.memory_budget = bytes;
        self
    }

    /// Page alignment (default 256). Rounded up to a power of two; 256 if that overflows.
    pub fn page_alignment(mut self, bytes: u64) -> Self {
        self.page_alignment = bytes;
        self
    }

    /// The largest page (default a quarter of the total memory); clamped to the total memory.
    pub fn max_page_size(mut self, bytes: u64) -> Self {
        self.max_page_size = Some(bytes);
        self
    }

    /// An integrated device (default false): pinned host pages are mapped, with their host
    /// address as device address, and usable by copies and kernels.
    pub fn integrated(mut self, yes: bool) -> Self {
        self.integrated = yes;
        self
    }

    /// Lazy mode (default false): a stream runs nothing until an event of it is queried or waited
    /// on, then runs up to that event (see the `stream` module documentation).
    pub fn lazy(mut self, yes: bool) -> Self {
        self.lazy = yes;
        self
    }

    /// Poison mode (default false): freed device and host pages are filled with
    /// [`POISON_BYTE`](crate::POISON_BYTE) and held in a bounded quarantine (the last 64 blocks,
    /// at most 64 MiB) before going back to the heap, so late reads see poison.
    pub fn poison(mut self, yes: bool) -> Self {
        self.poison = yes;
        self
    }

    /// Launch argument lists each stream keeps for reuse (default 8): launches allocate nothing
    /// while at most this many are queued on a stream at once; raise it to the most launches a
    /// host queues between two syncs.
    pub fn spare_launches(mut self, n: usize) -> Self {
        self.spare_launches = n;
        self
    }

    /// The granule of the device's virtual memory ([`DeviceFacts::vm_granule`]; default
    /// [`DEFAULT_VM_GRANULE`](crate::DEFAULT_VM_GRANULE): 2 MiB on Unix, so the core meets the
    /// std shim as it meets a CUDA GPU). 0 turns virtual memory off: the device then has only
    /// whole pages, as a GPU without virtual memory management. Rounded up to a power of two and
    /// to at least the system's page size; a value that overflows that rounding turns it off.
    /// Always 0 on targets other than Unix (no `mmap`).
    ///
    /// With a granule, [`Shim::vm_reserve`] reserves address space with `mmap` and
    /// [`Shim::vm_map`] backs it with memory counted like device pages (against the total
    /// memory and [`StdShimBuilder::alloc_budget`]); copies and kernels accept spans in mapped
    /// memory, across adjacent mappings of one reservation too.
    pub fn vm_granule(mut self, bytes: u64) -> Self {
        self.vm_granule = bytes;
        self
    }

    /// Host threads that help with staging copies ([`Shim::host_copy`], the staging copy of a
    /// pipelined upload or read): 0 copies on the caller's thread only. Default
    /// [`CopyWorkers::default_threads`](devcmd::workers::CopyWorkers::default_threads). The
    /// threads start with the first copy large enough to split.
    pub fn copy_threads(mut self, n: usize) -> Self {
        self.copy_threads = Some(n);
        self
    }

    /// Injected: fail `device_alloc` with [`status::BUDGET`] past `bytes` of live device pages.
    pub fn alloc_budget(mut self, bytes: Option<u64>) -> Self {
        self.alloc_budget = bytes;
        self
    }

    /// Installs a fault injection from the start.
    pub fn inject(mut self, injection: Injection) -> Self {
        self.injections.push(injection);
        self
    }

    /// The device.
    pub fn build(self) -> StdShim {
        let align = self
            .page_alignment
            .max(1)
            .checked_next_power_of_two()
            .filter(|a| usize::try_from(*a).is_ok_and(|a| Layout::from_size_align(1, a).is_ok()))
            .unwrap_or(256);
        let max_page = self
            .max_page_size
            .unwrap_or(self.total_memory / 4)
            .min(self.total_memory);
        let facts = DeviceFacts::new(self.total_memory, align)
            .with_memory_budget(self.memory_budget)
            .with_max_page_size(max_page)
            .with_integrated(self.integrated)
            .with_can_map_host(self.integrated)
            .with_vm_granule(vm::normalise_granule(self.vm_granule));
        let state = DeviceState {
            stats: Stats::default(),
            injections: self.injections,
            alloc_budget: self.alloc_budget,
            lost_cause: None,
            captures: HashMap::new(),
            ranges: BTreeMap::new(),
            quarantine: Quarantine::default(),
            graveyard: Vec::new(),
            vm: Vm::new(vm::normalise_granule(self.vm_granule)),
        };
        StdShim {
            inner: Arc::new(DeviceInner {
                facts,
                align: usize::try_from(align).unwrap_or(256),
                lazy: self.lazy,
                poison_freed: self.poison,
                spare_launches: self.spare_launches,
                lost: AtomicBool::new(false),
                state: Mutex::new(state),
                kernels: Mutex::new(HashMap::new()),
                next_stream: AtomicU64::new(0),
                busy: Mutex::new(0),
                idle: Condvar::new(),
                // Staging copies through the caches: this device's copies are the CPU's,
                // which reads what was just staged from there (streaming stores help a DMA
                // engine, not a memcpy on the stream's worker).
                copies: CopyWorkers::new(
                    self.copy_threads
                        .unwrap_or_else(CopyWorkers::default_threads),
                )
                .streaming(devcmd::workers::STREAM_FROM, 0),
                process: self.process.unwrap_or_default(),
            }),
        }
    }
}

struct DeviceState {
    stats: Stats,
    injections: Vec<Injection>,
    alloc_budget: Option<u64>,
    lost_cause: Option<DriverError>,
    /// Recording streams, by id: whether the recording was invalidated (by an allocation).
    captures: HashMap<u64, bool>,
    /// Device-visible memory: start address -> length (device pages; host pages if integrated).
    ranges: BTreeMap<usize, usize>,
    quarantine: Quarantine,
    /// Blocks freed after the device was lost: an operation a worker was already running
    /// may still touch them (the core frees everything at once on a lost device), so they go
    /// back to the heap only when the device state drops, after every worker has exited.
    graveyard: Vec<Block>,
    /// Reserved address ranges and the memory mapped in them; dropped (every reservation
    /// unmapped) with the state, after every worker has exited.
    vm: Vm,
}

impl Drop for DeviceState {
    fn drop(&mut self) {
        for block in self.graveyard.drain(..) {
            // SAFETY: the device state drops only once every stream worker (each holds the
            // device) has exited, so nothing can run that uses the block.
            unsafe { block.free() };
        }
    }
}

impl DeviceState {
    /// Whether `len` bytes at `addr` lie in one live device-visible range: a page, or mappings
    /// of one reservation that follow each other with no gap.
    fn holds(&self, addr: u64, len: u64) -> bool {
        if len == 0 {
            return true;
        }
        let (Ok(a), Ok(l)) = (usize::try_from(addr), usize::try_from(len)) else {
            return false;
        };
        let Some(end) = a.checked_add(l) else {
            return false;
        };
        self.ranges
            .range(..=a)
            .next_back()
            .is_some_and(|(&s, &n)| end <= s + n)
            || self.vm.holds(a, end)
    }

    /// Bytes held in both poison quarantines, for the stats.
    fn note_quarantine(&mut self) {
        self.stats.quarantined_bytes = (self.quarantine.bytes() + self.vm.quarantined()) as u64;
    }

    fn lost_error(&self, op: ShimOp) -> DriverError {
        classify(
            op,
            self.lost_cause.map_or(status::DEVICE_LOST, |c| c.status),
        )
    }
}

/// The device-wide state streams share with the shim.
pub(crate) struct DeviceInner {
    facts: DeviceFacts,
    align: usize,
    lazy: bool,
    poison_freed: bool,
    /// Launch argument lists a stream keeps (see [`StdShimBuilder::spare_launches`]).
    pub(crate) spare_launches: usize,
    lost: AtomicBool,
    state: Mutex<DeviceState>,
    kernels: Mutex<HashMap<String, StdKernel>>,
    next_stream: AtomicU64,
    /// Operations the stream workers are running now, on every stream.
    busy: Mutex<usize>,
    /// Signalled when `busy` drops to zero.
    idle: Condvar,
    /// Threads for staging copies ([`StdShimBuilder::copy_threads`]).
    copies: CopyWorkers,
    /// The process the device belongs to ([`StdShimBuilder::process`]).
    process: Process,
}

impl DeviceInner {
    pub(crate) fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    /// The error of a call of `op` on the lost device (with the status of the cause), once no
    /// worker runs an operation any more: the contract lets the core free everything when it
    /// hears that the device is lost, so nothing may still touch memory by then.
    pub(crate) fn lost_error(&self, op: ShimOp) -> DriverError {
        let mut busy = lock(&self.busy);
        while *busy > 0 {
            busy = wait(&self.idle, busy);
        }
        drop(busy);
        lock(&self.state).lost_error(op)
    }

    /// [`Self::lost_error`] if no worker runs an operation now, else `None` (without waiting:
    /// for the calls that must not block, `event_query`).
    pub(crate) fn lost_error_if_idle(&self, op: ShimOp) -> Option<DriverError> {
        if *lock(&self.busy) > 0 {
            return None;
        }
        Some(lock(&self.state).lost_error(op))
    }

    /// A worker starts an operation; returns whether to run it (not once the device is lost:
    /// it is then completed without running). Counted before the check, so a caller told the
    /// device is lost ([`Self::lost_error`]) waits for it or it sees the loss.
    pub(crate) fn begin_op(&self) -> bool {
        *lock(&self.busy) += 1;
        !self.is_lost()
    }

    /// A worker finished the operation [`Self::begin_op`] counted.
    pub(crate) fn end_op(&self) {
        let mut busy = lock(&self.busy);
        *busy -= 1;
        if *busy == 0 {
            self.idle.notify_all();
        }
    }

    fn lose_locked(&self, st: &mut DeviceState, cause: DriverError) {
        st.lost_cause.get_or_insert(cause);
        self.lost.store(true, Ordering::Release);
    }

    /// A fault raised by running work; loses the device if it is a fault that does.
    pub(crate) fn async_fault(&self, e: DriverError) {
        let mut st = lock(&self.state);
        st.stats.async_faults += 1;
        if e.loses_device() {
            self.lose_locked(&mut st, e);
        }
    }

    /// Counts one operation run by a worker.
    pub(crate) fn note_run(&self, kernel: bool) {
        let mut st = lock(&self.state);
        st.stats.ops_run += 1;
        st.stats.kernels_run += u64::from(kernel);
    }

    /// Stream `id` starts recording (counted in the process under the state's lock, so the
    /// process never counts fewer recordings than this device's state holds).
    pub(crate) fn open_capture(&self, id: u64) {
        let mut st = lock(&self.state);
        if st.captures.insert(id, false).is_none() {
            self.process.began();
        }
    }

    /// Stream `id` stops recording (its end, or its drop while it records): whether its recording
    /// was invalidated (`None` if it did not record).
    pub(crate) fn close_capture(&self, id: u64) -> Option<bool> {
        let mut st = lock(&self.state);
        let invalidated = st.captures.remove(&id);
        if invalidated.is_some() {
            self.process.ended();
        }
        invalidated
    }

    /// The process the device belongs to.
    pub(crate) fn process(&self) -> &Process {
        &self.process
    }

    /// Refuses `op` for now (`CAPTURE_ELSEWHERE`) while a stream of another device of the
    /// process records: what devcmd-cuda answers under CUDA's global capture mode, where such
    /// a call would spoil that recording. `st` is this device's state, locked.
    fn refuse_while_others_record(&self, st: &DeviceState, op: ShimOp) -> Result<(), DriverError> {
        if self.others_record(st) {
            return Err(classify(op, status::CAPTURE_ELSEWHERE));
        }
        Ok(())
    }

    /// Whether a stream of another device of the process records. `st` is this device's state,
    /// locked (its own recordings are counted in the process under that lock).
    fn others_record(&self, st: &DeviceState) -> bool {
        self.process.recordings() > st.captures.len()
    }

    /// Invalidates every recording in progress (a call CUDA forbids while any stream records was
    /// made); returns whether there was one.
    fn invalidate_captures(st: &mut DeviceState) -> bool {
        st.captures.values_mut().for_each(|v| *v = true);
        !st.captures.is_empty()
    }

    /// Whether a host wait must be refused: a stream records (CUDA's global capture mode refuses
    /// one on any stream, and the recording is lost); the recording is invalidated then.
    pub(crate) fn refuse_host_wait(&self) -> bool {
        Self::invalidate_captures(&mut lock(&self.state))
    }

    /// Invalidates the recording of stream `id`, if it records.
    pub(crate) fn invalidate_capture(&self, id: u64) {
        if let Some(v) = lock(&self.state).captures.get_mut(&id) {
            *v = true;
        }
    }
}

/// The CPU device. Cheap to clone (clones share the device); `Send + Sync`.
///
/// Every call counts itself in [`StdShim::stats`], then fails fast if the device is lost,
/// then fails if an [`Injection`] fires, then does its work.
#[derive(Clone)]
pub struct StdShim {
    pub(crate) inner: Arc<DeviceInner>,
}

impl Default for StdShim {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for StdShim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StdShim")
            .field("facts", &self.inner.facts)
            .field("lazy", &self.inner.lazy)
            .field("poison", &self.inner.poison_freed)
            .field("lost", &self.inner.is_lost())
            .finish_non_exhaustive()
    }
}

impl StdShim {
    /// A device with the default settings (see [`StdShimBuilder`]).
    pub fn new() -> Self {
        Self::builder().build()
    }

    /// A builder of a device.
    pub fn builder() -> StdShimBuilder {
        StdShimBuilder::default()
    }

    /// The process the device belongs to: give it to [`StdShimBuilder::process`] to make
    /// another device of the same process.
    pub fn process(&self) -> Process {
        self.inner.process().clone()
    }

    /// Registers (or replaces) the kernel `name` and returns it. The name is the kernel's in
    /// every failure report ([`Shim::kernel_name`]): a launch does not name it again.
    pub fn register_kernel(
        &self,
        name: &'static str,
        body: impl Fn(&mut KernelCtx<'_>) -> Result<(), KernelFault> + Send + Sync + 'static,
    ) -> StdKernel {
        let kernel = StdKernel::new(name, body);
        lock(&self.inner.kernels).insert(name.to_owned(), kernel.clone());
        kernel
    }

    /// The kernel registered as `name`.
    pub fn kernel(&self, name: &str) -> Option<StdKernel> {
        lock(&self.inner.kernels).get(name).cloned()
    }

    /// Installs a fault injection.
    pub fn inject(&self, injection: Injection) {
        lock(&self.inner.state).injections.push(injection);
    }

    /// Removes every fault injection (not the allocation budget).
    pub fn clear_injections(&self) {
        lock(&self.inner.state).injections.clear();
    }

    /// Fails `device_alloc` with [`status::BUDGET`] (out of memory) past `bytes` of live device
    /// pages; `None` lifts the budget.
    pub fn set_alloc_budget(&self, bytes: Option<u64>) {
        lock(&self.inner.state).alloc_budget = bytes;
    }

    /// Loses the device now: every later call fails with [`status::DEVICE_LOST`] and
    /// queued work is skipped.
    pub fn lose_device(&self) {
        let mut st = lock(&self.inner.state);
        self.inner
            .lose_locked(&mut st, classify(ShimOp::Launch, status::DEVICE_LOST));
    }

    /// Whether the device is lost.
    pub fn is_lost(&self) -> bool {
        self.inner.is_lost()
    }

    /// Whether the device runs in lazy mode.
    pub fn is_lazy(&self) -> bool {
        self.inner.lazy
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> Stats {
        lock(&self.inner.state).stats.clone()
    }

    /// Counts a call of `op` with `size` bytes; fails if the device is lost or an injection
    /// fires. `Ok(Some(fault))`: an [`Injection::while_running`] fired, so the call goes ahead and
    /// its work must fail with `fault` once it ran ([`then_fail`]).
    pub(crate) fn enter(&self, op: ShimOp, size: u64) -> Result<Option<DriverError>, DriverError> {
        self.enter_or(op, size, || self.inner.lost_error(op))
    }

    /// [`Self::enter`] for `event_query`, which never blocks: on a lost device whose workers
    /// still run an operation it answers `Err(None)` (not done yet) instead of waiting for them.
    fn enter_query(&self) -> Result<Option<DriverError>, Option<DriverError>> {
        const OP: ShimOp = ShimOp::EventQuery;
        self.enter_or(OP, 0, || self.inner.lost_error_if_idle(OP))
    }

    /// [`Self::enter`], with `lost` answering a call on a lost device.
    fn enter_or<E: From<DriverError>>(
        &self,
        op: ShimOp,
        size: u64,
        lost: impl FnOnce() -> E,
    ) -> Result<Option<DriverError>, E> {
        let mut st = lock(&self.inner.state);
        let count = st.stats.count(op);
        if self.inner.is_lost() {
            drop(st);
            return Err(lost());
        }
        let fired = st.injections.iter().find(|i| i.fires(op, count, size));
        match fired.map(Injection::effect) {
            None => Ok(None),
            Some(Effect::FailWhileRunning) => Ok(Some(classify(op, status::injected_at_run(op)))),
            Some(Effect::Refuse) => Err(E::from(classify(op, status::injected(op, false)))),
            Some(Effect::LoseDevice) => {
                let e = classify(op, status::injected(op, true));
                self.inner.lose_locked(&mut st, e);
                drop(st);
                // Told only once no worker runs an operation (the contract), like any later call.
                Err(lost())
            }
        }
    }

    /// Validates and enqueues a copy; each side is `(address, is device memory)`.
    /// Counts an enqueued copy by the kind of its host side.
    fn count_host_memory(&self, memory: HostMemory) {
        let i = match memory {
            HostMemory::Pageable => 0,
            HostMemory::Pinned => 1,
            HostMemory::Registered => 2,
        };
        lock(&self.inner.state).stats.copies_by_host_memory[i] += 1;
    }

    fn copy(
        &self,
        op: ShimOp,
        stream: &StdStream,
        src: (u64, bool),
        dst: (u64, bool),
        layout: CopyLayout,
    ) -> Result<(), DriverError> {
        let fail = self.enter(op, layout.packed_bytes())?;
        if layout.packed_bytes() == 0 {
            then_fail(stream, fail);
            return Ok(());
        }
        let size = |v: u64| usize::try_from(v).map_err(|_| classify(op, status::BAD_ARGUMENT));
        size(layout.device_span())?;
        {
            let st = lock(&self.inner.state);
            for (addr, device) in [src, dst] {
                if device && !st.holds(addr, layout.device_span()) {
                    return Err(classify(op, status::BAD_ADDRESS));
                }
                if !device && addr == 0 {
                    return Err(classify(op, status::BAD_ARGUMENT));
                }
            }
        }
        stream.shared.enqueue(Op::Copy(CopyOp {
            src: size(src.0)?,
            dst: size(dst.0)?,
            layout,
            src_device: src.1,
            dst_device: dst.1,
        }));
        then_fail(stream, fail);
        Ok(())
    }

    /// Frees a block into the quarantine (poison mode) or the heap.
    ///
    /// # Safety
    ///
    /// Nothing uses the block any more (or only buggy late work the quarantine is meant to catch).
    unsafe fn release(&self, st: &mut DeviceState, block: Block) {
        st.ranges.remove(&block.addr());
        if self.inner.is_lost() {
            st.graveyard.push(block);
        } else if self.inner.poison_freed {
            // SAFETY: the caller promises nothing uses the block.
            unsafe { st.quarantine.push(block) };
            st.note_quarantine();
        } else {
            // SAFETY: the caller promises nothing uses the block.
            unsafe { block.free() };
        }
    }
}

/// Enqueues, after the work of an accepted call, the failure an [`Injection::while_running`]
/// asked for (`None`: nothing to do).
pub(crate) fn then_fail(stream: &StdStream, fault: Option<DriverError>) {
    if let Some(e) = fault {
        stream.shared.enqueue(Op::Fail(e));
    }
}

/// The launch geometry CUDA accepts on every current GPU, which the std shim enforces too.
#[derive(Debug, Clone, Copy)]
pub struct LaunchLimits {
    /// Largest grid, per axis.
    pub grid: [u32; 3],
    /// Largest block, per axis.
    pub block: [u32; 3],
    /// Most threads in a block.
    pub threads_per_block: u32,
    /// Most dynamic shared memory per block without an opt-in (48 KiB).
    pub shared_bytes: u32,
}

/// CUDA's limits: grid 2³¹−1 × 65535 × 65535, block 1024 × 1024 × 64 and 1024 threads, 48 KiB of
/// dynamic shared memory.
pub const CUDA_LIMITS: LaunchLimits = LaunchLimits {
    grid: [i32::MAX as u32, 65_535, 65_535],
    block: [1024, 1024, 64],
    threads_per_block: 1024,
    shared_bytes: 48 << 10,
};

impl LaunchLimits {
    /// Whether `dims` stays within the limits.
    pub fn admit(&self, dims: LaunchDims) -> bool {
        let axes = |d: devcmd::Dim3| [d.x, d.y, d.z];
        axes(dims.grid)
            .iter()
            .zip(self.grid)
            .all(|(&v, max)| v <= max)
            && axes(dims.block)
                .iter()
                .zip(self.block)
                .all(|(&v, max)| v <= max)
            && dims.block.count() <= u64::from(self.threads_per_block)
            && dims.shared_bytes <= self.shared_bytes
    }
}

/// A registration of the caller's host memory: where and how long (nothing is locked on a CPU).
#[derive(Debug)]
pub struct StdRegistration {
    #[allow(dead_code)]
    addr: usize,
    #[allow(dead_code)]
    len: usize,
}

impl Shim for StdShim {
    type Stream = StdStream;
    type Event = StdEvent;
    type DevicePage = StdDevicePage;
    type HostPage = StdHostPage;
    type Kernel = StdKernel;
    type Registration = StdRegistration;
    type Graph = StdGraph;
    /// A stream is its own native handle: library work enqueues host functions on its worker
    /// ([`StdStream::enqueue_host`]).
    type NativeStream = StdStream;

    fn kernel_name(&self, kernel: &StdKernel) -> &'static str {
        kernel.name()
    }

    fn native_stream<'a>(&self, stream: &'a StdStream) -> &'a StdStream {
        stream
    }

    unsafe fn borrow_stream(&self, native: &StdStream) -> Result<StdStream, DriverError> {
        self.enter(ShimOp::StreamCreate, 0)?;
        // One its owner records is refused, as the CUDA shim refuses a captured stream.
        if native.shared.tail().1 {
            return Err(classify(ShimOp::StreamCreate, status::CAPTURE_STATE));
        }
        Ok(native.borrowed())
    }

    fn facts(&self) -> DeviceFacts {
        self.inner.facts
    }

    fn classify(&self, op: ShimOp, status: i32) -> DriverError {
        classify(op, status)
    }

    fn create_stream(&self) -> Result<StdStream, DriverError> {
        self.enter(ShimOp::StreamCreate, 0)?;
        let id = self.inner.next_stream.fetch_add(1, Ordering::Relaxed);
        StdStream::spawn(Arc::clone(&self.inner), id, self.inner.lazy)
            .ok_or(classify(ShimOp::StreamCreate, status::THREAD_SPAWN))
    }

    fn stream_wait_event(&self, stream: &StdStream, event: &StdEvent) -> Result<(), DriverError> {
        let fail = self.enter(ShimOp::StreamWaitEvent, 0)?;
        if Arc::ptr_eq(&event.stream, &stream.shared) {
            then_fail(stream, fail);
            return Ok(()); // A stream is in order with itself.
        }
        if event.captured {
            return Err(classify(ShimOp::StreamWaitEvent, status::UNSUPPORTED));
        }
        if stream.shared.tail().1 {
            // A recording may not depend on work outside it (CUDA's capture isolation): the
            // recording is invalidated and the wait refused.
            self.inner.invalidate_capture(stream.shared.id);
            return Err(classify(
                ShimOp::StreamWaitEvent,
                status::ILLEGAL_IN_CAPTURE,
            ));
        }
        stream.shared.enqueue(Op::Wait {
            stream: Arc::clone(&event.stream),
            seq: event.seq,
        });
        then_fail(stream, fail);
        Ok(())
    }

    fn record_event(&self, stream: &StdStream) -> Result<StdEvent, DriverError> {
        self.enter(ShimOp::EventRecord, 0)?;
        let (seq, captured) = stream.shared.tail();
        Ok(StdEvent::new(Arc::clone(&stream.shared), seq, captured))
    }

    fn event_query(&self, event: &StdEvent) -> Result<bool, DriverError> {
        // Never blocks: on a lost device whose workers still run an operation (lost before or
        // by this very call), the event is not done yet; `enter` would wait for the workers.
        match self.enter_query() {
            Ok(_) => {}
            Err(Some(e)) => return Err(e),
            Err(None) => return Ok(false),
        }
        if event.captured || self.inner.refuse_host_wait() {
            return Err(classify(ShimOp::EventQuery, status::ILLEGAL_IN_CAPTURE));
        }
        if self.inner.others_record(&lock(&self.inner.state)) {
            // As devcmd-cuda: "not yet" while another device of the process records.
            return Ok(false);
        }
        event.stream.query(event.seq, ShimOp::EventQuery)
    }

    /// The stream's worker wakes the task when it completes the event's point.
    fn event_notify(&self, event: &StdEvent, waker: &std::task::Waker) -> bool {
        if event.captured {
            return false; // stands for nothing that runs: the future answers at its next poll
        }
        event.stream.notify(event.seq, event.waiter, waker);
        true
    }

    fn event_wait(&self, event: &StdEvent) -> Result<(), DriverError> {
        self.enter(ShimOp::EventWait, 0)?;
        if event.captured || self.inner.refuse_host_wait() {
            return Err(classify(ShimOp::EventWait, status::ILLEGAL_IN_CAPTURE));
        }
        self.inner
            .refuse_while_others_record(&lock(&self.inner.state), ShimOp::EventWait)?;
        event.stream.wait(event.seq, ShimOp::EventWait)
    }

    fn device_alloc(&self, size: u64) -> Result<StdDevicePage, DriverError> {
        const OP: ShimOp = ShimOp::DeviceAlloc;
        self.enter(OP, size)?;
        let facts = &self.inner.facts;
        let mut st = lock(&self.inner.state);
        if DeviceInner::invalidate_captures(&mut st) {
            // CUDA would invalidate the recording: refuse, and make `end_capture` refuse too.
            return Err(classify(OP, status::CAPTURE_INVALIDATED));
        }
        self.inner.refuse_while_others_record(&st, OP)?;
        if size > facts.max_page_size || size > facts.total_memory {
            return Err(classify(OP, status::TOO_BIG));
        }
        let after = st.stats.device_bytes_live.saturating_add(size);
        if st.alloc_budget.is_some_and(|b| after > b) {
            return Err(classify(OP, status::BUDGET));
        }
        if after > facts.total_memory {
            return Err(classify(OP, status::OUT_OF_MEMORY));
        }
        let block = usize::try_from(size)
            .ok()
            .and_then(|s| Block::alloc(s, self.inner.align))
            .ok_or(classify(OP, status::OUT_OF_MEMORY))?;
        st.ranges.insert(block.addr(), size as usize);
        st.stats.device_bytes_live = after;
        st.stats.device_pages_live += 1;
        Ok(StdDevicePage { block, size })
    }

    fn device_page_addr(&self, page: &StdDevicePage) -> DeviceAddr {
        DeviceAddr(page.block.addr() as u64)
    }

    unsafe fn device_free(&self, page: StdDevicePage) {
        let mut st = lock(&self.inner.state);
        st.stats.device_frees += 1;
        // Freeing device memory while recording is illegal on CUDA: it invalidates the recording.
        DeviceInner::invalidate_captures(&mut st);
        st.stats.device_pages_live = st.stats.device_pages_live.saturating_sub(1);
        st.stats.device_bytes_live = st.stats.device_bytes_live.saturating_sub(page.size);
        // SAFETY: `device_free`'s contract: no pending work uses the page.
        unsafe { self.release(&mut st, page.block) };
    }

    /// `mmap` of `PROT_NONE`, `MAP_NORESERVE` address space (see the `vm` module), aligned to
    /// the granule. Refused while a stream records (the recording is invalidated), as
    /// `device_alloc` is; [`status::UNSUPPORTED`] on a device built without a granule.
    fn vm_reserve(&self, size: u64) -> Result<DeviceAddr, DriverError> {
        const OP: ShimOp = ShimOp::VmReserve;
        self.enter(OP, size)?;
        let mut st = lock(&self.inner.state);
        if st.vm.granule() == 0 {
            return Err(classify(OP, status::UNSUPPORTED));
        }
        if DeviceInner::invalidate_captures(&mut st) {
            return Err(classify(OP, status::CAPTURE_INVALIDATED));
        }
        let addr = st.vm.reserve(size).map_err(|code| classify(OP, code))?;
        st.stats.vm_reserved_live += size;
        Ok(DeviceAddr(addr as u64))
    }

    /// `munmap` of the reservation. A range that is not exactly one reservation is ignored, and
    /// memory still mapped in it goes with it; both count in [`Stats::vm_misuse`]. After the
    /// device was lost the range stays until the device drops (work a worker was running may
    /// still touch it).
    unsafe fn vm_release(&self, addr: DeviceAddr, size: u64) {
        let mut st = lock(&self.inner.state);
        // As `device_free`: giving memory back while a stream records invalidates the recording.
        DeviceInner::invalidate_captures(&mut st);
        let keep = self.inner.is_lost();
        // SAFETY: `vm_release`'s contract: nothing is mapped in the range, so no work uses it.
        match unsafe { st.vm.release(addr.0, size, keep) } {
            Some(still_mapped) => {
                st.stats.vm_reserved_live = st.stats.vm_reserved_live.saturating_sub(size);
                if still_mapped > 0 {
                    let bytes = still_mapped as u64;
                    st.stats.vm_misuse += 1;
                    st.stats.vm_mapped_live = st.stats.vm_mapped_live.saturating_sub(bytes);
                    st.stats.device_bytes_live = st.stats.device_bytes_live.saturating_sub(bytes);
                }
                st.note_quarantine();
            }
            None => st.stats.vm_misuse += 1,
        }
    }

    /// `mmap` of new read-write memory (zeroed) over the range, with `MAP_FIXED`. Checked first:
    /// multiples of the granule ([`status::BAD_ARGUMENT`]), inside one reservation
    /// ([`status::BAD_ADDRESS`]), nothing mapped there ([`status::ALREADY_MAPPED`]), and counted
    /// like a device page against the total memory ([`status::TOO_BIG`],
    /// [`status::OUT_OF_MEMORY`]) and the allocation budget ([`status::BUDGET`]). Refused while
    /// a stream records, as `device_alloc` is. The handle is a serial number of the mapping.
    fn vm_map(&self, addr: DeviceAddr, size: u64) -> Result<u64, DriverError> {
        const OP: ShimOp = ShimOp::VmMap;
        self.enter(OP, size)?;
        let facts = &self.inner.facts;
        let mut st = lock(&self.inner.state);
        if st.vm.granule() == 0 {
            return Err(classify(OP, status::UNSUPPORTED));
        }
        if DeviceInner::invalidate_captures(&mut st) {
            return Err(classify(OP, status::CAPTURE_INVALIDATED));
        }
        let (a, len) = st
            .vm
            .check_map(addr.0, size)
            .map_err(|code| classify(OP, code))?;
        if size > facts.total_memory {
            return Err(classify(OP, status::TOO_BIG));
        }
        let after = st.stats.device_bytes_live.saturating_add(size);
        if st.alloc_budget.is_some_and(|b| after > b) {
            return Err(classify(OP, status::BUDGET));
        }
        if after > facts.total_memory {
            return Err(classify(OP, status::OUT_OF_MEMORY));
        }
        let handle = st.vm.map(a, len).map_err(|code| classify(OP, code))?;
        st.stats.device_bytes_live = after;
        st.stats.vm_mapped_live += size;
        st.stats.vm_maps += 1;
        st.note_quarantine();
        Ok(handle)
    }

    /// `mmap` of `PROT_NONE`, `MAP_NORESERVE` over the range again: the memory goes back, the
    /// range stays reserved. In poison mode the range is filled with
    /// [`POISON_BYTE`](crate::POISON_BYTE) and kept readable in a bounded quarantine first (as
    /// freed pages are). A range that is not exactly one mapping (address, size and handle) is
    /// ignored and counted in [`Stats::vm_misuse`].
    unsafe fn vm_unmap(&self, addr: DeviceAddr, size: u64, memory: u64) {
        let mut st = lock(&self.inner.state);
        // As `device_free`: giving memory back while a stream records invalidates the recording.
        DeviceInner::invalidate_captures(&mut st);
        let how = if self.inner.is_lost() {
            Unmap::Keep
        } else if self.inner.poison_freed {
            Unmap::Poison
        } else {
            Unmap::GiveBack
        };
        // SAFETY: `vm_unmap`'s contract: no pending work uses the range.
        match unsafe { st.vm.unmap(addr.0, size, memory, how) } {
            Some(len) => {
                let bytes = len as u64;
                st.stats.vm_unmaps += 1;
                st.stats.vm_mapped_live = st.stats.vm_mapped_live.saturating_sub(bytes);
                st.stats.device_bytes_live = st.stats.device_bytes_live.saturating_sub(bytes);
                st.note_quarantine();
            }
            None => st.stats.vm_misuse += 1,
        }
    }

    fn host_alloc_pinned(&self, size: usize) -> Result<StdHostPage, DriverError> {
        const OP: ShimOp = ShimOp::HostAlloc;
        self.enter(OP, size as u64)?;
        if Layout::from_size_align(size.max(1), self.inner.align).is_err() {
            return Err(classify(OP, status::TOO_BIG));
        }
        let mut st = lock(&self.inner.state);
        if DeviceInner::invalidate_captures(&mut st) {
            // Page-locking memory while a stream records is a call the core must not make.
            return Err(classify(OP, status::CAPTURE_INVALIDATED));
        }
        self.inner.refuse_while_others_record(&st, OP)?;
        let block =
            Block::alloc(size, self.inner.align).ok_or(classify(OP, status::OUT_OF_MEMORY))?;
        // SAFETY: the block was just allocated and is not shared yet.
        unsafe { block.fill(crate::memory::FRESH_HOST_BYTE) };
        if self.inner.facts.integrated {
            st.ranges.insert(block.addr(), size);
        }
        st.stats.host_bytes_live += size as u64;
        st.stats.host_pages_live += 1;
        Ok(StdHostPage { block, size })
    }

    fn host_page_ptr(&self, page: &StdHostPage) -> NonNull<u8> {
        page.ptr()
    }

    fn host_page_device_addr(&self, page: &StdHostPage) -> Option<DeviceAddr> {
        self.inner
            .facts
            .integrated
            .then(|| DeviceAddr(page.block.addr() as u64))
    }

    unsafe fn host_free_pinned(&self, page: StdHostPage) {
        let mut st = lock(&self.inner.state);
        DeviceInner::invalidate_captures(&mut st);
        st.stats.host_frees += 1;
        st.stats.host_pages_live = st.stats.host_pages_live.saturating_sub(1);
        st.stats.host_bytes_live = st.stats.host_bytes_live.saturating_sub(page.size as u64);
        // SAFETY: `host_free_pinned`'s contract: no pending copy uses the page.
        unsafe { self.release(&mut st, page.block) };
    }

    /// Registers nothing with any hardware (every host byte is device-reachable here), but
    /// keeps CUDA's rules: a null or empty range is refused, and the registration is counted
    /// until [`Shim::host_unregister`] ([`Stats::registrations_live`](crate::Stats)).
    fn host_register(&self, ptr: NonNull<u8>, len: usize) -> Result<StdRegistration, DriverError> {
        const OP: ShimOp = ShimOp::HostRegister;
        self.enter(OP, len as u64)?;
        if len == 0 {
            return Err(classify(OP, status::BAD_ARGUMENT));
        }
        let mut st = lock(&self.inner.state);
        if DeviceInner::invalidate_captures(&mut st) {
            // As on CUDA: page-locking memory while a stream records spoils the recording.
            return Err(classify(OP, status::CAPTURE_INVALIDATED));
        }
        self.inner.refuse_while_others_record(&st, OP)?;
        st.stats.registrations_live += 1;
        Ok(StdRegistration {
            addr: ptr.as_ptr().expose_provenance(),
            len,
        })
    }

    unsafe fn host_unregister(&self, registration: StdRegistration) {
        let _ = registration;
        let mut st = lock(&self.inner.state);
        // As on CUDA, undoing a registration inside a recording spoils it.
        DeviceInner::invalidate_captures(&mut st);
        st.stats.registrations_live = st.stats.registrations_live.saturating_sub(1);
    }

    unsafe fn host_copy(&self, dst: *mut u8, src: *const u8, len: usize, kind: HostCopy) {
        // SAFETY: `host_copy`'s contract is `CopyWorkers::copy`'s.
        unsafe { self.inner.copies.copy(dst, src, len, kind) }
    }

    unsafe fn copy_to_device(
        &self,
        stream: &StdStream,
        src: *const u8,
        src_memory: HostMemory,
        dst: DeviceAddr,
        layout: CopyLayout,
    ) -> Result<(), DriverError> {
        let src = (src.expose_provenance() as u64, false);
        self.copy(ShimOp::CopyHostToDevice, stream, src, (dst.0, true), layout)?;
        self.count_host_memory(src_memory);
        Ok(())
    }

    unsafe fn copy_to_host(
        &self,
        stream: &StdStream,
        src: DeviceAddr,
        dst: *mut u8,
        dst_memory: HostMemory,
        layout: CopyLayout,
    ) -> Result<(), DriverError> {
        let dst = (dst.expose_provenance() as u64, false);
        self.copy(ShimOp::CopyDeviceToHost, stream, (src.0, true), dst, layout)?;
        self.count_host_memory(dst_memory);
        Ok(())
    }

    unsafe fn copy_on_device(
        &self,
        stream: &StdStream,
        src: DeviceAddr,
        dst: DeviceAddr,
        layout: CopyLayout,
    ) -> Result<(), DriverError> {
        self.copy(
            ShimOp::CopyDeviceToDevice,
            stream,
            (src.0, true),
            (dst.0, true),
            layout,
        )
    }

    /// Every other `StdShim` of the process: each is its own address space (its pages, its
    /// mappings), and its events are waited on like this shim's own.
    fn peer_access(&self, _src: &StdShim) -> bool {
        true
    }

    /// A copy between the two shims' address spaces, run on `stream`'s worker: the source must
    /// lie in one of `src_device`'s ranges and the destination in one of this shim's, else
    /// [`status::BAD_ADDRESS`]. Counted, refused and failed by injections as this shim's
    /// device-to-device copies.
    unsafe fn copy_peer(
        &self,
        stream: &StdStream,
        dst: DeviceAddr,
        src_device: &StdShim,
        src: DeviceAddr,
        len: u64,
    ) -> Result<(), DriverError> {
        const OP: ShimOp = ShimOp::CopyDeviceToDevice;
        let fail = self.enter(OP, len)?;
        if len == 0 {
            then_fail(stream, fail);
            return Ok(());
        }
        // One lock at a time: the two states are never held together (no order to get wrong).
        let theirs = lock(&src_device.inner.state).holds(src.0, len);
        let ours = lock(&self.inner.state).holds(dst.0, len);
        if !(theirs && ours) {
            return Err(classify(OP, status::BAD_ADDRESS));
        }
        let size = |v: u64| usize::try_from(v).map_err(|_| classify(OP, status::BAD_ARGUMENT));
        let copy = CopyOp {
            src: size(src.0)?,
            dst: size(dst.0)?,
            layout: CopyLayout::linear(len),
            src_device: true,
            dst_device: true,
        };
        stream
            .shared
            .enqueue(Op::Peer(copy, Arc::clone(&src_device.inner)));
        then_fail(stream, fail);
        Ok(())
    }

    /// Runs the kernel once, on the stream's worker, whatever the geometry; but refuses, as CUDA
    /// does, a geometry past CUDA's limits ([`CUDA_LIMITS`]), so code that runs here does not
    /// fail on a GPU for that reason.
    unsafe fn launch(
        &self,
        stream: &StdStream,
        kernel: &StdKernel,
        dims: LaunchDims,
        buffers: &[DeviceSpan],
        params: &[KernelParam<'_>],
    ) -> Result<(), DriverError> {
        let bytes = buffers.iter().fold(0u64, |a, s| a.saturating_add(s.len));
        let fail = self.enter(ShimOp::Launch, bytes)?;
        if !CUDA_LIMITS.admit(dims) {
            return Err(classify(ShimOp::Launch, status::BAD_LAUNCH));
        }
        let st = lock(&self.inner.state);
        if !buffers.iter().all(|s| st.holds(s.addr.0, s.len)) {
            return Err(classify(ShimOp::Launch, status::BAD_ADDRESS));
        }
        drop(st);
        let mut args = stream.shared.launch_args();
        args.fill(buffers, params);
        stream.shared.enqueue(Op::Launch {
            kernel: kernel.clone(),
            dims,
            args,
        });
        then_fail(stream, fail);
        Ok(())
    }

    fn begin_capture(&self, stream: &StdStream) -> Result<(), DriverError> {
        self.capture_begin(stream)
    }

    fn end_capture(&self, stream: &StdStream, doomed: bool) -> Result<StdGraph, DriverError> {
        self.capture_end(stream, doomed).map(StdGraph::new)
    }

    fn end_capture_update(
        &self,
        stream: &StdStream,
        doomed: bool,
        graph: &StdGraph,
    ) -> Result<Option<StdGraph>, DriverError> {
        let ops = self.capture_end(stream, doomed)?;
        Ok(graph.update(ops).err().map(StdGraph::new))
    }

    fn graph_upload(&self, _graph: &StdGraph, _stream: &StdStream) -> Result<(), DriverError> {
        self.enter(ShimOp::GraphUpload, 0).map(drop)
    }

    unsafe fn graph_launch(&self, graph: &StdGraph, stream: &StdStream) -> Result<(), DriverError> {
        let fail = self.enter(ShimOp::GraphLaunch, 0)?;
        stream.shared.enqueue(Op::Replay(graph.ops()));
        then_fail(stream, fail);
        Ok(())
    }
}
