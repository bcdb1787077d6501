//! The fault ledger: what a fence told the core, and what the core remembers of it.
//!
//! Owns the one decision of what a shim's answer at a fence means ([`FenceOutcome::of`]), the
//! record of which streams ran failed work and whether the device is lost (the ledger), and
//! the turning of both into the caller's error. Every path that waits for or polls a fence (the
//! drop queue, the read and sync futures, reclaim, teardown) gets a [`FenceOutcome`] and matches
//! on it; nothing else in the core looks at a [`Fault`] of a fence.
//!
//! Shared with the futures, it also says whether a stream records (no fence may be waited for
//! then) and keeps what a future could not wait for meanwhile, for the device to queue.
//!
//! Does not own the fences themselves (streams and the drop queue record them) nor the failure
//! records of data (`failure.rs`: a refused enqueue marks the bytes it would have written).
//!
//! # The five outcomes of a fence
//!
//! | outcome | the device is done with what the fence covered | the stream | the caller |
//! |---|---|---|---|
//! | [`FenceOutcome::Passed`] | yes | unchanged | `Ok` (unless the ledger already holds a fault for the stream) |
//! | [`FenceOutcome::PassedOverFailedWork`] | yes | faulted for good | [`ServerError::StreamFaulted`] |
//! | [`FenceOutcome::Refused`] | not asked: the fence stands, what it covers is kept for a later wait | unchanged | [`ServerError::Device`] (nothing when no caller waits) |
//! | [`FenceOutcome::Unknown`] | maybe not: what it covered is leaked | unchanged | [`ServerError::Device`] |
//! | [`FenceOutcome::DeviceLost`] | yes: nothing runs again | the device is lost | [`ServerError::DeviceLost`] |

use crate::attention::Attention;
use crate::error::{DriverError, Fault, ServerError};
use crate::host::HostBuffer;
use crate::memory::Binding;
use crate::shim::Shim;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicBool, Ordering};

/// What a fence (an event waited for or polled) says about the work it covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum FenceOutcome {
    /// Everything before the fence ran.
    Passed,
    /// The fence completed, but work before it failed while it ran ([`Fault::WorkFailed`]): the
    /// device is done with what the fence covered, and the stream can no longer be trusted.
    PassedOverFailedWork(DriverError),
    /// The shim refused to wait for the fence now, without doing anything ([`Fault::Busy`]: on
    /// CUDA, a stream of the process records a graph): the fence still stands, and what it
    /// covers is kept for a later wait (a query never answers it: a refused query is "not
    /// yet"). Only teardown, which cannot wait later, keeps the memory for good, as for
    /// [`Self::Unknown`].
    Refused(DriverError),
    /// The wait or query failed in a way that says nothing about completion (or the fence could
    /// not be recorded): the device may still use what the fence was to cover.
    Unknown(DriverError),
    /// The device is lost: nothing will run on it again, so nothing it held is in use.
    DeviceLost(DriverError),
}

impl FenceOutcome {
    /// The one place a shim's answer at a fence is read: a wait's result turned into an outcome.
    /// (A fence that could not even be recorded is [`Self::unrecorded`].)
    pub const fn of(answer: Result<(), DriverError>) -> Self {
        match answer {
            Ok(()) => Self::Passed,
            Err(e) => match e.fault {
                Fault::WorkFailed => Self::PassedOverFailedWork(e),
                Fault::DeviceLost => Self::DeviceLost(e),
                Fault::Busy => Self::Refused(e),
                Fault::OutOfMemory | Fault::TooBig | Fault::Unsupported | Fault::Failed => {
                    Self::Unknown(e)
                }
            },
        }
    }

    /// The outcome of a fence that could not be recorded: nothing covers the work before it, so
    /// whatever the shim answered (even the fault of earlier work), the device may still be using
    /// what the fence was to cover. Only a lost device says otherwise, and a refusal for now
    /// ([`Fault::Busy`]) asks the caller to keep what the fence was to cover for a later one.
    pub const fn unrecorded(e: DriverError) -> Self {
        match e.fault {
            Fault::DeviceLost => Self::DeviceLost(e),
            Fault::Busy => Self::Refused(e),
            Fault::WorkFailed
            | Fault::OutOfMemory
            | Fault::TooBig
            | Fault::Unsupported
            | Fault::Failed => Self::Unknown(e),
        }
    }

    /// Blocks until `event` completes.
    pub fn wait<S: Shim>(shim: &S, event: &S::Event) -> Self {
        Self::of(shim.event_wait(event))
    }

    /// Whether `event` has completed, without blocking: `None` while it has not, or while the
    /// shim refuses to ask ([`Fault::Busy`]). A fault of work that ran is confirmed by a wait
    /// first, so what the fence covered is released only once the fence really completed,
    /// whatever the shim answered the query.
    pub fn query<S: Shim>(shim: &S, event: &S::Event) -> Option<Self> {
        match shim.event_query(event) {
            Ok(true) => Some(Self::Passed),
            Ok(false) => None,
            // Refused for now, nothing asked of the fence: not known to have completed yet.
            Err(e) if e.fault == Fault::Busy => None,
            Err(e) if e.fault == Fault::WorkFailed => match shim.event_wait(event) {
                // The confirming wait refused for now: not known to have completed yet either.
                Err(w) if w.fault == Fault::Busy => None,
                waited => Some(Self::of(waited.and(Err(e)))),
            },
            Err(e) => Some(Self::of(Err(e))),
        }
    }

    /// Records a fence on `stream` and waits for it: everything enqueued so far.
    pub fn sync<S: Shim>(shim: &S, stream: &S::Stream) -> Self {
        match shim.record_event(stream) {
            Ok(event) => Self::wait(shim, &event),
            Err(e) => Self::unrecorded(e),
        }
    }

    /// Whether the device is done with what the fence covered, so it may be released.
    pub const fn completed(&self) -> bool {
        match self {
            Self::Passed | Self::PassedOverFailedWork(_) | Self::DeviceLost(_) => true,
            Self::Refused(_) | Self::Unknown(_) => false,
        }
    }

    /// The graver of two outcomes, for a sequence of fences such as a drain: a lost device, then
    /// an unknown wait, then a refused one, then failed work. An unknown or refused wait outranks
    /// failed work so the sequence never claims to have completed when one of its fences did not
    /// (teardown frees pages on a completed sync); the failed work is not lost, as it is sticky:
    /// every later fence of the stream reports it again (the shim contract's second rule).
    pub const fn and(self, other: Self) -> Self {
        const fn rank(o: &FenceOutcome) -> u8 {
            match o {
                FenceOutcome::Passed => 0,
                FenceOutcome::PassedOverFailedWork(_) => 1,
                FenceOutcome::Refused(_) => 2,
                FenceOutcome::Unknown(_) => 3,
                FenceOutcome::DeviceLost(_) => 4,
            }
        }
        if rank(&other) > rank(&self) {
            other
        } else {
            self
        }
    }
}

/// Where a fence was recorded on its stream: what the ledger needs to attribute its outcome.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct FenceMark {
    /// The stream's cursor when the fence was recorded: the work of every earlier command is
    /// behind it. Zero for "no fence" (nothing is learnt from it).
    pub cursor: u64,
    /// The last kernel launched on the stream before the fence.
    pub kernel: Option<&'static str>,
}

/// A fence's outcome, with where the fence was recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fenced {
    /// What the fence said.
    pub outcome: FenceOutcome,
    /// Where it was recorded.
    pub mark: FenceMark,
}

impl Fenced {
    /// Nothing was waited for: nothing is learnt.
    pub const NOTHING: Self = Self {
        outcome: FenceOutcome::Passed,
        mark: FenceMark {
            cursor: 0,
            kernel: None,
        },
    };

    /// The graver of two fences (see [`FenceOutcome::and`]), `later` on a tie.
    pub fn and(self, later: Self) -> Self {
        if self.outcome.and(later.outcome) == later.outcome {
            later
        } else {
            self
        }
    }
}

/// A stream whose work failed while it ran, as the caller's error reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StreamFault {
    /// The stream whose work failed.
    pub stream: usize,
    /// What its fence reported.
    pub cause: DriverError,
    /// The last kernel launched on the stream before the fence that reported the fault.
    pub kernel: Option<&'static str>,
}

impl StreamFault {
    fn error(self) -> ServerError {
        ServerError::StreamFaulted {
            stream: self.stream as u32,
            cause: self.cause,
            kernel: self.kernel,
        }
    }
}

#[derive(Debug, Default)]
struct StreamEntry {
    /// Its own work failed while it ran: sticky. A stream ordered after the failed work hears of
    /// it from its own fences (rule 3 of the shim contract); one ordered after earlier work only
    /// is not affected.
    failed: Option<StreamFault>,
    /// An internal flush met a fence of unknown outcome after an enqueue that succeeded: reported
    /// once, at the stream's next read or sync (where asynchronous faults surface).
    deferred: Option<DriverError>,
    /// The work of every command up to this cursor completed cleanly: a fence recorded after it
    /// passed (failed work is reported by every fence after it, so it lies beyond).
    clean_through: u64,
}

#[derive(Debug, Default)]
struct Ledger {
    device: Option<DriverError>,
    streams: Vec<StreamEntry>,
}

impl Ledger {
    fn entry(&mut self, stream: usize) -> &mut StreamEntry {
        if self.streams.len() <= stream {
            self.streams.resize_with(stream + 1, StreamEntry::default);
        }
        &mut self.streams[stream]
    }

    fn stream_fault(&self, stream: usize) -> Option<StreamFault> {
        self.streams.get(stream).and_then(|s| s.failed)
    }
}

/// The device's fault state: whether it is lost, which streams ran failed work, how far each
/// stream's work is known to have completed cleanly, and the faults kept for a stream's next read
/// or sync. Shared (cheaply cloned) with the futures of reads and syncs, which may be the ones to
/// find out.
#[derive(Debug, Clone, Default)]
pub(crate) struct FaultLedger {
    shared: Arc<Shared>,
    /// Whether a fault is on record (until then every check passes without the lock: the path
    /// every operation takes), in the device's attention word beside its bookkeeping request.
    attention: Arc<Attention>,
}

#[derive(Debug, Default)]
struct Shared {
    ledger: spin::Mutex<Ledger>,
    /// What futures could not wait for while a stream recorded: `(stream, buffers, bindings)`,
    /// handed to that stream's drop queue at the device's next operation.
    orphans: spin::Mutex<Vec<Orphan>>,
    has_orphans: AtomicBool,
}

/// What a read's future held when it could not wait: its stream, host buffers and bindings.
pub(crate) type Orphan = (usize, Vec<HostBuffer>, Vec<Binding>);

impl Drop for Shared {
    /// What futures left after the device's teardown took the last of it (a future that could
    /// not wait, dropped after its device) was never covered by a fence that passed: the device
    /// may still write those buffers, so they are leaked, not freed.
    fn drop(&mut self) {
        let left = core::mem::take(self.orphans.get_mut());
        if !left.is_empty() {
            warn!(
                "{} reads could not be waited for before their device went: leaking their buffers",
                left.len()
            );
            core::mem::forget(left);
        }
    }
}

impl core::ops::Deref for Shared {
    type Target = spin::Mutex<Ledger>;

    fn deref(&self) -> &Self::Target {
        &self.ledger
    }
}

impl FaultLedger {
    /// The device's attention word, for what else asks for its bookkeeping (its streams'
    /// managers).
    pub(crate) fn attention(&self) -> Arc<Attention> {
        Arc::clone(&self.attention)
    }

    /// Whether bookkeeping was asked for since the last call (see [`Attention::answer`]).
    #[inline]
    pub(crate) fn bookkeeping_due(&self) -> bool {
        self.attention.answer()
    }

    /// Whether no bookkeeping is due and no fault is on record (one load): an operation's
    /// begin has nothing to do.
    #[inline]
    pub(crate) fn quiet(&self) -> bool {
        self.attention.quiet()
    }

    /// Whether no stream's work failed and the device is not lost: every check passes.
    #[inline]
    pub(crate) fn clean(&self) -> bool {
        !self.attention.faulted()
    }

    /// Records that a check may now fail (a stream's work failed, or the device is lost).
    fn mark_faulted(&self) {
        self.attention.mark_faulted();
    }

    /// Keeps what a future could not wait for, for its stream's drop queue.
    pub fn orphan(&self, orphan: Orphan) {
        self.shared.orphans.lock().push(orphan);
        self.shared.has_orphans.store(true, Ordering::Release);
        self.attention.ring();
    }

    /// Whether a future left something for the device since the last [`Self::take_orphans`]
    /// (one atomic load: the path every operation takes).
    pub fn has_orphans(&self) -> bool {
        self.shared.has_orphans.load(Ordering::Acquire)
    }

    /// Takes what futures could not wait for (cheap when nothing was).
    pub fn take_orphans(&self) -> Vec<Orphan> {
        if !self.shared.has_orphans.swap(false, Ordering::AcqRel) {
            return Vec::new();
        }
        core::mem::take(&mut *self.shared.orphans.lock())
    }

    /// The fault that lost the device, if any.
    pub fn device_lost(&self) -> Option<DriverError> {
        if self.clean() {
            return None;
        }
        self.shared.lock().device
    }

    /// Fails fast when the device is lost.
    pub fn check_device(&self) -> Result<(), ServerError> {
        match self.device_lost() {
            Some(cause) => Err(ServerError::DeviceLost { cause }),
            None => Ok(()),
        }
    }

    /// Fails fast when the device is lost or `stream` ran failed work.
    pub fn check(&self, stream: usize) -> Result<(), ServerError> {
        if self.clean() {
            return Ok(());
        }
        let l = self.shared.lock();
        if let Some(cause) = l.device {
            return Err(ServerError::DeviceLost { cause });
        }
        match l.stream_fault(stream) {
            Some(f) => Err(f.error()),
            None => Ok(()),
        }
    }

    /// Whether what `stream` wrote may be used: `Ok` when its work up to command `cursor` is
    /// known to have completed cleanly, or when the stream has no fault on record.
    pub fn check_stream_at(&self, stream: usize, cursor: u64) -> Result<(), ServerError> {
        if self.clean() {
            return Ok(());
        }
        let l = self.shared.lock();
        match l.streams.get(stream) {
            Some(s) if cursor > s.clean_through => s.failed.map_or(Ok(()), |f| Err(f.error())),
            _ => Ok(()),
        }
    }

    /// Whether `stream`'s work up to command `cursor` is known to have completed cleanly (a
    /// device-side wait for it would be a no-op).
    pub fn clean_through(&self, stream: usize, cursor: u64) -> bool {
        let l = self.shared.lock();
        l.streams
            .get(stream)
            .is_some_and(|s| cursor <= s.clean_through)
    }

    /// Records a fence outcome of `stream` that its caller waited for, and returns the caller's
    /// result. A fence that passed still fails when the stream is known to be faulted: another
    /// caller may have heard of the fault first.
    pub fn answer(&self, stream: usize, fenced: Fenced) -> Result<(), ServerError> {
        let mut l = self.shared.lock();
        match fenced.outcome {
            FenceOutcome::Passed => {
                let entry = l.entry(stream);
                // The fence's own command may have enqueued more after it: only the earlier
                // commands are wholly behind it.
                let behind = fenced.mark.cursor.saturating_sub(1);
                entry.clean_through = entry.clean_through.max(behind);
                entry.failed.map_or(Ok(()), |f| Err(f.error()))
            }
            FenceOutcome::PassedOverFailedWork(cause) => {
                self.mark_faulted();
                let f = *l.entry(stream).failed.get_or_insert(StreamFault {
                    stream,
                    cause,
                    kernel: fenced.mark.kernel,
                });
                Err(f.error())
            }
            FenceOutcome::Refused(e) | FenceOutcome::Unknown(e) => Err(ServerError::Device(e)),
            FenceOutcome::DeviceLost(cause) => {
                self.mark_faulted();
                l.device.get_or_insert(cause);
                Err(ServerError::DeviceLost { cause })
            }
        }
    }

    /// Records a fence outcome of `stream` met by the core's own bookkeeping (a flush after an
    /// enqueue that succeeded, reclaim on another stream, a future dropped unwaited, teardown):
    /// only a lost device fails the caller. Failed work taints the stream (its next operation
    /// fails); an unknown outcome is kept for the stream's next read or sync (a future dropped
    /// unwaited passes on failed work and a lost device only: what its unknown fence covered
    /// was leaked where it was met, see `command/futures.rs`). A refused wait is nothing to
    /// report: what its fence covers is still queued, and a later wait settles it.
    pub fn defer(&self, stream: usize, fenced: Fenced) -> Result<(), ServerError> {
        match fenced.outcome {
            FenceOutcome::Passed | FenceOutcome::PassedOverFailedWork(_) => {
                // Recorded; a fault is the stream's from now on, not this call's.
                let _ = self.answer(stream, fenced);
                Ok(())
            }
            FenceOutcome::Refused(_) => Ok(()),
            FenceOutcome::Unknown(e) => {
                self.shared.lock().entry(stream).deferred.get_or_insert(e);
                Ok(())
            }
            FenceOutcome::DeviceLost(_) => self.answer(stream, fenced),
        }
    }

    /// Returns (once) a fault [`Self::defer`] kept for `stream`.
    pub fn take_deferred(&self, stream: usize) -> Result<(), ServerError> {
        let mut l = self.shared.lock();
        match l.streams.get_mut(stream).and_then(|s| s.deferred.take()) {
            Some(e) => Err(ServerError::Device(e)),
            None => Ok(()),
        }
    }

    /// Records the failure of a device call that is not a fence (a copy, a launch, an event
    /// record, a stream wait); returns it for `?`. Only a lost device is remembered: a refused
    /// call changed nothing on the device.
    pub fn call_failed(&self, e: DriverError) -> DriverError {
        if e.loses_device() {
            let mut l = self.shared.lock();
            self.mark_faulted();
            l.device.get_or_insert(e);
        }
        e
    }
}

#[cfg(test)]
#[path = "fault_tests.rs"]
mod tests;
