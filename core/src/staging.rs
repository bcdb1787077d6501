//! Staging: whether the host side of an upload goes through pinned memory first.
//!
//! Owns the thresholds ([`StagingPolicy`]) and the decision ([`Staging::of`]), read by the
//! engine's host side (`command/host_side.rs`), which stages an upload at most once. Does not own
//! the pinned pools (`pinned.rs`) nor the copies.

use crate::host::HostOrigin;

/// Thresholds of the staging decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct StagingPolicy {
    /// Unpinned data smaller than this is copied into pinned memory first.
    pub max_staged: u64,
    /// A copy larger than this flushes the drop queue right after, so its buffer goes soon.
    pub flush_after: u64,
}

impl Default for StagingPolicy {
    fn default() -> Self {
        Self {
            max_staged: 100 << 20,
            flush_after: 10 << 20,
        }
    }
}

/// What to do with the host side of one upload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Staging {
    /// Copy the data into pinned memory (or a heap buffer when none is left) before the device
    /// reads it.
    pub through_pinned: bool,
    /// Flush the drop queue right after the copy.
    pub flush_after: bool,
}

impl Staging {
    /// The decision for `size` bytes from `origin`.
    ///
    /// File-backed data is always staged (a mapped file may still fault while the device reads
    /// it) and always flushed after; other data is staged when smaller than
    /// [`StagingPolicy::max_staged`] and not already pinned or registered (page-locked in place),
    /// and flushed after when larger than [`StagingPolicy::flush_after`].
    pub fn of(size: u64, origin: HostOrigin, policy: &StagingPolicy) -> Self {
        let file = origin == HostOrigin::FileMapped;
        let locked = matches!(origin, HostOrigin::Pinned | HostOrigin::Registered);
        Self {
            through_pinned: file || (size < policy.max_staged && !locked),
            flush_after: file || size > policy.flush_after,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn file_backed_data_is_always_staged_and_flushed() {
        let p = StagingPolicy::default();
        for size in [1, 100 * MIB, 400 * MIB] {
            assert_eq!(
                Staging::of(size, HostOrigin::FileMapped, &p),
                Staging {
                    through_pinned: true,
                    flush_after: true
                }
            );
        }
    }

    #[test]
    fn pinned_and_registered_data_is_never_restaged() {
        let p = StagingPolicy::default();
        for size in [1, 50 * MIB, 400 * MIB] {
            assert!(!Staging::of(size, HostOrigin::Pinned, &p).through_pinned);
            assert!(!Staging::of(size, HostOrigin::Registered, &p).through_pinned);
        }
    }

    #[test]
    fn heap_data_is_staged_below_the_threshold_only() {
        let p = StagingPolicy::default();
        assert!(Staging::of(100 * MIB - 1, HostOrigin::Heap, &p).through_pinned);
        assert!(!Staging::of(100 * MIB, HostOrigin::Heap, &p).through_pinned);
    }

    #[test]
    fn a_large_source_is_flushed_without_waiting_for_the_batch() {
        let p = StagingPolicy::default();
        assert!(!Staging::of(10 * MIB, HostOrigin::Heap, &p).flush_after);
        assert!(Staging::of(10 * MIB + 1, HostOrigin::Heap, &p).flush_after);
        assert!(Staging::of(1, HostOrigin::FileMapped, &p).flush_after);
    }
}
