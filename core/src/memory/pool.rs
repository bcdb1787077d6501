//! Which pool of a manager an allocation lives in.
//!
//! Owns [`Pool`], the one list of a manager's pools: what each is made of (pages carved in
//! slices, a granule pool over a reserved range, or whole pages) and which requests it serves.
//! Every dispatch on a pool is a `match` on it, so a new pool kind is a variant here and the
//! compiler names each place that must serve it, and the compact form of a pool and a block that
//! a handle's identity stores in one word ([`Pool::pack`], [`Pool::unpack`]: which is why a pool
//! holds at most [`MAX_BLOCKS`] blocks), and where an allocation lives and was placed
//! ([`Location`], [`Placed`]). Does not own the pools themselves (the manager's fields,
//! reached through its accessors in `manager/lookup.rs`) nor the identity (`handle.rs`).

use super::report::PoolKind;

/// Where an allocation lives: a pool of the manager and a block of that pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Location {
    pub pool: Pool,
    pub block: u32,
}

/// Where an allocation was placed: its location and the device address its block starts at
/// (which stays while the block is used: a used block never moves, splits or merges).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Placed {
    pub location: Location,
    pub addr: u64,
}

/// A pool of a manager.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub(crate) enum Pool {
    /// Pages carved in slices (`sliced.rs`).
    Pages(Size),
    /// A reserved address range with memory mapped granule by granule (`vm.rs`).
    Granules(Size),
    /// A page per allocation (`whole.rs`).
    Whole(Whole),
}

/// The requests a pool of pages or granules serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub(crate) enum Size {
    /// Up to `MemoryConfig::small_max_slice`.
    Small,
    /// Larger ones.
    Arena,
}

/// What a pool of whole pages does with them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub(crate) enum Whole {
    /// Reused by exact size (`AllocationMode::Persistent`).
    Persistent,
    /// Released soon after it is freed (`AllocationMode::Dedicated`).
    Dedicated,
}

impl Size {
    /// Its slot in the manager's pair of granule pools.
    pub(crate) const fn slot(self) -> usize {
        match self {
            Self::Small => 0,
            Self::Arena => 1,
        }
    }
}

impl Whole {
    /// Its slot among the manager's pools of whole pages.
    pub(crate) const fn slot(self) -> usize {
        match self {
            Self::Persistent => 0,
            Self::Dedicated => 1,
        }
    }
}

/// The most blocks one pool may number: a block's index shares a word with its pool's code
/// ([`Pool::pack`]). Far past what host memory holds (each live block also costs its records:
/// about 50 GiB of them at this count); the pools refuse to number more.
pub(crate) const MAX_BLOCKS: u32 = 1 << BLOCK_BITS;

/// The bits of a packed word that hold the block; the pool's code is above them.
const BLOCK_BITS: u32 = 29;

// Every code, `Pool::NO_CODE` included, fits the bits above a block.
const _: () = assert!(Pool::NO_CODE < 1 << (32 - BLOCK_BITS));

impl Pool {
    /// Every pool, in the order of their codes.
    const ALL: [Self; 6] = [
        Self::Pages(Size::Small),
        Self::Pages(Size::Arena),
        Self::Granules(Size::Small),
        Self::Granules(Size::Arena),
        Self::Whole(Whole::Persistent),
        Self::Whole(Whole::Dedicated),
    ];

    /// A code no pool has: a handle with no location.
    const NO_CODE: u32 = Self::ALL.len() as u32;

    /// The word for no pool at all, with a `tag` (below [`MAX_BLOCKS`]) that says why.
    pub(crate) const fn none(tag: u32) -> u32 {
        Self::NO_CODE << BLOCK_BITS | tag
    }

    /// The pool and the block `block` (below [`MAX_BLOCKS`]) in one word.
    pub(crate) const fn pack(self, block: u32) -> u32 {
        debug_assert!(block < MAX_BLOCKS);
        self.code() << BLOCK_BITS | block
    }

    /// The pool and block of a word from [`Self::pack`], or the tag of one from [`Self::none`].
    #[inline]
    pub(crate) fn unpack(word: u32) -> Result<(Self, u32), u32> {
        let block = word & (MAX_BLOCKS - 1);
        match Self::from_code(word >> BLOCK_BITS) {
            Some(pool) => Ok((pool, block)),
            None => Err(block),
        }
    }

    /// Its line in the report (a granule pool reports as the pool of pages it replaces).
    pub(crate) const fn kind(self) -> PoolKind {
        match self {
            Self::Pages(Size::Small) | Self::Granules(Size::Small) => PoolKind::Small,
            Self::Pages(Size::Arena) | Self::Granules(Size::Arena) => PoolKind::Arena,
            Self::Whole(Whole::Persistent) => PoolKind::Persistent,
            Self::Whole(Whole::Dedicated) => PoolKind::Dedicated,
        }
    }

    /// A small number naming the pool (below [`Self::NO_CODE`]).
    const fn code(self) -> u32 {
        match self {
            Self::Pages(Size::Small) => 0,
            Self::Pages(Size::Arena) => 1,
            Self::Granules(Size::Small) => 2,
            Self::Granules(Size::Arena) => 3,
            Self::Whole(Whole::Persistent) => 4,
            Self::Whole(Whole::Dedicated) => 5,
        }
    }

    /// The pool of `code`, if any.
    #[inline]
    fn from_code(code: u32) -> Option<Self> {
        Self::ALL.get(code as usize).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_name_each_pool_once_and_none_is_no_pool() {
        for (i, p) in Pool::ALL.iter().enumerate() {
            assert_eq!(p.code(), i as u32, "{p:?}: codes follow the list");
            assert_eq!(Pool::from_code(p.code()), Some(*p));
        }
        assert_eq!(Pool::from_code(Pool::NO_CODE), None);
    }

    #[test]
    fn a_packed_word_gives_back_its_pool_and_block_or_its_tag() {
        for p in Pool::ALL {
            for block in [0, 1, 12_345, MAX_BLOCKS - 1] {
                assert_eq!(Pool::unpack(p.pack(block)), Ok((p, block)), "{p:?} {block}");
            }
        }
        for tag in [0, 1, MAX_BLOCKS - 1] {
            assert_eq!(Pool::unpack(Pool::none(tag)), Err(tag));
        }
    }
}
