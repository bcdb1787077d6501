//! What a manager lets go before the device is done with it, and how it goes back.
//!
//! Owns [`Released`] (a page, or a mapping of one or more granules of a granule pool), the retire
//! token a retiring mapping shares between its pool and the drop queue ([`RetireToken`], with
//! its states in [`Retire`]: whichever side moves it off `Pending` first wins), and
//! [`RetiredPage::free`], which frees a page or unmaps a mapping that was not taken back. Does
//! not own when things are let go (the manager) nor the fences they wait for (the device's drop
//! queue).

use super::types::{RawPage, RetiredPage};
use crate::shim::{DeviceAddr, Shim};
use crate::sync::AtomicU8;
use alloc::sync::Arc;
use core::sync::atomic::Ordering;

/// What a manager lets go: a page, or the memory behind one mapping (one granule, or several
/// under `map_spans`) of a granule pool.
pub enum Released<S: Shim> {
    /// A page of a pool of pages or of whole pages.
    Page(RawPage<S>),
    /// Device memory behind one mapping of a reserved address range, on its way out.
    Granule(RetiringGranule),
}

impl<S: Shim> core::fmt::Debug for Released<S> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Page(p) => f.debug_tuple("Page").field(p).finish(),
            Self::Granule(g) => f.debug_tuple("Granule").field(g).finish(),
        }
    }
}

/// The memory behind one mapping ([`Shim::vm_map`]'s `memory`, at `addr`, `size` bytes), and
/// the token that says whether the drop queue unmapped it or the manager took it back first.
#[derive(Debug)]
pub struct RetiringGranule {
    addr: u64,
    size: u64,
    memory: u64,
    token: Arc<RetireToken>,
}

impl RetiringGranule {
    /// The mapping at `addr` of `size` bytes with the shim's `memory`, sharing `token` with its
    /// pool.
    pub(crate) fn new(addr: u64, size: u64, memory: u64, token: Arc<RetireToken>) -> Self {
        Self {
            addr,
            size,
            memory,
            token,
        }
    }
}

/// Says [`Retire::Done`] when dropped: the end of the drop queue's unmap, however it ends.
struct DoneOnDrop<'a>(&'a RetireToken);

impl Drop for DoneOnDrop<'_> {
    fn drop(&mut self) {
        self.0.0.store(Retire::Done as u8, Ordering::Release);
    }
}

/// Where a retiring mapping (of one granule or more) stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Retire {
    /// Waiting for its fence: still mapped, and the pool may take it back.
    Pending = 0,
    /// The manager took it back before its fence: the drop queue leaves it mapped.
    Cancelled = 1,
    /// The drop queue unmapped it: the address range is free to map again.
    Done = 2,
    /// The drop queue is unmapping it now (on its thread): neither takeable nor free to map
    /// again until `Done`, a driver call later ([`RetireToken::take_back`] waits it out).
    Unmapping = 3,
}

/// A [`Retire`] shared by a mapping's pool (every granule of it) and its retired page (an atomic: the drop queue may
/// run on another thread).
#[derive(Debug)]
pub(crate) struct RetireToken(AtomicU8);

impl RetireToken {
    /// A token of a granule just retired.
    pub(crate) fn pending() -> Self {
        Self(AtomicU8::new(Retire::Pending as u8))
    }

    /// Where the granule stands now.
    pub(crate) fn state(&self) -> Retire {
        match self.0.load(Ordering::Acquire) {
            0 => Retire::Pending,
            1 => Retire::Cancelled,
            3 => Retire::Unmapping,
            _ => Retire::Done,
        }
    }

    /// Waits while the drop queue's thread unmaps the granule (one driver call): afterwards
    /// the state is not [`Retire::Unmapping`].
    fn wait_unmapped(&self) {
        while self.state() == Retire::Unmapping {
            crate::sync::spin_wait();
        }
    }

    /// The manager's side: takes the mapping back (true) unless the drop queue began to unmap
    /// it, and then waits until that unmap is through (false: the range is unmapped, its bytes
    /// given back to the budget, and the manager may map the address again or release its
    /// range). The cancel comes first: a wait before it could see `Pending`, lose the race to
    /// the drop queue and leave the manager mapping over an unmap in progress.
    /// Called at most once per token (the manager's pool marks the mapping mapped again, or
    /// forgets it, right after).
    pub(crate) fn take_back(&self) -> bool {
        debug_assert_ne!(self.state(), Retire::Cancelled, "a token taken back twice");
        if self.settle(Retire::Cancelled) {
            return true;
        }
        self.wait_unmapped();
        false
    }

    /// The drop queue's side: runs `unmap` unless the manager took the mapping back first
    /// (false); the token says [`Retire::Done`] once `unmap` returned (or unwound: a manager
    /// waiting in [`Self::take_back`] must not spin for ever).
    pub(crate) fn unmap_unless_taken_back(&self, unmap: impl FnOnce()) -> bool {
        if !self.settle(Retire::Unmapping) {
            return false;
        }
        let _done = DoneOnDrop(self);
        unmap();
        true
    }

    /// Moves the granule from `Pending` to `to`; whether this side won (it was still pending).
    pub(crate) fn settle(&self, to: Retire) -> bool {
        self.0
            .compare_exchange(
                Retire::Pending as u8,
                to as u8,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
    }
}

impl<S: Shim> RetiredPage<Released<S>> {
    /// Bytes it still holds on its way out: its size, or nothing for a granule its manager took
    /// back before the fence (those bytes are the pool's again, and counted there).
    pub fn bytes_on_the_way_out(&self) -> u64 {
        match &self.raw {
            Released::Granule(g) if g.token.state() == Retire::Cancelled => 0,
            _ => self.size,
        }
    }

    /// Frees the page on the device (or the host, for a mapped page), or unmaps the granule
    /// unless its manager took it back first, and gives its bytes back to the device's budget.
    ///
    /// # Safety
    ///
    /// No work that may use the page is pending on any stream of the device (or the device is
    /// poisoned).
    pub unsafe fn free(self, shim: &S) {
        match self.raw {
            // SAFETY: the caller's guarantee.
            Released::Page(page) => unsafe { page.free(shim) },
            Released::Granule(g) => {
                // Unless taken back by the manager before its fence (it stays mapped, and
                // counted there): unmapped, and its bytes given back, before the token says done.
                g.token.unmap_unless_taken_back(|| {
                    // SAFETY: the caller guarantees no pending work uses the granule; the
                    // manager neither takes it back nor maps over it nor releases its range
                    // until the token says done (`RetireToken::take_back`).
                    unsafe { shim.vm_unmap(DeviceAddr(g.addr), g.size, g.memory) };
                    self.budget.give_back(self.size);
                });
                return;
            }
        }
        self.budget.give_back(self.size);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unmapping_granule_is_neither_taken_back_nor_free_until_done() {
        let token = Arc::new(RetireToken::pending());
        assert!(token.settle(Retire::Unmapping), "the drop queue wins");
        assert!(
            !token.settle(Retire::Cancelled),
            "no take back while it unmaps"
        );
        let other = Arc::clone(&token);
        let unmapper = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            other.0.store(Retire::Done as u8, Ordering::Release);
        });
        token.wait_unmapped();
        assert_eq!(token.state(), Retire::Done);
        unmapper.join().unwrap();
    }
}
