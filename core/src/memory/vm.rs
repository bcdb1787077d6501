//! A granule pool: one reserved device address range, carved like a sliced pool, with device
//! memory behind it only where live allocations lie (devices with virtual memory management:
//! [`DeviceFacts::vm_granule`](crate::shim::DeviceFacts::vm_granule)).
//!
//! Owns the address range's blocks (a [`SlicedPool`] with the range as its one page, so free
//! neighbours coalesce across granules and a request is placed best-fit anywhere in the range), and
//! the state of each granule: unmapped, mapped (with how many allocations, and blocks held back for
//! a repeat of their size, touch it and how many guards hold it), or retiring (handed to the device
//! to unmap once its fence passes, and taken back if needed before that), the mapping it belongs to
//! (what one device call mapped: the granule alone, or under `map_spans` the granules a placement
//! covers whole), with exact counts of the granules in use (touched or guarded), idle, and idle but
//! pinned by a granule in use in their mapping. The mappings themselves (recording one, taking a
//! retiring one back, the counts of their granules in use) are `vm/mapping.rs`; the give-back
//! side (the cache of mapped granules no allocation touches, the retiring list, teardown) is
//! `vm/idle.rs`; placement (the bounded, scored choice of a block and the search of mapped room
//! for a recording) is `vm/place.rs`; a bit per granule saying whether it is mapped, which placement, its scoring,
//! the counts of granules going into or out of use and the cache's idle test read instead of the
//! records (so it must change with the backing, before any of them looks), is `vm/bits.rs`. Does not own the device calls nor the budget
//! (the manager maps, unmaps and counts: `manager/granules.rs`), nor when the cache is given
//! back (the manager's policy, from [`IdleGranules`](crate::memory::IdleGranules): before
//! growing past the peak, past the slack at a reservation, and at an explicit cleanup).
//!
//! Why: memory held is the granules touched by live allocations (with `map_spans`, and the idle
//! granules of their mappings), never a page sized for a request long gone; a freed granule goes
//! back without moving any allocation.

mod bits;
mod idle;
mod mapping;
mod place;

use super::retire::{Retire, RetireToken};
use super::sliced::{Carved, SlicedPool, Used};
use alloc::sync::Arc;
use alloc::vec::Vec;
use bits::MappedBits;

/// What is behind one granule of the range.
#[derive(Debug)]
pub(crate) enum Backing {
    /// Nothing.
    Unmapped,
    /// Device memory (the shim's handle of the mapping the granule belongs to).
    Mapped(u64),
    /// Device memory handed to the drop queue to unmap after a fence; the token says whether it
    /// did, or the manager took it back first. Every granule of the mapping shares it.
    Retiring(u64, Arc<RetireToken>),
}

/// One granule: its guards, what is behind it, and the mapping it belongs to (its count of uses
/// lies apart, in [`GranulePool`]'s `uses`, which every placement walks). A mapping is
/// what one device call mapped: one granule, or under
/// [`MemoryConfig::map_spans`](crate::memory::MemoryConfig::map_spans) the missing granules a
/// placement covers whole. It goes back whole (the contract's `vm_unmap` takes back exactly what one
/// `vm_map` mapped): only once every granule of it is idle, and taking back one retiring granule
/// takes back its whole mapping.
#[derive(Debug)]
struct Granule {
    /// Guards that keep it mapped (counted in its uses too).
    guards: u32,
    /// The first granule of the mapping it belongs to, while backed (stale while unmapped).
    head: u32,
    /// On a mapping's first granule: how many granules the mapping spans.
    len: u32,
    /// On a mapped mapping's first granule, under spans only: how many of its granules are in
    /// use (touched or guarded); 0 when it may go back (`GranulePool::mapping_in_use`).
    in_use: u32,
    backing: Backing,
}

/// Free blocks a placement compares by the maps they would need (bounded: the cost of a
/// placement does not grow with the number of allocations).
const CANDIDATES: usize = 8;

/// Whether memory is behind `g` that a new allocation may use without a device call (mapped,
/// or retiring and still takeable).
fn usable(g: &Granule) -> bool {
    match &g.backing {
        Backing::Mapped(_) => true,
        Backing::Retiring(_, token) => token.state() == Retire::Pending,
        Backing::Unmapped => false,
    }
}

/// What is behind the granules a placement touches ([`GranulePool::touch`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Behind {
    /// Granules with no memory a new allocation may use without a device call (unmapped, or
    /// retiring and no longer takeable): what mapping them would take.
    pub missing: u32,
    /// Whether every granule is mapped (none unmapped or retiring): nothing to take back or map.
    pub all_mapped: bool,
}

/// How a granule stands for a new allocation placed over it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Need {
    /// Memory is behind it.
    Mapped,
    /// It was retiring and was taken back: memory is behind it again.
    TakenBack,
    /// It must be mapped.
    Map,
}

/// One reserved address range and the state of its granules.
#[derive(Debug)]
pub(crate) struct GranulePool {
    /// The blocks: one page, the whole range (the range itself is released by the manager).
    pub pool: SlicedPool<()>,
    pub base: u64,
    pub granule: u64,
    shift: u32,
    granules: Vec<Granule>,
    /// Per granule, the live allocations that touch it plus the guards that hold it: in use
    /// while not 0. Apart from the records so that a placement's walk over its granules reads
    /// 4 bytes of each, side by side, instead of a 40-byte record.
    uses: Vec<u32>,
    /// Whether a mapping may span several granules ([`MemoryConfig::map_spans`]): else every
    /// mapping is one granule, whose count in use is its uses (`vm/mapping.rs` keeps no count).
    ///
    /// [`MemoryConfig::map_spans`]: crate::memory::MemoryConfig::map_spans
    spans: bool,
    /// Which granules are mapped (kept with every change of their backing to or from it).
    mapped_bits: MappedBits,
    /// Mapped granules no allocation touches, most recent last (entries may be stale: checked
    /// when taken).
    cache: Vec<u32>,
    /// The first granules of retiring mappings, for [`Self::settle`] (entries may be stale:
    /// checked there).
    retiring: Vec<u32>,
    /// Granules with memory behind them (mapped or retiring).
    pub mapped: u32,
    /// Granules touched by a live allocation or held by a guard (whatever is behind them).
    pub busy: u32,
    /// Idle granules whose mapping has a granule in use: they cannot go back before it (only
    /// under `map_spans`, where a mapping spans several granules).
    pinned: u32,
    /// Granules retiring now (counted in `mapped` until their fence).
    retiring_now: u32,
    pub mapped_peak: u32,
    /// Map and unmap calls made, for the report and benchmarks.
    pub maps: u64,
    pub unmaps: u64,
}

impl GranulePool {
    /// A pool over the range `[base, base + size)`; `granule` is a power of two dividing `base`
    /// and `size`; `spans`: whether a mapping may span several granules.
    pub(crate) fn new(base: u64, size: u64, granule: u64, spans: bool) -> Self {
        debug_assert!(
            granule.is_power_of_two()
                && base.is_multiple_of(granule)
                && size.is_multiple_of(granule)
        );
        let mut pool = SlicedPool::new(granule);
        pool.add_page((), base, size);
        let count = size >> granule.trailing_zeros();
        let mut granules = Vec::new();
        granules.resize_with(count as usize, || Granule {
            guards: 0,
            head: 0,
            len: 0,
            in_use: 0,
            backing: Backing::Unmapped,
        });
        Self {
            pool,
            base,
            granule,
            shift: granule.trailing_zeros(),
            mapped_bits: MappedBits::new(granules.len()),
            uses: alloc::vec![0; granules.len()],
            spans,
            granules,
            cache: Vec::new(),
            retiring: Vec::new(),
            mapped: 0,
            busy: 0,
            pinned: 0,
            retiring_now: 0,
            mapped_peak: 0,
            maps: 0,
            unmaps: 0,
        }
    }

    /// The granules `[first, last]` that the bytes `[addr, addr + len)` touch.
    #[inline]
    pub(crate) fn span(&self, addr: u64, len: u64) -> (u32, u32) {
        let start = addr - self.base;
        let end = start + len.max(1) - 1;
        ((start >> self.shift) as u32, (end >> self.shift) as u32)
    }

    /// The first device address of granule `g`.
    pub(crate) fn addr_of(&self, g: u32) -> u64 {
        self.base + (u64::from(g) << self.shift)
    }

    /// Granules the pool itself holds memory behind now: mapped ones. A retiring granule is the
    /// drop queue's until its fence passes (the report counts it there), or mapped again once
    /// taken back. From the counts (`mapped` holds the retiring ones too): a walk of the range,
    /// which may span a hundred thousand granules, made every report cost as much (debug builds
    /// still check the counts, and the mapped bits, against it).
    pub(crate) fn mapped_now(&self) -> u32 {
        let mapped = self.mapped - self.retiring_now;
        debug_assert_eq!(
            mapped as usize,
            self.granules
                .iter()
                .filter(|g| matches!(g.backing, Backing::Mapped(_)))
                .count(),
            "the counts of mapped and retiring granules agree with the granules"
        );
        debug_assert!(
            self.granules.iter().enumerate().all(|(g, gr)| {
                self.mapped_bits.get(g as u32) == matches!(gr.backing, Backing::Mapped(_))
            }),
            "the mapped bits agree with the granules"
        );
        mapped
    }

    /// Bytes of address space the range spans (reserved once; memory is mapped into it on
    /// demand).
    pub(crate) fn address_space(&self) -> u64 {
        (self.granules.len() as u64) << self.shift
    }

    /// Mapped granules neither touched nor guarded. Exact between placements, when every granule
    /// in use is mapped: what is behind the range, less what is retiring, less what is in use.
    pub(crate) fn idle_count(&self) -> u32 {
        self.mapped
            .saturating_sub(self.retiring_now)
            .saturating_sub(self.busy)
    }

    /// Bytes of device memory behind the range (retiring granules included).
    pub(crate) fn held(&self) -> u64 {
        u64::from(self.mapped) << self.shift
    }

    /// Counts a new allocation over `[first, last]`, and says what is behind those granules (from
    /// the mapped bits: the records are read only where a granule is not mapped while some
    /// mapping is retiring, and under spans for the count of a mapping a granule goes into use
    /// in).
    pub(crate) fn touch(&mut self, first: u32, last: u32) -> Behind {
        let unmapped = self.mapped_bits.unmapped_in(first, last);
        if self.spans {
            for g in first..=last {
                let uses = &mut self.uses[g as usize];
                *uses += 1;
                if *uses == 1 {
                    self.now_in_use(g);
                }
            }
        } else {
            // A granule going into use changes no mapping's count (`now_in_use`): counted only.
            let mut now = 0;
            for u in &mut self.uses[first as usize..=last as usize] {
                *u += 1;
                now += u32::from(*u == 1);
            }
            self.busy += now;
        }
        // Not mapped and nothing retiring: unmapped, so missing. Otherwise looked at one by one.
        let missing = if unmapped == 0 || self.retiring_now == 0 {
            unmapped
        } else {
            let records = &self.granules[first as usize..=last as usize];
            records.iter().filter(|g| !usable(g)).count() as u32
        };
        Behind {
            missing,
            all_mapped: unmapped == 0,
        }
    }

    /// Undoes a placement of `owner` at `block` over `[first, last]` (counted by
    /// [`Self::touch`]): the room is free again, and granules no allocation touches any more
    /// join the cache.
    pub(crate) fn undo(&mut self, first: u32, last: u32, block: u32, owner: u64) {
        self.untouch(first, last);
        self.pool.free(block, owner);
    }

    /// Counts an allocation over `[first, last]` gone; granules no allocation touches any more
    /// (and no guard holds) join the cache.
    pub(crate) fn untouch(&mut self, first: u32, last: u32) {
        if self.spans {
            for g in first..=last {
                let uses = &mut self.uses[g as usize];
                *uses -= 1;
                if *uses == 0 {
                    self.now_idle(g);
                }
            }
            return;
        }
        let uses = &mut self.uses[first as usize..=last as usize];
        // A granule going idle changes no mapping's count (`now_idle`): counted off and cached,
        // the cache compacted once after the walk.
        // No branch per granule: each is written just past the cache's end, which moves over
        // it only where it went idle.
        self.cache.reserve(uses.len());
        let len = self.cache.len();
        let spare = self.cache.spare_capacity_mut();
        let mut idle = 0;
        for (g, u) in (first..).zip(uses) {
            *u -= 1;
            spare[idle].write(g); // `idle` is below the granules walked, so below `uses.len()`
            idle += usize::from(*u == 0);
        }
        // SAFETY: the `idle` slots past `len` were written (each before the end moved over it),
        // and `reserve` made room for them.
        unsafe { self.cache.set_len(len + idle) };
        self.busy -= idle as u32;
        self.compact_cache();
    }

    /// Frees the block bound to `owner`, held back where the pool may hold it (its granules stay
    /// touched until it is released); false when the block is not bound to `owner`.
    #[inline]
    pub(crate) fn free(&mut self, block: u32, owner: u64) -> bool {
        let Some(f) = self.pool.free_held(block, owner) else {
            return false;
        };
        if !f.held {
            self.untouch_span(f.span.0, f.span.1);
        }
        if let Some((offset, size)) = f.released {
            self.untouch_span(offset, size);
        }
        true
    }

    /// A block held back of exactly `aligned` bytes for `used` (its granules are touched, so
    /// mapped, still); on a miss every held block is released, so the placement that follows
    /// sees the free room as if none had been held.
    #[inline(always)]
    pub(crate) fn take_held(&mut self, size: u64, aligned: u64, used: Used) -> Option<Carved> {
        let c = self.pool.take_held(size, aligned, used);
        if c.is_none() && self.pool.held_count() != 0 {
            self.release_held();
        }
        c
    }

    /// Releases every block held back: the granules they touch are counted off.
    pub(crate) fn release_held(&mut self) {
        if self.pool.held_count() == 0 {
            return;
        }
        let mut spans = [(0, 0); crate::memory::sliced::HELD];
        let mut n = 0;
        self.pool.release_held(|offset, size| {
            spans[n] = (offset, size);
            n += 1;
        });
        for &(offset, size) in &spans[..n] {
            self.untouch_span(offset, size);
        }
    }

    /// [`Self::untouch`] of the granules `size` bytes at `offset` in the range touch.
    #[inline]
    fn untouch_span(&mut self, offset: u64, size: u64) {
        let (first, last) = self.span(self.base + offset, size);
        self.untouch(first, last);
    }

    /// Adds or removes a guard on granule `g`; an unguarded idle granule joins the cache.
    pub(crate) fn guard(&mut self, g: u32, add: bool) {
        let Some(gr) = self.granules.get_mut(g as usize) else {
            return;
        };
        let uses = &mut self.uses[g as usize];
        if add {
            gr.guards += 1;
            *uses += 1;
            if *uses == 1 {
                self.now_in_use(g);
            }
        } else if gr.guards > 0 {
            gr.guards -= 1;
            *uses -= 1;
            if *uses == 0 {
                self.now_idle(g);
            }
        }
    }

    /// Whether granule `g` is guarded.
    pub(crate) fn guarded(&self, g: u32) -> bool {
        self.granules
            .get(g as usize)
            .is_some_and(|gr| gr.guards > 0)
    }

    /// Whether granule `g` has memory behind it that a new allocation may use without a device
    /// call (mapped, or retiring and still takeable); changes nothing, unlike [`Self::need`].
    pub(crate) fn usable(&self, g: u32) -> bool {
        usable(&self.granules[g as usize])
    }

    /// Maximal runs of granules with memory behind them, as (first granule, count).
    pub(crate) fn runs(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        let n = self.granules.len() as u32;
        let backed = |g: u32| !matches!(self.granules[g as usize].backing, Backing::Unmapped);
        let mut g = 0;
        core::iter::from_fn(move || {
            while g < n && !backed(g) {
                g += 1;
            }
            if g >= n {
                return None;
            }
            let first = g;
            while g < n && backed(g) {
                g += 1;
            }
            Some((first, g - first))
        })
    }

    /// The run of backed granules that holds granule `g`, as (first granule, count).
    pub(crate) fn run_of(&self, g: u32) -> (u32, u32) {
        let backed = |g: u32| !matches!(self.granules[g as usize].backing, Backing::Unmapped);
        let mut first = g;
        while first > 0 && backed(first - 1) {
            first -= 1;
        }
        let mut end = g + 1;
        while (end as usize) < self.granules.len() && backed(end) {
            end += 1;
        }
        (first, end - first)
    }
}
