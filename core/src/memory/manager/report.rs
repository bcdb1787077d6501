//! Reports: what the manager holds, for diagnostics and checks.
//!
//! Owns [`MemoryManager::report`] and [`MemoryManager::bytes_held`] (the figures of every pool),
//! and the lists of pages and live allocations ([`MemoryManager::pages`],
//! [`MemoryManager::allocations`]). Does not own the report's types (`memory/report.rs`) nor
//! change anything but freeing what dropped handles returned, which every call does first.

use super::MemoryManager;
use crate::memory::handle::{POOL_ARENA_BASE, POOL_DEDICATED, POOL_PERSISTENT, POOL_SMALL, PoolId};
use crate::memory::report::{MemoryReport, PoolKind, PoolReport};
use crate::memory::sliced::SlicedPool;
use crate::memory::types::{AllocationInfo, PageInfo, PageRef, RawPage};
use crate::shim::Shim;
use alloc::vec::Vec;

impl<S: Shim> MemoryManager<S> {
    /// Bytes of pages held by this manager (retired pages included).
    pub fn bytes_held(&mut self) -> u64 {
        self.report().device().reserved + self.retired_bytes()
    }

    /// The figures of every pool (allocations dropped since the last call are freed first).
    pub fn report(&mut self) -> MemoryReport {
        self.collect_returns();
        let mut pools = Vec::new();
        let sliced = |kind, p: &SlicedPool<RawPage<S>>| {
            let usage = p.usage();
            PoolReport {
                kind,
                page_size: p.page_size,
                pages: p.pages_live,
                pages_peak: p.pages_peak,
                allocations: usage.allocations,
                in_use: usage.in_use,
                padding: usage.padding,
                reserved: usage.reserved,
            }
        };
        if self.small.pages_peak > 0 {
            pools.push(sliced(PoolKind::Small, &self.small));
        }
        let current = self.current.and_then(|c| self.arena[c].as_ref());
        if let Some(p) = current {
            pools.push(sliced(PoolKind::Arena { outdated: false }, p));
        }
        for (i, p) in self.arena.iter().enumerate() {
            if let Some(p) = p.as_ref().filter(|_| Some(i) != self.current) {
                pools.push(sliced(PoolKind::Arena { outdated: true }, p));
            }
        }
        for (kind, w) in [
            (PoolKind::Persistent, &self.persistent),
            (PoolKind::Dedicated, &self.dedicated),
        ] {
            if w.pages_peak > 0 {
                let usage = w.usage();
                pools.push(PoolReport {
                    kind,
                    page_size: w.largest_page(),
                    pages: w.pages_live,
                    pages_peak: w.pages_peak,
                    allocations: usage.allocations,
                    in_use: usage.in_use,
                    padding: usage.padding,
                    reserved: usage.reserved,
                });
            }
        }
        MemoryReport { pools }
    }

    /// The page size of the current arena class, if any.
    pub fn arena_page_size_now(&self) -> Option<u64> {
        self.current
            .and_then(|c| self.arena[c].as_ref())
            .map(|p| p.page_size)
    }

    /// Every page held, for checks (allocations dropped since the last call are freed first).
    pub fn pages(&mut self) -> Vec<PageInfo> {
        self.collect_returns();
        let mut out = Vec::new();
        self.each_sliced(|kind, id, pool| {
            for (i, p) in pool.pages() {
                out.push(PageInfo {
                    kind,
                    page: PageRef { pool: id, page: i },
                    addr: p.addr,
                    size: p.size,
                    guarded: p.guards > 0,
                });
            }
        });
        for (kind, id, w) in [
            (PoolKind::Persistent, POOL_PERSISTENT, &self.persistent),
            (PoolKind::Dedicated, POOL_DEDICATED, &self.dedicated),
        ] {
            for (i, p) in w.pages() {
                out.push(PageInfo {
                    kind,
                    page: PageRef { pool: id, page: i },
                    addr: p.addr,
                    size: p.size,
                    guarded: p.guards > 0,
                });
            }
        }
        out
    }

    /// Every live allocation, for checks (allocations dropped since the last call are freed
    /// first).
    pub fn allocations(&mut self) -> Vec<AllocationInfo> {
        self.collect_returns();
        let mut out = Vec::new();
        self.each_sliced(|kind, id, pool| {
            for (page, offset, span, used) in pool.used_blocks() {
                let p = pool.page(page).expect("used blocks lie on live pages");
                let info = PageInfo {
                    kind,
                    page: PageRef { pool: id, page },
                    addr: p.addr,
                    size: p.size,
                    guarded: p.guards > 0,
                };
                out.push(AllocationInfo {
                    owner: used.owner,
                    addr: p.addr + offset,
                    size: used.size,
                    span,
                    page: info,
                });
            }
        });
        for (kind, id, w) in [
            (PoolKind::Persistent, POOL_PERSISTENT, &self.persistent),
            (PoolKind::Dedicated, POOL_DEDICATED, &self.dedicated),
        ] {
            for (i, p) in w.pages() {
                if let Some(used) = p.used {
                    let info = PageInfo {
                        kind,
                        page: PageRef { pool: id, page: i },
                        addr: p.addr,
                        size: p.size,
                        guarded: p.guards > 0,
                    };
                    out.push(AllocationInfo {
                        owner: used.owner,
                        addr: p.addr,
                        size: used.size,
                        span: p.size,
                        page: info,
                    });
                }
            }
        }
        out
    }

    fn each_sliced(&self, mut f: impl FnMut(PoolKind, PoolId, &SlicedPool<RawPage<S>>)) {
        f(PoolKind::Small, POOL_SMALL, &self.small);
        for (i, p) in self.arena.iter().enumerate() {
            if let Some(p) = p {
                f(
                    PoolKind::Arena {
                        outdated: !p.is_serving(),
                    },
                    POOL_ARENA_BASE + i as u8,
                    p,
                );
            }
        }
    }
}
