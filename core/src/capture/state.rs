//! The capture state of a device: the one place that knows whether a recording is open, on which
//! stream, and what it has collected.
//!
//! Owns the state machine of the [module](super) documentation's cycle ([`CaptureState`], whose
//! methods are its transitions: nothing else changes it), the [`RecordingFlag`] it keeps in step
//! (the drop queues and futures read it), the stance each operation asks it for
//! ([`CaptureState::stance`]), and the graphs callers dropped, let go only outside a recording.
//! Makes no device call: the caller ends the shim's capture where a transition says so.

use super::CapturePhase;
use super::flag::{LowerOnDrop, RecordingFlag};
use super::graph::GraphReturns;
use super::window::Window;
use crate::error::{CaptureError, ServerError};
use crate::host::{Deferral, Unregisters};
use crate::shim::Shim;
use alloc::boxed::Box;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicBool, Ordering};

enum State<S: Shim> {
    Idle,
    Recording {
        stream: usize,
        window: Box<Window<S>>,
    },
    Discarded {
        stream: usize,
        reason: ServerError,
        abandoned: Arc<AtomicBool>,
    },
}

/// What an operation on a stream does about the device's recording.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stance {
    /// No stream records: run.
    Run,
    /// This stream records: record, do not run.
    Record,
    /// Another stream (this index) records: run, but wait for nothing on the host and touch
    /// nothing the recording uses.
    OtherRecords(usize),
}

/// The capture state of a device. See the module documentation.
pub(crate) struct CaptureState<S: Shim> {
    state: State<S>,
    flag: RecordingFlag,
    returns: GraphReturns<S>,
    unregisters: Unregisters,
}

impl<S: Shim> core::fmt::Debug for CaptureState<S> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let (phase, stream) = match &self.state {
            State::Idle => (CapturePhase::Idle, None),
            State::Recording { stream, .. } => (CapturePhase::Recording, Some(*stream)),
            State::Discarded { stream, .. } => (CapturePhase::Discarded, Some(*stream)),
        };
        f.debug_struct("CaptureState")
            .field("phase", &phase)
            .field("stream", &stream)
            .finish_non_exhaustive()
    }
}

impl<S: Shim> Drop for CaptureState<S> {
    fn drop(&mut self) {
        // The device goes (its recording was aborted first): what waits here is undone now, and
        // a registration whose last buffer goes later is handed back and undone at once.
        self.unregisters.close();
    }
}

impl<S: Shim> Default for CaptureState<S> {
    fn default() -> Self {
        Self {
            state: State::Idle,
            flag: RecordingFlag::default(),
            returns: Arc::default(),
            unregisters: Arc::default(),
        }
    }
}

impl<S: Shim> CaptureState<S> {
    /// A read-only view of "a stream records", for drop queues and futures.
    pub fn flag(&self) -> RecordingFlag {
        self.flag.clone()
    }

    /// Where graphs dropped by their callers go.
    pub fn returns(&self) -> &GraphReturns<S> {
        &self.returns
    }

    /// What a registration of host memory needs to wait out a recording: its last drop inside
    /// one queues it here, undone by [`Self::release_dropped_graphs`].
    pub fn deferral(&self) -> Deferral {
        Deferral {
            recording: self.flag.clone(),
            queue: Arc::clone(&self.unregisters),
        }
    }

    /// The stream that records now, if one does.
    pub fn recording(&self) -> Option<usize> {
        match self.state {
            State::Recording { stream, .. } => Some(stream),
            _ => None,
        }
    }

    /// The stream whose recording is open (recording, or discarded and not yet ended).
    pub fn open(&self) -> Option<usize> {
        match self.state {
            State::Idle => None,
            State::Recording { stream, .. } | State::Discarded { stream, .. } => Some(stream),
        }
    }

    /// What an operation on `stream` does about the recording.
    pub fn stance(&self, stream: usize) -> Stance {
        match self.recording() {
            None => Stance::Run,
            Some(r) if r == stream => Stance::Record,
            Some(r) => Stance::OtherRecords(r),
        }
    }

    /// Where `stream` is in the cycle.
    pub fn phase(&self, stream: usize) -> CapturePhase {
        match &self.state {
            State::Recording { stream: s, .. } if *s == stream => CapturePhase::Recording,
            State::Discarded { stream: s, .. } if *s == stream => CapturePhase::Discarded,
            _ => CapturePhase::Idle,
        }
    }

    /// What the open recording collected so far.
    pub fn window(&self) -> Option<&Window<S>> {
        match &self.state {
            State::Recording { window, .. } => Some(window),
            _ => None,
        }
    }

    /// What the open recording collected so far, to add to it.
    pub fn window_mut(&mut self) -> Option<&mut Window<S>> {
        match &mut self.state {
            State::Recording { window, .. } => Some(window),
            _ => None,
        }
    }

    /// Whether no recording is open (nor discarded and not yet ended).
    #[inline]
    pub fn is_idle(&self) -> bool {
        matches!(self.state, State::Idle)
    }

    /// Whether the caller dropped the [`Recording`](super::Recording) of the open (or discarded)
    /// recording.
    pub fn abandoned(&self) -> bool {
        match &self.state {
            State::Idle => false,
            State::Recording { window, .. } => window.abandoned.load(Ordering::Acquire),
            State::Discarded { abandoned, .. } => abandoned.load(Ordering::Acquire),
        }
    }

    /// Fails with the reason while `stream`'s recording is discarded and not yet ended.
    pub fn check_open(&self, stream: usize) -> Result<(), ServerError> {
        match &self.state {
            State::Discarded {
                stream: s, reason, ..
            } if *s == stream => Err(reason.clone()),
            _ => Ok(()),
        }
    }

    /// Idle → Recording on `stream`. Refused (and nothing changes) while a recording is open.
    /// Raises the recording flag ahead of [`Self::begin`], before the shim's capture begins,
    /// so a future waited on another thread meanwhile does not wait on the host inside it;
    /// `begin_shim`'s error or panic lowers it again (nothing changed then). Idle only: with a
    /// recording open it changes nothing and returns `begin_shim`'s answer unasked for.
    pub fn announce<T, E>(&mut self, begin_shim: impl FnOnce() -> Result<T, E>) -> Result<T, E> {
        if self.open().is_some() {
            return begin_shim();
        }
        self.flag.set(true);
        // Lowered again unless the shim began: on its error, and on its panic.
        let lower = LowerOnDrop(&self.flag);
        let began = begin_shim();
        if began.is_ok() {
            core::mem::forget(lower);
        }
        began
    }

    pub fn begin(&mut self, stream: usize, window: Window<S>) -> Result<(), CaptureError> {
        if let Some(open) = self.open() {
            return Err(CaptureError::AnotherRecords {
                stream: stream as u32,
                recording: open as u32,
            });
        }
        self.state = State::Recording {
            stream,
            window: Box::new(window),
        };
        self.flag.set(true);
        Ok(())
    }

    /// Recording → Discarded when `stream` records, returning what the recording collected;
    /// `None` (and nothing changes) otherwise. `end_shim` ends the shim's capture as doomed
    /// between the state change and the flag's, so no future waits while the shim still records.
    pub fn discard(
        &mut self,
        stream: usize,
        reason: ServerError,
        end_shim: impl FnOnce(),
    ) -> Option<Box<Window<S>>> {
        if self.recording() != Some(stream) {
            return None;
        }
        let abandoned = Arc::clone(&self.window()?.abandoned);
        let reason = ServerError::Capture(CaptureError::Discarded {
            stream: stream as u32,
            reason: Box::new(reason),
        });
        let discarded = State::Discarded {
            stream,
            reason,
            abandoned,
        };
        let window = match core::mem::replace(&mut self.state, discarded) {
            State::Recording { window, .. } => Some(window),
            // Unreachable: `stream` was recording.
            State::Discarded { .. } | State::Idle => None,
        };
        let _lower = LowerOnDrop(&self.flag);
        end_shim();
        window
    }

    /// Recording → Idle with what it collected and what `end_shim` answered (it ends the shim's
    /// capture, before the flag drops), or Discarded → Idle with the reason it was discarded
    /// (`end_shim` is not called: the shim's capture ended then), for `stream`'s recording.
    /// Otherwise refused: nothing changes.
    pub fn end<R>(
        &mut self,
        stream: usize,
        end_shim: impl FnOnce() -> R,
    ) -> Result<(Box<Window<S>>, R), ServerError> {
        if self.open() != Some(stream) {
            return Err(CaptureError::NotRecording {
                stream: stream as u32,
            }
            .into());
        }
        match core::mem::replace(&mut self.state, State::Idle) {
            State::Recording { window, .. } => {
                let _lower = LowerOnDrop(&self.flag);
                let ended = end_shim();
                Ok((window, ended))
            }
            State::Discarded { reason, .. } => Err(reason),
            State::Idle => Err(CaptureError::NotRecording {
                stream: stream as u32,
            }
            .into()),
        }
    }

    /// Any phase → Idle: the recording is thrown away, nothing is marked failed. `end_shim` ends
    /// the shim's capture of the stream that was still recording, as doomed, before the flag
    /// drops; returns what that recording collected.
    pub fn abort(&mut self, end_shim: impl FnOnce(usize)) -> Option<Box<Window<S>>> {
        match core::mem::replace(&mut self.state, State::Idle) {
            State::Recording { stream, window } => {
                let _lower = LowerOnDrop(&self.flag);
                end_shim(stream);
                Some(window)
            }
            State::Discarded { .. } | State::Idle => None,
        }
    }

    /// Lets go of the graphs their callers dropped, and undoes the registrations of host memory
    /// whose last buffer went inside a recording, unless a stream records (the shim's graph must
    /// not be destroyed, nor host bytes unregistered, inside a recording). What replays still
    /// hold stays with them.
    pub fn release_dropped_graphs(&mut self) {
        if self.recording().is_some() {
            return;
        }
        let mut dropped = Vec::new();
        self.returns.drain_into(&mut dropped);
        drop(dropped);
        let mut waiting = Vec::new();
        self.unregisters.drain_into(&mut waiting);
        drop(waiting);
    }
}
