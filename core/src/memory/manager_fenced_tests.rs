//! The granule pools under every release mode, idle setting, span setting and budget, with
//! guards, fences and cleanups in between: a property test that checks after every step that
//! the report, the budget and the device agree on what is held, that no live allocation or guard
//! lies on a granule the device does not map, and, once everything is dropped, that nothing is
//! left mapped.

use super::*;
use crate::memory::config::IdleGranules;
use crate::memory::pool::Pool;
use crate::memory::types::PageGuard;
use alloc::collections::BTreeSet;
use proptest::prelude::*;

const G: u64 = 2 * MIB;
const ALIGN: u64 = 256;

/// One step.
#[derive(Debug, Clone)]
enum Op {
    Reserve(u64),
    /// A reservation that may not change the device's memory (as while a stream records).
    ReserveMapped(u64),
    Drop(usize),
    /// Guards the granule of a live allocation.
    Guard(usize),
    /// Drops a guard (the manager notices at its next cleanup or reservation).
    Unguard(usize),
    /// The fence of what was retired passes: the drop queue frees it.
    Fence,
    Cleanup(Cleanup),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => prop_oneof![1u64..=64 * 1024, 64 * 1024 + 1..=4 * MIB, 4 * MIB..=24 * MIB]
            .prop_map(Op::Reserve),
        1 => (1u64..=4 * MIB).prop_map(Op::ReserveMapped),
        3 => any::<usize>().prop_map(Op::Drop),
        1 => any::<usize>().prop_map(Op::Guard),
        1 => any::<usize>().prop_map(Op::Unguard),
        2 => Just(Op::Fence),
        1 => prop_oneof![Just(Cleanup::Periodic), Just(Cleanup::Explicit)].prop_map(Op::Cleanup),
    ]
}

/// A device with 2 MiB granules; `fenced`: memory let go waits for [`Op::Fence`].
fn device(
    fenced: bool,
    idle: IdleGranules,
    spans: bool,
    limit: Option<u64>,
) -> (TestShim, MemoryBudget, MemoryManager<TestShim>) {
    let shim = TestShim::with_vm(1 << 30, ALIGN, 256 * MIB, G);
    let budget = MemoryBudget::new(limit);
    let config = MemoryConfig {
        idle_granules: idle,
        map_spans: spans,
        ..MemoryConfig::default()
    };
    let issuer = Issuer {
        device: 1,
        stream: 0,
    };
    let mut mm = MemoryManager::new(&shim.facts, config, issuer, budget.clone());
    if !fenced {
        // SAFETY: the test shim runs no device work.
        unsafe { mm.release_pages_immediately() };
    }
    (shim, budget, mm)
}

/// Frees what `mm` retired, as the drop queue does once the fence passed.
fn fence(shim: &TestShim, mm: &mut MemoryManager<TestShim>) {
    for page in mm.take_retired() {
        // SAFETY: no device work exists in these tests.
        unsafe { page.free(shim) };
    }
}

/// Whether the device maps the granule at `addr`.
fn mapped(shim: &TestShim, addr: u64) -> bool {
    let m = shim.mappings.borrow();
    m.range(..=addr)
        .next_back()
        .is_some_and(|(&a, &(_, n))| addr < a + n)
}

/// Cases: `DEVCMD_PROPTEST_CASES`, or 64.
fn cases() -> u32 {
    std::env::var("DEVCMD_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64)
}

const STEPS: usize = if cfg!(miri) { 16 } else { 80 };

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn what_is_held_agrees_and_nothing_live_lies_on_an_unmapped_granule(
        fenced in any::<bool>(),
        slack in prop_oneof![
            Just(IdleGranules::UpToPeak),
            (0u32..=64, 0u64..=4).prop_map(|(per_64, floor)| IdleGranules::Slack {
                per_64,
                floor: floor * G
            }),
        ],
        spans in any::<bool>(),
        limit in prop_oneof![Just(None), (8u64..=64).prop_map(|m| Some(m * MIB))],
        ops in prop::collection::vec(op(), 1..STEPS),
    ) {
        let (shim, budget, mut mm) = device(fenced, slack, spans, limit);
        let mut live: Vec<(Handle, u64)> = Vec::new();
        // Each guard, with the granule it keeps mapped (none for a page's guard).
        let mut guards: Vec<(PageGuard, Option<u64>)> = Vec::new();
        for op in ops {
            match op {
                Op::Reserve(size) => match mm.reserve(&shim, size, PageUpdate::Allow) {
                    Ok(h) => live.push((h, size)),
                    // Only a budget refuses: for now (out of memory) or for good (too big for it).
                    Err(e) => prop_assert!(
                        limit.is_some()
                            && matches!(e, IoError::OutOfMemory { .. } | IoError::BufferTooBig { .. }),
                        "{} bytes refused: {:?}", size, e
                    ),
                },
                Op::ReserveMapped(size) => {
                    let calls = (shim.maps.get(), shim.unmaps.get());
                    match mm.reserve(&shim, size, PageUpdate::Forbidden) {
                        Ok(h) => live.push((h, size)),
                        Err(e) => prop_assert!(
                            matches!(e, IoError::PageUpdateForbidden { .. }),
                            "{} bytes without a map refused: {:?}", size, e
                        ),
                    }
                    prop_assert_eq!((shim.maps.get(), shim.unmaps.get()), calls,
                        "a reservation that may not map made a device call");
                }
                Op::Drop(i) if !live.is_empty() => {
                    live.swap_remove(i % live.len());
                }
                Op::Guard(i) if !live.is_empty() => {
                    let (h, _) = &live[i % live.len()];
                    let r = mm.resolve(h).unwrap();
                    let granule = matches!(r.page.pool, Pool::Granules(_)).then_some(r.addr.0 / G * G);
                    guards.push((mm.guard(h).unwrap(), granule));
                }
                Op::Unguard(i) if !guards.is_empty() => {
                    guards.swap_remove(i % guards.len());
                }
                Op::Fence => fence(&shim, &mut mm),
                Op::Cleanup(kind) => mm.cleanup(&shim, kind),
                _ => {}
            }
            let (held, device) = (mm.bytes_held(), shim.live_bytes.get());
            prop_assert_eq!((held, budget.held()), (device, device),
                "the report, the budget and the device agree (retiring mappings included)");
            if let Some(limit) = limit {
                prop_assert!(device <= limit, "{} bytes mapped under a budget of {}", device, limit);
            }
            let mut granules = BTreeSet::new();
            for (h, size) in &live {
                let r = mm.resolve(h).expect("a live handle resolves");
                if !matches!(r.page.pool, Pool::Granules(_)) {
                    continue; // on a page of its own (what the granules could not serve)
                }
                let aligned = (*size).max(1).next_multiple_of(ALIGN);
                granules.extend((r.addr.0 / G..=(r.addr.0 + aligned - 1) / G).map(|g| g * G));
            }
            granules.extend(guards.iter().filter_map(|&(_, g)| g));
            for g in granules {
                prop_assert!(mapped(&shim, g), "granule at {:#x} in use but not mapped", g);
            }
        }
        drop(live);
        drop(guards);
        mm.cleanup(&shim, Cleanup::Explicit);
        fence(&shim, &mut mm);
        prop_assert_eq!(
            (shim.mapped.get(), shim.live_bytes.get(), mm.bytes_held(), budget.held()),
            (0, 0, 0, 0),
            "everything dropped, cleaned up and past its fence: nothing held"
        );
    }
}
