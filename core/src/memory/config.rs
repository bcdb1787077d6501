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
    /// before the next reserves (8 by default); returns past it free their identities.
    pub spare_identities: usize,
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
        }
    }
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
