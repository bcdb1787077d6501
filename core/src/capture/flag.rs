//! The device-wide "a stream records" flag, as the parts that cannot ask the device read it: the
//! drop queues (no fence is recorded, waited for or polled while it is set) and the futures of
//! reads and syncs, which may be waited on from another thread (no host wait is legal then, on
//! any stream: CUDA's global capture mode).
//!
//! Owns nothing but the bit. Only the capture state (`state.rs`) sets it, in its transitions and
//! just ahead of one (`CaptureState::announce` raises it before the shim's capture begins, and
//! lowers it if that fails), so it is up whenever the state records; everyone else holds a
//! read-only clone. A reader on another thread that saw it down just before it rose may still
//! wait on the host once inside the capture (a check, then the act): that wait's outcome is then
//! unknown, and what it covered is leaked, never freed early.

use alloc::sync::Arc;
use core::sync::atomic::{AtomicBool, Ordering};

/// Whether a stream of the device records; cheap to clone, read-only outside `capture/`.
#[derive(Debug, Clone, Default)]
pub struct RecordingFlag(Arc<AtomicBool>);

impl RecordingFlag {
    /// Whether a stream of the device records now.
    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    /// Set by the capture state's transitions only.
    pub(super) fn set(&self, on: bool) {
        self.0.store(on, Ordering::Release);
    }
}

/// Lowers the flag when dropped: after the shim's end of a recording, also when that call
/// panics (a caught panic would otherwise leave every drop queue frozen for good).
pub(super) struct LowerOnDrop<'a>(pub(super) &'a RecordingFlag);

impl Drop for LowerOnDrop<'_> {
    fn drop(&mut self) {
        self.0.set(false);
    }
}
