//! Reports: what the manager holds, for diagnostics and checks.
//!
//! Owns [`MemoryManager::report`] and [`MemoryManager::bytes_held`] (the figures of every pool),
//! and the lists of pages and live allocations ([`MemoryManager::pages`],
//! [`MemoryManager::allocations`]). Does not own the report's types (`memory/report.rs`) nor
//! change anything but freeing what dropped handles returned, which every call does first.

use super::MemoryManager;
use crate::memory::pool::{Pool, Size, Whole};
use crate::memory::report::{MemoryReport, PoolKind, PoolReport};
use crate::memory::sliced::SlicedPool;
use crate::memory::types::{AllocationInfo, PageInfo, PageRef, RawPage};
use crate::memory::vm::GranulePool;
use crate::shim::Shim;
use alloc::vec::Vec;

impl<S: Shim> MemoryManager<S> {
    /// Bytes of pages held by this manager (retired pages included).
    pub fn bytes_held(&mut self) -> u64 {
        self.report().device().reserved + self.retired_bytes()
    }

    /// The figures of every pool (allocations dropped since the last call are freed first). A
    /// granule pool reports its mapped granules as pages; granules let go and awaiting a fence
    /// are the drop queue's, not the pool's.
    pub fn report(&mut self) -> MemoryReport {
        self.collect_returns();
        self.settle_granules();
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
        let mut address_space = 0;
        for size in [Size::Small, Size::Arena] {
            let kind = Pool::Granules(size).kind();
            if let Some(vm) = self.granule_pool(size) {
                let usage = vm.pool.usage();
                let mapped = vm.mapped_now();
                address_space += vm.address_space();
                pools.push(PoolReport {
                    kind,
                    page_size: vm.granule,
                    pages: mapped,
                    pages_peak: vm.mapped_peak,
                    allocations: usage.allocations,
                    in_use: usage.in_use,
                    padding: usage.padding,
                    reserved: u64::from(mapped) * vm.granule,
                });
            }
        }
        for size in [Size::Small, Size::Arena] {
            let p = self.sliced(size);
            if p.pages_peak > 0 {
                pools.push(sliced(Pool::Pages(size).kind(), p));
            }
        }
        for id in [Whole::Persistent, Whole::Dedicated] {
            let w = self.whole(id);
            if w.pages_peak > 0 {
                let usage = w.usage();
                pools.push(PoolReport {
                    kind: Pool::Whole(id).kind(),
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
        MemoryReport {
            pools,
            address_space,
        }
    }

    /// Device calls the granule pools made so far: (map calls, mappings given back). Without
    /// `map_spans` a call maps one granule; with it, one or more.
    pub fn granule_calls(&self) -> (u64, u64) {
        self.vm
            .iter()
            .flatten()
            .fold((0, 0), |(m, u), p| (m + p.maps, u + p.unmaps))
    }

    /// Every page held, for checks (allocations dropped since the last call are freed first).
    /// A granule pool lists each run of adjacent granules with memory behind them as one page:
    /// mapped ones and retiring ones the drop queue has not unmapped yet (the device still maps
    /// them; [`Self::report`] counts those as the drop queue's instead).
    pub fn pages(&mut self) -> Vec<PageInfo> {
        self.collect_returns();
        self.settle_granules();
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
        self.each_granule_pool(|kind, id, vm| {
            for (first, count) in vm.runs() {
                out.push(run_info(kind, id, vm, first, count));
            }
        });
        for id in [Whole::Persistent, Whole::Dedicated] {
            let (id, w) = (Pool::Whole(id), self.whole(id));
            let kind = id.kind();
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
    /// first). An allocation of a granule pool lies on the run of granules that holds it.
    pub fn allocations(&mut self) -> Vec<AllocationInfo> {
        self.collect_returns();
        self.settle_granules();
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
        self.each_granule_pool(|kind, id, vm| {
            for (_, offset, span, used) in vm.pool.used_blocks() {
                let addr = vm.base + offset;
                let (first, count) = vm.run_of(vm.span(addr, 1).0);
                out.push(AllocationInfo {
                    owner: used.owner,
                    addr,
                    size: used.size,
                    span,
                    page: run_info(kind, id, vm, first, count),
                });
            }
        });
        for id in [Whole::Persistent, Whole::Dedicated] {
            let (id, w) = (Pool::Whole(id), self.whole(id));
            let kind = id.kind();
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

    fn each_sliced(&self, mut f: impl FnMut(PoolKind, Pool, &SlicedPool<RawPage<S>>)) {
        for size in [Size::Small, Size::Arena] {
            let pool = Pool::Pages(size);
            f(pool.kind(), pool, self.sliced(size));
        }
    }

    fn each_granule_pool(&self, mut f: impl FnMut(PoolKind, Pool, &GranulePool)) {
        for size in [Size::Small, Size::Arena] {
            if let Some(vm) = self.granule_pool(size) {
                let pool = Pool::Granules(size);
                f(pool.kind(), pool, vm);
            }
        }
    }
}

/// A run of `count` backed granules from `first`, as a page.
fn run_info(kind: PoolKind, pool: Pool, vm: &GranulePool, first: u32, count: u32) -> PageInfo {
    PageInfo {
        kind,
        page: PageRef { pool, page: first },
        addr: vm.addr_of(first),
        size: u64::from(count) * vm.granule,
        guarded: (first..first + count).any(|g| vm.guarded(g)),
    }
}
