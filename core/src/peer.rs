//! Copies to other devices that may still read a device's memory.
//!
//! Owns [`PeerRead`]: what a device keeps of a copy to another device whose end it could not
//! learn when the copy was made (the copy's source stream could not be made to wait for it, and
//! the host wait for the destination's event after it was refused or inconclusive), and the
//! teardown's question whether every such copy is done. Does not own the copy itself
//! (`command/across.rs`) nor what teardown does with the answer (`device.rs`).

use crate::capture::RecordingFlag;
use crate::fault::FenceOutcome;
use crate::shim::Shim;
use alloc::sync::Arc;
use alloc::vec::Vec;

/// A copy to another device that may still read this device's memory: the destination's shim
/// (kept alive for it), its event after the copy (none where it could not be recorded), and
/// whether a stream of the destination records (no host wait on its shim is legal then).
#[derive(Debug)]
pub(crate) struct PeerRead<S: Shim> {
    pub shim: Arc<S>,
    pub after: Option<S::Event>,
    pub recording: RecordingFlag,
}

impl<S: Shim> PeerRead<S> {
    /// Waits for every copy in `reads` (and forgets them): whether each one is done, so the
    /// memory they read may be freed. A copy whose event is missing, or whose wait is refused or
    /// inconclusive, is not, nor one whose destination records now (the core never waits on a
    /// device that records); a lost destination runs nothing any more.
    pub(crate) fn all_done(reads: &mut Vec<Self>) -> bool {
        let mut done = true;
        for read in reads.drain(..) {
            let passed = !read.recording.is_set()
                && read
                    .after
                    .as_ref()
                    .is_some_and(|ev| FenceOutcome::wait(&*read.shim, ev).completed());
            done &= passed;
        }
        done
    }
}
