//! The sizes and thresholds of the memory manager, with their defaults in one place, and when
//! pages go back.
//!
//! Owns the numbers as asked for. Does not own fitting them to a device: the manager does that
//! when it is built (no page past the device's largest page or the memory it may hold; small
//! pages and the arena's smallest page a fraction of that memory), so the defaults, sized for a
//! GPU, also suit a board of a few MiB.

const MIB: u64 = 1 << 20;

/// Sizes and thresholds of the pools. Every number the manager uses comes from here, fitted to
/// the device and the budget by [`MemoryManager::new`](super::MemoryManager::new) (the sizes in
/// effect: [`MemoryManager::config`](super::MemoryManager::config)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct MemoryConfig {
    /// Page size of the small pool (at most the device's largest page and an eighth of the
    /// memory the manager may hold: the budget, or the device's total).
    pub small_page_size: u64,
    /// Largest request the small pool serves (at most its page size); larger ones go to the
    /// arena.
    pub small_max_slice: u64,
    /// Smallest page of the arena (at most a quarter of the memory the manager may hold).
    pub arena_min_page: u64,
    /// What the arena rounds a new page up to: a page is the request rounded up to this, or
    /// `arena_min_page` if larger (at most an eighth of that memory).
    pub arena_granule: u64,
    /// Use the device's virtual memory management where it has it
    /// ([`DeviceFacts::vm_granule`](crate::shim::DeviceFacts::vm_granule)): each pool is one
    /// reserved address range with memory behind the granules live allocations touch. Off, or on
    /// a device without it, pools hold whole pages.
    pub virtual_memory: bool,
    /// Handle identities kept for reuse once their allocations come back: a reservation while
    /// one is kept allocates nothing on the heap. Raise it to the most handles a step drops
    /// before the next reserves (256 by default); returns past it free their identities.
    pub spare_identities: usize,
    /// What the granule pools do with idle granules (mapped, touched by no live allocation, held
    /// by no guard): keep them up to the most the pools ever held (the default), or give back
    /// what passes a slack above the granules in use. See [`IdleGranules`].
    pub idle_granules: IdleGranules,
    /// Map the missing granules a placement covers whole, side by side, with one device call
    /// instead of one call per granule (a first or last granule it covers in part, which a
    /// neighbour may share, has a call of its own). Such a mapping goes back whole, only once every granule of it is
    /// idle, so idle granules beside live ones in it stay held, a budget shortfall cannot take
    /// them back, and a placement that takes back one retiring granule of it takes back all of
    /// it: fewer device calls for a higher peak. Off by default (the peak rule then gives any
    /// idle granule back); worth it with [`IdleGranules::Slack`], where each load swing
    /// otherwise costs a call per granule (BENCHMARKS.md, "Mapping spans").
    pub map_spans: bool,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        Self {
            small_page_size: 2 * MIB,
            small_max_slice: 64 * 1024,
            arena_min_page: 2 * MIB,
            arena_granule: 2 * MIB,
            virtual_memory: true,
            spare_identities: 256,
            idle_granules: IdleGranules::UpToPeak,
            map_spans: false,
        }
    }
}

/// What the granule pools keep of their idle granules (mapped, touched by no live allocation,
/// held by no guard). Each granule given back and mapped again is a device call (on CUDA an
/// unmap or a map costs about a `cuMemAlloc`, 26-43 µs on an H200), so keeping fewer idle
/// granules trades device calls for memory held (BENCHMARKS.md, "Giving back idle granules").
/// Either way, growing past the most the pools ever held gives idle granules back first, and
/// an explicit cleanup gives back all of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum IdleGranules {
    /// Kept for reuse while the pools hold no more than the most they ever held (since the last
    /// explicit cleanup): the fewest device calls; after a load spike the pools keep its memory
    /// until a cleanup.
    UpToPeak,
    /// At most `per_64` 64ths of the granules in use kept idle, and at least `floor` bytes'
    /// worth: at every reservation the rest go back, longest-held last (under
    /// [`PageRelease::Fenced`] they retire and go at the next fence, and a placement that
    /// needs one first takes it back without a device call). Memory held tracks what is live;
    /// each load swing past the slack costs a map and an unmap per granule.
    Slack {
        /// Idle granules kept per 64 granules in use.
        per_64: u32,
        /// Bytes of idle granules kept however few are in use.
        floor: u64,
    },
}

/// When a page the manager no longer needs goes back to the device. `Fenced` unless the owner
/// opts in to `Immediate` through the unsafe
/// [`MemoryManager::release_pages_immediately`](super::MemoryManager::release_pages_immediately).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum PageRelease {
    /// The page is retired: it goes back only when its owner, the device, knows no work can
    /// still touch it (it moves retired pages into a stream's drop queue, freed once a fence
    /// passes). Work enqueued before a handle was dropped may still run. A manager used without a
    /// device keeps retired pages until
    /// [`MemoryManager::release_all`](super::MemoryManager::release_all).
    Fenced,
    /// The page goes back at once. Only for owners that never leave device work in flight when
    /// they drop a handle (synchronous devices, allocator benchmarks, tests).
    Immediate,
}
