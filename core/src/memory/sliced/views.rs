//! What a sliced pool reports: its pages, its free and used blocks, its totals. Read only; owns
//! none of the rules (`sliced.rs`, `sliced/held.rs`).

use super::{BlockState, Page, SlicedPool, Used};
use crate::memory::report::Usage;

impl<P> SlicedPool<P> {
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
