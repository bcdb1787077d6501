//! The manager's granule pools (devices with virtual memory).

use super::*;

/// A device with 2 MiB granules of virtual memory, pages freed at once.
fn vm_device() -> (TestShim, MemoryManager<TestShim>) {
    let shim = TestShim::with_vm(1 << 30, 256, 256 * MIB, 2 * MIB);
    let mm = manager(&shim, MemoryConfig::default(), MemoryBudget::new(None));
    (shim, mm)
}

#[test]
fn granule_pools_hold_only_the_granules_live_allocations_touch() {
    let (shim, mut mm) = vm_device();
    assert_eq!(mm.vm_granule(), 2 * MIB);
    let a = mm.reserve(&shim, 3 * MIB, PageUpdate::Allow).unwrap();
    let _s = mm.reserve(&shim, 1000, PageUpdate::Allow).unwrap();
    assert_eq!(
        (shim.mapped.get(), shim.ranges.get()),
        (3, 2),
        "two granules + one small"
    );
    assert_eq!(pool(&mut mm, PoolKind::Arena).reserved, 4 * MIB);
    assert_eq!(pool(&mut mm, PoolKind::Small).reserved, 2 * MIB);
    drop(a);
    assert_eq!(
        shim.mapped.get(),
        3,
        "idle granules are kept until the pool grows"
    );
    // The freed room coalesced with the rest of the range: 5 MiB lands over the two idle
    // granules and maps one more.
    let b = mm.reserve(&shim, 5 * MIB, PageUpdate::Allow).unwrap();
    assert_eq!((shim.mapped.get(), shim.maps.get()), (4, 4));
    assert_eq!(mm.resolve(&b).unwrap().len, 5 * MIB);
    drop(b);
    mm.cleanup(&shim, Cleanup::Explicit);
    assert_eq!(
        shim.mapped.get(),
        1,
        "an explicit cleanup gives every idle granule back"
    );
}

#[test]
fn a_granule_allocation_keeps_its_address() {
    let (shim, mut mm) = vm_device();
    let a = mm.reserve(&shim, 3 * MIB, PageUpdate::Allow).unwrap();
    let s = mm.reserve(&shim, 1000, PageUpdate::Allow).unwrap();
    // Shared: an arena request below a granule placed in the small pool's mapped room.
    let shared = mm.reserve(&shim, MIB, PageUpdate::Allow).unwrap();
    for h in [&a, &s, &shared] {
        super::lookup::assert_kept_address_is_the_pools(&mm, h);
    }
}

#[test]
fn growth_gives_idle_granules_back_first() {
    let (shim, mut mm) = vm_device();
    let a = mm.reserve(&shim, 4 * MIB, PageUpdate::Allow).unwrap();
    let _pin = mm.reserve(&shim, 2 * MIB, PageUpdate::Allow).unwrap();
    drop(a);
    assert_eq!(shim.mapped.get(), 3);
    // 8 MiB does not fit before `_pin`: it needs 4 new granules, and the 2 idle ones go first.
    let _b = mm.reserve(&shim, 8 * MIB, PageUpdate::Allow).unwrap();
    assert_eq!(
        shim.mapped.get(),
        5,
        "held grows by what is missing, not by the idle ones"
    );
    assert_eq!(mm.granule_calls(), (7, 2));
}

/// The manager's live allocations by address, after checking that no two overlap.
fn allocations_apart(mm: &mut MemoryManager<TestShim>) -> Vec<crate::memory::AllocationInfo> {
    let mut allocs = mm.allocations();
    allocs.sort_by_key(|a| a.addr);
    for w in allocs.windows(2) {
        assert!(
            w[0].addr + w[0].span <= w[1].addr,
            "{:?} overlaps {:?}",
            w[0],
            w[1]
        );
    }
    allocs
}

#[test]
fn every_allocation_lies_on_a_run_of_mapped_granules_and_none_overlap() {
    let (shim, mut mm) = vm_device();
    let mut live = Vec::new();
    for i in 0..40u64 {
        let size = (i * 37 % 11) * MIB / 3 + 100 * i;
        live.push(mm.reserve(&shim, size, PageUpdate::Allow).unwrap());
        if i % 3 == 0 {
            live.swap_remove((i as usize * 7) % live.len());
        }
    }
    let pages = mm.pages();
    let allocs = allocations_apart(&mut mm);
    for a in &allocs {
        assert!(a.page.addr <= a.addr && a.addr + a.size <= a.page.addr + a.page.size);
        assert!(pages.contains(&a.page), "its run is listed: {:?}", a.page);
    }
    drop(live);
    mm.cleanup(&shim, Cleanup::Explicit);
    assert_eq!((shim.mapped.get(), mm.report().device().reserved), (0, 0));
}

#[test]
fn forbidden_reservations_land_on_mapped_granules_only() {
    let (shim, mut mm) = vm_device();
    let keep = mm.reserve(&shim, MIB, PageUpdate::Allow).unwrap();
    drop(mm.reserve(&shim, 4 * MIB, PageUpdate::Allow).unwrap());
    let maps = shim.maps.get();
    // The 4 MiB after `keep` touched three granules: 5 MiB of mapped room is free.
    let h = mm.reserve(&shim, 3 * MIB, PageUpdate::Forbidden).unwrap();
    assert_eq!(shim.maps.get(), maps, "nothing mapped");
    let r = mm.resolve(&h).unwrap();
    assert!(r.addr.0 >= mm.resolve(&keep).unwrap().addr.0 + MIB);
    let e = mm
        .reserve(&shim, 3 * MIB, PageUpdate::Forbidden)
        .unwrap_err();
    assert!(matches!(e, IoError::PageUpdateForbidden { .. }), "{e:?}");
    assert_eq!(shim.maps.get(), maps);
}

#[test]
fn a_refused_map_undoes_the_placement() {
    let (shim, mut mm) = vm_device();
    shim.device_limit.set(6 * MIB);
    let _a = mm.reserve(&shim, 3 * MIB, PageUpdate::Allow).unwrap();
    let e = mm.reserve(&shim, 5 * MIB, PageUpdate::Allow).unwrap_err();
    assert!(
        matches!(
            e,
            IoError::OutOfMemory {
                source: Some(_),
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(mm.allocations().len(), 1, "the failed placement is gone");
    assert_eq!(
        mm.budget().held(),
        shim.live_bytes.get(),
        "budget and device agree"
    );
    let _b = mm.reserve(&shim, 2 * MIB, PageUpdate::Allow).unwrap();
    assert!(shim.live_bytes.get() <= 6 * MIB);
}

#[test]
fn a_guard_keeps_its_granule_mapped() {
    let (shim, mut mm) = vm_device();
    let a = mm.reserve(&shim, MIB, PageUpdate::Allow).unwrap();
    let guard = mm.guard(&a).unwrap();
    drop(a);
    mm.cleanup(&shim, Cleanup::Explicit);
    assert_eq!(shim.mapped.get(), 1, "kept while guarded");
    drop(guard);
    mm.cleanup(&shim, Cleanup::Explicit);
    assert_eq!(shim.mapped.get(), 0);
}

/// A manager over a 2 MiB-granule device with fenced release, and its budget.
fn fenced_vm() -> (TestShim, MemoryBudget, MemoryManager<TestShim>) {
    let shim = TestShim::with_vm(1 << 30, 256, 256 * MIB, 2 * MIB);
    let budget = MemoryBudget::new(None);
    let issuer = Issuer {
        device: 1,
        stream: 0,
    };
    let mm = MemoryManager::new(&shim.facts, MemoryConfig::default(), issuer, budget.clone());
    (shim, budget, mm)
}

#[test]
fn fenced_granules_retire_and_are_taken_back_when_needed_before_their_fence() {
    let (shim, budget, mut mm) = fenced_vm();
    drop(mm.reserve(&shim, 4 * MIB, PageUpdate::Allow).unwrap());
    mm.cleanup(&shim, Cleanup::Explicit);
    assert_eq!((shim.mapped.get(), mm.retired_bytes()), (2, 4 * MIB));
    assert_eq!(budget.held(), 4 * MIB, "retiring granules still count");
    assert_eq!(mm.pages().len(), 1, "still mapped: listed until unmapped");
    assert_eq!(mm.granule_calls(), (2, 2));
    // Needed again before the fence: taken back, no map call; counted once, by the pool (the
    // retired page no longer holds it).
    let a = mm.reserve(&shim, 4 * MIB, PageUpdate::Allow).unwrap();
    assert_eq!(shim.maps.get(), 2);
    assert_eq!(mm.retired_bytes(), 0, "taken back: nothing on its way out");
    assert_eq!(mm.granule_calls(), (2, 0), "taken back: never given back");
    assert_eq!(
        mm.bytes_held(),
        budget.held(),
        "the report agrees with the budget"
    );
    let retired = mm.take_retired();
    for page in retired {
        // SAFETY: no device work exists in this test.
        unsafe { page.free(&shim) };
    }
    assert_eq!(
        (shim.mapped.get(), budget.held()),
        (2, 4 * MIB),
        "taken back: left mapped"
    );
    drop(a);
    mm.cleanup(&shim, Cleanup::Explicit);
    for page in mm.take_retired() {
        // SAFETY: as above.
        unsafe { page.free(&shim) };
    }
    assert_eq!((shim.mapped.get(), budget.held()), (0, 0));
    assert_eq!(mm.pages(), [], "unmapped by the drop queue: not listed");
    // The unmapped granules are mapped anew.
    let _b = mm.reserve(&shim, 4 * MIB, PageUpdate::Allow).unwrap();
    assert_eq!((shim.mapped.get(), shim.maps.get()), (2, 4));
    // SAFETY: as above.
    unsafe { mm.release_all(&shim) };
    assert_eq!(
        (shim.mapped.get(), shim.ranges.get(), budget.held()),
        (0, 0, 0)
    );
}

/// The granule of `h`'s first byte.
fn granule_of(mm: &mut MemoryManager<TestShim>, h: &Handle) -> u64 {
    mm.resolve(h).unwrap().addr.0 / (2 * MIB)
}

/// Issue 19, "no granule wasted": an arena request no larger than a granule that fits room the
/// small pool already has memory behind goes there, with no map: the small slices and what
/// would have been the arena's partial granule share one granule.
#[test]
fn an_arena_slice_shares_the_small_pools_granule_instead_of_mapping_one() {
    let (shim, mut mm) = vm_device();
    let small: Vec<Handle> = [512, 4096, 40, 32 * 1024]
        .iter()
        .map(|&s| mm.reserve(&shim, s, PageUpdate::Allow).unwrap())
        .collect();
    assert_eq!(shim.mapped.get(), 1, "the small pool's granule");
    let big = mm.reserve(&shim, 4 * MIB, PageUpdate::Allow).unwrap();
    assert_eq!(shim.mapped.get(), 3);
    let tail = mm.reserve(&shim, MIB, PageUpdate::Allow).unwrap();
    assert_eq!(
        (shim.mapped.get(), shim.maps.get()),
        (3, 3),
        "1 MiB placed in the small pool's granule: nothing mapped for it"
    );
    assert_eq!(granule_of(&mut mm, &tail), granule_of(&mut mm, &small[0]));
    assert_eq!(mm.resolve(&tail).unwrap().len, MIB);
    allocations_apart(&mut mm);
    // Its granule stays while either side lives, and goes once both are gone.
    drop(small);
    mm.cleanup(&shim, Cleanup::Explicit);
    assert_eq!(
        shim.mapped.get(),
        3,
        "the shared granule still holds `tail`"
    );
    drop(tail);
    mm.cleanup(&shim, Cleanup::Explicit);
    assert_eq!(
        (shim.mapped.get(), mm.report().device().reserved),
        (2, 4 * MIB),
        "only `big`'s granules are left"
    );
    drop(big);
    mm.cleanup(&shim, Cleanup::Explicit);
    assert_eq!((shim.mapped.get(), mm.budget().held()), (0, 0));
}

/// The shape of the fixture `snapshot-small` (issue 19), scaled down: small slices, two
/// workspaces and a 1 MiB buffer live at once hold the granules their bytes need and no more
/// (it held one granule more before the pools shared memory).
#[test]
fn a_small_live_peak_holds_the_fewest_granules_its_bytes_need() {
    let (shim, mut mm) = vm_device();
    let sizes = [
        32768,
        512,
        5120,
        40,
        2048,
        64,
        4096,
        8 * MIB,
        MIB,
        8 * MIB,
        4096,
        320,
    ];
    let live: Vec<Handle> = sizes
        .iter()
        .map(|&s| mm.reserve(&shim, s, PageUpdate::Allow).unwrap())
        .collect();
    let bytes: u64 = sizes.iter().sum();
    let fewest = bytes.div_ceil(2 * MIB);
    assert_eq!(
        shim.mapped.get(),
        fewest,
        "{bytes} live bytes need {fewest} granules"
    );
    assert_eq!(mm.budget().held(), fewest * 2 * MIB);
    drop(live);
    mm.cleanup(&shim, Cleanup::Explicit);
    assert_eq!(shim.mapped.get(), 0);
}

/// The arena maps its own granules where the small pool's room with memory behind it cannot
/// hold the request, and for a request past a granule.
#[test]
fn an_arena_slice_maps_its_own_granule_where_the_small_pool_has_no_room_for_it() {
    let (shim, mut mm) = vm_device();
    let _s = mm.reserve(&shim, 1000, PageUpdate::Allow).unwrap();
    let _a = mm.reserve(&shim, 3 * MIB, PageUpdate::Allow).unwrap();
    assert_eq!(shim.mapped.get(), 3, "past a granule: the arena's own two");
    let shared = mm.reserve(&shim, 3 * MIB / 2, PageUpdate::Allow).unwrap();
    assert_eq!(
        shim.mapped.get(),
        3,
        "1.5 MiB fits the small pool's granule"
    );
    assert_eq!(granule_of(&mut mm, &shared), granule_of(&mut mm, &_s));
    // The arena's second granule has 1 MiB free: it serves the next 1 MiB with no map.
    let _b = mm.reserve(&shim, MIB, PageUpdate::Allow).unwrap();
    assert_eq!(shim.mapped.get(), 3);
    // Neither has room left for 1 MiB: the arena maps one.
    let c = mm.reserve(&shim, MIB, PageUpdate::Allow).unwrap();
    assert_eq!(shim.mapped.get(), 4);
    assert_ne!(granule_of(&mut mm, &c), granule_of(&mut mm, &_s));
}

/// Room held ahead of a recording (a `hold` reserves and drops) that sharing placed in the small
/// pool serves the same arena request while the stream records (conformance: capture's "a
/// recording that needs a page", with the room held).
#[test]
fn room_shared_with_the_small_pool_serves_a_recording() {
    let (shim, mut mm) = vm_device();
    let _s = mm.reserve(&shim, 4096, PageUpdate::Allow).unwrap();
    drop(mm.reserve(&shim, MIB, PageUpdate::Allow).unwrap());
    let maps = shim.maps.get();
    assert_eq!(maps, 1, "the 1 MiB shared the small pool's granule");
    let h = mm.reserve(&shim, MIB, PageUpdate::Forbidden).unwrap();
    assert_eq!(shim.maps.get(), maps, "nothing mapped while recording");
    assert_eq!(granule_of(&mut mm, &h), granule_of(&mut mm, &_s));
}

/// Reserve-and-drop cycles of the two bound tests below: past twice a pool's granules (256
/// entries) the lists are compacted at least once; fewer under miri, where a cycle is slow.
const CYCLES: usize = if cfg!(miri) { 300 } else { 10_000 };

/// A granule used and freed over and over is pushed on the idle cache each time, and a shared
/// placement touches and untouches the arena's granule it did not need: the cache stays within
/// twice the pool's granules however many cycles run (it grew by one entry a cycle before).
#[test]
fn the_idle_cache_stays_bounded_over_many_reserve_and_drop_cycles() {
    let (shim, mut mm) = vm_device();
    let _small = mm.reserve(&shim, 4096, PageUpdate::Allow).unwrap();
    // Two whole arena granules: a 1 MiB request would map a third, so it shares.
    let _arena = mm.reserve(&shim, 4 * MIB, PageUpdate::Allow).unwrap();
    for cycle in 0..CYCLES {
        // Shared: 1 MiB fits the small pool's mapped granule.
        let shared = mm.reserve(&shim, MIB, PageUpdate::Allow).unwrap();
        if cycle == 0 {
            assert_eq!(
                mm.resolve(&shared).unwrap().page.pool,
                crate::memory::pool::Pool::Granules(crate::memory::pool::Size::Small),
                "the 1 MiB request shares the small pool's granule"
            );
        }
        drop(shared);
        // Plain: the arena's own granules, mapped once, used and freed.
        drop(mm.reserve(&shim, 3 * MIB, PageUpdate::Allow).unwrap());
        mm.collect_returns();
    }
    for (i, vm) in mm.vm.iter().enumerate() {
        let (cached, granules) = vm.as_ref().unwrap().cache_len();
        assert!(
            cached <= (2 * granules).max(16),
            "pool {i}: {cached} cache entries for {granules} granules"
        );
    }
    let maps = shim.maps.get();
    drop(mm.reserve(&shim, 3 * MIB, PageUpdate::Allow).unwrap());
    assert_eq!(shim.maps.get(), maps, "the idle granules are still found");
}

/// Under `IdleGranules::Slack` and fenced release, a reservation's trim retires
/// the small pool's idle granule and the shared placement (an arena request under a granule)
/// takes it straight back and returns before `granules_held` runs `settle`: the pool's
/// `retiring` list gains a stale entry every reserve-and-drop cycle, without bound.
#[test]
fn the_retiring_list_stays_bounded_over_many_shared_reserve_and_drop_cycles() {
    use crate::memory::IdleGranules;
    let shim = TestShim::with_vm(1 << 30, 256, 256 * MIB, 2 * MIB);
    let config = MemoryConfig {
        idle_granules: IdleGranules::Slack {
            per_64: 0,
            floor: 0,
        },
        ..MemoryConfig::default()
    };
    let issuer = Issuer {
        device: 1,
        stream: 0,
    };
    let mut mm = MemoryManager::new(&shim.facts, config, issuer, MemoryBudget::new(None));
    // The small pool's first granule full of live slices, its second one idle.
    let full: Vec<_> = (0..32)
        .map(|_| mm.reserve(&shim, 64 * 1024, PageUpdate::Allow).unwrap())
        .collect();
    let second: Vec<_> = (0..4)
        .map(|_| mm.reserve(&shim, 64 * 1024, PageUpdate::Allow).unwrap())
        .collect();
    drop(second);
    mm.collect_returns();
    let maps = shim.maps.get();
    let mut in_flight = Vec::new();
    for cycle in 0..CYCLES {
        // 1 MiB: shared into the small pool's idle (just retired) granule.
        drop(mm.reserve(&shim, MIB, PageUpdate::Allow).unwrap());
        mm.collect_returns();
        // The device's drop queue takes what retired; its fences pass every 100 cycles.
        in_flight.extend(mm.take_retired());
        if cycle % 100 == 99 {
            for p in in_flight.drain(..) {
                // SAFETY: no device work in this test.
                unsafe { p.free(&shim) };
            }
        }
    }
    assert_eq!(
        shim.maps.get(),
        maps,
        "taken back every cycle, nothing mapped"
    );
    let vm = mm.vm[0].as_ref().unwrap();
    let (_, granules) = vm.cache_len();
    assert!(
        vm.retiring_len() <= (2 * granules).max(16),
        "{} retiring entries for {granules} granules",
        vm.retiring_len()
    );
    drop(full);
}

#[test]
fn a_release_all_unmaps_retiring_granules_whose_pages_are_still_out() {
    let (shim, budget, mut mm) = fenced_vm();
    drop(mm.reserve(&shim, 4 * MIB, PageUpdate::Allow).unwrap());
    mm.cleanup(&shim, Cleanup::Explicit);
    let kept = mm.take_retired();
    assert_eq!((shim.mapped.get(), kept.len()), (2, 2));
    // SAFETY: no device work exists in this test.
    unsafe { mm.release_all(&shim) };
    assert_eq!(
        (shim.mapped.get(), shim.ranges.get(), budget.held()),
        (0, 0, 0),
        "nothing mapped in a released range"
    );
    for page in kept {
        // SAFETY: as above; the granules were unmapped by release_all, so this does nothing.
        unsafe { page.free(&shim) };
    }
    assert_eq!(
        (shim.mapped.get(), shim.unmaps.get(), budget.held()),
        (0, 2, 0)
    );
}

/// A granule pool made before `map_pages(true)` turned new pages away from the pools is still
/// trimmed under `IdleGranules::Slack`: its idle granules go back at the next reservation.
#[test]
fn idle_granules_go_back_after_new_pages_stop_coming_from_the_pools() {
    use crate::memory::IdleGranules;
    let shim = TestShim::with_vm(1 << 30, 256, 256 * MIB, 2 * MIB);
    let slack = IdleGranules::Slack {
        per_64: 0,
        floor: 0,
    };
    let config = MemoryConfig {
        idle_granules: slack,
        ..MemoryConfig::default()
    };
    let mut mm = manager(&shim, config, MemoryBudget::new(None));
    drop(mm.reserve(&shim, 8 * MIB, PageUpdate::Allow).unwrap());
    mm.map_pages(true);
    let _page = mm.reserve(&shim, MIB, PageUpdate::Allow).unwrap();
    assert_eq!(shim.mapped.get(), 0, "the idle granules went back");
}
