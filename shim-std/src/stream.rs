//! Streams: one worker thread per stream runs its queue in order; events are sequence numbers.
//!
//! Every enqueued operation gets the next sequence number of its stream; an event is the tail
//! sequence number when it was recorded and completes once the worker has completed it. The host
//! blocks only in [`StreamShared::wait`] (on a `Condvar`, never spinning).
//!
//! **Lazy mode**: the worker runs an operation only when its sequence number is at most the
//! stream's *drive target*, which starts at 0 and is raised by a query or wait of an event of the
//! stream (up to that event, not past it), by a cross-stream wait that reaches it (the waiting
//! worker drives the other stream up to the event it waits for, so waits cannot deadlock), and by
//! dropping the stream (to the end). Outside lazy mode the target is `u64::MAX`.

use crate::device::DeviceInner;
use crate::faults::{classify, status};
use crate::kernel::{KernelCtx, KernelFault, LaunchArgs, StdKernel};
use crate::{lock, wait};
use devcmd::{CopyLayout, CopyRow, DriverError, LaunchDims, ShimOp};
use std::collections::VecDeque;
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr;
use std::sync::{Arc, Condvar, Mutex};
use std::task::Waker;
use std::thread::{self, JoinHandle};

/// A copy between two address ranges, validated when it was enqueued: the device side (or both
/// sides, device to device) is pitched by the layout, a host side is packed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CopyOp {
    pub(crate) src: usize,
    pub(crate) dst: usize,
    pub(crate) layout: CopyLayout,
    /// Whether the source is device memory (pitched) rather than host memory (packed).
    pub(crate) src_device: bool,
    /// Whether the destination is device memory.
    pub(crate) dst_device: bool,
}

impl CopyOp {
    /// Copies the rows of the layout ([`CopyLayout::rows`], the core's one row walk).
    ///
    /// # Safety
    ///
    /// Both sides are valid for the rows (the contract of the `copy_*` call that built it, which
    /// holds until an event recorded after the call completes, so while the worker runs it).
    unsafe fn run(&self) {
        let src = ptr::with_exposed_provenance::<u8>(self.src);
        let dst = ptr::with_exposed_provenance_mut::<u8>(self.dst);
        let side = |device: bool, r: CopyRow| if device { r.device } else { r.host } as usize;
        for r in self.layout.rows() {
            // SAFETY: each row of each side lies inside the span validated at enqueue (offsets
            // and lengths were checked to fit a usize then).
            unsafe {
                ptr::copy(
                    src.add(side(self.src_device, r)),
                    dst.add(side(self.dst_device, r)),
                    r.len as usize,
                )
            };
        }
    }
}

/// One operation of a stream's queue (or of a recording).
pub(crate) enum Op {
    Copy(CopyOp),
    Launch {
        kernel: StdKernel,
        dims: LaunchDims,
        args: LaunchArgs,
    },
    Wait {
        stream: Arc<StreamShared>,
        seq: u64,
    },
    Replay(Arc<Vec<Op>>),
    /// A copy from another device's memory ([`devcmd::Shim::copy_peer`]): refused at run time
    /// when that device is lost, as its work up to the copy may not have run and its memory
    /// may be gone.
    Peer(CopyOp, Arc<DeviceInner>),
    /// A host function library work enqueued ([`StdStream::enqueue_host`]); a replay runs it
    /// again.
    Host(HostFn),
    /// The work before it fails while it runs (an [`Injection::while_running`] fired on the call
    /// that enqueued that work): runs nothing, reports the fault.
    ///
    /// [`Injection::while_running`]: crate::Injection::while_running
    Fail(DriverError),
}

/// A host function enqueued on a stream by library work: it runs on the stream's worker, in
/// stream order; an `Err` or a panic is a fault of the stream's work (reported by the stream's
/// fences as a failed or panicked kernel's status).
pub type HostFn = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// Runs `op` on the calling worker.
impl Op {
    /// The call that enqueued it, for the error of a panic while it ran.
    fn shim_op(&self) -> ShimOp {
        match self {
            Op::Copy(c) => match (c.src_device, c.dst_device) {
                (true, true) => ShimOp::CopyDeviceToDevice,
                (false, _) => ShimOp::CopyHostToDevice,
                (true, false) => ShimOp::CopyDeviceToHost,
            },
            Op::Peer(..) => ShimOp::CopyDeviceToDevice,
            Op::Launch { .. } | Op::Host(_) => ShimOp::Launch,
            Op::Wait { .. } => ShimOp::StreamWaitEvent,
            Op::Replay(_) => ShimOp::GraphLaunch,
            Op::Fail(e) => e.op,
        }
    }
}

fn run(op: &Op, dev: &DeviceInner) -> Result<(), DriverError> {
    if !matches!(op, Op::Fail(_)) {
        dev.note_run(matches!(op, Op::Launch { .. }));
    }
    match op {
        Op::Copy(c) => {
            // SAFETY: the enqueuer's contract keeps both sides valid until an event after the copy
            // completes; that event cannot complete before this operation does.
            unsafe { c.run() };
            Ok(())
        }
        Op::Launch { kernel, dims, args } => {
            // SAFETY: `Shim::launch`'s caller promised the spans lie in live pages and that the
            // kernel touches nothing else; the core orders other work on them with events.
            let mut ctx = unsafe { KernelCtx::new(*dims, &args.spans, &args.params) };
            kernel.run(&mut ctx).map_err(|f| {
                let code = match f {
                    Some(KernelFault::Failed) => status::KERNEL_FAILED,
                    Some(KernelFault::DeviceLost) => status::KERNEL_LOST_DEVICE,
                    None => status::KERNEL_PANICKED,
                };
                classify(ShimOp::Launch, code)
            })
        }
        Op::Peer(c, source) => {
            if source.is_lost() {
                return Err(classify(ShimOp::CopyDeviceToDevice, status::SOURCE_LOST));
            }
            // SAFETY: as for `Op::Copy`: the core frees neither side before a fence after this
            // copy. Should the source be lost while the copy runs, its core frees its pages only
            // after hearing of the loss, and a lost device's freed memory goes to its graveyard
            // (kept while `source`, held here, lives), so the bytes stay readable.
            unsafe { c.run() };
            Ok(())
        }
        Op::Wait { stream, seq } => {
            stream.reach(*seq);
            // Work ordered after failed work depends on what it left unwritten: the failure
            // travels with the order, and this stream's next fence reports it too.
            stream.first_fault_through(*seq).map_or(Ok(()), Err)
        }
        Op::Replay(ops) => {
            let mut first = None;
            for op in ops.iter() {
                if dev.is_lost() {
                    break;
                }
                match run(op, dev) {
                    Err(e) if e.loses_device() => return Err(e),
                    Err(e) => _ = first.get_or_insert(e),
                    Ok(()) => {}
                }
            }
            first.map_or(Ok(()), Err)
        }
        // The fence reports a failed kernel's status (the message has nowhere to go: a fault of
        // work that ran is a status, as on CUDA); a panic is caught, as a kernel's is, so the
        // worker lives on and the stream's fences complete.
        Op::Host(f) => match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f())) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(classify(ShimOp::Launch, status::KERNEL_FAILED)),
            Err(_) => Err(classify(ShimOp::Launch, status::KERNEL_PANICKED)),
        },
        Op::Fail(e) => Err(*e),
    }
}

struct StreamState {
    queue: VecDeque<(u64, Op)>,
    enqueued: u64,
    completed: u64,
    drive_to: u64,
    shutdown: bool,
    /// The worker took an operation off the queue and has not completed it yet. Once the device
    /// is lost, waits return early, but never while an operation may still touch memory.
    running: bool,
    capture: Option<Vec<Op>>,
    /// The first asynchronous fault, by the sequence number of the failed operation: every
    /// fence from there on reports it, and streams ordered after this one inherit it.
    first_fault: Option<(u64, DriverError)>,
    /// The arguments of launches the worker ran, kept for the next launches (at most
    /// `StdShimBuilder::spare_launches`): a warm launch allocates nothing.
    spare_args: Vec<LaunchArgs>,
    /// Tasks waiting for a sequence number ([`StreamShared::notify`]): woken by the worker once
    /// it completed that far. One entry per event value waited on (by [`StdEvent::waiter`]): a
    /// task polled again replaces its entry's waker, whether or not its executor made a new one.
    wakers: Vec<Waiting>,
}

/// A task waiting for a point of the stream: the point, the event value it waits with, its
/// latest waker.
struct Waiting {
    seq: u64,
    waiter: u64,
    waker: Waker,
}

/// The state a stream shares with its worker and its events.
pub(crate) struct StreamShared {
    pub(crate) id: u64,
    dev: Arc<DeviceInner>,
    state: Mutex<StreamState>,
    cv: Condvar,
}

impl StreamShared {
    /// Launch arguments to fill: kept ones when the worker is done with some, else new (empty).
    pub(crate) fn launch_args(&self) -> LaunchArgs {
        lock(&self.state).spare_args.pop().unwrap_or_default()
    }

    /// Enqueues `op`, or records it while the stream records.
    pub(crate) fn enqueue(&self, op: Op) {
        let mut st = lock(&self.state);
        if let Some(recording) = st.capture.as_mut() {
            recording.push(op);
            return;
        }
        st.enqueued += 1;
        let seq = st.enqueued;
        st.queue.push_back((seq, op));
        self.cv.notify_all();
    }

    /// The current tail and whether the stream records.
    pub(crate) fn tail(&self) -> (u64, bool) {
        let st = lock(&self.state);
        (st.enqueued, st.capture.is_some())
    }

    /// Starts recording; false if the stream already records.
    pub(crate) fn begin_capture(&self) -> bool {
        let mut st = lock(&self.state);
        let idle = st.capture.is_none();
        if idle {
            st.capture = Some(Vec::new());
        }
        idle
    }

    /// Stops recording and returns what was recorded; `None` if the stream did not record.
    pub(crate) fn end_capture(&self) -> Option<Vec<Op>> {
        lock(&self.state).capture.take()
    }

    fn drive(&self, st: &mut StreamState, seq: u64) {
        if st.drive_to < seq {
            st.drive_to = seq;
            self.cv.notify_all();
        }
    }

    /// The first fault of an operation at or before `seq`, reported or not.
    fn first_fault_through(&self, seq: u64) -> Option<DriverError> {
        lock(&self.state)
            .first_fault
            .filter(|(s, _)| *s <= seq)
            .map(|(_, e)| e)
    }

    /// Blocks the calling thread until `seq` has completed or the device is lost.
    fn reach(&self, seq: u64) {
        let mut st = lock(&self.state);
        self.drive(&mut st, seq);
        while st.completed < seq && (st.running || !self.dev.is_lost()) {
            st = wait(&self.cv, st);
        }
    }

    /// The fault of the stream's first failed operation, if it ran at or before `seq`. Faults
    /// are sticky: every fence from the failed work on reports it, so no fence covering the
    /// failure can look clean to one caller because another caller heard first.
    fn fault_through(st: &StreamState, seq: u64) -> Result<(), DriverError> {
        match st.first_fault {
            Some((s, e)) if s <= seq => Err(e),
            _ => Ok(()),
        }
    }

    /// Whether `seq` has completed, without blocking (lazy mode: also drives up to it).
    pub(crate) fn query(&self, seq: u64, op: ShimOp) -> Result<bool, DriverError> {
        let mut st = lock(&self.state);
        self.drive(&mut st, seq);
        if self.dev.is_lost() {
            if st.running && st.completed < seq {
                return Ok(false); // an operation may still touch memory: not done yet
            }
            drop(st);
            // Another stream's worker may still run: not done yet rather than a wait.
            return self.dev.lost_error_if_idle(op).map_or(Ok(false), Err);
        }
        // A fault is reported only with the fence it belongs to, once that fence completed:
        // the core releases what the fence covered when it hears of a fault of run work.
        if st.completed < seq {
            return Ok(false);
        }
        Self::fault_through(&st, seq)?;
        Ok(true)
    }

    /// Blocks the host until `seq` completes.
    pub(crate) fn wait(&self, seq: u64, op: ShimOp) -> Result<(), DriverError> {
        self.reach(seq);
        if self.dev.is_lost() {
            return Err(self.dev.lost_error(op));
        }
        Self::fault_through(&lock(&self.state), seq)
    }

    /// Wakes `waker` once `seq` completed: at once if it has (or the device is lost and nothing
    /// runs), else when the worker gets there (lazy mode: drives up to it, as a query does). A
    /// later call for the same event value (`waiter`) replaces the waker instead of adding one.
    pub(crate) fn notify(&self, seq: u64, waiter: u64, waker: &Waker) {
        let mut st = lock(&self.state);
        self.drive(&mut st, seq);
        if st.completed >= seq || (self.dev.is_lost() && !st.running) {
            drop(st);
            waker.wake_by_ref();
            return;
        }
        // One entry per event value: a future polled again replaces its waker, also when its
        // executor made a new one for this poll (`will_wake` tells only the same one apart, so
        // keying on it alone let such an executor add an entry per poll).
        match st.wakers.iter_mut().find(|w| w.waiter == waiter) {
            Some(entry) => {
                if !entry.waker.will_wake(waker) {
                    entry.waker.clone_from(waker);
                }
            }
            None => st.wakers.push(Waiting {
                seq,
                waiter,
                waker: waker.clone(),
            }),
        }
    }

    /// Tasks waiting on this stream now.
    #[cfg(test)]
    pub(crate) fn waiting(&self) -> usize {
        lock(&self.state).wakers.len()
    }

    /// Operations enqueued and not completed yet.
    fn pending(&self) -> u64 {
        let st = lock(&self.state);
        st.enqueued - st.completed
    }
}

/// The worker: runs the queue in order until the stream is dropped and the queue is empty. After
/// the device is lost it completes operations without running them.
fn work(shared: Arc<StreamShared>) {
    loop {
        let (seq, op) = {
            let mut st = lock(&shared.state);
            loop {
                if st.queue.front().is_some_and(|(seq, _)| *seq <= st.drive_to)
                    && let Some(next) = st.queue.pop_front()
                {
                    st.running = true;
                    break next;
                }
                if st.shutdown && st.queue.is_empty() {
                    // Nothing will complete any more: no task may sleep on this stream.
                    let wakers = std::mem::take(&mut st.wakers);
                    drop(st);
                    wakers.into_iter().for_each(|w| w.waker.wake());
                    return;
                }
                st = wait(&shared.cv, st);
            }
        };
        let what = op.shim_op();
        // A panic while the worker runs or drops an operation (a shim bug, or a value a host
        // function captured whose drop panics) fails the stream's work, as a kernel's panic
        // does: the worker lives on, so the stream's fences still complete.
        let panicked = || Some(classify(what, status::WORKER_PANICKED));
        let mut fault = if shared.dev.begin_op() {
            catch_unwind(AssertUnwindSafe(|| run(&op, &shared.dev)))
                .map_or_else(|_| panicked(), Result::err)
        } else {
            None
        };
        // A launch's arguments go back to the stream for the next launch; the rest is dropped.
        let spare = match op {
            Op::Launch { args, .. } => Some(args),
            other => {
                if catch_unwind(AssertUnwindSafe(|| drop(other))).is_err() {
                    fault = fault.or_else(panicked);
                }
                None
            }
        };
        shared.dev.end_op();
        if let Some(e) = fault {
            shared.dev.async_fault(e);
        }
        let mut st = lock(&shared.state);
        if let Some(args) = spare
            && st.spare_args.len() < shared.dev.spare_launches
        {
            st.spare_args.push(args);
        }
        st.completed = seq;
        st.running = false;
        if let Some(e) = fault.filter(|e| !e.loses_device()) {
            st.first_fault.get_or_insert((seq, e));
        }
        shared.cv.notify_all();
        // Tasks waiting for this point (or, the device lost, for any) are woken outside the lock.
        let lost = shared.dev.is_lost();
        let mut woken = Vec::new();
        st.wakers.retain(|w| {
            let done = w.seq <= seq || lost;
            if done {
                woken.push(w.waker.clone());
            }
            !done
        });
        drop(st);
        woken.into_iter().for_each(Waker::wake);
    }
}

/// A stream: an in-order queue run by its own worker thread. Dropping it lets the queued work
/// finish (in lazy mode too), then joins the worker; events of it stay valid.
pub struct StdStream {
    pub(crate) shared: Arc<StreamShared>,
    worker: Option<JoinHandle<()>>,
    /// A second handle on another stream's worker ([`Shim::borrow_stream`]): dropping it leaves
    /// the worker running.
    ///
    /// [`Shim::borrow_stream`]: devcmd::Shim::borrow_stream
    borrowed: bool,
}

impl StdStream {
    /// Starts the worker of a new stream; `None` if the thread could not start.
    pub(crate) fn spawn(dev: Arc<DeviceInner>, id: u64, lazy: bool) -> Option<Self> {
        let state = StreamState {
            queue: VecDeque::new(),
            enqueued: 0,
            completed: 0,
            drive_to: if lazy { 0 } else { u64::MAX },
            shutdown: false,
            running: false,
            capture: None,
            first_fault: None,
            spare_args: Vec::new(),
            wakers: Vec::new(),
        };
        let shared = Arc::new(StreamShared {
            id,
            dev,
            state: Mutex::new(state),
            cv: Condvar::new(),
        });
        let for_worker = Arc::clone(&shared);
        let worker = thread::Builder::new()
            .name(format!("devcmd-stream-{id}"))
            .spawn(move || work(for_worker))
            .ok()?;
        Some(Self {
            shared,
            worker: Some(worker),
            borrowed: false,
        })
    }

    /// A handle on this stream's worker that does not own it: the stream of a
    /// [`Shim::borrow_stream`](devcmd::Shim::borrow_stream).
    pub(crate) fn borrowed(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
            worker: None,
            borrowed: true,
        }
    }

    /// Enqueues `work` to run on the stream's worker in stream order, as a library enqueues its
    /// kernels on a CUDA stream: the native side of library work on this shim
    /// ([`Command::library`](devcmd::Command::library)). While the stream records, `work` is
    /// recorded and every replay runs it again. An `Err` it returns is a fault of the stream's
    /// work (its next fences report it).
    pub fn enqueue_host(&self, work: impl Fn() -> Result<(), String> + Send + Sync + 'static) {
        self.shared.enqueue(Op::Host(Arc::new(work)));
    }

    /// The stream's id, unique within its shim.
    pub fn id(&self) -> u64 {
        self.shared.id
    }

    /// Operations enqueued and not completed yet (in lazy mode: not yet driven, or running).
    pub fn pending(&self) -> u64 {
        self.shared.pending()
    }
}

impl Drop for StdStream {
    fn drop(&mut self) {
        if self.borrowed {
            // The stream's owner ends it; a recording the borrower left open ends here (the
            // owner's stream would record on, and the device refuse allocations, otherwise).
            let recording = lock(&self.shared.state).capture.take().is_some();
            if recording {
                self.shared.dev.close_capture(self.shared.id);
            }
            return;
        }
        {
            let mut st = lock(&self.shared.state);
            st.shutdown = true;
            st.drive_to = u64::MAX;
            st.capture = None;
            self.shared.cv.notify_all();
        }
        self.shared.dev.close_capture(self.shared.id);
        if let Some(worker) = self.worker.take()
            && worker.thread().id() != thread::current().id()
        {
            // A worker that panicked has nothing left to clean up.
            _ = worker.join();
        }
    }
}

impl fmt::Debug for StdStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StdStream")
            .field("id", &self.shared.id)
            .finish_non_exhaustive()
    }
}

/// An event: a point (sequence number) in a stream's queue. Cheap to clone; stays valid after its
/// stream is dropped.
///
/// One task waits on an event value at a time ([`devcmd::Shim::event_notify`] keeps one waker
/// per value, the latest); a clone is another value, which another task may wait on.
pub struct StdEvent {
    pub(crate) stream: Arc<StreamShared>,
    pub(crate) seq: u64,
    /// Recorded while the stream recorded: it stands for nothing that runs, so it may be neither
    /// queried nor waited on.
    pub(crate) captured: bool,
    /// This value's own number: the key of its task's entry among the stream's wakers.
    pub(crate) waiter: u64,
}

impl StdEvent {
    /// The event of `stream` at `seq`, a value of its own.
    pub(crate) fn new(stream: Arc<StreamShared>, seq: u64, captured: bool) -> Self {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        Self {
            stream,
            seq,
            captured,
            waiter: NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        }
    }
}

impl Clone for StdEvent {
    /// The same point, as a value of its own (its task, if any, waits apart).
    fn clone(&self) -> Self {
        Self::new(Arc::clone(&self.stream), self.seq, self.captured)
    }
}

impl StdEvent {
    /// The sequence number the event completes at.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// The id of the stream it was recorded on.
    pub fn stream_id(&self) -> u64 {
        self.stream.id
    }
}

impl fmt::Debug for StdEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StdEvent")
            .field("stream", &self.stream.id)
            .field("seq", &self.seq)
            .field("captured", &self.captured)
            .finish()
    }
}
