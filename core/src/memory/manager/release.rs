//! Release: giving memory and pages back.
//!
//! Owns the freeing of what dropped handles return, [`MemoryManager::cleanup`] (which pages go
//! back, and when), retiring a page until the device is done with it or freeing it at once
//! ([`PageRelease`]), and the teardowns ([`MemoryManager::release_all`], leaking on an
//! inconclusive one, and the manager's `Drop`). Does not own the fences that tell when a retired
//! page is safe to free: the owner (the device) holds them and frees retired pages through
//! [`RetiredPage::free`].

use super::MemoryManager;
use crate::memory::config::PageRelease;
use crate::memory::handle::Returned;
use crate::memory::pool::{Location, Pool, Size, Whole};
use crate::memory::retire::Released;
use crate::memory::sliced::SlicedPool;
use crate::memory::types::{Cleanup, RawPage, RetiredPage};
use crate::shim::{DeviceAddr, Shim};
use alloc::sync::Arc;
use alloc::vec::Vec;

impl<S: Shim> MemoryManager<S> {
    /// Frees what was dropped since the last call (handles dropped on any thread). Rings
    /// nothing for the ids it records: each return's push rang the device's attention, which
    /// only the device's own bookkeeping lowers, and that bookkeeping drains this queue.
    #[inline]
    pub(super) fn collect_returns(&mut self) {
        // Nothing came back (the usual case at a reservation right after the device's own
        // bookkeeping drained the queue): one load, no call.
        if !self.returns.is_empty() {
            self.collect_returns_now();
        }
    }

    /// [`Self::collect_returns`] with returns in the queue.
    #[inline(never)]
    fn collect_returns_now(&mut self) {
        self.returns.drain_into(&mut self.returned);
        // One return (a handle dropped between two operations: the usual case) is taken off the
        // vector in place; more are drained in the order they came back.
        if self.returned.len() == 1 {
            if let Some(r) = self.returned.pop() {
                self.take_back(r);
            }
            return;
        }
        let mut returned = core::mem::take(&mut self.returned);
        for r in returned.drain(..) {
            self.take_back(r);
        }
        self.returned = returned;
    }

    /// Frees a returned allocation's room and keeps its identity for a next handle.
    #[inline]
    fn take_back(&mut self, r: Returned) {
        self.free_location(r.location, r.id);
        if self.spare.len() < self.config.spare_identities {
            self.spare.push(r.identity);
        }
    }

    /// Frees the room at `location` if `owner` holds it, recording the id for the device (the
    /// caller rings: see [`Self::ring`]).
    pub(super) fn free_location(&mut self, location: Location, owner: u64) {
        if let Some(freed) = &mut self.freed {
            freed.push(owner);
        }
        match location.pool {
            Pool::Whole(Whole::Persistent) => {
                self.persistent.free(location.block, owner);
            }
            Pool::Whole(Whole::Dedicated) => {
                self.dedicated_freed |= self.dedicated.free(location.block, owner);
            }
            Pool::Granules(size) => {
                self.free_granules(size, location.block, owner);
            }
            Pool::Pages(Size::Arena) => {
                if let Some(f) = self.arena.free_held(location.block, owner)
                    && self.arena.page(f.page).is_some_and(|p| p.live == 0)
                {
                    self.arena_empty.push(f.page);
                }
            }
            Pool::Pages(Size::Small) => {
                self.small.free_held(location.block, owner);
            }
        }
    }

    /// Gives back the arena's empty, unguarded pages (before the arena grows).
    pub(super) fn release_empty_arena_pages(&mut self, shim: &S) {
        for page in core::mem::take(&mut self.arena_empty) {
            if let Some(p) = self.arena.remove_page_if_empty(page) {
                self.release(shim, p.raw, p.size);
            }
        }
    }

    /// Runs a cleanup. Periodic: freed dedicated pages go back, and guards dropped since are
    /// noticed. Explicit: also every idle granule, every empty, unguarded page of the small pool
    /// and the arena, and every freed persistent page.
    #[inline]
    pub fn cleanup(&mut self, shim: &S, kind: Cleanup) {
        self.collect_returns();
        // The periodic tick runs on every reservation: with nothing to release it costs nothing.
        if kind == Cleanup::Periodic && !self.dedicated_freed && self.guards.is_empty() {
            return;
        }
        self.cleanup_now(shim, kind);
    }

    /// [`Self::cleanup`] past the returns, when it has something to look at.
    #[inline(never)]
    fn cleanup_now(&mut self, shim: &S, kind: Cleanup) {
        self.drop_released_guards();
        let mut released: Vec<(RawPage<S>, u64)> = Vec::new();
        if self.dedicated_freed || kind == Cleanup::Explicit {
            let mut pages = Vec::new();
            self.dedicated.take_free(&mut pages);
            released.extend(pages.into_iter().map(|p| (p.raw, p.size)));
            self.dedicated_freed = false;
        }
        if kind == Cleanup::Explicit {
            // Blocks held back for a request of their size go back to the pools first, so what
            // is empty or idle under them goes back too.
            self.small.release_held(|_, _| ());
            self.arena.release_held(|_, _| ());
            self.release_all_held();
            let mut pages = Vec::new();
            self.persistent.take_free(&mut pages);
            released.extend(pages.into_iter().map(|p| (p.raw, p.size)));
            self.arena_empty.clear();
            for pool in [&mut self.small, &mut self.arena] {
                let empty: Vec<u32> = pool.empty_pages().collect();
                for page in empty {
                    if let Some(p) = pool.remove_page_if_empty(page) {
                        released.push((p.raw, p.size));
                    }
                }
            }
            self.give_back_idle(shim, usize::MAX);
            // The mark starts again from what stays: under fenced release what was just given
            // back still counts as held until its fence, but it is on its way out. (A placement
            // that maps or takes a granule back in its own pool before that fence raises the
            // mark to what is held, retiring granules included, as such a placement always does;
            // one over mapped granules leaves it. The device's cleanup drains its queue right
            // after this, so on a device the restart holds once the fence passes.)
            self.vm_high_water = self.granules_mapped_now();
        }
        for (raw, size) in released {
            self.release(shim, raw, size);
        }
    }

    fn drop_released_guards(&mut self) {
        let mut i = 0;
        while i < self.guards.len() {
            if Arc::strong_count(&self.guards[i]) == 1 {
                let page = *self.guards.swap_remove(i);
                self.set_guard(page, false);
            } else {
                i += 1;
            }
        }
    }

    fn release(&mut self, shim: &S, raw: RawPage<S>, size: u64) {
        let page = RetiredPage {
            raw: Released::Page(raw),
            size,
            budget: self.budget.clone(),
        };
        match self.release {
            // SAFETY: `Immediate` is set only through the unsafe `release_pages_immediately`,
            // whose caller promised that no device work uses memory whose handles were dropped;
            // an empty page holds no live allocation.
            PageRelease::Immediate => unsafe { page.free(shim) },
            PageRelease::Fenced => self.retire(page),
        }
    }

    /// Keeps `page` until the device frees it after a fence ([`Self::take_retired`]), and asks
    /// for the device's attention so that it looks.
    pub(super) fn retire(&mut self, page: RetiredPage<Released<S>>) {
        self.retired.push(page);
        self.ring();
    }

    /// Takes the pages retired since the last call; each must be freed (see
    /// [`RetiredPage::free`]) once no device work can use it. The device does this for its
    /// streams; a manager used on its own under [`PageRelease::Fenced`] does it with fences of
    /// its own (or keeps them until [`Self::release_all`]).
    pub fn take_retired(&mut self) -> Vec<RetiredPage<Released<S>>> {
        core::mem::take(&mut self.retired)
    }

    /// Whether a page retired since the last [`Self::take_retired`].
    pub(crate) fn has_retired(&self) -> bool {
        !self.retired.is_empty()
    }

    /// Bytes of pages retired and not yet freed.
    pub fn retired_bytes(&self) -> u64 {
        self.retired.iter().map(|p| p.bytes_on_the_way_out()).sum()
    }

    /// Frees every retired page.
    ///
    /// # Safety
    ///
    /// No work that may use memory of this manager whose handles were dropped is pending on any
    /// stream of the device.
    pub(crate) unsafe fn free_retired(&mut self, shim: &S) {
        for page in core::mem::take(&mut self.retired) {
            // SAFETY: the caller guarantees the device is done with freed memory.
            unsafe { page.free(shim) };
        }
    }

    /// Frees every page the manager holds, live allocations and retired pages included: for the
    /// owner's teardown (the device's, or that of a manager used on its own). Handles still out
    /// resolve to nothing afterwards (their pages are gone from the pools).
    ///
    /// # Safety
    ///
    /// No work that may use any memory of this manager is pending on any stream of the device.
    pub unsafe fn release_all(&mut self, shim: &S) {
        // Guards of pages about to go would name the next pages of those numbers.
        self.guards.clear();
        self.vm_high_water = 0;
        // Retired pages first: a retired granule is unmapped before its range is released.
        // SAFETY: the caller guarantees no pending work uses any memory of this manager.
        unsafe { self.free_retired(shim) };
        for slot in &mut self.vm {
            let Some(mut pool) = slot.take().filter(|_| S::VIRTUAL_MEMORY) else {
                continue;
            };
            let granule = pool.granule;
            for (g, len, memory, token) in pool.drain_backed() {
                // Retiring: its retired page unmapped it if it was freed (above, or from the
                // device's drop queue before this call). One still out (`take_retired` kept by
                // the caller) is cancelled here and unmapped with the rest: its later free then
                // does nothing, and the range is never released with a granule mapped in it.
                if token.is_some_and(|t| !t.take_back()) {
                    continue;
                }
                let bytes = u64::from(len) * granule;
                // SAFETY: as above; `bytes` is the whole mapping one `vm_map` made at its first
                // granule.
                unsafe { shim.vm_unmap(DeviceAddr(pool.addr_of(g)), bytes, memory) };
                self.budget.give_back(bytes);
            }
            // SAFETY: every granule of the range is unmapped now, and no pending work uses it. A
            // range counts nothing against the budget; its granules did.
            unsafe { shim.vm_release(DeviceAddr(pool.base), pool.address_space()) };
        }
        self.arena_empty.clear();
        let budget = self.budget.clone();
        let free = |raw, size| {
            let page = RetiredPage {
                raw: Released::Page(raw),
                size,
                budget: budget.clone(),
            };
            // SAFETY: the caller guarantees no pending work uses any page of this manager.
            unsafe { page.free(shim) };
        };
        self.small.take_pages().for_each(|p| free(p.raw, p.size));
        self.arena.take_pages().for_each(|p| free(p.raw, p.size));
        for whole in [&mut self.persistent, &mut self.dedicated] {
            core::mem::take(whole)
                .into_pages()
                .for_each(|p| free(p.raw, p.size));
        }
    }

    /// Leaks every page on purpose: for a teardown that could not tell whether the device is
    /// done with them.
    pub(crate) fn forget_all(&mut self) {
        // As in `release_all`: the guards name pages that are gone.
        self.guards.clear();
        self.vm_high_water = 0;
        let small_page = self.small.page_size;
        core::mem::forget(core::mem::replace(
            &mut self.small,
            SlicedPool::new(small_page),
        ));
        let arena_page = self.arena.page_size;
        core::mem::forget(core::mem::replace(
            &mut self.arena,
            SlicedPool::new(arena_page),
        ));
        self.arena_empty.clear();
        for slot in &mut self.vm {
            core::mem::forget(slot.take());
        }
        core::mem::forget(core::mem::take(&mut self.persistent));
        core::mem::forget(core::mem::take(&mut self.dedicated));
        core::mem::forget(core::mem::take(&mut self.retired));
    }
}

impl<S: Shim> Drop for MemoryManager<S> {
    fn drop(&mut self) {
        // Returned identities hold the queue, and the queue holds them: closed, it drops them and
        // refuses later returns (a handle that outlives its manager drops its identity).
        self.returns.close();
        if !self.retired.is_empty() {
            warn!(
                "memory manager dropped with {} retired pages not freed: leaking them",
                self.retired.len()
            );
            // Leak on purpose: the device may still use them and only the owner could know.
            core::mem::forget(core::mem::take(&mut self.retired));
        }
    }
}
