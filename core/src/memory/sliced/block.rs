//! The record of one block of a sliced pool: where it lies, its neighbours on the page, and
//! its state (free with its links in the free index, used by an allocation, held back whole
//! for a request of its size, or a vacant slot).
//!
//! Owns the record's layout (what every live allocation costs the pool: 40 bytes) and the
//! [`Links`] the free index walks. Does not own carving, coalescing or the index itself
//! (`sliced.rs`, `free_index.rs`).

use super::super::free_index::{Links, NIL};
use alloc::vec::Vec;

/// What a used block knows of its allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Used {
    /// The id of the handle it is bound to.
    pub owner: u64,
    /// Bytes asked for (the block may be larger by the padding).
    pub size: u64,
}

/// A used block keeps its owner and its padding (the bytes asked for are its size less the
/// padding, which is at most the caller's alignment, itself at most
/// [`MAX_ALIGNMENT`](super::MAX_ALIGNMENT)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum BlockState {
    Free {
        prev: u32,
        next: u32,
    },
    Used {
        owner: u64,
        padding: u32,
    },
    Vacant {
        next: u32,
    },
    /// Freed and held back whole for a request of its exact size (`sliced/held.rs`): neither
    /// coalesced nor in the free index.
    Held,
}

/// The most pages a block's record can name: it keeps its state's kind in the top two bits of
/// its page's index (the pool never numbers that many: see `sliced.rs`).
pub(super) const MAX_PAGES: u32 = 1 << 30;
const KIND_SHIFT: u32 = 30;
const FREE: u32 = 0;
const USED: u32 = 1;
const VACANT: u32 = 2;
const HELD: u32 = 3;

/// A block of a page: its place, its neighbours on the page (blocks, or `NIL`), its state.
///
/// The state is packed by hand (its kind beside the page's index, its payload in one word and
/// one half-word), where an enum field would pad the record to 48 bytes: read and written only
/// as a [`BlockState`] ([`Self::state`], [`Self::set_state`]).
#[derive(Clone, Copy)]
pub(super) struct Block {
    pub offset: u64,
    pub size: u64,
    /// A used block's owner; a free block's links (previous in the low half, next in the high);
    /// a vacant slot's next.
    word: u64,
    /// A used block's padding.
    half: u32,
    /// The page's index, and the state's kind in the top two bits.
    page_kind: u32,
    pub prev_phys: u32,
    pub next_phys: u32,
}

// A block is part of what every live allocation costs (issue 19): 40 bytes on every target (the
// enum it replaced padded it to 48 wherever `u64` aligns to 8, Cortex-M and 64-bit hosts).
const _: () = assert!(core::mem::size_of::<Block>() <= 40);

impl core::fmt::Debug for Block {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Block")
            .field("page", &self.page())
            .field("offset", &self.offset)
            .field("size", &self.size)
            .field("prev_phys", &self.prev_phys)
            .field("next_phys", &self.next_phys)
            .field("state", &self.state())
            .finish()
    }
}

impl Block {
    /// A block of `page` (below [`MAX_PAGES`]) at `offset`, of `size` bytes.
    #[inline]
    pub(super) fn new(
        page: u32,
        offset: u64,
        size: u64,
        prev_phys: u32,
        next_phys: u32,
        state: BlockState,
    ) -> Self {
        // Proven for every page a pool numbers (the compile-time check in `sliced.rs`).
        debug_assert!(page < MAX_PAGES, "page {page} past the record's 30 bits");
        let mut b = Self {
            offset,
            size,
            word: 0,
            half: 0,
            page_kind: page,
            prev_phys,
            next_phys,
        };
        b.set_state(state);
        b
    }

    /// The index of the block's page.
    #[inline]
    pub(super) fn page(&self) -> u32 {
        self.page_kind & (MAX_PAGES - 1)
    }

    /// The block's state.
    #[inline]
    pub(super) fn state(&self) -> BlockState {
        match self.page_kind >> KIND_SHIFT {
            FREE => BlockState::Free {
                prev: self.word as u32,
                next: (self.word >> 32) as u32,
            },
            USED => BlockState::Used {
                owner: self.word,
                padding: self.half,
            },
            VACANT => BlockState::Vacant {
                next: self.word as u32,
            },
            _ => BlockState::Held,
        }
    }

    /// Whether the block is free.
    #[inline]
    pub(super) fn is_free(&self) -> bool {
        self.page_kind >> KIND_SHIFT == FREE
    }

    /// Sets the block's state.
    #[inline]
    pub(super) fn set_state(&mut self, state: BlockState) {
        let (kind, word, half) = match state {
            BlockState::Free { prev, next } => (FREE, u64::from(prev) | u64::from(next) << 32, 0),
            BlockState::Used { owner, padding } => (USED, owner, padding),
            BlockState::Vacant { next } => (VACANT, u64::from(next), 0),
            BlockState::Held => (HELD, 0, 0),
        };
        self.page_kind = self.page() | kind << KIND_SHIFT;
        (self.word, self.half) = (word, half);
    }

    /// What the block knows of its allocation, if it is used and bound to `owner`.
    pub(super) fn used_by(&self, owner: u64) -> Option<Used> {
        match self.state() {
            BlockState::Used { owner: o, padding } if o == owner => Some(Used {
                owner,
                size: self.size - u64::from(padding),
            }),
            _ => None,
        }
    }
}

/// The free index's links, read and written in the packed word of a free block (a block that is
/// not free has none: reads give `NIL`, writes but `set_links` change nothing).
impl Links for Vec<Block> {
    #[inline]
    fn size(&self, block: u32) -> u64 {
        self[block as usize].size
    }
    #[inline]
    fn next_free(&self, block: u32) -> u32 {
        let b = &self[block as usize];
        if b.is_free() {
            (b.word >> 32) as u32
        } else {
            NIL
        }
    }
    #[inline]
    fn prev_free(&self, block: u32) -> u32 {
        let b = &self[block as usize];
        if b.is_free() { b.word as u32 } else { NIL }
    }
    #[inline]
    fn set_links(&mut self, block: u32, prev: u32, next: u32) {
        self[block as usize].set_state(BlockState::Free { prev, next });
    }
    #[inline]
    fn set_prev(&mut self, block: u32, prev: u32) {
        let b = &mut self[block as usize];
        if b.is_free() {
            b.word = (b.word & !u64::from(u32::MAX)) | u64::from(prev);
        }
    }
    #[inline]
    fn set_next(&mut self, block: u32, next: u32) {
        let b = &mut self[block as usize];
        if b.is_free() {
            b.word = (b.word & u64::from(u32::MAX)) | u64::from(next) << 32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every state round-trips at its extremes, on the highest page, and the link writes change
    /// only their own half.
    #[test]
    fn states_round_trip_and_links_touch_only_their_half() {
        let page = MAX_PAGES - 1;
        for state in [
            BlockState::Used {
                owner: u64::MAX,
                padding: u32::MAX,
            },
            BlockState::Used {
                owner: 0,
                padding: 0,
            },
            BlockState::Free { prev: 0, next: NIL },
            BlockState::Free { prev: NIL, next: 0 },
            BlockState::Vacant { next: NIL },
            BlockState::Vacant { next: 0 },
            BlockState::Held,
        ] {
            let b = Block::new(page, u64::MAX, u64::MAX, 7, 9, state);
            assert_eq!((b.state(), b.page()), (state, page));
            assert_eq!(b.is_free(), matches!(state, BlockState::Free { .. }));
        }
        let mut blocks = alloc::vec![
            Block::new(page, 0, 1, NIL, NIL, BlockState::Free { prev: 1, next: 2 }),
            Block::new(
                3,
                0,
                1,
                NIL,
                NIL,
                BlockState::Used {
                    owner: 5,
                    padding: 6
                }
            ),
        ];
        blocks.set_prev(0, NIL);
        assert_eq!(blocks[0].state(), BlockState::Free { prev: NIL, next: 2 });
        blocks.set_next(0, 0);
        assert_eq!(blocks[0].state(), BlockState::Free { prev: NIL, next: 0 });
        assert_eq!(blocks[0].page(), page);
        // A used block has no links: reads give none, writes change nothing.
        blocks.set_prev(1, 4);
        blocks.set_next(1, 4);
        assert_eq!((blocks.prev_free(1), blocks.next_free(1)), (NIL, NIL));
        assert_eq!(
            blocks[1].state(),
            BlockState::Used {
                owner: 5,
                padding: 6
            }
        );
    }
}
