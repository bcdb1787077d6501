//! Capture: recording a stream's work into a [`Graph`] and replaying it.
//!
//! Owns the capture state of a stream (`CaptureState`, whose transitions are the only way to
//! change it), the token a caller holds for a recording in progress ([`Recording`]), what a
//! recording collects while it is open (`window.rs`) and the graph it seals into, with everything
//! the graph keeps alive (`graph.rs`). Does not own the operations (`command/capture.rs` begins,
//! ends and replays; the other operations ask the state what a recording forbids), cross-stream
//! order (`order.rs`), nor the drop queue (which holds a graph's resources after each replay).
//!
//! # The cycle
//!
//! ```text
//!            begin_capture                  end_capture (sealed)
//!   Idle ───────────────────▶ Recording ───────────────────────────▶ Idle  + Graph
//!    ▲                          │   │
//!    │  end_capture (reports)   │   │ a step fails (a reservation needing a page,
//!    └──────── Discarded ◀──────┘   │ a refused copy or launch): the shim's capture
//!    ▲                              │ is ended and thrown away at once
//!    └──────────────────────────────┘ the Recording token dropped, or the device dropped:
//!                                     aborted (nothing marked)
//! ```
//!
//! One stream of a device records at a time. While it records:
//!
//! - **No device page is allocated or freed, on any stream.** Reservations are served from room
//!   already held ([`PageUpdate::Forbidden`](crate::memory::PageUpdate::Forbidden) everywhere);
//!   one that needs a page fails with
//!   [`IoError::PageUpdateForbidden`](crate::IoError::PageUpdateForbidden) naming the size and the
//!   room held, and on the recording stream it discards the recording. Hold room ahead with
//!   [`Command::hold`](crate::Command::hold) or a warm-up run. Drop queues keep what their fences
//!   release (pages, host buffers, graphs) until the recording ends; pinned staging serves only
//!   from pinned pages already held (else the heap). Cleanup and reclaim are refused.
//! - **Nothing waits on the recording.** Reads, syncs and drop-queue flushes or polls on the
//!   recording stream are refused ([`Validation::Recording`](crate::Validation::Recording)); no
//!   fence is recorded inside the window, so none can be waited on. Work on another stream that
//!   uses memory the recording uses is refused
//!   ([`CaptureError::RecordedElsewhere`]): it
//!   would be ordered after recorded work, which has not run. Other streams' use of the recording
//!   stream's other memory waits for the work enqueued before the recording began (an event
//!   recorded just before it).
//! - **What a recording touches, it keeps.** Every allocation a recorded copy or launch uses is
//!   bound to the recording (so one freed inside it goes back only when the graph is gone), and
//!   host bytes of recorded uploads are owned by it (pinned slices where held, else the heap;
//!   the caller's buffer may go at once). Sealing guards every page the recording touched.
//!
//! A [`Graph`] replays on any stream ([`Command::replay`](crate::Command::replay)), ordered after
//! other streams' work on its memory like any operation, with the failure rule (a replay whose
//! input carries a failure is skipped and its outputs carry it). Each replay hands the graph's
//! resources to that stream's drop queue, so they outlive the replay's fence; dropping the graph
//! releases them once the last of those fences passed.

mod device;
mod graph;
mod window;

pub use graph::{Graph, Recorded};
pub(crate) use graph::{GraphReturns, Owned};
pub(crate) use window::{Span, Window};

use crate::error::{CaptureError, ServerError};
use crate::shim::Shim;
use alloc::boxed::Box;
use alloc::sync::Arc;
use core::sync::atomic::{AtomicBool, Ordering};

/// Where a stream is in the capture cycle (see the [module](self) documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum CapturePhase {
    /// Not recording: every operation runs as it is enqueued.
    Idle,
    /// Work enqueued on the stream is recorded into a graph, not run.
    Recording,
    /// The recording failed and was thrown away; `end_capture` reports why.
    Discarded,
}

/// A recording in progress, returned by [`Command::begin_capture`](crate::Command::begin_capture)
/// and given back to [`Command::end_capture`](crate::Command::end_capture). Dropping it instead
/// ends the recording cleanly: the device's next command aborts it (nothing is kept, nothing is
/// marked failed). On CUDA a recording must end on the thread that began it, so drop it there too.
#[derive(Debug)]
pub struct Recording {
    pub(crate) device: u32,
    pub(crate) stream: u32,
    pub(crate) abandoned: Arc<AtomicBool>,
    pub(crate) ended: bool,
}

impl Recording {
    /// The stream that records.
    pub fn stream(&self) -> crate::StreamId {
        crate::StreamId(self.stream)
    }
}

impl Drop for Recording {
    fn drop(&mut self) {
        if !self.ended {
            self.abandoned.store(true, Ordering::Release);
        }
    }
}

enum State<S: Shim> {
    Idle,
    Recording(Box<Window<S>>),
    Discarded {
        reason: ServerError,
        abandoned: Arc<AtomicBool>,
    },
}

/// The capture state of one stream: the phase and, while recording, what the recording
/// collected. Its methods are the transitions of the cycle in the [module](self) documentation;
/// nothing else changes it.
pub(crate) struct CaptureState<S: Shim> {
    state: State<S>,
}

impl<S: Shim> core::fmt::Debug for CaptureState<S> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_tuple("CaptureState").field(&self.phase()).finish()
    }
}

impl<S: Shim> Default for CaptureState<S> {
    fn default() -> Self {
        Self { state: State::Idle }
    }
}

impl<S: Shim> CaptureState<S> {
    /// The phase.
    pub fn phase(&self) -> CapturePhase {
        match self.state {
            State::Idle => CapturePhase::Idle,
            State::Recording(_) => CapturePhase::Recording,
            State::Discarded { .. } => CapturePhase::Discarded,
        }
    }

    /// Whether the stream records.
    pub fn is_recording(&self) -> bool {
        matches!(self.state, State::Recording(_))
    }

    /// What the open recording collected so far.
    pub fn window(&self) -> Option<&Window<S>> {
        match &self.state {
            State::Recording(w) => Some(w),
            _ => None,
        }
    }

    /// What the open recording collected so far, to add to it.
    pub fn window_mut(&mut self) -> Option<&mut Window<S>> {
        match &mut self.state {
            State::Recording(w) => Some(w),
            _ => None,
        }
    }

    /// Whether the caller dropped the [`Recording`] of the open (or discarded) recording.
    pub fn abandoned(&self) -> bool {
        match &self.state {
            State::Idle => false,
            State::Recording(w) => w.abandoned.load(Ordering::Acquire),
            State::Discarded { abandoned, .. } => abandoned.load(Ordering::Acquire),
        }
    }

    /// Idle → Recording. Refused (and nothing changes) from any other phase.
    pub fn begin(&mut self, stream: u32, window: Window<S>) -> Result<(), CaptureError> {
        match self.state {
            State::Idle => {
                self.state = State::Recording(Box::new(window));
                Ok(())
            }
            _ => Err(CaptureError::AnotherRecords {
                stream,
                recording: stream,
            }),
        }
    }

    /// Recording → Discarded, returning what the recording collected; `None` (and nothing
    /// changes) from any other phase.
    pub fn discard(&mut self, stream: u32, reason: ServerError) -> Option<Box<Window<S>>> {
        let abandoned = Arc::clone(&self.window()?.abandoned);
        let reason = ServerError::Capture(CaptureError::Discarded {
            stream,
            reason: Box::new(reason),
        });
        match core::mem::replace(&mut self.state, State::Discarded { reason, abandoned }) {
            State::Recording(window) => Some(window),
            // Unreachable: the window above was an open recording's.
            State::Discarded { .. } | State::Idle => None,
        }
    }

    /// Recording → Idle with what it collected, or Discarded → Idle with the reason it was
    /// discarded. From Idle: refused, nothing changes.
    pub fn end(&mut self, stream: u32) -> Result<Box<Window<S>>, ServerError> {
        match core::mem::replace(&mut self.state, State::Idle) {
            State::Recording(w) => Ok(w),
            State::Discarded { reason, .. } => Err(reason),
            State::Idle => Err(CaptureError::NotRecording { stream }.into()),
        }
    }

    /// Any phase → Idle; returns what an open recording collected.
    pub fn abort(&mut self) -> Option<Box<Window<S>>> {
        match core::mem::replace(&mut self.state, State::Idle) {
            State::Recording(w) => Some(w),
            State::Discarded { .. } | State::Idle => None,
        }
    }

    /// Fails with the reason while the stream's recording is discarded and not yet ended.
    pub fn check_open(&self) -> Result<(), ServerError> {
        match &self.state {
            State::Discarded { reason, .. } => Err(reason.clone()),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drop_queue::{DropItem, DropPolicy, DropQueue};
    use crate::fault::FenceMark;
    use crate::host::HostBuffer;
    use crate::test_shim::TestShim;

    #[test]
    fn a_frozen_drop_queue_records_and_waits_for_no_fence() {
        let shim = TestShim::new(1 << 30, 32, 1 << 28);
        let mut q = DropQueue::<TestShim>::new(DropPolicy::default());
        q.push(DropItem::Host(HostBuffer::zeroed(4)));
        q.set_frozen(true);
        q.drain(&shim, &(), FenceMark::default());
        assert!(q.poll(&shim, &(), FenceMark::default()).is_none());
        assert_eq!(shim.events_recorded.get(), 0);
        assert_eq!(q.staged_len(), 1);
        q.set_frozen(false);
        q.drain(&shim, &(), FenceMark::default());
        assert_eq!(q.stats().items_released, 1);
    }

    fn window(abandoned: &Arc<AtomicBool>) -> Window<TestShim> {
        Window::new("g", 1, None, Arc::clone(abandoned))
    }

    #[test]
    fn transitions_follow_the_cycle_and_refusals_change_nothing() {
        let flag = Arc::new(AtomicBool::new(false));
        let mut c = CaptureState::<TestShim>::default();
        assert!(c.end(0).is_err(), "idle: nothing to end");
        assert_eq!(c.phase(), CapturePhase::Idle);
        c.begin(0, window(&flag)).unwrap();
        assert!(c.begin(0, window(&flag)).is_err());
        assert_eq!(c.phase(), CapturePhase::Recording);
        assert!(c.end(0).is_ok());
        assert_eq!(c.phase(), CapturePhase::Idle);

        c.begin(0, window(&flag)).unwrap();
        let reason: ServerError = crate::Validation::Recording { op: "x" }.into();
        assert!(c.discard(0, reason).is_some());
        assert!(
            c.discard(0, crate::Validation::ReadOnlyDestination.into())
                .is_none()
        );
        assert_eq!(c.phase(), CapturePhase::Discarded);
        assert!(c.check_open().is_err());
        assert!(!c.abandoned());
        flag.store(true, Ordering::Release);
        assert!(
            c.abandoned(),
            "the token of a discarded recording is still watched"
        );
        let e = c.end(0).unwrap_err();
        assert!(matches!(
            e,
            ServerError::Capture(CaptureError::Discarded { stream: 0, .. })
        ));
        assert_eq!(c.phase(), CapturePhase::Idle);
        assert!(c.check_open().is_ok());

        c.begin(0, window(&flag)).unwrap();
        assert!(c.abort().is_some());
        assert_eq!(c.phase(), CapturePhase::Idle);
    }
}
