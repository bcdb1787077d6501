//! The mappings of a granule pool: what one device call mapped (one granule, or under
//! [`MemoryConfig::map_spans`](crate::memory::MemoryConfig::map_spans) the granules a placement
//! covers whole), which mapping each granule belongs to, and how many of a mapping's granules are
//! in use, so the idle granules beside one in use (pinned: their mapping cannot go back yet) are
//! counted exactly.
//!
//! Owns recording a new mapping ([`GranulePool::set_mapped`]), taking a retiring mapping back
//! whole or forgetting it whole when the drop queue unmapped it ([`GranulePool::need`]), and the
//! counts a granule going into or out of use changes. Does not own the use counts of each
//! granule nor placement (`vm.rs`), nor giving mappings back (`vm/idle.rs`).

use super::{Backing, GranulePool, Need};
use alloc::sync::Arc;

impl GranulePool {
    /// Idle granules that may go back now: [`Self::idle_count`] less those whose mapping has a
    /// granule in use.
    pub(crate) fn idle_free_count(&self) -> u32 {
        // Checked against a walk where the range is small (tests; not under miri, where the
        // walk at every reservation of a long test takes minutes): a debug build over a device's
        // whole range would walk a hundred thousand granules at every reservation.
        debug_assert!(
            cfg!(miri)
                || self.granules.len() > 4096
                || self.pinned as usize
                    == (0..self.granules.len() as u32)
                        .filter(|&g| { self.idle(g) && self.mapping_in_use(self.mapping(g).0) })
                        .count(),
            "the count of pinned idle granules agrees with the granules"
        );
        self.idle_count().saturating_sub(self.pinned)
    }

    /// Granule `g` went into use (touched or guarded, from neither): counted, and under spans in
    /// its mapping's count.
    #[inline]
    pub(super) fn now_in_use(&mut self, g: u32) {
        self.busy += 1;
        if !self.spans || !self.mapped_bits.get(g) {
            // Unmapped: counted when mapped or taken back (`count_in_use`). Without spans a
            // mapping is the granule alone: its uses are its count, and it pins no other.
            return;
        }
        let (head, len) = self.mapping(g);
        let h = &mut self.granules[head as usize];
        h.in_use += 1;
        if h.in_use == 1 {
            self.pinned += len - 1;
        } else {
            self.pinned -= 1;
        }
    }

    /// Granule `g` went out of use: counted off, and under spans in its mapping's count; it joins
    /// the cache.
    #[inline]
    pub(super) fn now_idle(&mut self, g: u32) {
        self.busy -= 1;
        if self.spans && self.mapped_bits.get(g) {
            let (head, len) = self.mapping(g);
            let h = &mut self.granules[head as usize];
            h.in_use -= 1;
            if h.in_use == 0 {
                self.pinned -= len - 1;
            } else {
                self.pinned += 1;
            }
        }
        self.cache_push(g);
    }

    /// Counts the granules in use of the mapping of `len` granules from `head`, just mapped or
    /// taken back.
    fn count_in_use(&mut self, head: u32, len: u32) {
        if !self.spans {
            return; // a mapping of one granule: its uses say (`mapping_in_use`), none pinned
        }
        let in_use = self.uses[head as usize..(head + len) as usize]
            .iter()
            .filter(|&&u| u > 0)
            .count() as u32;
        self.granules[head as usize].in_use = in_use;
        if in_use > 0 {
            self.pinned += len - in_use;
        }
    }

    /// Whether a granule of the mapping whose first granule is `head` is in use (without spans,
    /// the mapping is that granule: no count is kept beside its uses).
    #[inline]
    pub(super) fn mapping_in_use(&self, head: u32) -> bool {
        if self.spans {
            self.granules[head as usize].in_use > 0
        } else {
            self.uses[head as usize] > 0
        }
    }

    /// The mapping granule `g` (backed) belongs to, as (first granule, granules).
    #[inline]
    pub(super) fn mapping(&self, g: u32) -> (u32, u32) {
        let head = self.granules[g as usize].head;
        (head, self.granules[head as usize].len)
    }

    /// How granule `g` stands for an allocation about to be placed over it; a retiring granule
    /// whose fence has not passed is taken back with its whole mapping (so it counts as mapped
    /// from now on; the mapping's idle granules join the cache).
    pub(crate) fn need(&mut self, g: u32) -> Need {
        let (memory, token) = match &self.granules[g as usize].backing {
            Backing::Mapped(_) => return Need::Mapped,
            Backing::Unmapped => return Need::Map,
            Backing::Retiring(memory, token) => (*memory, Arc::clone(token)),
        };
        let (head, len) = self.mapping(g);
        self.retiring_now -= len;
        // A drop queue on another thread may be unmapping it right now: the address is mapped
        // again only once that is done.
        if token.take_back() {
            // The bits first: `idle` reads them.
            self.mapped_bits.set(head, len, true);
            for u in head..head + len {
                self.granules[u as usize].backing = Backing::Mapped(memory);
                if self.idle(u) {
                    self.cache_push(u);
                }
            }
            self.count_in_use(head, len);
            // `take_cached` counted it as given back; it never was.
            self.unmaps -= 1;
            Need::TakenBack
        } else {
            // Unmapped by the drop queue: its memory and budget are gone.
            for u in head..head + len {
                self.granules[u as usize].backing = Backing::Unmapped;
            }
            self.mapped -= len;
            Need::Map
        }
    }

    /// Records that the `len` granules from `first` were mapped by one call, with the shim's
    /// `memory`.
    pub(crate) fn set_mapped(&mut self, first: u32, len: u32, memory: u64) {
        debug_assert!(
            self.spans || len == 1,
            "a mapping of {len} granules without spans"
        );
        for gr in &mut self.granules[first as usize..(first + len) as usize] {
            gr.backing = Backing::Mapped(memory);
            gr.head = first;
        }
        self.mapped_bits.set(first, len, true);
        self.granules[first as usize].len = len;
        self.count_in_use(first, len);
        self.mapped += len;
        self.mapped_peak = self.mapped_peak.max(self.mapped);
        self.maps += 1;
    }
}
