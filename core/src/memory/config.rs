//! The sizes and thresholds of the memory manager, with their defaults in one place.

const MIB: u64 = 1 << 20;

/// Sizes and thresholds of the pools. Every number the manager uses comes from here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct MemoryConfig {
    /// Page size of the small pool (clamped to the device's largest page).
    pub small_page_size: u64,
    /// Largest request the small pool serves.
    pub small_max_slice: u64,
    /// Smallest page of the adaptive arena.
    pub arena_min_page: u64,
    /// Room added to a request when the arena grows a new page size for it.
    pub arena_slack: u64,
    /// Granule the arena rounds new page sizes up to.
    pub arena_granule: u64,
    /// Page-size classes the arena may hold at once (at most 64).
    pub arena_classes: usize,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        Self {
            small_page_size: 8 * MIB,
            small_max_slice: 64 * 1024,
            arena_min_page: 2 * MIB,
            arena_slack: MIB,
            arena_granule: MIB,
            arena_classes: 64,
        }
    }
}

/// When a page the manager no longer needs goes back to the device. `Fenced` unless the owner
/// opts in to `Immediate` through the unsafe
/// [`MemoryManager::release_pages_immediately`](super::MemoryManager::release_pages_immediately).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum PageRelease {
    /// The page is retired: it goes back only when the owner says no device work can still touch
    /// it ([`MemoryManager::free_retired`](super::MemoryManager::free_retired)). The device's
    /// streams use this: work enqueued before a handle was dropped may still run.
    Fenced,
    /// The page goes back at once. Only for owners that never leave device work in flight when
    /// they drop a handle (synchronous devices, allocator benchmarks, tests).
    Immediate,
}
