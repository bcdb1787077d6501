//! Blocks held back: the last few blocks freed, kept whole (neither coalesced nor in the free
//! index) for a request of exactly their size. A reserve and drop of one size, which a model's
//! steps and an edge host's loop repeat, then costs no search, split, coalesce or index update,
//! and lands where the last one did.
//!
//! Owns the ring of held blocks and the rules: a block is held only where it is small (64 KiB at
//! most) and its page is indexed (no guard); only a full ring releases a block (the next in turn)
//! to take a new one; a held block is served only to a request of its exact size on an unguarded
//! page; any other request releases every held block into the free index before it is placed, so it
//! sees the free room exactly as if nothing had been held (only exact repeats land differently);
//! held blocks are released too before idle memory is given back, at an explicit cleanup and before
//! their page is taken out. Held blocks count as free on their page (its `live`, `in_use` and
//! `padding` dropped them). Does not own when the caller asks, nor what a caller counts beside the
//! pool (a granule pool keeps a held block's granules touched until it is released: `vm.rs`).

use super::{BlockState, Carved, SlicedPool, Used};

/// Blocks held at most per pool: a few (a loop that reserves and drops up to four sizes), so a
/// held block never keeps much room from the index.
pub(crate) const HELD: usize = 4;
const _: () = assert!(HELD.is_power_of_two(), "slots wrap by a mask");

/// The largest block held (a small pool's slice: 64 KiB), so what holding keeps from the index
/// (and, in a granule pool, touched) stays small; larger blocks coalesce at once. Measured
/// (BENCHMARKS.md, "Blocks held back"): held back up to 2 MiB, the peak rose on 15 of the 34
/// trace and RMM figures by up to 0.6 %, since blocks that large shape where the next large
/// requests go.
const HOLD_MAX: u64 = 64 << 10;

/// Whether this build holds blocks back (the `held-blocks` feature): without it every free
/// coalesces at once and nothing below holds, the branches compiled out. `--cfg
/// devcmd_no_held_blocks` turns it off too, for CI's host run of the unit tests as a firmware
/// builds them: the core's dev-dependencies turn `std`, so `held-blocks`, on in every test build,
/// and Cargo unifies features.
const HOLDING: bool = cfg!(all(feature = "held-blocks", not(devcmd_no_held_blocks)));

/// The ring of held blocks. A slot is empty where its size is 0 (no block is 0 bytes).
#[derive(Debug, Clone, Default)]
pub(super) struct Held {
    sizes: [u64; HELD],
    blocks: [u32; HELD],
    /// The slot the next held block takes when the ring is full (the oldest, unless a take
    /// emptied a slot since: a free fills an empty slot first).
    next: usize,
    count: usize,
    /// Whether frees hold blocks back: raised by a request of the size last freed (a repeat,
    /// which holding serves), lowered by a request no held block serves (holding would only
    /// delay the frees' coalescing: the stored model traces ran 1-7 % slower holding always).
    armed: bool,
    /// The size of the block last freed and not held.
    last_freed: u64,
}

/// What [`SlicedPool::free_held`] did with a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HeldFree {
    /// The page the block is on.
    pub page: u32,
    /// Whether the block is held (else it was freed and coalesced at once).
    pub held: bool,
    /// The block's offset in its page and its size.
    pub span: (u64, u64),
    /// A block held before, released to make room: its offset in its page and its size.
    pub released: Option<(u64, u64)>,
}

impl<P> SlicedPool<P> {
    /// Blocks held now.
    pub(crate) fn held_count(&self) -> usize {
        self.held.count
    }

    /// Serves `aligned` bytes (`size` asked) to `used` from a held block of exactly that size on
    /// an unguarded page, the most recently held first. A miss while blocks are held lowers
    /// holding (the caller then releases them); a request of the size last freed raises it.
    #[inline(always)]
    pub(crate) fn take_held(&mut self, size: u64, aligned: u64, used: Used) -> Option<Carved> {
        if !HOLDING {
            return None;
        }
        if self.held.count == 0 {
            self.held.armed |= aligned == self.held.last_freed;
            return None;
        }
        // The block held last first, inline: a loop of one size takes it back every time.
        let last = self.held.next.wrapping_sub(1) & (HELD - 1);
        if self.held.sizes[last] == aligned
            && let Some(c) = self.take_slot(last, size, aligned, used)
        {
            return Some(c);
        }
        self.take_held_from_ring(size, aligned, used)
    }

    /// [`Self::take_held`] past the block held last.
    #[inline(never)]
    fn take_held_from_ring(&mut self, size: u64, aligned: u64, used: Used) -> Option<Carved> {
        for back in 2..=HELD {
            let slot = self.held.next.wrapping_sub(back) & (HELD - 1);
            if self.held.sizes[slot] == aligned
                && let Some(c) = self.take_slot(slot, size, aligned, used)
            {
                return Some(c);
            }
        }
        self.held.armed = false;
        None
    }

    /// The block held in `slot` (of `aligned` bytes) bound to `used`, unless its page is guarded
    /// now (a guarded page's free room is not handed out).
    #[inline(always)]
    fn take_slot(&mut self, slot: usize, size: u64, aligned: u64, used: Used) -> Option<Carved> {
        let b = self.held.blocks[slot];
        let (page, offset) = (
            self.blocks[b as usize].page(),
            self.blocks[b as usize].offset,
        );
        if !self.pages[page as usize]
            .as_ref()
            .is_some_and(|p| p.indexed)
        {
            return None;
        }
        self.held.sizes[slot] = 0;
        self.held.count -= 1;
        Some(self.mark_used(b, page, offset, size, aligned, used))
    }

    /// A block for `aligned` bytes (`size` asked) bound to `used`: a held block of that size,
    /// else, every held block released first, a free block that fits ([`Self::try_carve`]). For
    /// pools whose held blocks nothing outside counts (pages; a granule pool releases its own:
    /// `vm.rs`).
    #[inline]
    pub(crate) fn carve_or_release(
        &mut self,
        size: u64,
        aligned: u64,
        used: Used,
    ) -> Option<Carved> {
        if let Some(c) = self.take_held(size, aligned, used) {
            return Some(c);
        }
        self.release_held(|_, _| ());
        self.try_carve(size, aligned, used)
    }

    /// Frees the block bound to `owner` as [`Self::free`] does, but holds it back whole where it
    /// may be (holding raised, at most [`HOLD_MAX`] bytes, its page indexed); `None` when the
    /// block is not bound to `owner`. The page's counts drop it either way, so a page left with no
    /// allocation reads as empty (and its held blocks are released before it goes).
    #[inline]
    pub(crate) fn free_held(&mut self, block: u32, owner: u64) -> Option<HeldFree> {
        let (page, indexed) = self.uncount(block, owner)?;
        let (offset, size) = (
            self.blocks[block as usize].offset,
            self.blocks[block as usize].size,
        );
        if !(HOLDING && self.held.armed && indexed && size <= HOLD_MAX) {
            self.held.last_freed = size;
            self.coalesce(block, indexed);
            return Some(HeldFree {
                page,
                held: false,
                span: (offset, size),
                released: None,
            });
        }
        // The next slot in turn; while the ring is not full, an empty one (a take emptied it),
        // so only a full ring releases a block to hold another.
        let mut slot = self.held.next;
        if self.held.sizes[slot] != 0 && self.held.count < HELD {
            slot = (0..HELD).find(|&s| self.held.sizes[s] == 0).unwrap_or(slot);
        }
        self.blocks[block as usize].set_state(BlockState::Held);
        let released = self.release_slot(slot);
        self.held.sizes[slot] = size;
        self.held.blocks[slot] = block;
        self.held.next = (slot + 1) & (HELD - 1);
        self.held.count += 1;
        Some(HeldFree {
            page,
            held: true,
            span: (offset, size),
            released,
        })
    }

    /// Releases every held block into the free index (coalesced with its free neighbours),
    /// telling `each` its offset in its page and its size first.
    #[inline(always)]
    pub(crate) fn release_held(&mut self, each: impl FnMut(u64, u64)) {
        if HOLDING && self.held.count != 0 {
            self.release_ring(each);
        }
    }

    /// [`Self::release_held`] with blocks held.
    #[inline(never)]
    fn release_ring(&mut self, mut each: impl FnMut(u64, u64)) {
        for slot in 0..HELD {
            if let Some((offset, size)) = self.release_slot(slot) {
                each(offset, size);
            }
        }
    }

    /// Releases the blocks held on `page` (which is about to go).
    pub(super) fn release_held_on(&mut self, page: u32) {
        if !HOLDING || self.held.count == 0 {
            return;
        }
        for slot in 0..HELD {
            if self.held.sizes[slot] != 0
                && self.blocks[self.held.blocks[slot] as usize].page() == page
            {
                self.release_slot(slot);
            }
        }
    }

    /// Releases the block held in `slot`, if any: returns its offset in its page and its size.
    #[inline]
    fn release_slot(&mut self, slot: usize) -> Option<(u64, u64)> {
        if self.held.sizes[slot] == 0 {
            return None;
        }
        let b = self.held.blocks[slot];
        let span = (self.blocks[b as usize].offset, self.blocks[b as usize].size);
        self.held.sizes[slot] = 0;
        self.held.count -= 1;
        self.release(b);
        Some(span)
    }

    /// Every held block as (block, offset in its page, size), for checks.
    #[cfg(test)]
    pub(crate) fn held_blocks(&self) -> impl Iterator<Item = (u32, u64, u64)> + '_ {
        (0..HELD).filter(|&s| self.held.sizes[s] != 0).map(|s| {
            let b = self.held.blocks[s];
            (b, self.blocks[b as usize].offset, self.held.sizes[s])
        })
    }
}
