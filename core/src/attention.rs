//! The device's attention word: what every operation reads first, in one cache line.
//!
//! Owns two flags (two bits of one byte) and their memory ordering: bookkeeping is due (rung by whatever leaves the
//! device thread work: an allocation returned on any thread, an id freed or a page retired by a
//! stream's manager, what a future left behind), and a fault is on record (set once a stream's
//! work failed or the device is lost, never cleared). An operation that finds both down makes
//! one load ([`Attention::quiet`]) instead of reading every stream's queues and the ledger's
//! state. Does not own what the
//! flags stand for: the bookkeeping is `Device::collect`'s, the faults the ledger's (`fault.rs`).

use crate::sync::AtomicU8;
use core::sync::atomic::Ordering;

/// The bit of [`Attention`]'s word that asks for bookkeeping.
const BOOKKEEPING: u8 = 1;
/// The bit of [`Attention`]'s word that says a fault is on record.
const FAULTED: u8 = 2;

/// The flags an operation checks before anything else (see the module documentation), in one
/// word so that the usual case (neither) is one load. A line of its own on 64-bit hosts: other
/// threads write to it, and it should share the line with nothing the device thread writes (a
/// firmware, with no data cache to share, keeps the byte).
#[derive(Debug, Default)]
#[cfg_attr(target_pointer_width = "64", repr(align(64)))]
pub(crate) struct Attention {
    word: AtomicU8,
}

impl Attention {
    /// Asks for the device thread's bookkeeping at its next operation. A read-modify-write, so
    /// rings from several threads form one release sequence: the answer that reads the last of
    /// them sees what every one of them published before it rang.
    #[inline]
    pub(crate) fn ring(&self) {
        self.word.fetch_or(BOOKKEEPING, Ordering::Release);
    }

    /// Whether bookkeeping was asked for since the last answer (one load when it was not), and
    /// takes the request. The read-modify-write reads the last ring, so what was pushed before
    /// any ring is seen by the caller after this answer.
    #[inline]
    pub(crate) fn answer(&self) -> bool {
        self.word.load(Ordering::Relaxed) & BOOKKEEPING != 0
            && self.word.fetch_and(!BOOKKEEPING, Ordering::AcqRel) & BOOKKEEPING != 0
    }

    /// Records that a check may now fail (never undone).
    pub(crate) fn mark_faulted(&self) {
        self.word.fetch_or(FAULTED, Ordering::Release);
    }

    /// Whether a fault is on record.
    #[inline]
    pub(crate) fn faulted(&self) -> bool {
        self.word.load(Ordering::Acquire) & FAULTED != 0
    }

    /// Whether neither flag is up (one load): no bookkeeping is due and no fault is on record,
    /// so an operation's begin has nothing to do. A flag up is then asked for by its own
    /// question ([`Self::answer`], [`Self::faulted`]), with that question's ordering.
    #[inline]
    pub(crate) fn quiet(&self) -> bool {
        self.word.load(Ordering::Relaxed) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_is_answered_once() {
        let a = Attention::default();
        assert!(!a.answer(), "silent at first");
        assert!(a.quiet());
        a.ring();
        assert!(!a.quiet(), "a ring is heard");
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
        assert!(!a.quiet(), "a fault is heard");
    }
}
