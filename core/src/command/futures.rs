//! The fences a caller waits for: [`ReadFuture`] (bytes read back), [`ReadToFuture`] (bytes read
//! into the caller's own buffer, [`Command::read_to`]) and [`SyncFuture`] (a stream reached a
//! point, [`Command::sync`]), and the fence every one of them holds.
//!
//! Owns what a future holds until its fence passes (the read's buffers and the bindings that keep
//! the memory alive) and whether it releases or leaks them, decided by the fence's
//! [`FenceOutcome`]. Does not decide what an outcome means for the stream: the fault ledger does.
//!
//! While a stream of the device records, no future waits for or queries its fence (a host wait
//! is illegal then, on any stream): polling answers "not yet", waiting is refused
//! ([`Validation::Recording`]), and a read's buffers and bindings go to its stream's drop queue,
//! released after a fence once the recording ended.

use super::Command;
use crate::capture::RecordingFlag;
use crate::error::{DriverError, ServerError, Validation};
use crate::fault::{FaultLedger, FenceMark, FenceOutcome, Fenced};
use crate::host::HostBuffer;
use crate::memory::Binding;
use crate::shim::{HostCopy, Shim};
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};

#[derive(Debug)]
enum FenceState<E> {
    /// Recorded and not yet found passed.
    Recorded(E),
    /// The shim refused to record it: nothing covers the work before it.
    NotRecorded(DriverError),
    /// Its outcome was taken.
    Done,
}

/// A fence recorded on a stream for a future, with what is needed to report its outcome.
#[derive(Debug)]
pub(super) struct Fence<S: Shim> {
    shim: Arc<S>,
    state: FenceState<S::Event>,
    ledger: FaultLedger,
    /// Set while a stream of the device records: the fence may then be neither waited for nor
    /// queried.
    recording: RecordingFlag,
    stream: usize,
    /// Where it was recorded (the last kernel before it is named if it reveals failed work).
    mark: FenceMark,
}

impl<S: Shim> Fence<S> {
    fn new(
        shim: Arc<S>,
        recorded: Result<S::Event, DriverError>,
        ledger: FaultLedger,
        recording: RecordingFlag,
        stream: usize,
        mark: FenceMark,
    ) -> Self {
        let state = match recorded {
            Ok(e) => FenceState::Recorded(e),
            Err(e) => FenceState::NotRecorded(e),
        };
        Self {
            shim,
            state,
            ledger,
            recording,
            stream,
            mark,
        }
    }

    fn pending(&self) -> bool {
        !matches!(self.state, FenceState::Done)
    }

    fn recorded(&self) -> bool {
        !matches!(self.state, FenceState::NotRecorded(_))
    }

    /// Whether waiting for or querying the fence is illegal now: a stream of the device records.
    fn blocked(&self) -> bool {
        matches!(self.state, FenceState::Recorded(_)) && self.recording.is_set()
    }

    /// Gives the fence up unwaited (a stream records): nothing is asked of the device.
    fn give_up(&mut self) {
        self.state = FenceState::Done;
    }

    /// Blocks until the fence completes (at once when it was never recorded: the outcome is then
    /// unknown, unless the device is lost).
    fn wait(&mut self) -> FenceOutcome {
        match core::mem::replace(&mut self.state, FenceState::Done) {
            FenceState::Recorded(e) => FenceOutcome::wait(&*self.shim, &e),
            FenceState::NotRecorded(e) => FenceOutcome::unrecorded(e),
            FenceState::Done => FenceOutcome::Passed,
        }
    }

    /// The outcome once the fence completed, without blocking.
    fn poll(&mut self) -> Option<FenceOutcome> {
        if self.blocked() {
            return None;
        }
        let outcome = match &self.state {
            FenceState::Recorded(e) => FenceOutcome::query(&*self.shim, e)?,
            FenceState::NotRecorded(_) | FenceState::Done => return Some(self.wait()),
        };
        self.state = FenceState::Done;
        Some(outcome)
    }

    /// [`Self::poll`] for a future: while the fence has not passed, the shim is asked to wake
    /// the task when it does ([`Shim::event_notify`]); a shim that cannot, or a fence that may
    /// not be queried now (a stream records), has the task polled again at once.
    fn poll_task(&mut self, cx: &mut Context<'_>) -> Poll<FenceOutcome> {
        if let Some(outcome) = self.poll() {
            return Poll::Ready(outcome);
        }
        let notified = match &self.state {
            FenceState::Recorded(e) if !self.blocked() => self.shim.event_notify(e, cx.waker()),
            _ => false,
        };
        if !notified {
            cx.waker().wake_by_ref();
        }
        Poll::Pending
    }

    fn fenced(&self, outcome: FenceOutcome) -> Fenced {
        Fenced {
            outcome,
            mark: self.mark,
        }
    }

    /// The caller's result of `outcome`, recorded in the ledger.
    fn answer(&self, outcome: FenceOutcome) -> Result<(), ServerError> {
        self.ledger.answer(self.stream, self.fenced(outcome))
    }

    /// Records what `outcome` says of the stream (failed work, a lost device) when nobody waits
    /// for this fence's answer. An unknown outcome says nothing of the stream: what it covered
    /// was leaked where it was met, and nobody is left to tell.
    fn record(&self, outcome: FenceOutcome) {
        match outcome {
            FenceOutcome::Passed
            | FenceOutcome::PassedOverFailedWork(_)
            | FenceOutcome::DeviceLost(_) => {
                // Only a lost device fails here, and the ledger now knows of it.
                let _ = self.ledger.defer(self.stream, self.fenced(outcome));
            }
            // Nothing to tell: what a refused fence covered went to the drop queue, what an
            // unknown one covered was leaked where it was met.
            FenceOutcome::Refused(_) | FenceOutcome::Unknown(_) => {}
        }
    }
}

/// The bytes of a [`Command::read_async`], once its fence passes.
#[derive(Debug)]
pub struct ReadFuture<S: Shim> {
    fence: Fence<S>,
    buffers: Vec<HostBuffer>,
    held: Vec<Binding>,
}

impl<S: Shim> ReadFuture<S> {
    pub(super) fn new(fence: Fence<S>, buffers: Vec<HostBuffer>, held: Vec<Binding>) -> Self {
        Self {
            fence,
            buffers,
            held,
        }
    }

    /// The future, or its error (the buffers released or leaked) when the fence could not be
    /// recorded.
    pub(super) fn recorded(mut self) -> Result<Self, ServerError> {
        if self.fence.recorded() {
            return Ok(self);
        }
        let outcome = self.fence.wait();
        self.finish(outcome).map(|_| self)
    }

    /// Releases the bindings once the device is done with the buffers and returns the buffers;
    /// leaks both when the device may not be done (`None`), or hands both to the stream's drop
    /// queue when the shim refused to wait for now (`None`).
    fn release(&mut self, outcome: FenceOutcome) -> Option<Vec<HostBuffer>> {
        if let FenceOutcome::Refused(_) = outcome {
            // Nothing was waited for: the drop queue's next fence covers the buffers instead.
            self.orphan();
            return None;
        }
        let buffers = core::mem::take(&mut self.buffers);
        let held = core::mem::take(&mut self.held);
        settle(outcome, buffers, held)
    }

    /// [`Self::release`], then the bytes or the fence's error.
    fn finish(&mut self, outcome: FenceOutcome) -> Result<Vec<HostBuffer>, ServerError> {
        let buffers = self.release(outcome);
        self.fence.answer(outcome)?;
        Ok(buffers.unwrap_or_default())
    }

    /// Hands the buffers and bindings to the stream's drop queue (through the ledger) without
    /// waiting: a stream of the device records.
    fn orphan(&mut self) {
        self.fence.give_up();
        let buffers = core::mem::take(&mut self.buffers);
        let held = core::mem::take(&mut self.held);
        self.fence.ledger.orphan((self.fence.stream, buffers, held));
    }

    /// Blocks until the copies landed and returns the bytes, one buffer per request.
    ///
    /// # Errors
    ///
    /// A device fault the fence reveals: [`ServerError::StreamFaulted`] for failed work (the fence
    /// completed; the buffers are released), or a fault of unknown outcome (the buffers are then
    /// leaked unless the device is lost). [`Validation::Recording`] while a stream of the device
    /// records: nothing is waited for and the read is given up (its buffers go back after a fence
    /// once the recording ended). [`ServerError::Device`] with [`Fault::Busy`](crate::Fault::Busy)
    /// when the shim refused to wait for now (on CUDA, a stream of another device of the process
    /// records): the read is given up the same way.
    pub fn wait(mut self) -> Result<Vec<HostBuffer>, ServerError> {
        if self.fence.blocked() {
            self.orphan();
            return Err(Validation::Recording {
                op: "ReadFuture::wait",
            }
            .into());
        }
        let outcome = self.fence.wait();
        self.finish(outcome)
    }
}

/// What a read's buffers and bindings become once its fence answered: the buffers back (the
/// bindings let go) when the device is done with them, both leaked when it may not be (`None`).
fn settle<B, H>(outcome: FenceOutcome, buffers: B, held: H) -> Option<B> {
    match outcome {
        FenceOutcome::Passed
        | FenceOutcome::PassedOverFailedWork(_)
        | FenceOutcome::DeviceLost(_) => {
            drop(held);
            Some(buffers)
        }
        // The futures hand a refused read's buffers to the drop queue before this.
        FenceOutcome::Refused(_) | FenceOutcome::Unknown(_) => {
            debug_assert!(!matches!(outcome, FenceOutcome::Refused(_)));
            warn!("a read's fence failed: leaking the buffers the device may still write");
            core::mem::forget((buffers, held));
            None
        }
    }
}

impl<S: Shim> Future for ReadFuture<S>
where
    S::Event: Unpin,
{
    type Output = Result<Vec<HostBuffer>, ServerError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        // Woken by the device where the shim can notify; otherwise polled again at once.
        this.fence.poll_task(cx).map(|outcome| this.finish(outcome))
    }
}

impl<S: Shim> Drop for ReadFuture<S> {
    fn drop(&mut self) {
        if self.fence.blocked() {
            self.orphan();
        } else if self.fence.pending() {
            // Dropped before completion: the device may still write the buffers and read the
            // sources. Wait, then release or leak exactly as a completed read would; what the
            // fence revealed of the stream is recorded.
            let outcome = self.fence.wait();
            drop(self.release(outcome));
            self.fence.record(outcome);
        }
    }
}

/// The caller's buffer of a [`Command::read_to`], filled once its fence passes. Holds one buffer
/// (and the pinned buffer a small read lands in first), and one binding inline: a read through
/// it allocates nothing.
#[derive(Debug)]
pub struct ReadToFuture<S: Shim> {
    fence: Fence<S>,
    buffer: Option<HostBuffer>,
    /// Where the device copies a staged read (pinned memory): copied into `buffer` once the
    /// fence passed.
    staged: Option<HostBuffer>,
    held: Option<Binding>,
}

impl<S: Shim> ReadToFuture<S> {
    /// The future of a read into `buffer` fenced by `fence`, holding `held` meanwhile; its error
    /// (the buffer released or leaked) when the fence could not be recorded.
    pub(super) fn new(
        fence: Fence<S>,
        buffer: HostBuffer,
        staged: Option<HostBuffer>,
        held: Binding,
    ) -> Result<Self, ServerError> {
        let mut future = Self {
            fence,
            buffer: Some(buffer),
            staged,
            held: Some(held),
        };
        if !future.fence.recorded() {
            let outcome = future.fence.wait();
            future.finish(outcome)?;
        }
        Ok(future)
    }

    /// Gives the buffer back once the device is done with it (a staged read's bytes copied into
    /// it when the fence passed); leaks both buffers (and the binding) when the device may not
    /// be done (`None`), or hands them to the stream's drop queue when the shim refused to wait
    /// for now (`None`).
    fn release(&mut self, outcome: FenceOutcome) -> Option<HostBuffer> {
        if let FenceOutcome::Refused(_) = outcome {
            // As `ReadFuture::release`: the drop queue's next fence covers them instead.
            self.orphan();
            return None;
        }
        let (buffer, staged, held) = (self.buffer.take(), self.staged.take(), self.held.take());
        let (buffer, staged) = settle(outcome, (buffer, staged), held)?;
        let mut buffer = buffer?;
        if let (FenceOutcome::Passed, Some(staged)) = (outcome, staged) {
            let (dst, src) = (buffer.as_mut_slice(), staged.as_slice());
            let len = dst.len().min(src.len());
            // SAFETY: both hold at least `len` bytes and are separate buffers; the device is
            // done with the staging buffer (its fence passed).
            unsafe {
                self.fence
                    .shim
                    .host_copy(dst.as_mut_ptr(), src.as_ptr(), len, HostCopy::Unstage)
            };
        }
        Some(buffer)
    }

    /// As [`ReadFuture`]'s: the buffers and binding go to the stream's drop queue without a wait
    /// (a stream of the device records).
    fn orphan(&mut self) {
        self.fence.give_up();
        let buffers = self
            .buffer
            .take()
            .into_iter()
            .chain(self.staged.take())
            .collect();
        let held = self.held.take().into_iter().collect();
        self.fence.ledger.orphan((self.fence.stream, buffers, held));
    }

    /// [`Self::release`], then the buffer or the fence's error.
    fn finish(&mut self, outcome: FenceOutcome) -> Result<HostBuffer, ServerError> {
        let buffer = self.release(outcome);
        self.fence.answer(outcome)?;
        // A passed fence released the buffer: `None` only after an outcome `answer` refused.
        Ok(buffer.unwrap_or_else(|| HostBuffer::from_vec(Vec::new())))
    }

    /// Blocks until the copy landed and returns the buffer, filled.
    ///
    /// # Errors
    ///
    /// As [`ReadFuture::wait`]; the buffer is then dropped (or leaked), or, while a stream of the
    /// device records, given up without a wait ([`Validation::Recording`]).
    pub fn wait(mut self) -> Result<HostBuffer, ServerError> {
        if self.fence.blocked() {
            self.orphan();
            return Err(Validation::Recording {
                op: "ReadToFuture::wait",
            }
            .into());
        }
        let outcome = self.fence.wait();
        self.finish(outcome)
    }
}

impl<S: Shim> Future for ReadToFuture<S>
where
    S::Event: Unpin,
{
    type Output = Result<HostBuffer, ServerError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        this.fence.poll_task(cx).map(|outcome| this.finish(outcome))
    }
}

impl<S: Shim> Drop for ReadToFuture<S> {
    fn drop(&mut self) {
        if self.fence.blocked() {
            self.orphan();
        } else if self.fence.pending() {
            // As a dropped `ReadFuture`: wait, then release or leak as a completed read would.
            let outcome = self.fence.wait();
            drop(self.release(outcome));
            self.fence.record(outcome);
        }
    }
}

/// Resolves once everything enqueued before it on its stream has run.
#[derive(Debug)]
pub struct SyncFuture<S: Shim> {
    fence: Fence<S>,
}

impl<S: Shim> SyncFuture<S> {
    /// Blocks until the stream reached the fence.
    ///
    /// # Errors
    ///
    /// A device fault the fence reveals; [`Validation::Recording`] while a stream of the device
    /// records (nothing is waited for).
    pub fn wait(mut self) -> Result<(), ServerError> {
        if self.fence.blocked() {
            self.fence.give_up();
            return Err(Validation::Recording {
                op: "SyncFuture::wait",
            }
            .into());
        }
        let outcome = self.fence.wait();
        self.fence.answer(outcome)
    }
}

impl<S: Shim> Future for SyncFuture<S>
where
    S::Event: Unpin,
{
    type Output = Result<(), ServerError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        this.fence
            .poll_task(cx)
            .map(|outcome| this.fence.answer(outcome))
    }
}

impl<S: Shim> Command<'_, S> {
    /// A fence recorded now on this stream, for a future.
    pub(super) fn fence(&mut self) -> Fence<S> {
        let (shim, s) = self.parts();
        let recorded = shim.record_event(&s.raw);
        let mark = s.mark();
        let recorded = recorded.map_err(|e| self.device.ledger.call_failed(e));
        Fence::new(
            Arc::clone(&self.device.shim),
            recorded,
            self.device.ledger.clone(),
            self.device.capture.flag(),
            self.stream,
            mark,
        )
    }

    /// A future that resolves once everything enqueued on this stream so far has run.
    ///
    /// # Errors
    ///
    /// [`ServerError::DeviceLost`], [`ServerError::StreamFaulted`], a fault kept for this
    /// stream's next sync, [`Validation::Recording`], the shim's refusal to record the fence.
    pub fn sync(&mut self) -> Result<SyncFuture<S>, ServerError> {
        self.begin()?;
        self.device.ledger.take_deferred(self.stream)?;
        self.refuse_while_recording("sync")?;
        let mut fence = self.fence();
        if !fence.recorded() {
            let outcome = fence.wait();
            fence.answer(outcome)?;
        }
        Ok(SyncFuture { fence })
    }
}
