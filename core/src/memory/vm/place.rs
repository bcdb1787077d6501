//! Where a granule pool places a request: good fit among a bounded number of free blocks,
//! preferring the one whose granules need the fewest maps, or (for a reservation that may not
//! map) only over granules with memory behind them.
//!
//! Owns that choice. Does not own the blocks, their carving and the free index (`sliced.rs`,
//! `free_index.rs`), nor the counts of the granules a placement touches (`vm.rs`).

use super::{CANDIDATES, GranulePool, usable};
use crate::memory::sliced::{Carved, Used};

impl GranulePool {
    /// Places `aligned` bytes good-fit, preferring, among the first [`CANDIDATES`] free blocks
    /// that fit, the one whose granules need the fewest maps (memory already behind them is
    /// reused instead of mapping more and giving idle granules back elsewhere).
    pub(crate) fn carve(&mut self, size: u64, aligned: u64, used: Used) -> Option<Carved> {
        let (shift, granules, bits) = (self.shift, &self.granules, &self.mapped_bits);
        let retiring = self.retiring_now != 0;
        self.pool
            .try_carve_scored(size, aligned, used, CANDIDATES, |offset, bound| {
                let first = (offset >> shift) as u32;
                let last = ((offset + aligned.max(1) - 1) >> shift) as u32;
                let unmapped = bits.unmapped_in(first, last);
                if unmapped == 0 || !retiring {
                    return unmapped;
                }
                // Some may be retiring and still takeable (usable): looked at one by one.
                let mut missing = 0;
                for g in &granules[first as usize..=last as usize] {
                    missing += u32::from(!usable(g));
                    if missing >= bound {
                        break; // no better than a block already seen
                    }
                }
                missing
            })
    }

    /// Places `aligned` bytes as [`Self::carve`] does, but only where memory is already behind
    /// every granule it touches (retiring granules count: the caller takes them back); `None`,
    /// with the room free again, when none of the blocks `carve` compares is such room.
    /// Bounded like `carve`: for the hot path.
    pub(crate) fn carve_mapped(&mut self, size: u64, aligned: u64, used: Used) -> Option<Carved> {
        let c = self.carve(size, aligned, used)?;
        let (first, last) = self.span(c.addr, aligned);
        if (first..=last).all(|g| self.usable(g)) {
            return Some(c);
        }
        self.pool.free(c.block, used.owner);
        None
    }

    /// Places `aligned` bytes where memory is already behind every granule it touches (for a
    /// reservation that may not map: a recording), best fit among the free stretches; `None`
    /// when no such room is large enough. Walks every free block: for the rare reservations that
    /// may not change the device's memory.
    pub(crate) fn carve_in_mapped(
        &mut self,
        size: u64,
        aligned: u64,
        alignment: u64,
        used: Used,
    ) -> Option<Carved> {
        let mut best: Option<(u64, u32, u64)> = None; // (room, block, offset in block)
        for (block, _, offset, len) in self.pool.free_blocks() {
            let (start, end) = (self.base + offset, self.base + offset + len);
            let (first, last) = self.span(start, len);
            let mut g = first;
            while g <= last {
                if !self.usable(g) {
                    g += 1;
                    continue;
                }
                let run = g;
                while g <= last && self.usable(g) {
                    g += 1;
                }
                let lo = start.max(self.addr_of(run));
                let lo = lo.next_multiple_of(alignment);
                let hi = end.min(self.addr_of(g));
                if hi > lo && hi - lo >= aligned && best.is_none_or(|(room, ..)| hi - lo < room) {
                    best = Some((hi - lo, block, lo - start));
                }
            }
        }
        let (_, block, offset) = best?;
        Some(self.pool.carve_at(block, offset, size, aligned, used))
    }
}
