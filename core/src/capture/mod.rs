//! Capture: recording a stream's work into a [`Graph`] and replaying it.
//!
//! Owns the capture state of the device (`state.rs`: one state machine for the whole device,
//! whose transitions are the only way to change it, and the stance every operation asks it
//! for), the flag the drop queues and futures read (`flag.rs`), the token a caller holds for a
//! recording in progress ([`Recording`]), what a recording collects while it is open
//! (`window.rs`) and the graph it seals into, with everything the graph keeps alive
//! (`graph.rs`). Does not own the operations (`command/capture.rs` begins, ends and replays; the
//! engine asks the state's stance for every other operation), cross-stream order (`order.rs`),
//! nor the drop queue (which holds a graph's resources after each replay).
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
//!   ([`CaptureError::RecordedElsewhere`](crate::CaptureError::RecordedElsewhere)): it
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

mod flag;
mod graph;
mod state;
mod window;

pub use flag::RecordingFlag;
pub(crate) use graph::Owned;
pub use graph::{Graph, Recorded};
pub(crate) use state::{CaptureState, Stance};
pub(crate) use window::{Span, Window};

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
/// ends the recording cleanly: the device's next command, or the next operation of the command
/// that began it, aborts it (nothing is kept, nothing is marked failed), on the thread that
/// makes that call. On CUDA a recording must end on the thread that began it: make that call
/// there.
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drop_queue::{DropItem, DropPolicy, DropQueue};
    use crate::error::{CaptureError, ServerError};
    use crate::fault::FenceMark;
    use crate::host::HostBuffer;
    use crate::test_shim::TestShim;

    fn window(abandoned: &Arc<AtomicBool>) -> Window<TestShim> {
        Window::new("g", 1, None, Arc::clone(abandoned))
    }

    #[test]
    fn a_frozen_drop_queue_records_and_waits_for_no_fence() {
        let shim = TestShim::new(1 << 30, 32, 1 << 28);
        let mut capture = CaptureState::<TestShim>::default();
        let mut q = DropQueue::<TestShim>::new(DropPolicy::default(), capture.flag());
        q.push(DropItem::Host(HostBuffer::zeroed(4)));
        capture.begin(0, window(&Arc::default())).unwrap();
        q.drain(&shim, &(), FenceMark::default());
        assert!(q.poll(&shim, &(), FenceMark::default()).is_none());
        assert_eq!(shim.events_recorded.get(), 0);
        assert_eq!(q.staged_len(), 1);
        capture.end(0, || ()).unwrap();
        q.drain(&shim, &(), FenceMark::default());
        assert_eq!(q.stats().items_released, 1);
    }

    #[test]
    fn transitions_follow_the_cycle_and_refusals_change_nothing() {
        let flag = Arc::new(AtomicBool::new(false));
        let mut c = CaptureState::<TestShim>::default();
        let recording = c.flag();
        assert!(c.end(0, || ()).is_err(), "idle: nothing to end");
        assert_eq!(c.phase(0), CapturePhase::Idle);
        c.begin(0, window(&flag)).unwrap();
        assert!(recording.is_set());
        assert!(
            c.begin(1, window(&flag)).is_err(),
            "one recording per device"
        );
        assert!(
            c.end(1, || ()).is_err(),
            "only the recording stream ends it"
        );
        assert_eq!(c.phase(0), CapturePhase::Recording);
        assert_eq!(c.phase(1), CapturePhase::Idle);
        assert_eq!(c.stance(0), Stance::Record);
        assert_eq!(c.stance(1), Stance::OtherRecords(0));
        assert!(c.end(0, || ()).is_ok());
        assert!(!recording.is_set());
        assert_eq!(c.phase(0), CapturePhase::Idle);
        assert_eq!(c.stance(1), Stance::Run);

        c.begin(0, window(&flag)).unwrap();
        let reason: ServerError = crate::Validation::Recording { op: "x" }.into();
        assert!(
            c.discard(1, reason.clone(), || ()).is_none(),
            "stream 1 does not record"
        );
        let ended = core::cell::Cell::new(false);
        assert!(
            c.discard(0, reason, || ended.set(recording.is_set()))
                .is_some()
        );
        assert!(
            ended.get(),
            "the shim's capture ends while the flag still holds"
        );
        assert!(!recording.is_set(), "a discarded recording records nothing");
        assert!(
            c.discard(0, crate::Validation::ReadOnlyDestination.into(), || ())
                .is_none()
        );
        assert_eq!(c.phase(0), CapturePhase::Discarded);
        assert!(c.check_open(0).is_err());
        assert!(c.check_open(1).is_ok());
        assert!(c.begin(1, window(&flag)).is_err(), "still open until ended");
        assert!(!c.abandoned());
        flag.store(true, Ordering::Release);
        assert!(
            c.abandoned(),
            "the token of a discarded recording is still watched"
        );
        let e = c
            .end(0, || {
                unreachable!("a discarded recording ended its shim capture")
            })
            .unwrap_err();
        assert!(matches!(
            e,
            ServerError::Capture(CaptureError::Discarded { stream: 0, .. })
        ));
        assert_eq!(c.phase(0), CapturePhase::Idle);
        assert!(c.check_open(0).is_ok());

        c.begin(0, window(&flag)).unwrap();
        assert!(c.abort(|stream| assert_eq!(stream, 0)).is_some());
        assert!(!recording.is_set());
        assert_eq!(c.phase(0), CapturePhase::Idle);
    }
}
