//! The process a device belongs to: what CUDA keeps once per process, and the std shim once per
//! group of devices made to share it, so that tests which run in parallel in one test binary do
//! not meet.
//!
//! Owns one thing CUDA keeps per process: how many streams record a graph. Under CUDA's global
//! capture mode the driver forbids host waits and allocations from every thread and context
//! while any stream of the process records; devcmd-cuda refuses them before the driver
//! (`Fault::Busy`). A device of the std shim does the same when a stream of *another* device of
//! its process records ([`status::CAPTURE_ELSEWHERE`](crate::status::CAPTURE_ELSEWHERE)); on its
//! own streams it keeps its stricter rule (the call spoils the recording), since a core
//! `Device` never makes such a call while one of its streams records: the rule catches a core
//! that would. So two `Device`s over clones of one `StdShim` are one device here, and a wait of
//! one while the other records spoils that recording; build the second `StdShim` in the first
//! one's process instead. Does not own the recordings themselves (each device's state keeps its
//! own).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A group of [`StdShim`](crate::StdShim) devices that behave as devices of one CUDA process. A
/// device is alone in a process of its own unless it was built with
/// [`StdShimBuilder::process`](crate::StdShimBuilder::process). Cheap to clone (clones are the same process).
///
/// ```
/// use devcmd::{Fault, Shim};
/// use devcmd_std::StdShim;
///
/// let a = StdShim::new();
/// let b = StdShim::builder().process(&a.process()).build();
/// let (sa, sb) = (a.create_stream().unwrap(), b.create_stream().unwrap());
/// let fence = b.record_event(&sb).unwrap();
/// a.begin_capture(&sa).unwrap();
/// // A stream of `a` records: `b` may not wait on the host, as on CUDA.
/// assert_eq!(b.event_wait(&fence).unwrap_err().fault, Fault::Busy);
/// a.end_capture(&sa, true).unwrap_err(); // discarded
/// b.event_wait(&fence).unwrap();
/// ```
#[derive(Debug, Clone, Default)]
pub struct Process {
    /// Streams of the process's devices that record now.
    recording: Arc<AtomicUsize>,
}

impl Process {
    /// A process of its own.
    pub fn new() -> Self {
        Self::default()
    }

    /// Streams of the process's devices that record now.
    pub fn recordings(&self) -> usize {
        self.recording.load(Ordering::Acquire)
    }

    /// One more stream records.
    pub(crate) fn began(&self) {
        self.recording.fetch_add(1, Ordering::AcqRel);
    }

    /// One stream no longer records.
    pub(crate) fn ended(&self) {
        let before = self.recording.fetch_sub(1, Ordering::AcqRel);
        debug_assert!(before > 0, "a recording ended that never began");
    }
}
