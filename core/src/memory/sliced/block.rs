//! The record of one block of a sliced pool: where it lies, its neighbours on the page, and
//! its state (free with its links in the free index, used by an allocation, or a vacant slot).
//!
//! Owns the record's layout (what every live allocation costs the pool: 48 bytes) and the
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
/// [`MAX_ALIGNMENT`](super::MAX_ALIGNMENT)): 16 bytes with the tag.
#[derive(Debug, Clone, Copy)]
pub(super) enum BlockState {
    Free { prev: u32, next: u32 },
    Used { owner: u64, padding: u32 },
    Vacant { next: u32 },
}

/// A block of a page: its place, its neighbours on the page (blocks, or `NIL`), its state.
#[derive(Debug, Clone, Copy)]
pub(super) struct Block {
    pub page: u32,
    pub offset: u64,
    pub size: u64,
    pub prev_phys: u32,
    pub next_phys: u32,
    pub state: BlockState,
}

// A block is part of what every live allocation costs (issue 19): 48 bytes wherever `u64`
// aligns to 8 (Cortex-M included).
const _: () = assert!(core::mem::size_of::<Block>() <= 48);

impl Block {
    /// What the block knows of its allocation, if it is used and bound to `owner`.
    pub(super) fn used_by(&self, owner: u64) -> Option<Used> {
        match self.state {
            BlockState::Used { owner: o, padding } if o == owner => Some(Used {
                owner,
                size: self.size - u64::from(padding),
            }),
            _ => None,
        }
    }
}

impl Links for Vec<Block> {
    fn size(&self, block: u32) -> u64 {
        self[block as usize].size
    }
    fn next_free(&self, block: u32) -> u32 {
        match self[block as usize].state {
            BlockState::Free { next, .. } => next,
            _ => NIL,
        }
    }
    fn prev_free(&self, block: u32) -> u32 {
        match self[block as usize].state {
            BlockState::Free { prev, .. } => prev,
            _ => NIL,
        }
    }
    fn set_links(&mut self, block: u32, prev: u32, next: u32) {
        self[block as usize].state = BlockState::Free { prev, next };
    }
    fn set_prev(&mut self, block: u32, new_prev: u32) {
        if let BlockState::Free { prev, .. } = &mut self[block as usize].state {
            *prev = new_prev;
        }
    }
    fn set_next(&mut self, block: u32, new_next: u32) {
        if let BlockState::Free { next, .. } = &mut self[block as usize].state {
            *next = new_next;
        }
    }
}
