//! `--verify`: the manager checked after every operation against a plain, independent model.
//!
//! Owns the model and its checks. The model keeps every live allocation by address
//! (`addr -> (end, op)`, from `resolve()` of each new handle) and the pages the manager reports
//! (`pages()`, read again whenever the device's count of calls or the bytes the budget counts
//! move, so O(log n) per operation in between). After every operation it checks that:
//! - a new allocation resolves to exactly its size, aligned, overlapping no live allocation (its
//!   two neighbours in the map), inside one page the manager reports;
//! - no page goes back (or shrinks) while a live allocation lies on it, and pages never overlap;
//! - at sampled points, the manager's `allocations()` are exactly the model's (same addresses,
//!   sizes and owners), each inside the page it names;
//! - at the end, once every handle is dropped and after `cleanup(Explicit)`, the manager holds no
//!   byte, the budget counts none and the device has no page live.
//!
//! A failure names the operation, where it came from in the trace, and the allocations involved.

use crate::device::ReplayShim;
use crate::input::Trace;
use crate::replay::Bench;
use devcmd::memory::{Cleanup, Handle};
use std::collections::BTreeMap;

#[derive(Debug, Clone, Copy)]
struct Live {
    end: u64,
    /// The operation that allocated it.
    op: usize,
    /// The handle's id (the manager's `owner`).
    owner: u64,
}

#[derive(Debug, Clone)]
struct Page {
    end: u64,
    pool: &'static str,
}

/// The independent model (see the module documentation).
#[derive(Debug)]
pub struct Verifier {
    live: BTreeMap<u64, Live>,
    /// The address of each slot's live allocation.
    at: Vec<u64>,
    pages: BTreeMap<u64, Page>,
    /// The device's count of calls and the budget's held bytes when the pages were last read.
    stamp: Option<(u64, u64)>,
    alignment: u64,
}

fn who(trace: &Trace, op: usize) -> String {
    let o = &trace.ops[op];
    format!(
        "id {} ({} B, allocated by op {op} at {})",
        o.id,
        o.size,
        trace.place(o)
    )
}

fn range(addr: u64, end: u64) -> String {
    format!("[{addr:#x}, {end:#x})")
}

impl Verifier {
    /// A model for `trace`, whose slices are aligned to `alignment`.
    pub fn new(trace: &Trace, alignment: u64) -> Self {
        Self {
            live: BTreeMap::new(),
            at: vec![0; trace.slots],
            pages: BTreeMap::new(),
            stamp: None,
            alignment: alignment.max(1),
        }
    }

    /// Checks the allocation operation `i` just made, and adds it to the model.
    pub fn on_alloc(
        &mut self,
        trace: &Trace,
        i: usize,
        bench: &mut Bench<impl ReplayShim>,
        handle: &Handle,
    ) -> Result<(), String> {
        let op = &trace.ops[i];
        let at = |what: String| {
            format!(
                "op {i} ({}), alloc of {}: {what}",
                trace.place(op),
                who(trace, i)
            )
        };
        let r = bench
            .mm
            .resolve(handle)
            .map_err(|e| at(format!("the new handle does not resolve: {e}")))?;
        let addr = r.addr.0;
        if r.len != op.size {
            return Err(at(format!("it resolves to {} bytes", r.len)));
        }
        if !addr.is_multiple_of(self.alignment) {
            return Err(at(format!(
                "its address {addr:#x} is not aligned to {}",
                self.alignment
            )));
        }
        let end = addr
            .checked_add(op.size)
            .ok_or_else(|| at(format!("{addr:#x} + {} overflows", op.size)))?;
        if let Some((&a, l)) = self.live.range(..=addr).next_back()
            && l.end > addr
        {
            return Err(at(format!(
                "{} overlaps {} at {}",
                range(addr, end),
                who(trace, l.op),
                range(a, l.end)
            )));
        }
        if let Some((&a, l)) = self.live.range(addr..).next()
            && a < end
        {
            return Err(at(format!(
                "{} overlaps {} at {}",
                range(addr, end),
                who(trace, l.op),
                range(a, l.end)
            )));
        }
        self.refresh_pages(trace, i, bench)?;
        let contained = self
            .pages
            .range(..=addr)
            .next_back()
            .is_some_and(|(_, page)| end <= page.end);
        if !contained {
            return Err(at(format!(
                "{} lies inside no page the manager reports",
                range(addr, end)
            )));
        }
        self.live.insert(
            addr,
            Live {
                end,
                op: i,
                owner: handle.id(),
            },
        );
        self.at[op.slot as usize] = addr;
        Ok(())
    }

    /// The allocation in `slot` was freed.
    pub fn on_free(&mut self, slot: u32) {
        self.live.remove(&self.at[slot as usize]);
    }

    /// Checks after every operation: the pages, when the device's count of them moved.
    pub fn after_op(
        &mut self,
        trace: &Trace,
        i: usize,
        bench: &mut Bench<impl ReplayShim>,
    ) -> Result<(), String> {
        self.refresh_pages(trace, i, bench)
    }

    /// Reads the pages again if the device was called or the bytes held moved since the last
    /// read; checks that no page (or part of one) that went back held a live allocation, and that
    /// pages do not overlap.
    fn refresh_pages(
        &mut self,
        trace: &Trace,
        i: usize,
        bench: &mut Bench<impl ReplayShim>,
    ) -> Result<(), String> {
        let stamp = (bench.shim.counters().calls, bench.mm.budget().held());
        if self.stamp == Some(stamp) {
            return Ok(());
        }
        self.stamp = Some(stamp);
        let mut pages = BTreeMap::new();
        for p in bench.mm.pages() {
            pages.insert(
                p.addr,
                Page {
                    end: p.addr + p.size,
                    pool: p.kind.name(),
                },
            );
        }
        let at = |what: String| format!("after op {i} ({}): {what}", trace.place(&trace.ops[i]));
        let mut prev: Option<(u64, &Page)> = None;
        for (&a, p) in &pages {
            if let Some((pa, pp)) = prev
                && pp.end > a
            {
                return Err(at(format!(
                    "the {} page at {} overlaps the {} page at {}",
                    pp.pool,
                    range(pa, pp.end),
                    p.pool,
                    range(a, p.end)
                )));
            }
            prev = Some((a, p));
        }
        // A page that changed (went back, or grew or shrank where pages are mapped granule by
        // granule) must still hold every live allocation it held, in some page of the new list.
        for (&a, old) in &self.pages {
            if pages.get(&a).is_some_and(|p| p.end == old.end) {
                continue;
            }
            for (&la, l) in self.live.range(a..old.end) {
                let held = pages
                    .range(..=la)
                    .next_back()
                    .is_some_and(|(_, p)| l.end <= p.end);
                if !held {
                    return Err(at(format!(
                        "the {} page at {} went back to the device (or shrank) while {} lives \
                         on it at {}",
                        old.pool,
                        range(a, old.end),
                        who(trace, l.op),
                        range(la, l.end)
                    )));
                }
            }
        }
        self.pages = pages;
        Ok(())
    }

    /// Checks that the manager's list of live allocations is exactly the model's.
    pub fn compare_allocations(
        &mut self,
        trace: &Trace,
        i: usize,
        bench: &mut Bench<impl ReplayShim>,
    ) -> Result<(), String> {
        let at = |what: String| format!("after op {i} ({}): {what}", trace.place(&trace.ops[i]));
        let listed = bench.mm.allocations();
        if listed.len() != self.live.len() {
            return Err(at(format!(
                "the manager lists {} live allocations, the trace has {}",
                listed.len(),
                self.live.len()
            )));
        }
        for a in &listed {
            let on = &a.page;
            if a.addr < on.addr || a.addr + a.size > on.addr + on.size {
                return Err(at(format!(
                    "the manager lists {} B of handle {} at {:#x} on the {} page at {}, which \
                     does not hold it",
                    a.size,
                    a.owner,
                    a.addr,
                    on.kind.name(),
                    range(on.addr, on.addr + on.size)
                )));
            }
            match self.live.get(&a.addr) {
                Some(l) if l.end == a.addr + a.size && l.owner == a.owner => {}
                Some(l) => {
                    return Err(at(format!(
                        "the manager lists {} B of handle {} at {:#x}, where the model has {}",
                        a.size,
                        a.owner,
                        a.addr,
                        who(trace, l.op)
                    )));
                }
                None => {
                    return Err(at(format!(
                        "the manager lists {} B of handle {} at {:#x}, which no live allocation \
                         of the trace has",
                        a.size, a.owner, a.addr
                    )));
                }
            }
        }
        Ok(())
    }

    /// The final check: every handle was dropped; after an explicit cleanup nothing is held.
    pub fn finish(self, bench: &mut Bench<impl ReplayShim>) -> Result<(), String> {
        bench.mm.cleanup(&bench.shim, Cleanup::Explicit);
        // As a device's cleanup: what the cleanup retired goes once its fence passes.
        bench.drain();
        let held = bench.mm.bytes_held();
        let budget = bench.mm.budget().held();
        let device = bench.shim.counters().bytes_live;
        let left = bench.mm.allocations().len();
        if held != 0 || budget != 0 || device != 0 || left != 0 {
            return Err(format!(
                "after every allocation was dropped and an explicit cleanup, the manager holds \
                 {held} bytes, its budget counts {budget}, the device has {device} bytes of \
                 pages live and {left} allocations are listed; the report:\n{}",
                bench.mm.report()
            ));
        }
        Ok(())
    }
}
