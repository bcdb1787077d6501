//! A counting, fault-injecting wrapper around any shim, so a shim author gets a [`Probe`] without
//! writing one (nor copying the std shim's): [`Counted`] (the shim: a [`Forward`] with the
//! [`Counting`] hooks), [`CountedProbe`] (its probe) and [`CountedHarness`] (any harness, run
//! through them).
//!
//! Owns the counting of calls per [`ShimOp`], the live-page counts, and the injection of
//! [`FaultRule`]s at the shim boundary, classified as the harness contract asks (see
//! [`crate::harness`]). Does not own the shim's behaviour: every call the wrapper lets through
//! goes to the inner shim unchanged.
//!
//! ```ignore
//! // A harness without a probe of its own ...
//! struct MyHarness;
//! impl devcmd_tests::Harness for MyHarness { /* type S, shim, kernel */ }
//! // ... gets counters and fault injection from the wrapper:
//! devcmd_tests::conformance_tests!(devcmd_tests::CountedHarness(MyHarness));
//! ```

use crate::forward::{Forward, Hooks};
use crate::harness::{Counters, FaultRule, Harness, Mode, Probe, TestArgs, TestKernel};
use devcmd::{
    CopyLayout, DeviceAddr, DeviceSpan, DriverError, Fault, HostMemory, KernelParam, LaunchDims,
    Shim, ShimOp,
};
use std::collections::HashMap;
use std::fmt;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// The status of a call refused by an injected [`FaultRule::Once`] or [`FaultRule::Always`].
/// Negative, so it is never mistaken for a device's own code.
pub const INJECTED_STATUS: i32 = -100;
/// The status of a call that lost the device by an injected [`FaultRule::LoseDevice`], and of every
/// call after it.
pub const INJECTED_LOSS_STATUS: i32 = -200;

const OPS: usize = ShimOp::ALL.len();

fn op_index(op: ShimOp) -> usize {
    ShimOp::ALL
        .iter()
        .position(|o| *o == op)
        .expect("ShimOp::ALL lists every call")
}

/// Whether `op` enqueues work on a stream, so its work can fail while it runs.
fn enqueues_work(op: ShimOp) -> bool {
    matches!(
        op,
        ShimOp::StreamWaitEvent
            | ShimOp::CopyHostToDevice
            | ShimOp::CopyDeviceToHost
            | ShimOp::CopyDeviceToDevice
            | ShimOp::Launch
            | ShimOp::GraphLaunch
    )
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A rule with the count of its call when it was installed.
#[derive(Debug, Clone, Copy)]
struct Armed {
    rule: FaultRule,
    base: u64,
}

/// The call `rule` is about.
fn rule_op(rule: FaultRule) -> ShimOp {
    match rule {
        FaultRule::Once { op, .. }
        | FaultRule::Always { op }
        | FaultRule::LoseDevice { op }
        | FaultRule::WorkFails { op, .. } => op,
    }
}

impl Armed {
    /// Whether it fires on the `count`th call of `op` since the shim was made.
    fn fires(&self, op: ShimOp, count: u64) -> bool {
        if op != rule_op(self.rule) {
            return false;
        }
        match self.rule {
            FaultRule::Once { skip, .. } | FaultRule::WorkFails { skip, .. } => {
                count == self.base + skip + 1
            }
            FaultRule::Always { .. } => count > self.base,
            FaultRule::LoseDevice { .. } => count == self.base + 1,
        }
    }
}

/// What the wrapper and its probe share: counts, rules, the injected loss.
#[derive(Debug, Default)]
struct State {
    calls: [u64; OPS],
    device_pages_live: u64,
    device_bytes_live: u64,
    host_pages_live: u64,
    vm_reserved_live: u64,
    rules: Vec<Armed>,
    /// Injected rules that fired.
    fired: u64,
    /// The injected fault that lost the device.
    lost: Option<DriverError>,
    /// Whether the wrapper can make work fail while it runs (it holds a failing kernel).
    can_fail_work: bool,
}

/// What a call may do, once counted.
enum Verdict {
    /// Go ahead.
    Go,
    /// Go ahead; the work it enqueues then fails while it runs.
    GoThenFail,
}

/// Any shim, counted and open to injected faults: the shim `S` with [`Counting`] hooks
/// ([`Forward`]), so every call the hooks do not bend reaches `S` unchanged. Each call is
/// forwarded after:
///
/// - counting it (per [`ShimOp`], failed and refused calls included), the live pages, the bytes
///   mapped by [`Shim::vm_map`] (with the pages' bytes) and the address space reserved by
///   [`Shim::vm_reserve`];
/// - refusing it when an installed [`FaultRule`] fires: allocations (and [`Shim::vm_map`]) with
///   [`Fault::OutOfMemory`], other calls with [`Fault::Failed`], both with
///   [`INJECTED_STATUS`] and with no effect on the inner shim;
/// - after a [`FaultRule::LoseDevice`] fired, refusing every call with [`Fault::DeviceLost`] (the
///   inner streams' queued work is finished first, so nothing touches memory the core then frees
///   at once);
/// - for a [`FaultRule::WorkFails`], forwarding the call, then launching the harness's
///   [`TestKernel::WriteThenFail`] with no buffers right after it on the same stream, so the
///   inner shim reports a fault of work that ran at the later fences, by its own rules (needs
///   [`Counted::failing_with`]).
///
/// Streams and pages are the inner shim's. To finish the inner streams' queued work when it
/// loses the device, the wrapper records a fence of its own on the inner stream after each call
/// that enqueues work there (not while a stream records a graph) and keeps the latest per
/// stream; it remembers each page's size by its address. The device's facts are the inner
/// shim's, its virtual-memory granule included: the four virtual-memory calls are forwarded
/// (the unmap and release, which cannot fail, uncounted and never refused, as the frees).
pub type Counted<S> = Forward<S, Counting<S>>;

/// The hooks of a [`Counted`] shim: the counting, the rules and the loss (see [`Counted`]).
pub struct Counting<S: Shim> {
    state: Arc<Mutex<State>>,
    failing: Option<S::Kernel>,
    /// Whether `event_notify` is forwarded (off: the trait's default, a shim that cannot notify).
    notify: bool,
    /// Held while an injected loss finishes the inner streams' queued work: a caller told the
    /// device is lost waits for it, since the core then frees everything.
    quiesce: Mutex<()>,
    /// Per inner stream (by its address while the call runs): the wrapper's own fence after its
    /// latest work.
    fences: Mutex<HashMap<usize, S::Event>>,
    /// Recordings open now (begun and not ended): no fence of the wrapper's is recorded then,
    /// since a host wait on it, or the fence itself on the recording stream, is refused or
    /// captured while any stream records (CUDA's global capture mode).
    recordings: Mutex<usize>,
    /// The size of each live device page, by its address.
    page_sizes: Mutex<HashMap<u64, u64>>,
}

impl<S: Shim> fmt::Debug for Counting<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Counting")
            .field("state", &*lock(&self.state))
            .field("notify", &self.notify)
            .finish_non_exhaustive()
    }
}

/// The key of an inner stream in [`Counting::fences`].
fn stream_key<T>(stream: &T) -> usize {
    std::ptr::from_ref(stream) as usize
}

impl<S: Shim> Forward<S, Counting<S>> {
    /// `inner`, counted, with no rule installed.
    pub fn new(inner: S) -> Self {
        Forward {
            inner,
            hooks: Counting {
                state: Arc::default(),
                failing: None,
                notify: true,
                quiesce: Mutex::new(()),
                fences: Mutex::default(),
                recordings: Mutex::new(0),
                page_sizes: Mutex::default(),
            },
        }
    }

    /// Answers `event_notify` as a shim that cannot notify does (the trait's default): pending
    /// futures are then polled again at once instead of being woken.
    pub fn without_notify(mut self) -> Self {
        self.hooks.notify = false;
        self
    }

    /// Gives the wrapper the [`TestKernel::WriteThenFail`] kernel (loaded on the inner shim), so
    /// that it can inject [`FaultRule::WorkFails`].
    pub fn failing_with(mut self, kernel: S::Kernel) -> Self {
        self.hooks.failing = Some(kernel);
        lock(&self.hooks.state).can_fail_work = true;
        self
    }

    /// The inner shim.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// The probe of this shim: counters and fault injection, usable after the shim is dropped.
    pub fn probe(&self) -> CountedProbe {
        CountedProbe(Arc::clone(&self.hooks.state))
    }
}

impl<S: Shim> Counting<S> {
    /// Counts a call of `op` and decides what it may do.
    fn enter(&self, inner: &S, op: ShimOp) -> Result<Verdict, DriverError> {
        let mut st = lock(&self.state);
        let i = op_index(op);
        st.calls[i] += 1;
        let count = st.calls[i];
        if let Some(lost) = st.lost {
            drop(st);
            // Not before the queued work of the loss is finished (see `quiesce`).
            drop(lock(&self.quiesce));
            return Err(DriverError::new(op, lost.status, Fault::DeviceLost));
        }
        let Some(armed) = st.rules.iter().find(|a| a.fires(op, count)).copied() else {
            return Ok(Verdict::Go);
        };
        st.fired += 1;
        match armed.rule {
            FaultRule::WorkFails { .. } => Ok(Verdict::GoThenFail),
            FaultRule::LoseDevice { .. } => {
                let e = DriverError::new(op, INJECTED_LOSS_STATUS, Fault::DeviceLost);
                let quiesced = lock(&self.quiesce);
                st.lost = Some(e);
                drop(st);
                self.finish_queued_work(inner);
                drop(quiesced);
                Err(e)
            }
            FaultRule::Once { .. } | FaultRule::Always { .. } => {
                let fault = match op {
                    ShimOp::DeviceAlloc | ShimOp::HostAlloc | ShimOp::VmMap => Fault::OutOfMemory,
                    _ => Fault::Failed,
                };
                Err(DriverError::new(op, INJECTED_STATUS, fault))
            }
        }
    }

    /// Waits, on the inner shim, for the fence recorded after each stream's latest work: after
    /// an injected loss the core frees every page at once, and the inner device must not touch
    /// them then.
    fn finish_queued_work(&self, inner: &S) {
        let fences: Vec<S::Event> = lock(&self.fences).drain().map(|(_, f)| f).collect();
        for fence in fences {
            // Errors do not matter here: a fault of work that ran still completed the fence, and
            // an inner device that is really lost runs nothing more.
            let _ = inner.event_wait(&fence);
        }
    }

    /// After a call that enqueued work on `stream` was accepted: makes that work fail while it
    /// runs for a [`Verdict::GoThenFail`], then records the wrapper's fence after it (unless a
    /// stream records a graph).
    fn enqueued(&self, inner: &S, verdict: Verdict, stream: &S::Stream) {
        if let Verdict::GoThenFail = verdict {
            let kernel = self
                .failing
                .as_ref()
                .expect("checked by CountedProbe::inject: WorkFails needs Counted::failing_with");
            let args = TestArgs::new(TestKernel::WriteThenFail, 0, &[], &[]);
            // SAFETY: no buffers: the harness contract has WriteThenFail write only its outputs,
            // so it touches no memory at all.
            let launched =
                unsafe { inner.launch(stream, kernel, args.dims(), &[], &args.params()) };
            if let Err(e) = launched {
                panic!(
                    "Counted: the inner shim refused the WriteThenFail launch that injects a \
                     fault of work that ran ({e}); the harness's WriteThenFail kernel must \
                     launch with no buffers"
                );
            }
        }
        if *lock(&self.recordings) > 0 {
            return;
        }
        // A fence the wrapper fails to record leaves the previous one: the loss then waits for
        // less, as the inner shim could not say more.
        if let Ok(fence) = inner.record_event(stream) {
            lock(&self.fences).insert(stream_key(stream), fence);
        }
    }

    /// Notes a recording begun (`true`) or ended.
    fn recording(&self, begun: bool) {
        let mut open = lock(&self.recordings);
        *open = if begun {
            *open + 1
        } else {
            open.saturating_sub(1)
        };
    }
}

impl<S: Shim> Hooks<S> for Counting<S> {
    unsafe fn borrow_stream(
        &self,
        inner: &S,
        native: &S::NativeStream,
    ) -> Result<S::Stream, DriverError> {
        self.enter(inner, ShimOp::StreamCreate)?;
        // SAFETY: the caller's contract is the inner shim's.
        unsafe { inner.borrow_stream(native) }
    }

    fn create_stream(&self, inner: &S) -> Result<S::Stream, DriverError> {
        self.enter(inner, ShimOp::StreamCreate)?;
        inner.create_stream()
    }

    fn stream_wait_event(
        &self,
        inner: &S,
        stream: &S::Stream,
        event: &S::Event,
    ) -> Result<(), DriverError> {
        let verdict = self.enter(inner, ShimOp::StreamWaitEvent)?;
        inner.stream_wait_event(stream, event)?;
        self.enqueued(inner, verdict, stream);
        Ok(())
    }

    fn record_event(&self, inner: &S, stream: &S::Stream) -> Result<S::Event, DriverError> {
        self.enter(inner, ShimOp::EventRecord)?;
        inner.record_event(stream)
    }

    fn event_query(&self, inner: &S, event: &S::Event) -> Result<bool, DriverError> {
        self.enter(inner, ShimOp::EventQuery)?;
        inner.event_query(event)
    }

    fn event_notify(&self, inner: &S, event: &S::Event, waker: &core::task::Waker) -> bool {
        self.notify && inner.event_notify(event, waker)
    }

    fn event_wait(&self, inner: &S, event: &S::Event) -> Result<(), DriverError> {
        self.enter(inner, ShimOp::EventWait)?;
        inner.event_wait(event)
    }

    fn device_alloc(&self, inner: &S, size: u64) -> Result<S::DevicePage, DriverError> {
        self.enter(inner, ShimOp::DeviceAlloc)?;
        let page = inner.device_alloc(size)?;
        lock(&self.page_sizes).insert(inner.device_page_addr(&page).0, size);
        let mut st = lock(&self.state);
        st.device_pages_live += 1;
        st.device_bytes_live += size;
        Ok(page)
    }

    unsafe fn device_free(&self, inner: &S, page: S::DevicePage) {
        let size = lock(&self.page_sizes).remove(&inner.device_page_addr(&page).0);
        {
            let mut st = lock(&self.state);
            st.device_pages_live = st.device_pages_live.saturating_sub(1);
            st.device_bytes_live = st.device_bytes_live.saturating_sub(size.unwrap_or(0));
        }
        // SAFETY: the caller keeps `device_free`'s contract for the page; after an injected loss
        // the inner streams' queued work was finished when the loss fired, and no call reached
        // the inner shim since.
        unsafe { inner.device_free(page) }
    }

    fn vm_reserve(&self, inner: &S, size: u64) -> Result<DeviceAddr, DriverError> {
        self.enter(inner, ShimOp::VmReserve)?;
        let addr = inner.vm_reserve(size)?;
        lock(&self.state).vm_reserved_live += size;
        Ok(addr)
    }

    unsafe fn vm_release(&self, inner: &S, addr: DeviceAddr, size: u64) {
        {
            let mut st = lock(&self.state);
            st.vm_reserved_live = st.vm_reserved_live.saturating_sub(size);
        }
        // SAFETY: forwarded with the caller's contract unchanged (after an injected loss, as in
        // `device_free`: no inner work runs any more).
        unsafe { inner.vm_release(addr, size) }
    }

    fn vm_map(&self, inner: &S, addr: DeviceAddr, size: u64) -> Result<u64, DriverError> {
        self.enter(inner, ShimOp::VmMap)?;
        let memory = inner.vm_map(addr, size)?;
        lock(&self.state).device_bytes_live += size;
        Ok(memory)
    }

    unsafe fn vm_unmap(&self, inner: &S, addr: DeviceAddr, size: u64, memory: u64) {
        {
            let mut st = lock(&self.state);
            st.device_bytes_live = st.device_bytes_live.saturating_sub(size);
        }
        // SAFETY: forwarded with the caller's contract unchanged, as in `device_free`.
        unsafe { inner.vm_unmap(addr, size, memory) }
    }

    fn host_alloc_pinned(&self, inner: &S, size: usize) -> Result<S::HostPage, DriverError> {
        self.enter(inner, ShimOp::HostAlloc)?;
        let page = inner.host_alloc_pinned(size)?;
        lock(&self.state).host_pages_live += 1;
        Ok(page)
    }

    unsafe fn host_free_pinned(&self, inner: &S, page: S::HostPage) {
        {
            let mut st = lock(&self.state);
            st.host_pages_live = st.host_pages_live.saturating_sub(1);
        }
        // SAFETY: as in `device_free`: the caller's contract, and no inner work after a loss.
        unsafe { inner.host_free_pinned(page) }
    }

    fn host_register(
        &self,
        inner: &S,
        ptr: NonNull<u8>,
        len: usize,
    ) -> Result<S::Registration, DriverError> {
        self.enter(inner, ShimOp::HostRegister)?;
        inner.host_register(ptr, len)
    }

    unsafe fn copy_to_device(
        &self,
        inner: &S,
        stream: &S::Stream,
        src: *const u8,
        src_memory: HostMemory,
        dst: DeviceAddr,
        layout: CopyLayout,
    ) -> Result<(), DriverError> {
        let verdict = self.enter(inner, ShimOp::CopyHostToDevice)?;
        // SAFETY: forwarded with the caller's contract unchanged.
        unsafe { inner.copy_to_device(stream, src, src_memory, dst, layout) }?;
        self.enqueued(inner, verdict, stream);
        Ok(())
    }

    unsafe fn copy_to_host(
        &self,
        inner: &S,
        stream: &S::Stream,
        src: DeviceAddr,
        dst: *mut u8,
        dst_memory: HostMemory,
        layout: CopyLayout,
    ) -> Result<(), DriverError> {
        let verdict = self.enter(inner, ShimOp::CopyDeviceToHost)?;
        // SAFETY: forwarded with the caller's contract unchanged.
        unsafe { inner.copy_to_host(stream, src, dst, dst_memory, layout) }?;
        self.enqueued(inner, verdict, stream);
        Ok(())
    }

    unsafe fn copy_on_device(
        &self,
        inner: &S,
        stream: &S::Stream,
        src: DeviceAddr,
        dst: DeviceAddr,
        layout: CopyLayout,
    ) -> Result<(), DriverError> {
        let verdict = self.enter(inner, ShimOp::CopyDeviceToDevice)?;
        // SAFETY: forwarded with the caller's contract unchanged.
        unsafe { inner.copy_on_device(stream, src, dst, layout) }?;
        self.enqueued(inner, verdict, stream);
        Ok(())
    }

    unsafe fn copy_peer(
        &self,
        inner: &S,
        stream: &S::Stream,
        dst: DeviceAddr,
        src_device: &S,
        src: DeviceAddr,
        len: u64,
    ) -> Result<(), DriverError> {
        let verdict = self.enter(inner, ShimOp::CopyDeviceToDevice)?;
        // SAFETY: forwarded with the caller's contract unchanged.
        unsafe { inner.copy_peer(stream, dst, src_device, src, len) }?;
        self.enqueued(inner, verdict, stream);
        Ok(())
    }

    unsafe fn launch(
        &self,
        inner: &S,
        stream: &S::Stream,
        kernel: &S::Kernel,
        dims: LaunchDims,
        buffers: &[DeviceSpan],
        params: &[KernelParam<'_>],
    ) -> Result<(), DriverError> {
        let verdict = self.enter(inner, ShimOp::Launch)?;
        // SAFETY: forwarded with the caller's contract unchanged.
        unsafe { inner.launch(stream, kernel, dims, buffers, params) }?;
        self.enqueued(inner, verdict, stream);
        Ok(())
    }

    fn begin_capture(&self, inner: &S, stream: &S::Stream) -> Result<(), DriverError> {
        self.enter(inner, ShimOp::GraphBegin)?;
        inner.begin_capture(stream)?;
        self.recording(true);
        Ok(())
    }

    fn end_capture(
        &self,
        inner: &S,
        stream: &S::Stream,
        doomed: bool,
    ) -> Result<S::Graph, DriverError> {
        // An injected refusal still ends the recording, as every end must.
        let verdict = self.enter(inner, ShimOp::GraphEnd);
        let ended = inner.end_capture(stream, doomed || verdict.is_err());
        self.recording(false);
        verdict?;
        ended
    }

    fn end_capture_update(
        &self,
        inner: &S,
        stream: &S::Stream,
        doomed: bool,
        graph: &S::Graph,
    ) -> Result<Option<S::Graph>, DriverError> {
        let verdict = self.enter(inner, ShimOp::GraphEnd);
        let ended = inner.end_capture_update(stream, doomed || verdict.is_err(), graph);
        self.recording(false);
        verdict?;
        ended
    }

    fn graph_upload(
        &self,
        inner: &S,
        graph: &S::Graph,
        stream: &S::Stream,
    ) -> Result<(), DriverError> {
        self.enter(inner, ShimOp::GraphUpload)?;
        inner.graph_upload(graph, stream)
    }

    unsafe fn graph_launch(
        &self,
        inner: &S,
        graph: &S::Graph,
        stream: &S::Stream,
    ) -> Result<(), DriverError> {
        let verdict = self.enter(inner, ShimOp::GraphLaunch)?;
        // SAFETY: forwarded with the caller's contract unchanged.
        unsafe { inner.graph_launch(graph, stream) }?;
        self.enqueued(inner, verdict, stream);
        Ok(())
    }
}

/// The [`Probe`] of a [`Counted`] shim. Cheap to clone; outlives the shim.
#[derive(Debug, Clone)]
pub struct CountedProbe(Arc<Mutex<State>>);

impl CountedProbe {
    /// Calls of `op` so far, failed and refused ones included.
    pub fn calls(&self, op: ShimOp) -> u64 {
        lock(&self.0).calls[op_index(op)]
    }

    /// Injected rules that fired so far (a rule that fires on several calls counts each).
    pub fn fired(&self) -> u64 {
        lock(&self.0).fired
    }
}

impl Probe for CountedProbe {
    fn counters(&self) -> Counters {
        let st = lock(&self.0);
        let calls = |op| st.calls[op_index(op)];
        Counters {
            event_records: calls(ShimOp::EventRecord),
            event_waits: calls(ShimOp::EventWait),
            event_queries: calls(ShimOp::EventQuery),
            device_pages_live: st.device_pages_live,
            device_bytes_live: st.device_bytes_live,
            host_pages_live: st.host_pages_live,
            vm_reserved_live: st.vm_reserved_live,
        }
    }

    /// Installs `rule`.
    ///
    /// # Panics
    ///
    /// On a [`FaultRule::WorkFails`] for a call that enqueues no work, or on a shim made without
    /// [`Counted::failing_with`]: the suite asked for something the wrapper cannot do.
    fn inject(&self, rule: FaultRule) {
        let mut st = lock(&self.0);
        if let FaultRule::WorkFails { op, .. } = rule {
            assert!(
                enqueues_work(op),
                "Counted: FaultRule::WorkFails needs a call that enqueues work, not {op}"
            );
            assert!(
                st.can_fail_work,
                "Counted: FaultRule::WorkFails needs the failing kernel (Counted::failing_with)"
            );
        }
        let base = st.calls[op_index(rule_op(rule))];
        st.rules.push(Armed { rule, base });
    }

    fn clear(&self) {
        lock(&self.0).rules.clear();
    }
}

/// Any [`Harness`], run through [`Counted`]: the shim it makes is wrapped (with its
/// [`TestKernel::WriteThenFail`] kernel, so every [`FaultRule`] can be injected), and the probe is
/// the wrapper's. The inner harness's own probe, if any, is not used.
#[derive(Debug, Clone, Copy, Default)]
pub struct CountedHarness<H>(pub H);

impl<H: Harness> Harness for CountedHarness<H> {
    type S = Counted<H::S>;

    fn shim(&self, mode: Mode) -> Option<Self::S> {
        let inner = self.0.shim(mode)?;
        let kernel = self.0.kernel(&inner, TestKernel::WriteThenFail);
        Some(Counted::new(inner).failing_with(kernel))
    }

    fn beside(&self, first: &Self::S, mode: Mode) -> Option<Self::S> {
        let inner = self.0.beside(first.inner(), mode)?;
        let kernel = self.0.kernel(&inner, TestKernel::WriteThenFail);
        Some(Counted::new(inner).failing_with(kernel))
    }

    fn kernel(&self, shim: &Self::S, kernel: TestKernel) -> <H::S as Shim>::Kernel {
        self.0.kernel(shim.inner(), kernel)
    }

    fn probe(&self, shim: &Self::S) -> Option<Box<dyn Probe>> {
        Some(Box::new(shim.probe()))
    }

    unsafe fn library_copy(
        &self,
        native: &<H::S as Shim>::NativeStream,
        src: devcmd::DeviceSpan,
        dst: devcmd::DeviceSpan,
    ) -> Option<Result<(), devcmd::LibraryError>> {
        // SAFETY: the caller's contract is the inner harness's.
        unsafe { self.0.library_copy(native, src, dst) }
    }
}
