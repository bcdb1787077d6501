//! The granule pools under [`MemoryConfig::map_spans`]: the granules a placement covers whole
//! mapped by one call, and a mapping given back whole, only once every granule of it is idle.

use super::*;
use alloc::sync::Arc;

/// A 2 MiB-granule device whose pools map spans (pages freed at once, or fenced), its budget.
fn spans_device(fenced: bool) -> (TestShim, MemoryBudget, MemoryManager<TestShim>) {
    let shim = TestShim::with_vm(1 << 30, 256, 256 * MIB, 2 * MIB);
    let budget = MemoryBudget::new(None);
    let config = MemoryConfig {
        map_spans: true,
        ..MemoryConfig::default()
    };
    let mm = if fenced {
        let issuer = Issuer {
            device: 1,
            stream: 0,
        };
        MemoryManager::new(&shim.facts, config, issuer, budget.clone())
    } else {
        manager(&shim, config, budget.clone())
    };
    (shim, budget, mm)
}

/// The mappings the shim holds now, as (first granule, granules), counted from the lowest one
/// (the tests here map granule 0 of the arena's range first and look while it is mapped).
fn mappings(shim: &TestShim) -> Vec<(u64, u64)> {
    let m = shim.mappings.borrow();
    let base = m.keys().next().copied().unwrap_or(0) / (2 * MIB) * (2 * MIB);
    m.iter()
        .map(|(&a, &(_, n))| ((a - base) / (2 * MIB), n / (2 * MIB)))
        .collect()
}

/// Whether the report, the budget and the shim agree on the bytes held (retiring mappings
/// included: mapped until their fence).
fn agree(shim: &TestShim, budget: &MemoryBudget, mm: &mut MemoryManager<TestShim>) {
    let held = mm.bytes_held();
    let live = shim.live_bytes.get();
    assert_eq!(
        (held, budget.held()),
        (live, live),
        "the report, the budget and the shim agree"
    );
}

#[test]
fn the_granules_a_placement_covers_whole_are_mapped_by_one_call() {
    let (shim, budget, mut mm) = spans_device(false);
    // 9 MiB from the range's start: granules 0-3 whole, by one call; 4 in part, alone.
    let a = mm.reserve(&shim, 9 * MIB, PageUpdate::Allow).unwrap();
    assert_eq!(mappings(&shim), [(0, 4), (4, 1)]);
    // 5 MiB right after: granule 4 in part (mapped already), 5-6 whole, by one call.
    let b = mm.reserve(&shim, 5 * MIB, PageUpdate::Allow).unwrap();
    assert_eq!(mappings(&shim), [(0, 4), (4, 1), (5, 2)]);
    assert_eq!((shim.maps.get(), shim.live_bytes.get()), (3, 14 * MIB));
    agree(&shim, &budget, &mut mm);
    drop((a, b));
    mm.cleanup(&shim, Cleanup::Explicit);
    assert_eq!(
        (shim.mapped.get(), shim.unmaps.get()),
        (0, 3),
        "each mapping whole"
    );
    agree(&shim, &budget, &mut mm);
    // Without the setting, a call per granule.
    let shim = TestShim::with_vm(1 << 30, 256, 256 * MIB, 2 * MIB);
    let mut mm = manager(&shim, MemoryConfig::default(), MemoryBudget::new(None));
    let _a = mm.reserve(&shim, 9 * MIB, PageUpdate::Allow).unwrap();
    let _b = mm.reserve(&shim, 5 * MIB, PageUpdate::Allow).unwrap();
    assert_eq!(shim.maps.get(), 7);
}

#[test]
fn a_mapping_goes_back_only_when_every_granule_of_it_is_idle() {
    let (shim, budget, mut mm) = spans_device(false);
    drop(mm.reserve(&shim, 9 * MIB, PageUpdate::Allow).unwrap());
    // Over granules 0-2, on room with memory behind it: three of the first mapping's four
    // granules in use.
    let x = mm.reserve(&shim, 4 * MIB + 1, PageUpdate::Allow).unwrap();
    assert_eq!(shim.maps.get(), 2, "placed where memory is");
    mm.cleanup(&shim, Cleanup::Explicit);
    assert_eq!(
        mappings(&shim),
        [(0, 4)],
        "granule 4 went; granule 3 is idle, but its mapping is not"
    );
    agree(&shim, &budget, &mut mm);
    drop(x);
    mm.cleanup(&shim, Cleanup::Explicit);
    assert_eq!(mappings(&shim), []);
    agree(&shim, &budget, &mut mm);
    // SAFETY: the test shim runs no device work.
    unsafe { mm.release_all(&shim) };
    assert_eq!((shim.ranges.get(), budget.held()), (0, 0));
}

#[test]
fn fenced_taking_back_one_granule_takes_back_its_whole_mapping() {
    let (shim, budget, mut mm) = spans_device(true);
    drop(mm.reserve(&shim, 9 * MIB, PageUpdate::Allow).unwrap());
    mm.cleanup(&shim, Cleanup::Explicit);
    assert_eq!(mm.retired_bytes(), 10 * MIB, "two mappings retiring");
    // Granules 0-2: the mapping of 0-3 is taken back whole, 4 stays retiring.
    let x = mm.reserve(&shim, 4 * MIB + 1, PageUpdate::Allow).unwrap();
    assert_eq!(shim.maps.get(), 2, "no map: taken back");
    assert_eq!(mm.retired_bytes(), 2 * MIB);
    agree(&shim, &budget, &mut mm);
    for page in mm.take_retired() {
        // SAFETY: no device work exists in this test.
        unsafe { page.free(&shim) };
    }
    assert_eq!(mappings(&shim), [(0, 4)], "the taken back stays mapped");
    agree(&shim, &budget, &mut mm);
    // Granule 3 came back idle with its mapping: a 2 MiB reservation lands there, no map.
    let y = mm.reserve(&shim, 2 * MIB, PageUpdate::Allow).unwrap();
    assert_eq!(shim.maps.get(), 2);
    drop((x, y));
    mm.cleanup(&shim, Cleanup::Explicit);
    for page in mm.take_retired() {
        // SAFETY: as above.
        unsafe { page.free(&shim) };
    }
    assert_eq!((mappings(&shim), budget.held()), (alloc::vec![], 0));
    // SAFETY: as above.
    unsafe { mm.release_all(&shim) };
    assert_eq!(shim.ranges.get(), 0);
}

#[test]
fn a_release_all_unmaps_each_mapping_whole() {
    let (shim, budget, mut mm) = spans_device(true);
    let a = mm.reserve(&shim, 10 * MIB, PageUpdate::Allow).unwrap();
    let b = mm.reserve(&shim, 8 * MIB, PageUpdate::Allow).unwrap();
    drop(a);
    mm.cleanup(&shim, Cleanup::Explicit);
    let out = mm.take_retired();
    assert!(!out.is_empty());
    // One retired mapping still out with its caller, one live allocation: the shim checks each
    // unmap names a whole mapping.
    // SAFETY: no device work exists in this test.
    unsafe { mm.release_all(&shim) };
    assert_eq!(
        (shim.mapped.get(), shim.ranges.get(), budget.held()),
        (0, 0, 0)
    );
    for page in out {
        // SAFETY: as above; cancelled by the release, it frees nothing.
        unsafe { page.free(&shim) };
    }
    assert_eq!(shim.unmaps.get(), shim.maps.get());
    drop(b);
}

/// A granule pool of 16 granules with an allocation over granules 2-5, mapped by one call
/// (memory handle 7).
fn pool_mapped_over_2_to_5() -> crate::memory::vm::GranulePool {
    const G: u64 = 2 * MIB;
    let mut p = crate::memory::vm::GranulePool::new(64 * G, 16 * G, G, true);
    p.touch(2, 5);
    p.set_mapped(2, 4, 7);
    p
}

#[test]
fn idle_granules_beside_one_in_use_in_their_mapping_may_not_go() {
    let mut p = pool_mapped_over_2_to_5();
    assert_eq!((p.mapped, p.idle_count(), p.idle_free_count()), (4, 0, 0));
    p.untouch(2, 5);
    assert_eq!((p.idle_count(), p.idle_free_count()), (4, 4));
    // One granule in use again: the other three are idle but pinned by it.
    p.touch(3, 3);
    assert_eq!((p.idle_count(), p.idle_free_count()), (3, 0));
    assert_eq!(p.take_cached(), None, "no mapping is wholly idle");
    // A guard is a use too.
    p.guard(4, true);
    assert_eq!((p.idle_count(), p.idle_free_count()), (2, 0));
    p.untouch(3, 3);
    assert_eq!((p.idle_count(), p.idle_free_count()), (3, 0));
    p.guard(4, false);
    assert_eq!((p.idle_count(), p.idle_free_count()), (4, 4));
    assert_eq!(p.take_cached(), Some((2, 4, 7)), "the whole mapping, once");
    assert_eq!(p.take_cached(), None);
    assert_eq!((p.mapped, p.idle_count(), p.idle_free_count()), (0, 0, 0));
}

#[test]
fn a_retiring_mapping_is_taken_back_whole_or_forgotten_whole_at_its_fence() {
    use crate::memory::retire::{Retire, RetireToken};
    use crate::memory::vm::Need;
    const G: u64 = 2 * MIB;
    let mut p = pool_mapped_over_2_to_5();
    p.untouch(2, 5);
    let (head, len, memory) = p.take_cached().unwrap();
    let token = Arc::new(RetireToken::pending());
    p.retire(head, len, memory, Arc::clone(&token));
    assert_eq!(
        (p.mapped, p.held(), p.idle_count()),
        (4, 4 * G, 0),
        "retiring: held"
    );
    // A placement over granule 4 takes the whole mapping back; 2, 3 and 5 are idle, pinned.
    p.touch(4, 4);
    assert_eq!(p.need(4), Need::TakenBack);
    assert_eq!(token.state(), Retire::Cancelled);
    assert_eq!(p.need(5), Need::Mapped, "taken back with it");
    assert_eq!((p.mapped, p.idle_count(), p.idle_free_count()), (4, 3, 0));
    assert_eq!(p.settle(), 0);
    // Retired again, and unmapped by the drop queue this time: forgotten whole.
    p.untouch(4, 4);
    let (head, len, memory) = p.take_cached().unwrap();
    let token = Arc::new(RetireToken::pending());
    p.retire(head, len, memory, Arc::clone(&token));
    assert!(token.settle(Retire::Done));
    assert_eq!((p.settle(), p.mapped, p.held()), (4, 0, 0));
    assert_eq!(p.need(3), Need::Map, "unmapped: mapped anew when needed");
}

#[test]
fn a_mapping_taken_back_with_no_granule_in_use_puts_them_all_in_the_cache() {
    use crate::memory::retire::RetireToken;
    use crate::memory::vm::Need;
    let mut p = pool_mapped_over_2_to_5();
    p.untouch(2, 5);
    let (head, len, memory) = p.take_cached().unwrap();
    p.retire(head, len, memory, Arc::new(RetireToken::pending()));
    let (before, _) = p.cache_len();
    assert_eq!(p.need(3), Need::TakenBack);
    assert_eq!((p.idle_count(), p.idle_free_count()), (4, 4));
    assert_eq!(
        p.cache_len().0,
        before + 4,
        "each granule of it, idle, joins the cache"
    );
    assert_eq!(
        p.take_cached(),
        Some((2, 4, 7)),
        "and may go back again whole"
    );
}

#[test]
fn a_map_refused_mid_span_undoes_the_placement_and_keeps_what_was_mapped_idle() {
    let (shim, budget, mut mm) = spans_device(false);
    // Room for the call of granules 0-3, not for granule 4's.
    shim.device_limit.set(8 * MIB);
    let e = mm.reserve(&shim, 9 * MIB, PageUpdate::Allow).unwrap_err();
    assert!(matches!(e, IoError::OutOfMemory { .. }), "{e:?}");
    assert_eq!(mappings(&shim), [(0, 4)]);
    assert_eq!(mm.report().device().allocations, 0);
    agree(&shim, &budget, &mut mm);
    mm.cleanup(&shim, Cleanup::Explicit);
    assert_eq!(mappings(&shim), []);
    agree(&shim, &budget, &mut mm);
    shim.device_limit.set(1 << 30);
    let a = mm.reserve(&shim, 9 * MIB, PageUpdate::Allow).unwrap();
    assert_eq!(mm.resolve(&a).unwrap().len, 9 * MIB);
    agree(&shim, &budget, &mut mm);
}

#[test]
fn a_slack_tries_nothing_while_every_idle_granule_is_pinned() {
    let shim = TestShim::with_vm(1 << 30, 256, 256 * MIB, 2 * MIB);
    let config = MemoryConfig {
        map_spans: true,
        idle_granules: crate::memory::IdleGranules::Slack {
            per_64: 0,
            floor: 0,
        },
        ..MemoryConfig::default()
    };
    let mut mm = manager(&shim, config, MemoryBudget::new(None));
    drop(mm.reserve(&shim, 8 * MIB, PageUpdate::Allow).unwrap());
    // A reservation that may not change pages does not trim: it lands in the idle mapping of
    // granules 0-3, and pins the other three.
    let z = mm.reserve(&shim, 2 * MIB, PageUpdate::Forbidden).unwrap();
    assert_eq!((shim.maps.get(), shim.unmaps.get()), (1, 0));
    // Past the slack (3 idle, 0 kept) but none may go: nothing given back.
    let v = mm.reserve(&shim, 4096, PageUpdate::Allow).unwrap();
    assert_eq!(
        (shim.maps.get(), shim.unmaps.get()),
        (2, 0),
        "the small pool mapped one"
    );
    // Once the mapping is wholly idle, the next reservation gives it back whole.
    drop(z);
    let w = mm.reserve(&shim, 4096, PageUpdate::Allow).unwrap();
    assert_eq!(shim.unmaps.get(), 1);
    assert_eq!(shim.live_bytes.get(), 2 * MIB, "the small pool's granule");
    drop((v, w));
}

/// A placement compares the free blocks that fit by the granules each would need mapped and
/// takes the one needing the fewest, whichever the free index lists first (the scorer stops
/// counting at the best so far, never below it); `touch` then says what is behind its granules.
#[test]
fn a_placement_takes_the_candidate_needing_the_fewest_maps() {
    use crate::memory::sliced::Used;
    use crate::memory::vm::{Behind, GranulePool};
    const G: u64 = 2 * MIB;
    let used = |owner: u64| Used { owner, size: 4 * G };
    use crate::memory::retire::RetireToken;
    for (fewer_in_first, retiring) in [(true, false), (false, false), (true, true), (false, true)] {
        let mut p = GranulePool::new(64 * G, 16 * G, G, true);
        // Granules 0-3, 4-7, 8-11 and 12-15; the first and third freed: two free blocks of 4.
        let carved: Vec<_> = (0..4)
            .map(|i| p.carve(4 * G, 4 * G, used(i + 1)).unwrap())
            .collect();
        assert_eq!(carved[2].addr, p.addr_of(8));
        p.pool.free(carved[0].block, 1).unwrap();
        p.pool.free(carved[2].block, 3).unwrap();
        // One free block has 3 of its 4 granules mapped, the other 1.
        let (three, one) = if fewer_in_first { (0, 8) } else { (8, 0) };
        p.set_mapped(three, 3, 1);
        p.set_mapped(one, 1, 2);
        if retiring {
            // A mapping retiring elsewhere (granule 14): the scores then read the records of
            // the unmapped granules, counting up to the best so far.
            p.set_mapped(14, 1, 4);
            p.touch(14, 14);
            p.untouch(14, 14);
            assert_eq!(p.take_cached(), Some((14, 1, 4)));
            p.retire(14, 1, 4, Arc::new(RetireToken::pending()));
        }
        let c = p.carve(4 * G, 4 * G, used(9)).unwrap();
        assert_eq!(c.addr, p.addr_of(three), "the block needing one map");
        assert_eq!(
            p.touch(three, three + 3),
            Behind {
                missing: 1,
                all_mapped: false
            }
        );
        p.set_mapped(three + 3, 1, 3);
        p.untouch(three, three + 3);
        assert_eq!(
            p.touch(three, three + 3),
            Behind {
                missing: 0,
                all_mapped: true
            }
        );
    }
}
