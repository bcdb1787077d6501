//! The capture state of a stream: whether it records into a graph, and what that forbids.
//!
//! Graph capture arrives with its own issue; until then a stream is always idle and every rule
//! that depends on recording is already routed through here ([`CaptureState::page_update`],
//! [`CaptureState::is_recording`]), so the capture window plugs in without touching the callers.
//! Nothing here pretends to record.

use crate::memory::PageUpdate;

/// Where a stream is in the capture cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum CaptureState {
    /// Not recording: every operation runs as it is enqueued.
    #[default]
    Idle,
}

impl CaptureState {
    /// Whether the stream records.
    pub fn is_recording(&self) -> bool {
        match self {
            Self::Idle => false,
        }
    }

    /// What a reservation on this stream may do to the pages, given whether another stream of
    /// the device records: `Forbidden` while this one records, `AddOnly` while another does.
    pub fn page_update(&self, another_records: bool) -> PageUpdate {
        if self.is_recording() {
            PageUpdate::Forbidden
        } else if another_records {
            PageUpdate::AddOnly
        } else {
            PageUpdate::Allow
        }
    }
}
