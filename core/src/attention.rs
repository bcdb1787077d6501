//! The device's attention word: what every operation reads first, in one cache line.
//!
//! Owns two flags and their memory ordering: bookkeeping is due (rung by whatever leaves the
//! device thread work: an allocation returned on any thread, an id freed or a page retired by a
//! stream's manager, what a future left behind), and a fault is on record (set once a stream's
//! work failed or the device is lost, never cleared). An operation that finds both down reads
//! this one line instead of every stream's queues and the ledger's state. Does not own what the
//! flags stand for: the bookkeeping is `Device::collect`'s, the faults the ledger's (`fault.rs`).

use core::sync::atomic::{AtomicBool, Ordering};

/// The flags an operation checks before anything else (see the module documentation). A line of
/// its own on 64-bit hosts: other threads write to it, and it should share the line with nothing
/// the device thread writes (a firmware, with no data cache to share, keeps the two bytes).
#[derive(Debug, Default)]
#[cfg_attr(target_pointer_width = "64", repr(align(64)))]
pub(crate) struct Attention {
    bookkeeping: AtomicBool,
    faulted: AtomicBool,
}

impl Attention {
    /// Asks for the device thread's bookkeeping at its next operation. A read-modify-write, so
    /// rings from several threads form one release sequence: the answer that reads the last of
    /// them sees what every one of them published before it rang.
    #[inline]
    pub(crate) fn ring(&self) {
        self.bookkeeping.swap(true, Ordering::Release);
    }

    /// Whether bookkeeping was asked for since the last answer (one load when it was not), and
    /// takes the request. The swap reads the last ring, so what was pushed before any ring is
    /// seen by the caller after this answer.
    #[inline]
    pub(crate) fn answer(&self) -> bool {
        self.bookkeeping.load(Ordering::Relaxed) && self.bookkeeping.swap(false, Ordering::AcqRel)
    }

    /// Records that a check may now fail (never undone).
    pub(crate) fn mark_faulted(&self) {
        self.faulted.store(true, Ordering::Release);
    }

    /// Whether a fault is on record.
    #[inline]
    pub(crate) fn faulted(&self) -> bool {
        self.faulted.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_is_answered_once() {
        let a = Attention::default();
        assert!(!a.answer(), "silent at first");
        a.ring();
        a.ring();
        assert!(a.answer(), "two rings, one answer");
        assert!(!a.answer(), "taken by the answer");
    }

    #[test]
    fn a_fault_stays_on_record_and_rings_nothing() {
        let a = Attention::default();
        assert!(!a.faulted());
        a.mark_faulted();
        assert!(a.faulted() && a.faulted(), "never cleared");
        assert!(!a.answer(), "a fault is not bookkeeping");
    }
}
