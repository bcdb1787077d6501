//! devcmd's `MemoryManager` over devcmd-std's `StdShim`.
//!
//! - Device: `StdShim::builder().total_memory(16 GiB).page_alignment(64).max_page_size(1 GiB)`
//!   (the same page limit and alignment cubecl is given). Pages are `alloc_zeroed` heap blocks,
//!   as in cubecl's `BytesStorage`.
//! - Manager: `MemoryManager::new(&shim.facts(), MemoryConfig::default(), Issuer { device: 0,
//!   stream: 0 }, MemoryBudget::new(None))`, then the unsafe `release_pages_immediately()` (no
//!   device work is ever enqueued here).
//!   `Immediate`: an empty page goes back to the shim when the manager releases it, as cubecl's
//!   `BytesStorage` deallocates at once (the default, `Fenced`, retires pages until the owner
//!   proves the device idle, which needs a device around the manager).
//! - Reserve: `reserve(&shim, size, PageUpdate::Allow)` (periodic cleanup, then reserve; one
//!   reclaim and retry on a curable failure). Free: dropping the `Handle`.
//! - Held: pages only change inside `reserve`, so the peak is sampled from the budget's count
//!   (`budget().held()`, one uncontended spin lock) after every reservation, inside the timed loop.

use crate::contender::{Contender, HeldStats};
use devcmd::memory::{Handle, Issuer, MemoryBudget, MemoryConfig, MemoryManager, PageUpdate};
use devcmd::{Shim, ShimOp};
use devcmd_std::StdShim;

const GIB: u64 = 1 << 30;

pub struct Devcmd {
    // Declared before the shim: the manager is torn down (pages released) before the shim goes.
    mm: MemoryManager<StdShim>,
    shim: StdShim,
    peak: u64,
    allocs_before: u64,
    frees_before: u64,
}

impl Devcmd {
    pub fn new() -> Self {
        let shim = StdShim::builder()
            .total_memory(16 * GIB)
            .page_alignment(64)
            .max_page_size(GIB)
            .build();
        let config = MemoryConfig::default();
        let mut mm = MemoryManager::new(
            &shim.facts(),
            config,
            Issuer { device: 0, stream: 0 },
            MemoryBudget::new(None),
        );
        // SAFETY: the benchmark enqueues no device work: a page may go back as soon as it empties.
        unsafe { mm.release_pages_immediately() };
        Self {
            mm,
            shim,
            peak: 0,
            allocs_before: 0,
            frees_before: 0,
        }
    }
}

impl Drop for Devcmd {
    fn drop(&mut self) {
        // SAFETY: the std shim runs nothing here: no work is pending on any stream.
        unsafe { self.mm.release_all(&self.shim) };
    }
}

impl Contender for Devcmd {
    type Handle = Handle;

    fn name(&self) -> &'static str {
        "devcmd"
    }

    #[inline]
    fn alloc(&mut self, size: u64) -> Option<Handle> {
        let h = self.mm.reserve(&self.shim, size, PageUpdate::Allow).ok();
        self.peak = self.peak.max(self.mm.budget().held());
        h
    }

    #[inline]
    fn free(&mut self, handle: Handle) {
        drop(handle);
    }

    fn take_stats(&mut self) -> HeldStats {
        let st = self.shim.stats();
        let (allocs, frees) = (st.calls(ShimOp::DeviceAlloc), st.device_frees);
        let held = self.mm.budget().held();
        let stats = HeldStats {
            peak_held: Some(self.peak),
            held_after: Some(held),
            page_allocs: Some(allocs - self.allocs_before),
            page_frees: Some(frees - self.frees_before),
        };
        self.peak = held;
        self.allocs_before = allocs;
        self.frees_before = frees;
        stats
    }
}
