//! The device's share of capture: which stream has a recording open, the freezing of every drop
//! queue while it records, ending a recording its caller abandoned, and letting go of graphs
//! their callers dropped.
//!
//! Owns nothing of its own: the fields live on [`Device`] (`capture_open`, `graph_returns`) and
//! each stream's capture state; this file holds the rules that read and change them at the start
//! of every command and at teardown. Does not own the operations (`command/capture.rs`).

use crate::device::Device;
use crate::shim::Shim;
use alloc::vec::Vec;

impl<S: Shim> Device<S> {
    /// The stream that records now, if one does.
    pub(crate) fn recording(&self) -> Option<usize> {
        let i = self.capture_open?;
        self.streams
            .get(i)?
            .as_ref()
            .is_some_and(|s| s.capture.is_recording())
            .then_some(i)
    }

    /// Freezes every drop queue while a stream records (no host wait is legal then, on any
    /// stream: CUDA's global capture mode), or thaws them.
    pub(crate) fn set_frozen(&mut self, frozen: bool) {
        self.ledger.set_recording(frozen);
        for s in self.streams.iter_mut().flatten() {
            s.drops.set_frozen(frozen);
        }
    }

    /// Run by every command before anything else: a recording whose caller dropped its
    /// [`Recording`](super::Recording) is aborted, and graphs dropped since the last command go,
    /// unless a stream records.
    pub(crate) fn settle_captures(&mut self) {
        if let Some(i) = self.capture_open
            && self.streams[i]
                .as_ref()
                .is_some_and(|s| s.capture.abandoned())
        {
            self.abort_capture();
        }
        if self.recording().is_none() {
            self.release_dropped_graphs();
        }
    }

    /// Ends the open recording, if any, and throws it away: the shim's capture is ended as
    /// doomed, the stream is idle again, the drop queues thaw. Nothing is marked failed: the
    /// buffers hold what they held before the recording.
    pub(crate) fn abort_capture(&mut self) {
        let Some(i) = self.capture_open.take() else {
            return;
        };
        let Some(s) = self.streams[i].as_mut() else {
            return;
        };
        let was_recording = s.capture.is_recording();
        let window = s.capture.abort();
        if was_recording {
            // Ends the recording whatever it answers; a graph from a doomed end is dropped.
            let _ = self.shim.end_capture(&s.raw, true);
            self.set_frozen(false);
        }
        drop(window);
    }

    /// Lets go of the graphs their callers dropped (what replays still hold stays with them).
    pub(crate) fn release_dropped_graphs(&mut self) {
        let mut dropped = Vec::new();
        self.graph_returns.drain_into(&mut dropped);
        drop(dropped);
    }
}
