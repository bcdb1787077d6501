//! The granule pools' device calls: reserving their address ranges, mapping the granules a new
//! allocation touches, and giving idle granules back.
//!
//! Owns when a range is reserved (at the pool's first request; a refusal turns the granule pools
//! off and the pools fall back to pages), when blocks held back go back to the pools (a placement
//! that no held block serves, and before idle granules are given back), the sharing of memory
//! between the two pools (an arena request up to a granule that would map one goes to room the
//! small pool has memory behind, where its bounded placement finds some), the order of a placement
//! (carve, count the granules, give idle granules back when mapping the missing ones would take the
//! pools past the most they ever held, map what is missing, undo all of it on a refusal) and how a
//! granule goes back (unmapped at once under [`PageRelease::Immediate`], else retired to the drop
//! queue with a token the pool can take it back through), and the give-back policy of
//! [`IdleGranules`] (at every reservation, the idle granules past the slack go back). Does not own
//! the bookkeeping of blocks and granules (`memory/vm.rs`) nor the routing of a request
//! (`reserve.rs`).

use super::MemoryManager;
use crate::error::IoError;
use crate::memory::config::{IdleGranules, PageRelease};
use crate::memory::pool::{Placed, Pool, Size};
use crate::memory::retire::{Released, RetireToken, RetiringGranule};
use crate::memory::sliced::Used;
use crate::memory::types::{PageUpdate, RetiredPage};
use crate::memory::vm::{GranulePool, Need};
use crate::shim::{DeviceAddr, Shim};
use alloc::boxed::Box;
use alloc::sync::Arc;

/// The most granules one range spans (2 TiB of 2 MiB granules; an H200's arena range, twice its
/// memory, is 143 360).
const MAX_RANGE_GRANULES: u64 = 1 << 20;

impl<S: Shim> MemoryManager<S> {
    /// Places `aligned` bytes in the granule pool serving `size`, mapping the granules it touches
    /// that have no memory behind them. `Ok(None)` when the pool cannot serve it (no granule pools,
    /// a full range, or, when `update` forbids mapping, no mapped room large enough): the caller
    /// falls back to pages.
    ///
    /// # Errors
    ///
    /// [`IoError::OutOfMemory`] (or the device's refusal) when a granule cannot be mapped; nothing
    /// changed then but idle granules given back, and the granules this placement mapped before
    /// the refusal, which stay mapped and idle (held and counted; a cleanup gives them back).
    #[inline(always)]
    pub(super) fn reserve_granules(
        &mut self,
        shim: &S,
        size: Size,
        aligned: u64,
        used: Used,
        update: PageUpdate,
    ) -> Result<Option<Placed>, IoError> {
        if !S::VIRTUAL_MEMORY || self.vm_granule == 0 {
            return Ok(None);
        }
        // A block held back at a free of this size: its granules are touched (so mapped) still.
        // On a miss, every held block is released. Inline: a reserve and drop loop of one size
        // makes no call for its placement.
        if let Some(pool) = self.vm[size.slot()].as_deref_mut()
            && let Some(c) = pool.take_held(used.size, aligned, used)
        {
            debug_assert!({
                let (first, last) = pool.span(c.addr, aligned);
                (first..=last).all(|g| pool.usable(g))
            });
            return Ok(Some(c.placed(Pool::Granules(size))));
        }
        self.place_granules(shim, size, aligned, used, update)
    }

    /// [`Self::reserve_granules`] past the blocks held back: a placement in the range (reserved
    /// first, at the pool's first request).
    #[inline(never)]
    fn place_granules(
        &mut self,
        shim: &S,
        size: Size,
        aligned: u64,
        used: Used,
        update: PageUpdate,
    ) -> Result<Option<Placed>, IoError> {
        let which = size.slot();
        if self.vm[which].is_none() {
            if update == PageUpdate::Forbidden {
                return Ok(None);
            }
            self.reserve_range(shim, size);
        }
        let alignment = self.alignment;
        let Some(pool) = self.vm[which].as_deref_mut() else {
            return Ok(None);
        };
        let carved = if update == PageUpdate::Forbidden {
            pool.carve_in_mapped(used.size, aligned, alignment, used)
        } else {
            pool.carve(used.size, aligned, used)
        };
        let Some(c) = carved else {
            if update == PageUpdate::Forbidden && size == Size::Arena && aligned <= self.vm_granule
            {
                // Room held ahead for a recording (`hold`, a warm-up) may lie in the small pool,
                // where sharing (below) placed it.
                return Ok(self.place_in_mapped(Size::Small, aligned, used, true));
            }
            return Ok(None);
        };
        let (first, last) = pool.span(c.addr, aligned);
        // Counted without taking retiring granules back: should the placement fall back to a
        // page below, they stay on their way out.
        let behind = pool.touch(first, last);
        let placed = c.placed(Pool::Granules(size));
        if behind.all_mapped {
            // Nothing to take back or map (the usual case below the peak): done, with no second
            // walk. Nothing was mapped or taken back, so the high-water mark is left as it is;
            // granules the drop queue unmapped since the last look are forgotten, as at the end
            // of every placement.
            self.settle_granules();
            return Ok(Some(placed));
        }
        let missing = behind.missing as usize;
        let granule = self.vm_granule;
        if missing > 0
            && update == PageUpdate::Allow
            && size == Size::Arena
            && aligned <= granule
            && let Some(shared) = self.place_in_mapped(Size::Small, aligned, used, false)
        {
            // Free room the small pool has memory behind serves it with no map: the arena's
            // partial granules and the small slices share memory instead of each holding a
            // granule of its own (a model whose small slices take a few hundred KiB holds no
            // granule for them alone).
            let pool = self.vm[which].as_deref_mut().expect("reserved above");
            pool.undo(first, last, c.block, used.owner);
            return Ok(Some(shared));
        }
        if missing > 0 {
            // Under `Forbidden` the placement lies over usable granules only, but a retiring one
            // may have been unmapped by a drop queue on another thread since: the walk below
            // undoes the placement then, as no map may be made.
            if update == PageUpdate::Allow {
                // Past the most the pools ever held, idle granules go back first: the peak
                // grows only by what live allocations need. Below it, they are kept for reuse
                // (each give back and map is a device call).
                let after = self.granules_held() + missing as u64 * granule;
                if after > self.vm_high_water {
                    let over = (after - self.vm_high_water).div_ceil(granule);
                    self.give_back_idle(shim, (over as usize).min(missing));
                }
            }
            if !self.budget_fits(shim, missing as u64 * granule, update) {
                // The granules this placement touches pass the budget where the request itself
                // might not (a placement maps whole granules): undone, and placed in a page of
                // its own size by the caller, or refused there with the budget's figures.
                let pool = self.vm[which].as_deref_mut().expect("reserved above");
                pool.undo(first, last, c.block, used.owner);
                return Ok(None);
            }
        }
        // Every granule of the span: a retiring one is taken back (with its mapping), a missing
        // one mapped; under `map_spans` those it covers whole side by side by one call.
        // Under `map_spans`, the granules a placement covers whole are mapped together; a first
        // or last granule it covers in part is mapped alone, as a neighbour may share it and a
        // mapping goes back only when every granule of it is idle. (A placement starts a free
        // block, whose bytes before it in its first granule belong to a used block, touched so
        // mapped: in practice only a last granule is covered in part and missing.)
        let spans = self.config.map_spans;
        let whole_first = c.addr.is_multiple_of(granule);
        let end = if (c.addr + aligned).is_multiple_of(granule) {
            last + 1
        } else {
            last
        };
        let mut g = first;
        while g <= last {
            let pool = self.vm[which].as_deref_mut().expect("reserved above");
            if pool.need(g) != Need::Map {
                g += 1;
                continue;
            }
            if update == PageUpdate::Forbidden {
                // A retiring granule counted usable above was unmapped since (its fence passed
                // between the count and here): no map may be made now, so the placement is
                // undone (the granules taken back join the cache) and the caller looks
                // elsewhere, as for any placement that does not fit.
                pool.undo(first, last, c.block, used.owner);
                return Ok(None);
            }
            let run = g;
            g += 1;
            if spans && (run != first || whole_first) {
                while g < end && pool.need(g) == Need::Map {
                    g += 1;
                }
            }
            let (addr, bytes) = (pool.addr_of(run), u64::from(g - run) * granule);
            let mapped = match self.budget.take(bytes) {
                Ok(()) => shim.vm_map(DeviceAddr(addr), bytes).map_err(|e| {
                    self.budget.give_back(bytes);
                    self.page_error(e, used.size, bytes)
                }),
                Err(r) => Err(IoError::OutOfMemory {
                    size: used.size,
                    held: r.held,
                    budget: Some(r.limit),
                    source: None,
                }),
            };
            let pool = self.vm[which].as_deref_mut().expect("reserved above");
            match mapped {
                Ok(memory) => pool.set_mapped(run, g - run, memory),
                Err(e) => {
                    // Undo the placement; the granules mapped for it join the cache (idle).
                    pool.undo(first, last, c.block, used.owner);
                    return Err(e);
                }
            }
        }
        self.vm_high_water = self.vm_high_water.max(self.granules_held());
        Ok(Some(placed))
    }

    /// Places `aligned` bytes in the granule pool serving `size` where memory is already behind
    /// every granule it touches (retiring ones taken back), or `None` with the room free again.
    /// `walk`: look at every free block (a reservation that may not map, rare), not only at the
    /// candidates a placement compares (bounded, for the hot path).
    fn place_in_mapped(
        &mut self,
        size: Size,
        aligned: u64,
        used: Used,
        walk: bool,
    ) -> Option<Placed> {
        let alignment = self.alignment;
        let pool = self.vm[size.slot()].as_deref_mut()?;
        // A block held back at a free of this size: touched and mapped still (on a miss, every
        // held block is released).
        if let Some(c) = pool.take_held(used.size, aligned, used) {
            return Some(c.placed(Pool::Granules(size)));
        }
        let c = if walk {
            pool.carve_in_mapped(used.size, aligned, alignment, used)?
        } else {
            pool.carve_mapped(used.size, aligned, used)?
        };
        let (first, last) = pool.span(c.addr, aligned);
        pool.touch(first, last);
        // A retiring granule the drop queue unmapped since `carve_mapped` looked (its fence
        // passed in between) needs a map: this placement is undone (granules taken back before
        // it stay mapped, idle) and the caller maps in its own pool.
        if (first..=last).any(|g| pool.need(g) == Need::Map) {
            pool.undo(first, last, c.block, used.owner);
            return None;
        }
        Some(c.placed(Pool::Granules(size)))
    }

    /// Whether `bytes` more fit the budget. Where they would not and `update` allows releasing,
    /// as many idle granules as the shortfall covers go back first (at once under
    /// [`PageRelease::Immediate`]; under `Fenced` they retire, and their budget returns at the
    /// fence a reclaim waits for).
    fn budget_fits(&mut self, shim: &S, bytes: u64, update: PageUpdate) -> bool {
        let Some(limit) = self.budget.limit() else {
            return true;
        };
        let short = self
            .budget
            .held()
            .saturating_add(bytes)
            .saturating_sub(limit);
        if short == 0 {
            return true;
        }
        if update == PageUpdate::Allow {
            let granules = short.div_ceil(self.vm_granule);
            self.give_back_idle(shim, usize::try_from(granules).unwrap_or(usize::MAX));
        }
        self.budget.held().saturating_add(bytes) <= limit
    }

    /// Releases the blocks every granule pool holds back (`sliced/held.rs`).
    pub(super) fn release_all_held(&mut self) {
        self.vm
            .iter_mut()
            .flatten()
            .for_each(|pool| pool.release_held());
    }

    /// Under [`IdleGranules::Slack`], gives back the idle granules past the slack above the
    /// granules in use (most recently idle first, as at growth). Run at every reservation that
    /// may change pages, after the returns are collected; free of device calls when within it.
    /// Under `map_spans` the slack counts every idle granule, those that may not go yet (beside
    /// one in use in their mapping) too, so whole idle mappings go in their place: measured to
    /// hold less over time, for a few more calls, than a slack over the free ones alone
    /// (BENCHMARKS.md, "Mapping spans"); when none may go and no block is held back (whose
    /// release could free some), nothing is tried.
    pub(super) fn trim_idle(&mut self, shim: &S) {
        let IdleGranules::Slack { per_64, floor } = self.config.idle_granules else {
            return;
        };
        if !S::VIRTUAL_MEMORY {
            return;
        }
        // The pools' granule: `vm_granule` turns 0 when new pages stop coming from the pools
        // (`map_pages(true)`, a refused range), while pools made before keep their granules.
        let Some(granule) = self.vm.iter().flatten().map(|p| p.granule).next() else {
            return;
        };
        let past_slack = |mm: &Self| {
            let (mut busy, mut idle, mut free) = (0u64, 0u64, 0u64);
            for pool in mm.vm.iter().flatten() {
                busy += u64::from(pool.busy);
                idle += u64::from(pool.idle_count());
                free += u64::from(pool.idle_free_count());
            }
            let keep = (floor / granule).max(busy * u64::from(per_64) / 64);
            (idle.saturating_sub(keep), free)
        };
        let (over, free) = past_slack(self);
        let held = || self.vm.iter().flatten().any(|p| p.pool.held_count() != 0);
        if over == 0 || (free == 0 && !held()) {
            return;
        }
        // Something goes back: blocks held back first, so the granules only they touch count
        // as idle (within the slack, held blocks stay and serve their repeats).
        self.release_all_held();
        let (over, _) = past_slack(self);
        if over > 0 {
            self.give_back_idle(shim, usize::try_from(over).unwrap_or(usize::MAX));
        }
    }

    /// Bytes of device memory behind the granule pools (retiring granules included; those the
    /// drop queue unmapped since are forgotten first).
    pub(super) fn granules_held(&mut self) -> u64 {
        self.settle_granules();
        self.vm.iter().flatten().map(|p| p.held()).sum()
    }

    /// Bytes of the granules mapped now and not on their way out (retiring ones left out).
    pub(super) fn granules_mapped_now(&mut self) -> u64 {
        self.settle_granules();
        self.vm
            .iter()
            .flatten()
            .map(|p| u64::from(p.mapped_now()) * p.granule)
            .sum()
    }

    /// Forgets the granules the drop queue unmapped since the last look ([`GranulePool::settle`]).
    pub(super) fn settle_granules(&mut self) {
        if !S::VIRTUAL_MEMORY {
            return;
        }
        for pool in self.vm.iter_mut().flatten() {
            pool.settle();
        }
    }

    /// Reserves the address range of the granule pool serving `size`: twice the memory the manager
    /// may hold for the large pool (room to place around holes), a quarter of it for the small one,
    /// each at most [`MAX_RANGE_GRANULES`]. A refusal turns the granule pools off.
    fn reserve_range(&mut self, shim: &S, size: Size) {
        let granule = self.vm_granule;
        let want = match size {
            Size::Small => self.memory / 4,
            Size::Arena => self.memory.saturating_mul(2),
        };
        // A pool keeps a record per granule of its range: bounded, so a device that does not
        // tell its memory (`u64::MAX` here) does not ask for 2^43 of them.
        let want = want.min(MAX_RANGE_GRANULES.saturating_mul(granule));
        let bytes = want / granule * granule;
        if bytes == 0 {
            self.vm_granule = 0;
            return;
        }
        match shim.vm_reserve(bytes) {
            Ok(addr) if addr.0.is_multiple_of(granule) => {
                let spans = self.config.map_spans;
                let pool = GranulePool::new(addr.0, bytes, granule, spans);
                self.vm[size.slot()] = Some(Box::new(pool));
            }
            Ok(addr) => {
                warn!(
                    "the device reserved an address range at {:#x}, not aligned to its granule of {} bytes: using pages",
                    addr.0, granule
                );
                // SAFETY: nothing was mapped in the range.
                unsafe { shim.vm_release(addr, bytes) };
                self.vm_granule = 0;
            }
            Err(e) => {
                debug!(
                    "reserving {} bytes of address space failed (status {}): using pages",
                    bytes, e.status
                );
                self.vm_granule = 0;
            }
        }
    }

    /// Gives back up to `count` idle granules (all of them for `usize::MAX`), most recently
    /// idle first, from both granule pools. A mapping goes back whole and only once every
    /// granule of it is idle, so under `map_spans` fewer may be found, or up to a mapping's
    /// granules less one more may go.
    pub(super) fn give_back_idle(&mut self, shim: &S, count: usize) {
        if !S::VIRTUAL_MEMORY {
            return;
        }
        // Blocks held back keep their granules touched: released first, so what only they
        // touch is idle and may go back instead of growing past the peak.
        self.release_all_held();
        let mut left = count;
        for which in 0..2 {
            while left > 0 {
                let Some(pool) = self.vm[which].as_deref_mut() else {
                    break;
                };
                let Some((g, len, memory)) = pool.take_cached() else {
                    break;
                };
                let (addr, size) = (pool.addr_of(g), u64::from(len) * pool.granule);
                match self.release {
                    PageRelease::Immediate => {
                        // SAFETY: `Immediate` is set only through the unsafe
                        // `release_pages_immediately`, whose caller promised no device work uses
                        // memory whose handles were dropped; a mapping whose every granule is
                        // idle holds no live allocation, and `size` is all of it.
                        unsafe { shim.vm_unmap(DeviceAddr(addr), size, memory) };
                        self.budget.give_back(size);
                    }
                    PageRelease::Fenced => {
                        let token = Arc::new(RetireToken::pending());
                        pool.retire(g, len, memory, Arc::clone(&token));
                        self.retire(RetiredPage {
                            raw: Released::Granule(RetiringGranule::new(addr, size, memory, token)),
                            size,
                            budget: self.budget.clone(),
                        });
                    }
                }
                left = left.saturating_sub(len as usize);
            }
        }
    }

    /// Counts the allocation at `block` of the granule pool serving `size`, bound to `owner`,
    /// gone from the granules it touched; returns whether it was there to free.
    pub(super) fn free_granules(&mut self, size: Size, block: u32, owner: u64) -> bool {
        let Some(pool) = self.granule_pool_mut(size) else {
            return false;
        };
        pool.free(block, owner)
    }
}
