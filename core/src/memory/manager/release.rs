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
use crate::memory::handle::{
    Location, POOL_ARENA_BASE, POOL_DEDICATED, POOL_PERSISTENT, POOL_SMALL, PoolId,
};
use crate::memory::sliced::SlicedPool;
use crate::memory::types::{Cleanup, PageRef, RawPage, RetiredPage};
use crate::shim::Shim;
use alloc::sync::Arc;
use alloc::vec::Vec;

impl<S: Shim> MemoryManager<S> {
    /// Frees what was dropped since the last call (handles dropped on any thread).
    pub(super) fn collect_returns(&mut self) {
        self.returns.drain_into(&mut self.returned);
        if self.returned.is_empty() {
            return;
        }
        let mut returned = core::mem::take(&mut self.returned);
        for r in returned.drain(..) {
            self.free_location(r.location, r.id);
            if self.spare.len() < super::SPARE_IDENTITIES {
                self.spare.push(r.identity);
            }
        }
        self.returned = returned;
    }

    pub(super) fn free_location(&mut self, location: Location, owner: u64) {
        if let Some(freed) = &mut self.freed {
            freed.push(owner);
        }
        match location.pool {
            POOL_PERSISTENT => {
                self.persistent.free(location.block, owner);
            }
            POOL_DEDICATED => {
                self.dedicated_freed |= self.dedicated.free(location.block, owner);
            }
            pool => {
                let Some(sliced) = self.sliced_mut(pool) else {
                    return;
                };
                if let Some(page) = sliced.free(location.block, owner) {
                    let outdated = !sliced.is_serving();
                    if outdated
                        && sliced
                            .page(page)
                            .is_some_and(|p| p.live == 0 && p.guards == 0)
                    {
                        self.outdated_empty.push(PageRef { pool, page });
                    }
                }
            }
        }
    }

    /// Runs a cleanup. Periodic: freed dedicated pages and empty pages of outdated arena classes
    /// go back. Explicit: also every empty, unguarded page of the small pool and the current
    /// arena class, and every freed persistent page.
    pub fn cleanup(&mut self, shim: &S, kind: Cleanup) {
        self.collect_returns();
        // The periodic tick runs on every reservation: with nothing to release it costs nothing.
        if kind == Cleanup::Periodic
            && !self.dedicated_freed
            && self.outdated_empty.is_empty()
            && self.guards.is_empty()
        {
            return;
        }
        self.drop_released_guards();
        let mut released: Vec<(RawPage<S>, u64)> = Vec::new();
        if self.dedicated_freed || kind == Cleanup::Explicit {
            let mut pages = Vec::new();
            self.dedicated.take_free(&mut pages);
            released.extend(pages.into_iter().map(|p| (p.raw, p.size)));
            self.dedicated_freed = false;
        }
        for page in core::mem::take(&mut self.outdated_empty) {
            if let Some(p) = self
                .sliced_mut(page.pool)
                .and_then(|s| s.remove_page_if_empty(page.page))
            {
                released.push((p.raw, p.size));
            }
        }
        if kind == Cleanup::Explicit {
            let mut pages = Vec::new();
            self.persistent.take_free(&mut pages);
            released.extend(pages.into_iter().map(|p| (p.raw, p.size)));
            let sliced_ids: Vec<PoolId> = core::iter::once(POOL_SMALL)
                .chain(
                    (0..self.arena.len())
                        .filter(|&i| self.arena[i].is_some())
                        .map(|i| POOL_ARENA_BASE + i as u8),
                )
                .collect();
            for id in sliced_ids {
                let pool = self.sliced_mut(id).expect("listed above");
                let empty: Vec<u32> = pool.empty_pages().collect();
                for page in empty {
                    if let Some(p) = pool.remove_page_if_empty(page) {
                        released.push((p.raw, p.size));
                    }
                }
            }
        }
        // Outdated classes with no page left free their slot.
        for slot in 0..self.arena.len() {
            let empty_outdated = self.arena[slot]
                .as_ref()
                .is_some_and(|p| !p.is_serving() && p.pages_live == 0);
            if empty_outdated {
                self.arena[slot] = None;
            }
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
            raw,
            size,
            budget: self.budget.clone(),
        };
        match self.release {
            // SAFETY: `Immediate` is set only through the unsafe `release_pages_immediately`,
            // whose caller promised that no device work uses memory whose handles were dropped;
            // an empty page holds no live allocation.
            PageRelease::Immediate => unsafe { page.free(shim) },
            PageRelease::Fenced => self.retired.push(page),
        }
    }

    /// Takes the pages retired since the last call; each must be freed (see
    /// [`RetiredPage::free`]) once no device work can use it.
    pub(crate) fn take_retired(&mut self) -> Vec<RetiredPage<RawPage<S>>> {
        core::mem::take(&mut self.retired)
    }

    /// Bytes of pages retired and not yet freed.
    pub fn retired_bytes(&self) -> u64 {
        self.retired.iter().map(|p| p.size).sum()
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
        let mut pages: Vec<(RawPage<S>, u64)> = Vec::new();
        let mut sliced: Vec<SlicedPool<RawPage<S>>> = Vec::new();
        let small_page = self.small.page_size;
        sliced.push(core::mem::replace(
            &mut self.small,
            SlicedPool::new(small_page),
        ));
        sliced.extend(self.arena.iter_mut().filter_map(Option::take).map(|b| *b));
        self.current = None;
        for pool in sliced {
            pages.extend(pool.into_pages().map(|p| (p.raw, p.size)));
        }
        for whole in [&mut self.persistent, &mut self.dedicated] {
            pages.extend(core::mem::take(whole).into_pages().map(|p| (p.raw, p.size)));
        }
        self.outdated_empty.clear();
        for (raw, size) in pages {
            let page = RetiredPage {
                raw,
                size,
                budget: self.budget.clone(),
            };
            // SAFETY: the caller guarantees no pending work uses any page of this manager.
            unsafe { page.free(shim) };
        }
        // SAFETY: as above.
        unsafe { self.free_retired(shim) };
    }

    /// Leaks every page on purpose: for a teardown that could not tell whether the device is
    /// done with them.
    pub(crate) fn forget_all(&mut self) {
        let small_page = self.small.page_size;
        core::mem::forget(core::mem::replace(
            &mut self.small,
            SlicedPool::new(small_page),
        ));
        for slot in &mut self.arena {
            core::mem::forget(slot.take());
        }
        self.current = None;
        core::mem::forget(core::mem::take(&mut self.persistent));
        core::mem::forget(core::mem::take(&mut self.dedicated));
        core::mem::forget(core::mem::take(&mut self.retired));
    }
}

impl<S: Shim> Drop for MemoryManager<S> {
    fn drop(&mut self) {
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
