//! A counting, fault-injecting wrapper around any shim, so a shim author gets a [`Probe`] without
//! writing one (nor copying the std shim's): [`Counted`] (the shim), [`CountedProbe`] (its probe)
//! and [`CountedHarness`] (any harness, run through them).
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

use crate::harness::{Counters, FaultRule, Harness, Mode, Probe, TestArgs, TestKernel};
use devcmd::{
    CopyLayout, DeviceAddr, DeviceFacts, DeviceSpan, DriverError, Fault, HostMemory, KernelParam,
    LaunchDims, Shim, ShimOp,
};
use std::fmt;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

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

/// Any shim, counted and open to injected faults. Implements [`Shim`] by forwarding each call to
/// the inner shim, after:
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
/// Streams are wrapped ([`CountedStream`]) so the wrapper can reach them when it loses the device;
/// pages are wrapped ([`CountedPage`]) to remember their sizes. The device's facts are the inner
/// shim's, its virtual-memory granule included: the four virtual-memory calls are forwarded
/// (the unmap and release, which cannot fail, uncounted and never refused, as the frees).
pub struct Counted<S: Shim> {
    inner: S,
    state: Arc<Mutex<State>>,
    streams: Mutex<Vec<Weak<S::Stream>>>,
    failing: Option<S::Kernel>,
    /// Whether `event_notify` is forwarded (off: the trait's default, a shim that cannot notify).
    notify: bool,
    /// Held while an injected loss finishes the inner streams' queued work: a caller told the
    /// device is lost waits for it, since the core then frees everything.
    quiesce: Mutex<()>,
}

impl<S: Shim> fmt::Debug for Counted<S>
where
    S: fmt::Debug,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Counted")
            .field("inner", &self.inner)
            .field("state", &*lock(&self.state))
            .finish_non_exhaustive()
    }
}

/// A stream of a [`Counted`] shim: the inner stream, shared with the wrapper's list of streams.
#[derive(Debug)]
pub struct CountedStream<T>(Arc<T>);

impl<T> CountedStream<T> {
    /// The inner shim's stream.
    pub fn inner(&self) -> &T {
        &self.0
    }
}

/// A page of a [`Counted`] shim: the inner shim's page and its size as asked.
#[derive(Debug)]
pub struct CountedPage<P> {
    page: P,
    size: u64,
}

impl<P> CountedPage<P> {
    /// The inner shim's page.
    pub fn inner(&self) -> &P {
        &self.page
    }

    /// Its size as asked.
    pub fn size(&self) -> u64 {
        self.size
    }
}

impl<S: Shim> Counted<S> {
    /// `inner`, counted, with no rule installed.
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            state: Arc::default(),
            streams: Mutex::default(),
            failing: None,
            notify: true,
            quiesce: Mutex::new(()),
        }
    }

    /// Answers `event_notify` as a shim that cannot notify does (the trait's default): pending
    /// futures are then polled again at once instead of being woken.
    pub fn without_notify(mut self) -> Self {
        self.notify = false;
        self
    }

    /// Gives the wrapper the [`TestKernel::WriteThenFail`] kernel (loaded on the inner shim), so
    /// that it can inject [`FaultRule::WorkFails`].
    pub fn failing_with(mut self, kernel: S::Kernel) -> Self {
        self.failing = Some(kernel);
        lock(&self.state).can_fail_work = true;
        self
    }

    /// The inner shim.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// The probe of this shim: counters and fault injection, usable after the shim is dropped.
    pub fn probe(&self) -> CountedProbe {
        CountedProbe(Arc::clone(&self.state))
    }

    /// Counts a call of `op` and decides what it may do.
    fn enter(&self, op: ShimOp) -> Result<Verdict, DriverError> {
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
                self.finish_queued_work();
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

    /// Waits, on the inner shim, for the work queued on every live stream: after an injected
    /// loss the core frees every page at once, and the inner device must not touch them then.
    fn finish_queued_work(&self) {
        let streams: Vec<Arc<S::Stream>> = lock(&self.streams)
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        for s in streams {
            // Errors do not matter here: a fault of work that ran still completed the fence, and
            // an inner device that is really lost runs nothing more.
            if let Ok(fence) = self.inner.record_event(&s) {
                let _ = self.inner.event_wait(&fence);
            }
        }
    }

    /// After an accepted call of a [`Verdict::GoThenFail`], makes the work enqueued on `stream`
    /// fail while it runs.
    fn then_fail(&self, verdict: Verdict, stream: &S::Stream) {
        let Verdict::GoThenFail = verdict else {
            return;
        };
        let kernel = self
            .failing
            .as_ref()
            .expect("checked by CountedProbe::inject: WorkFails needs Counted::failing_with");
        let args = TestArgs::new(TestKernel::WriteThenFail, 0, &[], &[]);
        // SAFETY: no buffers: the harness contract has WriteThenFail write only its outputs, so
        // it touches no memory at all.
        let launched = unsafe {
            self.inner
                .launch(stream, kernel, args.dims(), &[], &args.params())
        };
        if let Err(e) = launched {
            panic!(
                "Counted: the inner shim refused the WriteThenFail launch that injects a fault \
                 of work that ran ({e}); the harness's WriteThenFail kernel must launch with no \
                 buffers"
            );
        }
    }
}

impl<S: Shim> Shim for Counted<S> {
    type Stream = CountedStream<S::Stream>;
    type Event = S::Event;
    type DevicePage = CountedPage<S::DevicePage>;
    type HostPage = CountedPage<S::HostPage>;
    type Kernel = S::Kernel;
    type Registration = S::Registration;
    type Graph = S::Graph;
    type NativeStream = S::NativeStream;

    fn native_stream<'a>(&self, stream: &'a Self::Stream) -> &'a Self::NativeStream {
        self.inner.native_stream(&stream.0)
    }

    unsafe fn borrow_stream(
        &self,
        native: &Self::NativeStream,
    ) -> Result<Self::Stream, DriverError> {
        self.enter(ShimOp::StreamCreate)?;
        // SAFETY: the caller's contract is the inner shim's.
        let stream = Arc::new(unsafe { self.inner.borrow_stream(native) }?);
        let mut streams = lock(&self.streams);
        streams.retain(|w| w.strong_count() > 0);
        streams.push(Arc::downgrade(&stream));
        Ok(CountedStream(stream))
    }

    fn facts(&self) -> DeviceFacts {
        self.inner.facts()
    }

    fn classify(&self, op: ShimOp, status: i32) -> DriverError {
        self.inner.classify(op, status)
    }

    fn create_stream(&self) -> Result<Self::Stream, DriverError> {
        self.enter(ShimOp::StreamCreate)?;
        let stream = Arc::new(self.inner.create_stream()?);
        let mut streams = lock(&self.streams);
        streams.retain(|w| w.strong_count() > 0);
        streams.push(Arc::downgrade(&stream));
        Ok(CountedStream(stream))
    }

    fn stream_wait_event(
        &self,
        stream: &Self::Stream,
        event: &Self::Event,
    ) -> Result<(), DriverError> {
        let verdict = self.enter(ShimOp::StreamWaitEvent)?;
        self.inner.stream_wait_event(&stream.0, event)?;
        self.then_fail(verdict, &stream.0);
        Ok(())
    }

    fn record_event(&self, stream: &Self::Stream) -> Result<Self::Event, DriverError> {
        self.enter(ShimOp::EventRecord)?;
        self.inner.record_event(&stream.0)
    }

    fn event_query(&self, event: &Self::Event) -> Result<bool, DriverError> {
        self.enter(ShimOp::EventQuery)?;
        self.inner.event_query(event)
    }

    fn event_notify(&self, event: &Self::Event, waker: &core::task::Waker) -> bool {
        self.notify && self.inner.event_notify(event, waker)
    }

    fn event_wait(&self, event: &Self::Event) -> Result<(), DriverError> {
        self.enter(ShimOp::EventWait)?;
        self.inner.event_wait(event)
    }

    fn device_alloc(&self, size: u64) -> Result<Self::DevicePage, DriverError> {
        self.enter(ShimOp::DeviceAlloc)?;
        let page = self.inner.device_alloc(size)?;
        let mut st = lock(&self.state);
        st.device_pages_live += 1;
        st.device_bytes_live += size;
        Ok(CountedPage { page, size })
    }

    fn device_page_addr(&self, page: &Self::DevicePage) -> DeviceAddr {
        self.inner.device_page_addr(&page.page)
    }

    fn vm_reserve(&self, size: u64) -> Result<DeviceAddr, DriverError> {
        self.enter(ShimOp::VmReserve)?;
        let addr = self.inner.vm_reserve(size)?;
        lock(&self.state).vm_reserved_live += size;
        Ok(addr)
    }

    unsafe fn vm_release(&self, addr: DeviceAddr, size: u64) {
        {
            let mut st = lock(&self.state);
            st.vm_reserved_live = st.vm_reserved_live.saturating_sub(size);
        }
        // SAFETY: forwarded with the caller's contract unchanged (after an injected loss, as in
        // `device_free`: no inner work runs any more).
        unsafe { self.inner.vm_release(addr, size) }
    }

    fn vm_map(&self, addr: DeviceAddr, size: u64) -> Result<u64, DriverError> {
        self.enter(ShimOp::VmMap)?;
        let memory = self.inner.vm_map(addr, size)?;
        lock(&self.state).device_bytes_live += size;
        Ok(memory)
    }

    unsafe fn vm_unmap(&self, addr: DeviceAddr, size: u64, memory: u64) {
        {
            let mut st = lock(&self.state);
            st.device_bytes_live = st.device_bytes_live.saturating_sub(size);
        }
        // SAFETY: forwarded with the caller's contract unchanged, as in `device_free`.
        unsafe { self.inner.vm_unmap(addr, size, memory) }
    }

    unsafe fn device_free(&self, page: Self::DevicePage) {
        {
            let mut st = lock(&self.state);
            st.device_pages_live = st.device_pages_live.saturating_sub(1);
            st.device_bytes_live = st.device_bytes_live.saturating_sub(page.size);
        }
        // SAFETY: the caller keeps `device_free`'s contract for the page; after an injected loss
        // the inner streams' queued work was finished when the loss fired, and no call reached
        // the inner shim since.
        unsafe { self.inner.device_free(page.page) }
    }

    fn host_alloc_pinned(&self, size: usize) -> Result<Self::HostPage, DriverError> {
        self.enter(ShimOp::HostAlloc)?;
        let page = self.inner.host_alloc_pinned(size)?;
        lock(&self.state).host_pages_live += 1;
        Ok(CountedPage {
            page,
            size: size as u64,
        })
    }

    fn host_page_ptr(&self, page: &Self::HostPage) -> NonNull<u8> {
        self.inner.host_page_ptr(&page.page)
    }

    fn host_page_device_addr(&self, page: &Self::HostPage) -> Option<DeviceAddr> {
        self.inner.host_page_device_addr(&page.page)
    }

    unsafe fn host_free_pinned(&self, page: Self::HostPage) {
        {
            let mut st = lock(&self.state);
            st.host_pages_live = st.host_pages_live.saturating_sub(1);
        }
        // SAFETY: as in `device_free`: the caller's contract, and no inner work after a loss.
        unsafe { self.inner.host_free_pinned(page.page) }
    }

    fn host_register(
        &self,
        ptr: NonNull<u8>,
        len: usize,
    ) -> Result<Self::Registration, DriverError> {
        self.enter(ShimOp::HostRegister)?;
        self.inner.host_register(ptr, len)
    }

    unsafe fn host_unregister(&self, registration: Self::Registration) {
        // SAFETY: forwarded with the caller's contract unchanged.
        unsafe { self.inner.host_unregister(registration) }
    }

    unsafe fn copy_to_device(
        &self,
        stream: &Self::Stream,
        src: *const u8,
        src_memory: HostMemory,
        dst: DeviceAddr,
        layout: CopyLayout,
    ) -> Result<(), DriverError> {
        let verdict = self.enter(ShimOp::CopyHostToDevice)?;
        // SAFETY: forwarded with the caller's contract unchanged.
        unsafe {
            self.inner
                .copy_to_device(&stream.0, src, src_memory, dst, layout)
        }?;
        self.then_fail(verdict, &stream.0);
        Ok(())
    }

    unsafe fn copy_to_host(
        &self,
        stream: &Self::Stream,
        src: DeviceAddr,
        dst: *mut u8,
        dst_memory: HostMemory,
        layout: CopyLayout,
    ) -> Result<(), DriverError> {
        let verdict = self.enter(ShimOp::CopyDeviceToHost)?;
        // SAFETY: forwarded with the caller's contract unchanged.
        unsafe {
            self.inner
                .copy_to_host(&stream.0, src, dst, dst_memory, layout)
        }?;
        self.then_fail(verdict, &stream.0);
        Ok(())
    }

    unsafe fn copy_on_device(
        &self,
        stream: &Self::Stream,
        src: DeviceAddr,
        dst: DeviceAddr,
        layout: CopyLayout,
    ) -> Result<(), DriverError> {
        let verdict = self.enter(ShimOp::CopyDeviceToDevice)?;
        // SAFETY: forwarded with the caller's contract unchanged.
        unsafe { self.inner.copy_on_device(&stream.0, src, dst, layout) }?;
        self.then_fail(verdict, &stream.0);
        Ok(())
    }

    unsafe fn launch(
        &self,
        stream: &Self::Stream,
        kernel: &Self::Kernel,
        dims: LaunchDims,
        buffers: &[DeviceSpan],
        params: &[KernelParam<'_>],
    ) -> Result<(), DriverError> {
        let verdict = self.enter(ShimOp::Launch)?;
        // SAFETY: forwarded with the caller's contract unchanged.
        unsafe { self.inner.launch(&stream.0, kernel, dims, buffers, params) }?;
        self.then_fail(verdict, &stream.0);
        Ok(())
    }

    fn begin_capture(&self, stream: &Self::Stream) -> Result<(), DriverError> {
        self.enter(ShimOp::GraphBegin)?;
        self.inner.begin_capture(&stream.0)
    }

    fn end_capture(&self, stream: &Self::Stream, doomed: bool) -> Result<Self::Graph, DriverError> {
        // An injected refusal still ends the recording, as every end must.
        let verdict = self.enter(ShimOp::GraphEnd);
        let ended = self
            .inner
            .end_capture(&stream.0, doomed || verdict.is_err());
        verdict?;
        ended
    }

    fn end_capture_update(
        &self,
        stream: &Self::Stream,
        doomed: bool,
        graph: &Self::Graph,
    ) -> Result<Option<Self::Graph>, DriverError> {
        let verdict = self.enter(ShimOp::GraphEnd);
        let ended = self
            .inner
            .end_capture_update(&stream.0, doomed || verdict.is_err(), graph);
        verdict?;
        ended
    }

    fn graph_upload(&self, graph: &Self::Graph, stream: &Self::Stream) -> Result<(), DriverError> {
        self.enter(ShimOp::GraphUpload)?;
        self.inner.graph_upload(graph, &stream.0)
    }

    unsafe fn graph_launch(
        &self,
        graph: &Self::Graph,
        stream: &Self::Stream,
    ) -> Result<(), DriverError> {
        let verdict = self.enter(ShimOp::GraphLaunch)?;
        // SAFETY: forwarded with the caller's contract unchanged.
        unsafe { self.inner.graph_launch(graph, &stream.0) }?;
        self.then_fail(verdict, &stream.0);
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
