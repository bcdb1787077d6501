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

#[test]
fn fenced_granules_retire_and_are_taken_back_when_needed_before_their_fence() {
    let shim = TestShim::with_vm(1 << 30, 256, 256 * MIB, 2 * MIB);
    let budget = MemoryBudget::new(None);
    let issuer = Issuer {
        device: 1,
        stream: 0,
    };
    let mut mm = MemoryManager::new(&shim.facts, MemoryConfig::default(), issuer, budget.clone());
    drop(mm.reserve(&shim, 4 * MIB, PageUpdate::Allow).unwrap());
    mm.cleanup(&shim, Cleanup::Explicit);
    assert_eq!((shim.mapped.get(), mm.retired_bytes()), (2, 4 * MIB));
    assert_eq!(budget.held(), 4 * MIB, "retiring granules still count");
    let retired = mm.take_retired();
    // Needed again before the fence: taken back, no map call.
    let a = mm.reserve(&shim, 4 * MIB, PageUpdate::Allow).unwrap();
    assert_eq!(shim.maps.get(), 2);
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
