//! Giving idle granules back ([`IdleGranules`]): the rule, one test each, and a property test
//! that compares the granule pools' counts and the memory the device maps with a plain model
//! of the granules live allocations touch, after every reservation.

use super::*;
use crate::memory::config::IdleGranules;
use alloc::collections::BTreeSet;
use proptest::prelude::*;

const G: u64 = 2 * MIB;
const ALIGN: u64 = 256;

/// A device with 2 MiB granules of virtual memory, pages freed at once, under `idle`.
fn vm_device(idle: IdleGranules) -> (TestShim, MemoryManager<TestShim>) {
    vm_device_mapping(idle, false)
}

/// [`vm_device`], its pools mapping spans with `spans` ([`MemoryConfig::map_spans`]).
fn vm_device_mapping(idle: IdleGranules, spans: bool) -> (TestShim, MemoryManager<TestShim>) {
    let shim = TestShim::with_vm(4 << 30, ALIGN, 256 * MIB, G);
    let config = MemoryConfig {
        idle_granules: idle,
        map_spans: spans,
        ..MemoryConfig::default()
    };
    let mm = manager(&shim, config, MemoryBudget::new(None));
    (shim, mm)
}

/// `IdleGranules::Slack`: `per_64` 64ths of the granules in use kept idle, at least `floor`
/// bytes.
fn keep(per_64: u32, floor: u64) -> IdleGranules {
    IdleGranules::Slack { per_64, floor }
}

/// Granules the device maps, and those the pools count as in use and as idle.
fn granules(shim: &TestShim, mm: &MemoryManager<TestShim>) -> (u64, u64, u64) {
    let (busy, idle) = counts(mm);
    (shim.mapped.get(), busy, idle)
}

/// The granules the pools count as in use (touched or guarded) and as idle.
fn counts(mm: &MemoryManager<TestShim>) -> (u64, u64) {
    mm.vm.iter().flatten().fold((0, 0), |(b, i), p| {
        (b + u64::from(p.busy), i + u64::from(p.idle_count()))
    })
}

/// A reservation of the size last freed arms holding: the next free of that size is held back
/// whole (its granule stays touched), the next reservation of that size gets it at the same
/// address, any other size releases it first (so that reservation sees the room as if nothing
/// were held), and an explicit cleanup gives everything back (`sliced/held.rs`).
/// The same under a slack that has nothing to give back (held blocks are released only when
/// idle granules go back).
#[cfg(all(feature = "held-blocks", not(devcmd_no_held_blocks)))]
#[test]
fn a_repeated_size_is_served_from_a_held_block_and_nothing_stays_held() {
    for idle in [IdleGranules::UpToPeak, keep(64, 8 * G)] {
        repeat_served_from_a_held_block(idle);
    }
}

#[cfg(all(feature = "held-blocks", not(devcmd_no_held_blocks)))]
fn repeat_served_from_a_held_block(idle: IdleGranules) {
    let (shim, mut mm) = vm_device(idle);
    let held = |mm: &MemoryManager<TestShim>| {
        mm.vm
            .iter()
            .flatten()
            .map(|p| p.pool.held_count())
            .sum::<usize>()
    };
    let keep = mm.reserve(&shim, 64, PageUpdate::Allow).unwrap();
    let mut addrs = Vec::new();
    for _ in 0..4 {
        let h = mm.reserve(&shim, 4096, PageUpdate::Allow).unwrap();
        addrs.push(mm.resolve(&h).unwrap().addr);
        drop(h);
        mm.collect_returns();
    }
    assert!(addrs.windows(2).all(|w| w[0] == w[1]), "{addrs:?}");
    assert_eq!(
        held(&mm),
        1,
        "armed by the repeat: the last free is held back"
    );
    assert_eq!(counts(&mm), (1, 0), "its granule counts as in use");
    // Another size: the held block is released first, and the room it leaves serves it.
    let other = mm.reserve(&shim, 8192, PageUpdate::Allow).unwrap();
    assert_eq!(held(&mm), 0);
    assert_eq!(mm.resolve(&other).unwrap().addr, addrs[0]);
    assert_eq!(shim.maps.get(), 1, "one granule all along");
    drop((keep, other));
    mm.cleanup(&shim, Cleanup::Explicit);
    assert_eq!((held(&mm), counts(&mm), shim.mapped.get()), (0, (0, 0), 0));
}

/// Several allocations returned between two looks are freed in the order they came back: the
/// held ring then serves the last one freed first.
#[cfg(all(feature = "held-blocks", not(devcmd_no_held_blocks)))]
#[test]
fn returns_are_freed_in_the_order_they_came_back() {
    let (shim, mut mm) = vm_device(IdleGranules::UpToPeak);
    let _keep = mm.reserve(&shim, 64, PageUpdate::Allow).unwrap();
    // Arm holding: a request of the size last freed.
    drop(mm.reserve(&shim, 4096, PageUpdate::Allow).unwrap());
    mm.collect_returns();
    let handles: Vec<_> = (0..3)
        .map(|_| mm.reserve(&shim, 4096, PageUpdate::Allow).unwrap())
        .collect();
    let addrs: Vec<u64> = handles
        .iter()
        .map(|h| mm.resolve(h).unwrap().addr.0)
        .collect();
    // Dropped in turn with no look between: three returns wait in the queue.
    drop(handles);
    mm.collect_returns();
    // Kept live: each take is a new block.
    let kept: Vec<_> = (0..3)
        .map(|_| mm.reserve(&shim, 4096, PageUpdate::Allow).unwrap())
        .collect();
    let again: Vec<u64> = kept.iter().map(|h| mm.resolve(h).unwrap().addr.0).collect();
    assert_eq!(
        again,
        [addrs[2], addrs[1], addrs[0]],
        "the last freed is held last, so taken first"
    );
}

#[test]
fn by_default_idle_granules_stay_until_the_pools_grow() {
    let (shim, mut mm) = vm_device(IdleGranules::UpToPeak);
    assert_eq!(mm.config().idle_granules, IdleGranules::UpToPeak);
    let a = mm.reserve(&shim, 8 * MIB, PageUpdate::Allow).unwrap();
    let _small = mm.reserve(&shim, 1000, PageUpdate::Allow).unwrap();
    drop(a);
    let _again = mm.reserve(&shim, 1000, PageUpdate::Allow).unwrap();
    assert_eq!(granules(&shim, &mm), (5, 1, 4), "four idle granules kept");
}

#[test]
fn a_slack_of_zero_gives_every_idle_granule_back_at_the_next_reservation() {
    let (shim, mut mm) = vm_device(keep(0, 0));
    drop(mm.reserve(&shim, 8 * MIB, PageUpdate::Allow).unwrap());
    assert_eq!(
        shim.mapped.get(),
        4,
        "nothing goes back until the manager runs"
    );
    let _small = mm.reserve(&shim, 1000, PageUpdate::Allow).unwrap();
    assert_eq!(
        granules(&shim, &mm),
        (1, 1, 0),
        "only the small one's granule"
    );
}

#[test]
fn the_slack_keeps_a_share_of_the_granules_in_use_and_a_floor() {
    // 32/64 of the granules in use: 8 in use keep 4 idle.
    let (shim, mut mm) = vm_device(keep(32, 0));
    let _live = mm.reserve(&shim, 16 * MIB, PageUpdate::Allow).unwrap();
    drop(mm.reserve(&shim, 20 * MIB, PageUpdate::Allow).unwrap());
    let _next = mm.reserve(&shim, 64, PageUpdate::Allow).unwrap();
    assert_eq!(
        counts(&mm),
        (9, 4),
        "8 arena granules and 1 small in use, 4 idle kept"
    );
    assert_eq!(shim.mapped.get(), 13);
    // A floor of 6 granules keeps more than the share when little is in use.
    let (shim, mut mm) = vm_device(keep(32, 6 * G));
    drop(mm.reserve(&shim, 20 * MIB, PageUpdate::Allow).unwrap());
    let _next = mm.reserve(&shim, 64, PageUpdate::Allow).unwrap();
    assert_eq!(counts(&mm), (1, 6));
}

#[test]
fn a_kept_idle_granule_serves_the_next_allocation_without_a_map() {
    let (shim, mut mm) = vm_device(keep(0, 4 * G));
    drop(mm.reserve(&shim, 8 * MIB, PageUpdate::Allow).unwrap());
    let maps = shim.maps.get();
    let _again = mm.reserve(&shim, 8 * MIB, PageUpdate::Allow).unwrap();
    assert_eq!(shim.maps.get(), maps, "the four kept granules served it");
}

#[test]
fn guarded_granules_are_in_use_not_idle() {
    let (shim, mut mm) = vm_device(keep(0, 0));
    let a = mm.reserve(&shim, 4 * MIB, PageUpdate::Allow).unwrap();
    let guard = mm.guard(&a).unwrap();
    drop(a);
    let _next = mm.reserve(&shim, 64, PageUpdate::Allow).unwrap();
    assert_eq!(
        counts(&mm).0,
        2,
        "the guarded granule and the small one are in use"
    );
    drop(guard);
    mm.cleanup(&shim, Cleanup::Periodic);
    let _again = mm.reserve(&shim, 64, PageUpdate::Allow).unwrap();
    assert_eq!((counts(&mm), shim.mapped.get()), ((1, 0), 1));
}

#[test]
fn fenced_a_retiring_granule_is_neither_idle_nor_given_back_twice() {
    let shim = TestShim::with_vm(4 << 30, ALIGN, 256 * MIB, G);
    let config = MemoryConfig {
        idle_granules: keep(0, 0),
        ..MemoryConfig::default()
    };
    let issuer = Issuer {
        device: 1,
        stream: 0,
    };
    let mut mm = MemoryManager::new(&shim.facts, config, issuer, MemoryBudget::new(None));
    drop(mm.reserve(&shim, 8 * MIB, PageUpdate::Allow).unwrap());
    let _small = mm.reserve(&shim, 64, PageUpdate::Allow).unwrap();
    // The four idle granules retire: still mapped until their fence, but not idle.
    assert_eq!(granules(&shim, &mm), (5, 1, 0), "(mapped, in use, idle)");
    let retired = mm.take_retired();
    assert_eq!(retired.len(), 4);
    // The next reservation runs the slack again: nothing idle, nothing more retires.
    let _again = mm.reserve(&shim, 64, PageUpdate::Allow).unwrap();
    assert!(mm.take_retired().is_empty());
    // Taken back before the fence: in use again, no map call, left mapped by the fence.
    let maps = shim.maps.get();
    let _big = mm.reserve(&shim, 8 * MIB, PageUpdate::Allow).unwrap();
    assert_eq!((granules(&shim, &mm), shim.maps.get()), ((5, 5, 0), maps));
    for page in retired {
        // SAFETY: no device work exists in this test.
        unsafe { page.free(&shim) };
    }
    assert_eq!(granules(&shim, &mm), (5, 5, 0));
    // SAFETY: as above.
    unsafe { mm.release_all(&shim) };
    assert_eq!((shim.mapped.get(), shim.ranges.get()), (0, 0));
}

/// A device with granules whose manager releases under fences (the default), as a device's.
fn fenced_device() -> (TestShim, MemoryManager<TestShim>) {
    let shim = TestShim::with_vm(4 << 30, ALIGN, 256 * MIB, G);
    let issuer = Issuer {
        device: 1,
        stream: 0,
    };
    let config = MemoryConfig::default();
    let mm = MemoryManager::new(&shim.facts, config, issuer, MemoryBudget::new(None));
    (shim, mm)
}

/// Frees what `mm` retired, as the drop queue does once the fence passed.
fn free_retired(shim: &TestShim, mm: &mut MemoryManager<TestShim>) {
    for page in mm.take_retired() {
        // SAFETY: no device work exists in these tests.
        unsafe { page.free(shim) };
    }
}

/// Reserves X (8 MiB) and Y (2 MiB), drops X, then reserves Z (16 MiB), which fits only past Y:
/// the pools grow, giving X's idle granules back first unless the high-water mark keeps them.
/// Frees what that retired; returns Y and Z.
fn grow_past_a_freed_block(shim: &TestShim, mm: &mut MemoryManager<TestShim>) -> [Handle; 2] {
    let x = mm.reserve(shim, 8 * MIB, PageUpdate::Allow).unwrap();
    let y = mm.reserve(shim, 2 * MIB, PageUpdate::Allow).unwrap();
    drop(x);
    let z = mm.reserve(shim, 16 * MIB, PageUpdate::Allow).unwrap();
    free_retired(shim, mm);
    [y, z]
}

#[test]
fn fenced_an_explicit_cleanup_starts_the_peak_mark_again() {
    // Under fenced release an explicit cleanup retires every idle granule: on their way out,
    // they must not keep the mark at the peak before the cleanup, or idle granules stay held
    // up to it afterwards ("the most held since the last explicit cleanup").
    let (shim, mut mm) = fenced_device();
    drop(mm.reserve(&shim, 40 * MIB, PageUpdate::Allow).unwrap());
    mm.cleanup(&shim, Cleanup::Explicit);
    free_retired(&shim, &mut mm);
    assert_eq!(shim.mapped.get(), 0);
    // The pools grow past their 5 granules, so X's 4 idle ones go back first (a mark left at 20
    // would have kept them).
    let _live = grow_past_a_freed_block(&shim, &mut mm);
    assert_eq!(granules(&shim, &mm), (9, 9, 0), "(mapped, in use, idle)");
    // SAFETY: as above.
    unsafe { mm.release_all(&shim) };
}

#[test]
fn fenced_a_placement_over_mapped_granules_leaves_the_restarted_mark() {
    // As above, with an allocation kept across the cleanup: a placement beside it, before the
    // cleanup's fence, maps nothing and takes nothing back, so it must not raise the mark to
    // what is held with the retiring granules (which would keep idle granules up to it).
    let (shim, mut mm) = fenced_device();
    let _keep = mm.reserve(&shim, 4096, PageUpdate::Allow).unwrap();
    drop(mm.reserve(&shim, 40 * MIB, PageUpdate::Allow).unwrap());
    mm.cleanup(&shim, Cleanup::Explicit);
    // Beside `_keep` in the small pool's mapped granule (another size: no held block serves it).
    let beside = mm.reserve(&shim, 8192, PageUpdate::Allow).unwrap();
    free_retired(&shim, &mut mm);
    assert_eq!(granules(&shim, &mm), (1, 1, 0), "(mapped, in use, idle)");
    // X's 4 idle granules go back before the pools grow past the 6 they held (a mark raised by
    // `beside` to 21 would have kept them).
    let _live = grow_past_a_freed_block(&shim, &mut mm);
    assert_eq!(granules(&shim, &mm), (10, 10, 0), "(mapped, in use, idle)");
    drop(beside);
    // SAFETY: as above.
    unsafe { mm.release_all(&shim) };
}

#[test]
fn a_shim_without_virtual_memory_keeps_pages_whatever_its_facts_say() {
    let shim = TestShim::with_vm(4 << 30, ALIGN, 256 * MIB, G).without_virtual_memory();
    let issuer = Issuer {
        device: 1,
        stream: 0,
    };
    let config = MemoryConfig::default();
    let mut mm = MemoryManager::new(&shim.facts, config, issuer, MemoryBudget::new(None));
    assert_eq!(mm.vm_granule(), 0);
    let _a = mm.reserve(&shim, 3 * MIB, PageUpdate::Allow).unwrap();
    let _b = mm.reserve(&shim, 64, PageUpdate::Allow).unwrap();
    assert_eq!(
        (shim.ranges.get(), shim.maps.get(), shim.live_pages.get()),
        (0, 0, 2),
        "(ranges reserved, granules mapped, pages): an arena page and a small one"
    );
    // SAFETY: no device work exists in this test.
    unsafe { mm.release_all(&shim) };
}

/// One step of the property test.
#[derive(Debug, Clone)]
enum Op {
    Reserve(u64),
    Drop(usize),
}

/// Under miri a step costs thousands of times more: the largest reservation is smaller there
/// (the model walks every granule a live allocation touches after every step).
const LARGEST: u64 = if cfg!(miri) { 12 * MIB } else { 40 * MIB };
/// Steps of a case (fewer under miri, for the same reason).
const STEPS: usize = if cfg!(miri) { 16 } else { 80 };

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => prop_oneof![1u64..=64 * 1024, 64 * 1024 + 1..=8 * MIB, 8 * MIB..=LARGEST]
            .prop_map(Op::Reserve),
        2 => any::<usize>().prop_map(Op::Drop),
    ]
}

/// The model: the granules the live allocations touch, from their addresses and sizes alone, and
/// those of the blocks the pools hold back for a request of their size (touched until released).
fn touched(mm: &MemoryManager<TestShim>, live: &[(Handle, u64)]) -> BTreeSet<u64> {
    let mut set = BTreeSet::new();
    for pool in mm.vm.iter().flatten() {
        for (_, offset, size) in pool.pool.held_blocks() {
            let addr = pool.base + offset;
            set.extend(addr / G..=(addr + size - 1) / G);
        }
    }
    for (h, size) in live {
        let r = mm.resolve(h).expect("a live handle resolves");
        let aligned = (*size).max(1).next_multiple_of(ALIGN);
        set.extend(r.addr.0 / G..=(r.addr.0 + aligned - 1) / G);
    }
    set
}

fn slack() -> impl Strategy<Value = IdleGranules> {
    prop_oneof![
        Just(IdleGranules::UpToPeak),
        (0u32..=128, 0u64..=8).prop_map(|(per_64, floor)| IdleGranules::Slack {
            per_64,
            floor: floor * G
        }),
    ]
}

/// Cases: `DEVCMD_PROPTEST_CASES`, or 64 (`scripts/test` sets 4 under miri, where a case of
/// the smaller model takes about 10 s).
fn cases() -> u32 {
    std::env::var("DEVCMD_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    /// After every reservation: the pools count as in use exactly the granules the model says
    /// live allocations touch, as idle exactly the rest of what the device maps, and under a
    /// slack the device maps no more than the granules in use plus the slack (with spans, or
    /// every idle granule left is pinned by one in use in its mapping).
    #[test]
    fn held_stays_within_the_slack_above_what_is_in_use(
        idle in slack(),
        spans in any::<bool>(),
        ops in prop::collection::vec(op(), 1..STEPS),
    ) {
        let (shim, mut mm) = vm_device_mapping(idle, spans);
        let mut live: Vec<(Handle, u64)> = Vec::new();
        for op in ops {
            match op {
                Op::Reserve(size) => {
                    let h = mm.reserve(&shim, size, PageUpdate::Allow).unwrap();
                    live.push((h, size));
                }
                Op::Drop(i) if !live.is_empty() => {
                    live.swap_remove(i % live.len());
                    continue; // settled at the next reservation
                }
                Op::Drop(_) => continue,
            }
            let in_use = touched(&mm, &live).len() as u64;
            let (busy, idle_count) = counts(&mm);
            let mapped = shim.live_bytes.get() / G;
            prop_assert!(spans || mapped == shim.mapped.get(), "one mapping a granule");
            prop_assert_eq!(busy, in_use, "granules in use: the pools against the model");
            prop_assert_eq!(idle_count, mapped - in_use, "idle: what is mapped and not in use");
            if let IdleGranules::Slack { per_64, floor } = idle {
                let keep = (floor / G).max(in_use * u64::from(per_64) / 64);
                let free: u64 = mm.vm.iter().flatten().map(|p| u64::from(p.idle_free_count())).sum();
                prop_assert!(
                    mapped <= in_use + keep || (spans && free == 0),
                    "{} granules mapped for {} in use and a slack of {} ({} idle may go)",
                    mapped, in_use, keep, free
                );
            }
        }
        drop(live);
        mm.cleanup(&shim, Cleanup::Explicit);
        prop_assert_eq!((counts(&mm), shim.mapped.get(), shim.live_bytes.get()), ((0, 0), 0, 0));
    }
}
