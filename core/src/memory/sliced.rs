//! A sliced pool: device pages (of any size) carved into blocks.
//!
//! Owns its pages, their blocks (neighbours linked: freed blocks coalesce at once) and one index
//! of free blocks across every page, so a request lands in the best-fitting free block of any
//! page: good-fit (the smallest class that holds it, first fit inside), or at a chosen offset
//! ([`SlicedPool::carve_at`]). Device calls and when an empty page goes back: the manager's.
//! A block's record and the links the index walks are in `sliced/block.rs`.

mod block;

use super::free_index::{FreeIndex, NIL};
use super::handle::{Location, Placed};
use super::pool::{MAX_BLOCKS, Pool};
use super::report::Usage;
use alloc::vec::Vec;
pub(crate) use block::Used;

/// The largest alignment a sliced pool's callers may round a request to: a used block keeps its
/// padding (at most the alignment) in 32 bits. The manager and the pinned pool cap theirs here.
pub(crate) const MAX_ALIGNMENT: u64 = 1 << 31;
use block::{Block, BlockState, MAX_PAGES};

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
    /// The pages' size where all share one (the small pool), else the pool's first; see `Page`.
    pub page_size: u64,
    free_pages: Vec<u32>,
    vacant: u32,
    index: FreeIndex,
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
    /// offset in its page) rates lowest among the first `limit` that fit, in good-fit order.
    pub(crate) fn try_carve_scored(
        &mut self,
        size: u64,
        aligned: u64,
        used: Used,
        limit: usize,
        mut score: impl FnMut(u64) -> u32,
    ) -> Option<Carved> {
        let blocks = &self.blocks;
        let b = self
            .index
            .find_scored(blocks, aligned, limit, |b| score(blocks[b as usize].offset))?;
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

    /// Every free block of an indexed page, as (block, page, offset in the page, size).
    pub(crate) fn free_blocks(&self) -> impl Iterator<Item = (u32, u32, u64, u64)> + '_ {
        self.blocks.iter().enumerate().filter_map(|(i, b)| {
            let indexed = self
                .pages
                .get(b.page() as usize)
                .and_then(Option::as_ref)
                .is_some_and(|p| p.indexed);
            (b.is_free() && indexed).then_some((i as u32, b.page(), b.offset, b.size))
        })
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
        p.padding += aligned - size;
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

    /// The offset in its page and the size of the used block `block`, if it is bound to `owner`.
    pub(crate) fn used_span(&self, block: u32, owner: u64) -> Option<(u64, u64)> {
        let b = self.blocks.get(block as usize)?;
        b.used_by(owner).map(|_| (b.offset, b.size))
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
        let b = *self.blocks.get(block as usize)?;
        let used = b.used_by(owner)?;
        let page = b.page();
        let (indexed, _) = {
            let p = self.pages[page as usize]
                .as_mut()
                .expect("a block's page is live");
            p.live -= 1;
            p.in_use -= used.size;
            p.padding -= b.size - used.size;
            (p.indexed, ())
        };
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
        Some(page)
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

    /// Indices of the pages that hold nothing and are not guarded.
    pub(crate) fn empty_pages(&self) -> impl Iterator<Item = u32> + '_ {
        self.pages.iter().enumerate().filter_map(|(i, p)| {
            p.as_ref()
                .filter(|p| p.live == 0 && p.guards == 0)
                .map(|_| i as u32)
        })
    }

    /// Every live page.
    pub(crate) fn pages(&self) -> impl Iterator<Item = (u32, &Page<P>)> + '_ {
        self.pages
            .iter()
            .enumerate()
            .filter_map(|(i, p)| p.as_ref().map(|p| (i as u32, p)))
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

    /// Totals over the pool.
    pub(crate) fn usage(&self) -> Usage {
        self.pages()
            .map(|(_, p)| Usage {
                allocations: u64::from(p.live),
                in_use: p.in_use,
                padding: p.padding,
                reserved: p.size,
            })
            .sum()
    }

    /// The largest free block a reservation could be carved from (guarded pages serve
    /// nothing): for the error of a reservation that may not add a page.
    pub(crate) fn largest_free(&self) -> u64 {
        self.free_blocks()
            .map(|(_, _, _, size)| size)
            .max()
            .unwrap_or(0)
    }

    /// Every used block as (page, offset within page, block size, used), for checks.
    pub(crate) fn used_blocks(&self) -> impl Iterator<Item = (u32, u64, u64, Used)> + '_ {
        self.blocks.iter().filter_map(|b| match b.state() {
            BlockState::Used { owner, .. }
                if self
                    .pages
                    .get(b.page() as usize)
                    .is_some_and(Option::is_some) =>
            {
                Some((b.page(), b.offset, b.size, b.used_by(owner)?))
            }
            _ => None,
        })
    }
}

#[cfg(test)]
#[path = "sliced_tests.rs"]
mod tests;
