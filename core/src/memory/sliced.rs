//! A sliced pool: device pages (of any size) carved into blocks.
//!
//! Owns its pages, their blocks (neighbours linked: freed blocks coalesce at once, or are held
//! back whole for a repeat of their size: `sliced/held.rs`) and one index of free blocks across
//! every page, so a request lands in the best-fitting free block of any page: good-fit (the
//! smallest class that holds it, first fit inside), or at a chosen offset
//! ([`SlicedPool::carve_at`]). Device calls and when an empty page goes back: the manager's.
//! A block's record and the links the index walks are in `sliced/block.rs`; what the pool
//! reports in `sliced/views.rs`.

mod block;
mod held;
mod views;

use super::free_index::{FreeIndex, NIL};
use super::pool::{Location, MAX_BLOCKS, Placed, Pool};
use alloc::vec::Vec;
pub(crate) use block::Used;

/// The largest alignment a sliced pool's callers may round a request to: a used block keeps its
/// padding (at most the alignment) in 32 bits. The manager and the pinned pool cap theirs here.
pub(crate) const MAX_ALIGNMENT: u64 = 1 << 31;
use block::{Block, BlockState, MAX_PAGES};
pub(crate) use held::HELD;

// A block keeps its page's index in 30 bits. Pages never outnumber blocks (a live page holds at
// least one, and a new page takes a freed index before the vector grows), and a pool numbers at
// most `MAX_BLOCKS` blocks, so every page index fits.
const _: () = assert!(MAX_BLOCKS <= MAX_PAGES);

/// A free block out of the index.
const FREE_UNLINKED: BlockState = BlockState::Free {
    prev: NIL,
    next: NIL,
};

/// One device page of a sliced pool.
#[derive(Debug)]
pub(crate) struct Page<P> {
    pub raw: P,
    pub addr: u64,
    pub size: u64,
    /// Allocations on the page.
    pub live: u32,
    /// Bytes asked for by the allocations on the page.
    pub in_use: u64,
    /// Alignment padding of the allocations on the page.
    pub padding: u64,
    /// Guards alive on the page: nothing new is carved and the page is never released.
    pub guards: u32,
    /// Whether the page's free blocks are in the index (not guarded, pool not outdated).
    indexed: bool,
    /// The block at offset 0: it keeps its index for the page's whole life (carving keeps the
    /// front part, and nothing precedes it to merge into).
    first: u32,
}

/// A block handed out: where it is and what it spans.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Carved {
    pub block: u32,
    pub page: u32,
    pub addr: u64,
}

impl Carved {
    /// Where the block is, as a handle keeps it, for a sliced pool that is `pool` of its manager.
    pub(crate) fn placed(self, pool: Pool) -> Placed {
        Placed {
            location: Location {
                pool,
                block: self.block,
            },
            addr: self.addr,
        }
    }
}

/// Pages carved into blocks; the two tables a lookup reads lie side by side first (`repr(C)`).
#[derive(Debug)]
#[repr(C)]
pub(crate) struct SlicedPool<P> {
    pages: Vec<Option<Page<P>>>,
    blocks: Vec<Block>,
    /// The size of a new page of the small pool (one fitted to a budget's last bytes may be
    /// smaller), else the pool's first; each page keeps its own size (see `Page`).
    pub page_size: u64,
    free_pages: Vec<u32>,
    vacant: u32,
    index: FreeIndex,
    /// Blocks freed lately, held back whole (`sliced/held.rs`).
    held: held::Held,
    pub pages_live: u32,
    pub pages_peak: u32,
}

impl<P> SlicedPool<P> {
    pub(crate) fn new(page_size: u64) -> Self {
        Self {
            page_size,
            pages: Vec::new(),
            free_pages: Vec::new(),
            blocks: Vec::new(),
            vacant: NIL,
            index: FreeIndex::default(),
            held: held::Held::default(),
            pages_live: 0,
            pages_peak: 0,
        }
    }

    fn new_block(&mut self, block: Block) -> u32 {
        if self.vacant != NIL {
            let i = self.vacant;
            if let BlockState::Vacant { next } = self.blocks[i as usize].state() {
                self.vacant = next;
            }
            self.blocks[i as usize] = block;
            i
        } else {
            let i = self.blocks.len() as u32;
            // A handle packs the index with its pool in one word: see `MAX_BLOCKS`.
            assert!(
                i < MAX_BLOCKS,
                "a new block was asked of a pool that numbers {i} already, the most it may \
                 (their records alone fill tens of GiB of host memory); free allocations first"
            );
            self.blocks.push(block);
            i
        }
    }

    fn vacate(&mut self, block: u32) {
        let vacant = BlockState::Vacant { next: self.vacant };
        self.blocks[block as usize].set_state(vacant);
        self.vacant = block;
    }

    /// Carves `aligned` bytes (`size` asked + padding) from a free block, if one fits.
    pub(crate) fn try_carve(&mut self, size: u64, aligned: u64, used: Used) -> Option<Carved> {
        let b = self.index.find(&self.blocks, aligned)?;
        self.index.remove(&mut self.blocks, b);
        Some(self.carve_front(b, size, aligned, used))
    }

    /// Carves `aligned` bytes from the front of the free block that `score` (given a block's
    /// offset in its page, and the lowest score so far, past which it may stop counting) rates
    /// lowest among the first `limit` that fit, in good-fit order.
    pub(crate) fn try_carve_scored(
        &mut self,
        size: u64,
        aligned: u64,
        used: Used,
        limit: usize,
        mut score: impl FnMut(u64, u32) -> u32,
    ) -> Option<Carved> {
        let blocks = &self.blocks;
        let b = self.index.find_scored(blocks, aligned, limit, |b, bound| {
            score(blocks[b as usize].offset, bound)
        })?;
        Some(self.carve_at(b, 0, size, aligned, used))
    }

    /// Carves `aligned` bytes at `offset` bytes into the free, indexed block `block` (which holds
    /// them); what is left before and after stays free.
    pub(crate) fn carve_at(
        &mut self,
        block: u32,
        offset: u64,
        size: u64,
        aligned: u64,
        used: Used,
    ) -> Carved {
        debug_assert!(self.blocks[block as usize].is_free());
        debug_assert!(offset + aligned <= self.blocks[block as usize].size);
        self.index.remove(&mut self.blocks, block);
        if offset == 0 {
            return self.carve_front(block, size, aligned, used);
        }
        // Split the front part off as a free block of its own; the rest starts at `offset`.
        let rest = self.split(block, offset);
        self.index.insert(&mut self.blocks, block);
        self.carve_front(rest, size, aligned, used)
    }

    /// Splits block `b` (out of the index) at `at` bytes from its start: `b` keeps the front,
    /// a new free block (not indexed) takes the rest, whose id is returned.
    fn split(&mut self, b: u32, at: u64) -> u32 {
        let front = self.blocks[b as usize];
        let next_phys = front.next_phys;
        let rest = self.new_block(Block::new(
            front.page(),
            front.offset + at,
            front.size - at,
            b,
            next_phys,
            FREE_UNLINKED,
        ));
        if next_phys != NIL {
            self.blocks[next_phys as usize].prev_phys = rest;
        }
        let front = &mut self.blocks[b as usize];
        front.next_phys = rest;
        front.size = at;
        rest
    }

    /// Carves from the front of the free block `b`, already out of the index.
    fn carve_front(&mut self, b: u32, size: u64, aligned: u64, used: Used) -> Carved {
        let (page, offset) = (
            self.blocks[b as usize].page(),
            self.blocks[b as usize].offset,
        );
        if self.blocks[b as usize].size > aligned {
            let rest = self.split(b, aligned);
            self.index.insert(&mut self.blocks, rest);
        }
        debug_assert_eq!(self.blocks[b as usize].size, aligned);
        self.mark_used(b, page, offset, size, aligned, used)
    }

    /// Binds block `b` (of `page`, at `offset`, `aligned` bytes, out of the index) to `used`,
    /// `size` bytes of it asked for, and counts it on its page.
    #[inline]
    fn mark_used(
        &mut self,
        b: u32,
        page: u32,
        offset: u64,
        size: u64,
        aligned: u64,
        used: Used,
    ) -> Carved {
        let padding = aligned - size;
        self.blocks[b as usize].set_state(BlockState::Used {
            owner: used.owner,
            padding: u32::try_from(padding).expect("padding is at most MAX_ALIGNMENT"),
        });
        let p = self.pages[page as usize]
            .as_mut()
            .expect("a block's page is live");
        p.live += 1;
        p.in_use += size;
        p.padding += padding;
        Carved {
            block: b,
            page,
            addr: p.addr + offset,
        }
    }

    /// Adds a page of `size` bytes; its room joins the index.
    pub(crate) fn add_page(&mut self, raw: P, addr: u64, size: u64) -> u32 {
        let page = Page {
            raw,
            addr,
            size,
            live: 0,
            in_use: 0,
            padding: 0,
            guards: 0,
            indexed: true,
            first: NIL,
        };
        let pi = match self.free_pages.pop() {
            Some(i) => {
                self.pages[i as usize] = Some(page);
                i
            }
            None => {
                self.pages.push(Some(page));
                (self.pages.len() - 1) as u32
            }
        };
        let b = self.new_block(Block::new(pi, 0, size, NIL, NIL, FREE_UNLINKED));
        self.index.insert(&mut self.blocks, b);
        if let Some(p) = self.pages[pi as usize].as_mut() {
            p.first = b;
        }
        self.pages_live += 1;
        self.pages_peak = self.pages_peak.max(self.pages_live);
        pi
    }

    /// The used block `block`, if it is bound to `owner`.
    pub(crate) fn used(&self, block: u32, owner: u64) -> Option<(Used, u32, u64)> {
        let b = self.blocks.get(block as usize)?;
        let u = b.used_by(owner)?;
        let page = self.pages.get(b.page() as usize)?.as_ref()?;
        Some((u, b.page(), page.addr + b.offset))
    }

    /// Binds the used block `block` of `owner` to `new_owner`; false when `owner` holds no such
    /// block.
    pub(crate) fn rebind(&mut self, block: u32, owner: u64, new_owner: u64) -> bool {
        let Some(b) = self.blocks.get_mut(block as usize) else {
            return false;
        };
        match b.state() {
            BlockState::Used { owner: o, padding } if o == owner => {
                b.set_state(BlockState::Used {
                    owner: new_owner,
                    padding,
                });
                true
            }
            _ => false,
        }
    }

    /// Frees the block bound to `owner`, coalescing it with free neighbours. Returns the page it
    /// was on, or `None` when the block is not bound to `owner` (already freed or rebound).
    pub(crate) fn free(&mut self, block: u32, owner: u64) -> Option<u32> {
        let (page, indexed) = self.uncount(block, owner)?;
        self.coalesce(block, indexed);
        Some(page)
    }

    /// Takes the used block `block` bound to `owner` off its page's counts; returns the page
    /// and whether it is indexed, or `None` when the block is not bound to `owner`.
    #[inline]
    fn uncount(&mut self, block: u32, owner: u64) -> Option<(u32, bool)> {
        let b = self.blocks.get(block as usize)?;
        let used = b.used_by(owner)?;
        let (page, padding) = (b.page(), b.size - used.size);
        let p = self.pages[page as usize]
            .as_mut()
            .expect("a block's page is live");
        p.live -= 1;
        p.in_use -= used.size;
        p.padding -= padding;
        Some((page, p.indexed))
    }

    /// Makes block `block` (uncounted: freed or held) free, coalesced with its free neighbours
    /// and indexed where its page is.
    fn release(&mut self, block: u32) {
        let page = self.blocks[block as usize].page();
        let indexed = self.pages[page as usize]
            .as_ref()
            .expect("a block's page is live")
            .indexed;
        self.coalesce(block, indexed);
    }

    /// [`Self::release`] where the page's `indexed` is known.
    #[inline]
    fn coalesce(&mut self, block: u32, indexed: bool) {
        let b = self.blocks[block as usize];
        let mut start = block;
        let mut size = b.size;
        let mut next = b.next_phys;
        if next != NIL && self.blocks[next as usize].is_free() {
            if indexed {
                self.index.remove(&mut self.blocks, next);
            }
            size += self.blocks[next as usize].size;
            let after = self.blocks[next as usize].next_phys;
            self.vacate(next);
            next = after;
        }
        let prev = b.prev_phys;
        if prev != NIL && self.blocks[prev as usize].is_free() {
            if indexed {
                self.index.remove(&mut self.blocks, prev);
            }
            size += self.blocks[prev as usize].size;
            self.vacate(block);
            start = prev;
        }
        let s = &mut self.blocks[start as usize];
        s.size = size;
        s.next_phys = next;
        s.set_state(FREE_UNLINKED);
        if next != NIL {
            self.blocks[next as usize].prev_phys = start;
        }
        if indexed {
            self.index.insert(&mut self.blocks, start);
        }
    }

    pub(crate) fn page(&self, page: u32) -> Option<&Page<P>> {
        self.pages.get(page as usize)?.as_ref()
    }

    /// Takes an empty, unguarded page out of the pool, returning its raw page for release.
    pub(crate) fn remove_page_if_empty(&mut self, page: u32) -> Option<Page<P>> {
        let p = self.pages.get(page as usize)?.as_ref()?;
        if p.live != 0 || p.guards != 0 {
            return None;
        }
        // Blocks held back on it join its free room first.
        self.release_held_on(page);
        let p = self.pages[page as usize].as_ref()?;
        let (indexed, b) = (p.indexed, p.first);
        // An empty page is one free block: its first.
        if indexed {
            self.index.remove(&mut self.blocks, b);
        }
        self.vacate(b);
        self.free_pages.push(page);
        self.pages_live -= 1;
        self.pages[page as usize].take()
    }

    /// Adds or removes a guard on `page`.
    pub(crate) fn guard(&mut self, page: u32, add: bool) {
        let Some(p) = self.pages.get_mut(page as usize).and_then(Option::as_mut) else {
            return;
        };
        if add {
            p.guards += 1;
        } else {
            p.guards = p.guards.saturating_sub(1);
        }
        let index = p.guards == 0;
        self.set_indexed(page, index);
    }

    fn set_indexed(&mut self, page: u32, indexed: bool) {
        let Some(p) = self.pages.get_mut(page as usize).and_then(Option::as_mut) else {
            return;
        };
        if p.indexed == indexed {
            return;
        }
        p.indexed = indexed;
        let mut b = p.first;
        while b != NIL {
            if self.blocks[b as usize].is_free() {
                if indexed {
                    self.index.insert(&mut self.blocks, b);
                } else {
                    self.index.remove(&mut self.blocks, b);
                }
            }
            b = self.blocks[b as usize].next_phys;
        }
    }

    /// Every page, for teardown, leaving the pool empty as new. Not inlined: the pool it swaps
    /// out (its free index is a kilobyte) lives in this frame only, not in the caller's.
    #[inline(never)]
    pub(crate) fn take_pages(&mut self) -> impl Iterator<Item = Page<P>> + use<P> {
        let page_size = self.page_size;
        let pool = core::mem::replace(self, Self::new(page_size));
        pool.pages.into_iter().flatten()
    }
}

#[cfg(test)]
#[path = "sliced_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "sliced_index_tests.rs"]
mod index_tests;
