//! Model-based property test of the memory manager: random reserve / bind / drop / guard / mode /
//! cleanup sequences on the std shim, checked after every step against a plain model.
//!
//! The model is the list of live allocations (size, padding, pool kind expected from the mode),
//! the guards (with the page and the addresses they pin), and the budget. After every step: no two
//! live slices overlap, every slice lies inside its page, accounting (allocations, in use,
//! padding, reserved) matches, guarded pages never move or go, nothing new is carved from a
//! guarded page, `Forbidden` adds no page, `AddOnly` releases none, and the budget holds. Run
//! twice: with pages, and with granule pools (a device with virtual memory), where a page is a
//! run of mapped granules and a guard keeps its granule mapped and its residents in place; at
//! the end nothing is mapped or held.
//!
//! Beside it, the manager's regressions seen through a device: a small budget serves small and
//! MiB-sized allocations (page sizes fit the budget), and a bind of a handle to itself is an
//! error.

use devcmd::memory::{
    AllocationMode, Cleanup, Handle, IdleGranules, Issuer, MemoryBudget, MemoryConfig,
    MemoryManager, PageGuard, PageUpdate, PoolKind,
};
use devcmd::{Device, DeviceConfig, IoError, ServerError, Shim, StreamId};
use devcmd_std::StdShim;
use proptest::prelude::*;
use std::collections::HashSet;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const ALIGN: u64 = 64;
const MAX_PAGE: u64 = MIB;
const BUDGET: u64 = 6 * MIB;

#[derive(Debug, Clone)]
enum Op {
    Reserve {
        size: u64,
        update: PageUpdate,
    },
    /// Reserve then bind the room to a lazy handle.
    ReserveBound {
        size: u64,
    },
    Drop {
        index: usize,
    },
    CloneAndDrop {
        index: usize,
    },
    Guard {
        index: usize,
    },
    DropGuard {
        index: usize,
    },
    Mode(AllocationMode),
    Cleanup(Cleanup),
}

fn size() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => 0..4 * KIB,
        3 => 4 * KIB..256 * KIB,
        2 => 256 * KIB..MAX_PAGE,
        1 => Just(0u64),
        1 => MAX_PAGE - 100..MAX_PAGE + 100,
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (size(), prop_oneof![6 => Just(PageUpdate::Allow), 1 => Just(PageUpdate::AddOnly), 1 => Just(PageUpdate::Forbidden)])
            .prop_map(|(size, update)| Op::Reserve { size, update }),
        2 => size().prop_map(|size| Op::ReserveBound { size }),
        6 => any::<usize>().prop_map(|index| Op::Drop { index }),
        1 => any::<usize>().prop_map(|index| Op::CloneAndDrop { index }),
        1 => any::<usize>().prop_map(|index| Op::Guard { index }),
        1 => any::<usize>().prop_map(|index| Op::DropGuard { index }),
        1 => prop_oneof![Just(AllocationMode::Auto), Just(AllocationMode::Persistent), Just(AllocationMode::Dedicated)].prop_map(Op::Mode),
        1 => prop_oneof![Just(Cleanup::Periodic), Just(Cleanup::Explicit)].prop_map(Op::Cleanup),
    ]
}

struct Live {
    handle: Handle,
    size: u64,
}

struct Pinned {
    guard: PageGuard,
    page_addr: u64,
    /// The guarded allocation's address.
    addr: u64,
    page_size: u64,
    /// Allocations on the page when it was guarded: (handle id, address).
    residents: Vec<(u64, u64)>,
}

struct World {
    vm: bool,
    shim: StdShim,
    mm: MemoryManager<StdShim>,
    budget: MemoryBudget,
    live: Vec<Live>,
    guards: Vec<Pinned>,
    modes: Vec<AllocationMode>,
}

/// Whether every page of `inner` lies inside a page of `outer` (a granule pool's pages are runs of
/// mapped granules: mapping one beside a run makes a larger page holding the old one).
fn covers(outer: &HashSet<(u64, u64)>, inner: &HashSet<(u64, u64)>) -> bool {
    inner
        .iter()
        .all(|&(a, n)| outer.iter().any(|&(b, m)| b <= a && a + n <= b + m))
}

fn padded(size: u64) -> u64 {
    size.max(1).next_multiple_of(ALIGN)
}

impl World {
    /// With `vm`, the device has virtual memory (64 KiB granules) and the small pool and the
    /// arena are granule pools, keeping `idle` of their idle granules and mapping a placement's
    /// inner granules by one call with `spans`; without, they hold pages.
    fn new(vm: bool, idle: IdleGranules, spans: bool) -> Self {
        let shim = StdShim::builder()
            .total_memory(64 * MIB)
            .page_alignment(ALIGN)
            .max_page_size(MAX_PAGE)
            .vm_granule(if vm { 64 * KIB } else { 0 })
            .build();
        let config = MemoryConfig {
            small_page_size: 256 * KIB,
            small_max_slice: 4 * KIB,
            arena_min_page: 64 * KIB,
            arena_granule: 16 * KIB,
            virtual_memory: vm,
            spare_identities: 8,
            idle_granules: idle,
            map_spans: spans,
        };
        let budget = MemoryBudget::new(Some(BUDGET));
        let mut mm = MemoryManager::new(
            &shim.facts(),
            config,
            Issuer {
                device: 1,
                stream: 0,
            },
            budget.clone(),
        );
        // SAFETY: no device work is ever enqueued in this test: pages may go back at once.
        unsafe { mm.release_pages_immediately() };
        Self {
            vm,
            shim,
            mm,
            budget,
            live: Vec::new(),
            guards: Vec::new(),
            modes: Vec::new(),
        }
    }

    fn mode(&self) -> AllocationMode {
        self.modes.last().copied().unwrap_or(AllocationMode::Auto)
    }

    fn pages(&mut self) -> HashSet<(u64, u64)> {
        self.mm.pages().iter().map(|p| (p.addr, p.size)).collect()
    }

    fn apply(&mut self, op: &Op) -> Result<(), TestCaseError> {
        match *op {
            Op::Reserve { size, update } => {
                let before = self.pages();
                let reserved_before = self.mm.report().device().reserved;
                let result = self.mm.reserve(&self.shim, size, update);
                let after = self.pages();
                if update == PageUpdate::Forbidden {
                    prop_assert!(covers(&before, &after), "Forbidden added a page");
                    prop_assert!(self.mm.report().device().reserved <= reserved_before);
                }
                if update == PageUpdate::AddOnly {
                    prop_assert!(covers(&after, &before), "AddOnly released a page");
                }
                self.check_reservation(size, update, result)?;
            }
            Op::ReserveBound { size } => {
                let lazy = self.mm.lazy_handle(size);
                let result = self.mm.reserve(&self.shim, size, PageUpdate::Allow);
                match result {
                    Ok(reserved) => {
                        let stale = reserved.clone();
                        self.mm
                            .bind(reserved, &lazy)
                            .map_err(|e| TestCaseError::fail(format!("bind: {e}")))?;
                        prop_assert!(
                            self.mm.resolve(&stale).is_err(),
                            "a handed-over reservation resolves"
                        );
                        drop(stale);
                        self.check_new(&lazy)?;
                        self.live.push(Live { handle: lazy, size });
                    }
                    Err(e) => self.check_error(size, PageUpdate::Allow, &e)?,
                }
            }
            Op::Drop { index } => {
                if !self.live.is_empty() {
                    let i = index % self.live.len();
                    self.live.swap_remove(i);
                }
            }
            Op::CloneAndDrop { index } => {
                if !self.live.is_empty() {
                    let h = &self.live[index % self.live.len()].handle;
                    let c = h.clone();
                    prop_assert!(!h.can_mut());
                    drop(c);
                    prop_assert!(h.can_mut());
                }
            }
            Op::Guard { index } => {
                if !self.live.is_empty() {
                    let h = &self.live[index % self.live.len()].handle;
                    let addr = self
                        .mm
                        .resolve(h)
                        .map_err(|e| TestCaseError::fail(format!("{e}")))?
                        .addr
                        .0;
                    let guard = self
                        .mm
                        .guard(h)
                        .map_err(|e| TestCaseError::fail(format!("{e}")))?;
                    let page = self
                        .mm
                        .pages()
                        .into_iter()
                        .find(|p| p.addr <= addr && addr < p.addr + p.size.max(1))
                        .ok_or_else(|| TestCaseError::fail("guarded page not found"))?;
                    let residents = self
                        .mm
                        .allocations()
                        .into_iter()
                        .filter(|a| a.page.addr == page.addr)
                        .map(|a| (a.owner, a.addr))
                        .collect();
                    self.guards.push(Pinned {
                        guard,
                        page_addr: page.addr,
                        addr,
                        page_size: page.size,
                        residents,
                    });
                }
            }
            Op::DropGuard { index } => {
                if !self.guards.is_empty() {
                    let i = index % self.guards.len();
                    self.guards.swap_remove(i);
                }
            }
            Op::Mode(m) => {
                self.mm.set_mode(m);
                match m {
                    AllocationMode::Auto => {
                        self.modes.pop();
                    }
                    m => self.modes.push(m),
                }
                prop_assert_eq!(self.mm.mode(), self.mode());
            }
            Op::Cleanup(kind) => self.mm.cleanup(&self.shim, kind),
        }
        self.check_invariants()
    }

    fn check_reservation(
        &mut self,
        size: u64,
        update: PageUpdate,
        result: Result<Handle, IoError>,
    ) -> Result<(), TestCaseError> {
        match result {
            Ok(h) => {
                prop_assert!(
                    padded(size) <= MAX_PAGE,
                    "{} bytes served past the largest page",
                    size
                );
                prop_assert_eq!(h.allocation_size(), size);
                self.check_new(&h)?;
                self.live.push(Live { handle: h, size });
                Ok(())
            }
            Err(e) => self.check_error(size, update, &e),
        }
    }

    /// A new allocation lies on a page that serves: not outdated, not guarded, and in the pool
    /// the mode asks for.
    fn check_new(&mut self, h: &Handle) -> Result<(), TestCaseError> {
        let r = self
            .mm
            .resolve(h)
            .map_err(|e| TestCaseError::fail(format!("new handle does not resolve: {e}")))?;
        let info = self
            .mm
            .allocations()
            .into_iter()
            .find(|a| a.owner == h.id())
            .ok_or_else(|| TestCaseError::fail("new allocation missing"))?;
        prop_assert_eq!(info.addr, r.addr.0);
        let on_guarded = self
            .guards
            .iter()
            .any(|g| g.page_addr == info.page.addr && !g.residents.iter().any(|r| r.0 == h.id()));
        // A granule pool may place new allocations in a guarded granule's free bytes (the
        // guard keeps it mapped and its residents in place).
        let granules = self.vm && matches!(info.page.kind, PoolKind::Small | PoolKind::Arena);
        prop_assert!(granules || !on_guarded, "carved from a guarded page");
        let expected = match self.mode() {
            AllocationMode::Persistent => Some(PoolKind::Persistent),
            AllocationMode::Dedicated => Some(PoolKind::Dedicated),
            AllocationMode::Auto => None,
        };
        if let Some(kind) = expected {
            prop_assert_eq!(info.page.kind, kind);
        } else {
            let dynamic = matches!(info.page.kind, PoolKind::Small | PoolKind::Arena);
            prop_assert!(dynamic, "an Auto reservation outside the dynamic pools");
        }
        Ok(())
    }

    fn check_error(&self, size: u64, update: PageUpdate, e: &IoError) -> Result<(), TestCaseError> {
        match e {
            IoError::BufferTooBig { .. } => {
                prop_assert!(
                    padded(size) > MAX_PAGE,
                    "BufferTooBig for {} bytes that a page could hold",
                    size
                );
            }
            IoError::OutOfMemory { budget, held, .. } => {
                if let Some(b) = budget {
                    prop_assert_eq!(*b, BUDGET);
                }
                prop_assert!(*held <= BUDGET);
            }
            IoError::PageUpdateForbidden { .. } => prop_assert_eq!(update, PageUpdate::Forbidden),
            other => prop_assert!(false, "unexpected error {other:?}"),
        }
        Ok(())
    }

    fn check_invariants(&mut self) -> Result<(), TestCaseError> {
        let allocs = self.mm.allocations();
        let pages = self.mm.pages();
        // Every slice inside its page; no two overlap.
        let mut spans: Vec<(u64, u64)> = Vec::with_capacity(allocs.len());
        for a in &allocs {
            prop_assert!(
                a.page.addr <= a.addr && a.addr + a.span <= a.page.addr + a.page.size,
                "slice outside its page"
            );
            prop_assert!(
                pages
                    .iter()
                    .any(|p| p.page == a.page.page && p.addr == a.page.addr),
                "slice on a page not held"
            );
            spans.push((a.addr, a.addr + a.span));
        }
        spans.sort_unstable();
        for w in spans.windows(2) {
            prop_assert!(
                w[0].1 <= w[1].0,
                "slices overlap: {:?} and {:?}",
                w[0],
                w[1]
            );
        }
        // Accounting against the model.
        let report = self.mm.report();
        prop_assert_eq!(report.device().allocations, self.live.len() as u64);
        prop_assert_eq!(
            report.device().in_use,
            self.live.iter().map(|l| l.size).sum::<u64>()
        );
        prop_assert_eq!(
            report.device().padding,
            self.live
                .iter()
                .map(|l| padded(l.size) - l.size)
                .sum::<u64>()
        );
        prop_assert_eq!(
            report.device().reserved,
            pages.iter().map(|p| p.size).sum::<u64>()
        );
        // Every live handle resolves to its own allocation.
        let ids: HashSet<u64> = allocs.iter().map(|a| a.owner).collect();
        for l in &self.live {
            prop_assert!(
                ids.contains(&l.handle.id()),
                "live handle {} lost its memory",
                l.handle.id()
            );
            let r = self
                .mm
                .resolve(&l.handle)
                .map_err(|e| TestCaseError::fail(format!("{e}")))?;
            prop_assert_eq!(r.len, l.size);
        }
        // Guarded pages never move or go, and their residents keep their address.
        for g in &self.guards {
            // A granule pool's pages are runs of mapped granules, which grow and shrink around
            // the guarded granule: there, it must still lie in a guarded run.
            let kept = pages.iter().any(|p| {
                if self.vm && matches!(p.kind, PoolKind::Small | PoolKind::Arena) {
                    p.guarded && p.addr <= g.addr && g.addr < p.addr + p.size
                } else {
                    p.addr == g.page_addr && p.size == g.page_size && p.guarded
                }
            });
            prop_assert!(kept, "guarded page moved or went");
            prop_assert_eq!(g.guard.page(), g.guard.page());
            for (id, addr) in &g.residents {
                if let Some(a) = allocs.iter().find(|a| a.owner == *id) {
                    prop_assert_eq!(a.addr, *addr, "an allocation on a guarded page moved");
                }
            }
        }
        // The budget holds, and counts exactly the pages held (release is immediate here).
        prop_assert!(self.budget.held() <= BUDGET);
        prop_assert_eq!(self.budget.held(), report.device().reserved);
        prop_assert_eq!(
            self.shim.stats().device_bytes_live,
            report.device().reserved
        );
        Ok(())
    }
}

fn cases() -> u32 {
    std::env::var("DEVCMD_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), max_shrink_iters: 2000, ..ProptestConfig::default() })]

    #[test]
    fn the_manager_matches_the_model(ops in proptest::collection::vec(op(), 1..60)) {
        check_model(false, IdleGranules::UpToPeak, false, &ops)?;
    }

    #[test]
    fn the_manager_with_granule_pools_matches_the_model(ops in proptest::collection::vec(op(), 1..60)) {
        check_model(true, IdleGranules::UpToPeak, false, &ops)?;
    }

    #[test]
    fn the_manager_giving_idle_granules_back_matches_the_model(
        ops in proptest::collection::vec(op(), 1..60),
        per_64 in 0u32..=64,
    ) {
        check_model(true, IdleGranules::Slack { per_64, floor: 0 }, false, &ops)?;
    }

    #[test]
    fn the_manager_mapping_spans_matches_the_model(
        ops in proptest::collection::vec(op(), 1..60),
        per_64 in proptest::option::of(0u32..=64),
    ) {
        let idle = per_64.map_or(IdleGranules::UpToPeak, |per_64| IdleGranules::Slack { per_64, floor: 0 });
        check_model(true, idle, true, &ops)?;
    }
}

fn check_model(vm: bool, idle: IdleGranules, spans: bool, ops: &[Op]) -> Result<(), TestCaseError> {
    {
        let mut world = World::new(vm, idle, spans);
        for op in ops {
            world.apply(op)?;
        }
        // Everything dropped and cleaned up: nothing is held.
        world.guards.clear();
        world.live.clear();
        world.mm.cleanup(&world.shim, Cleanup::Explicit);
        prop_assert_eq!(world.mm.report().device().reserved, 0);
        prop_assert_eq!(world.budget.held(), 0);
        prop_assert_eq!(world.shim.stats().device_pages_live, 0);
        prop_assert_eq!(world.shim.stats().vm_mapped_live, 0);
    }
    Ok(())
}

#[test]
fn a_device_with_a_4_mib_budget_serves_many_small_allocations_and_one_mib() {
    let config = DeviceConfig {
        memory_budget: Some(4 * MIB),
        ..DeviceConfig::default()
    };
    let mut device = Device::new(StdShim::new(), config);
    let mut cmd = device.command(StreamId(0)).unwrap();
    let small: Vec<Handle> = (0..2000)
        .map(|i| {
            cmd.empty(64)
                .unwrap_or_else(|e| panic!("empty(64) #{i} under a 4 MiB budget: {e}"))
        })
        .collect();
    let big = cmd
        .empty(MIB)
        .unwrap_or_else(|e| panic!("empty(1 MiB) under a 4 MiB budget: {e}"));
    let report = cmd.memory_report();
    assert_eq!(report.streams[0].1.device().allocations, 2001, "{report}");
    assert!(report.held <= 4 * MIB, "{report}");
    drop((small, big));
}

#[test]
fn binding_a_handle_to_itself_through_a_device_is_an_error() {
    let mut device = Device::new(StdShim::new(), DeviceConfig::default());
    let mut cmd = device.command(StreamId(0)).unwrap();
    let reserved = cmd.reserve(256).unwrap();
    let view = reserved.view(64, 64).unwrap();
    for target in [reserved.clone(), view] {
        let e = cmd.bind(reserved.clone(), &target).unwrap_err();
        assert_eq!(
            e,
            ServerError::Io(IoError::SelfBind {
                handle: reserved.id()
            })
        );
    }
    // The device goes on: the room still binds to another handle.
    let lazy = cmd.lazy(256);
    cmd.bind(reserved, &lazy).unwrap();
    cmd.write(&lazy, devcmd::HostBuffer::from_vec(vec![7u8; 256]))
        .unwrap();
}
