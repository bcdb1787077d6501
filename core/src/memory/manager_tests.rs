//! The manager's rules, one test each.

use super::*;
use crate::error::{IoError, NotFoundReason};
use crate::memory::{Cleanup, PageUpdate, PoolKind, PoolReport};
use crate::test_shim::TestShim;

const MIB: u64 = 1 << 20;

/// A manager of stream 0 of device 1 that frees pages at once.
fn manager(shim: &TestShim, config: MemoryConfig, budget: MemoryBudget) -> MemoryManager<TestShim> {
    let issuer = Issuer {
        device: 1,
        stream: 0,
    };
    let mut mm = MemoryManager::new(&shim.facts, config, issuer, budget);
    // SAFETY: the test shim runs no device work.
    unsafe { mm.release_pages_immediately() };
    mm
}

fn setup(total: u64, alignment: u64, max_page: u64) -> (TestShim, MemoryManager<TestShim>) {
    let shim = TestShim::new(total, alignment, max_page);
    let mm = manager(&shim, MemoryConfig::default(), MemoryBudget::new(None));
    (shim, mm)
}

fn device() -> (TestShim, MemoryManager<TestShim>) {
    setup(1 << 30, 32, 256 * MIB)
}

fn pool(mm: &mut MemoryManager<TestShim>, kind: PoolKind) -> PoolReport {
    *mm.report()
        .pools
        .iter()
        .find(|p| p.kind == kind)
        .expect("pool in report")
}

#[test]
fn small_requests_share_one_small_page() {
    let (shim, mut mm) = device();
    let a = mm.reserve(&shim, 512, PageUpdate::Allow).unwrap();
    let b = mm.reserve(&shim, 512, PageUpdate::Allow).unwrap();
    let r = pool(&mut mm, PoolKind::Small);
    assert_eq!(
        (r.allocations, r.in_use, r.reserved, r.pages),
        (2, 1024, 2 * MIB, 1)
    );
    drop((a, b));
    let _c = mm.reserve(&shim, 512, PageUpdate::Allow).unwrap();
    assert_eq!(
        mm.report().device().reserved,
        2 * MIB,
        "freed room is reused"
    );
}

#[test]
fn padding_is_counted() {
    let (shim, mut mm) = device();
    let _a = mm.reserve(&shim, 40, PageUpdate::Allow).unwrap();
    let _b = mm.reserve(&shim, 40, PageUpdate::Allow).unwrap();
    let r = mm.report();
    assert_eq!((r.device().in_use, r.device().padding), (80, 48));
}

#[test]
fn arena_pages_are_the_request_rounded_up_and_placed_best_fit_across_pages() {
    let (shim, mut mm) = device();
    let _a = mm.reserve(&shim, MIB, PageUpdate::Allow).unwrap();
    assert_eq!(
        pool(&mut mm, PoolKind::Arena).reserved,
        2 * MIB,
        "the smallest page"
    );
    let _b = mm.reserve(&shim, 9 * MIB + 1, PageUpdate::Allow).unwrap();
    assert_eq!(
        pool(&mut mm, PoolKind::Arena).reserved,
        12 * MIB,
        "rounded up to the 2 MiB granule"
    );
    // The free MiB of the first page and the one of the second both fit this: best fit, no page.
    let _c = mm.reserve(&shim, 512 * 1024, PageUpdate::Allow).unwrap();
    let _d = mm
        .reserve(&shim, MIB - 512 * 1024, PageUpdate::Allow)
        .unwrap();
    let r = pool(&mut mm, PoolKind::Arena);
    assert_eq!(
        (r.pages, r.reserved),
        (2, 12 * MIB),
        "carved from free room of any page"
    );
}

#[test]
fn empty_arena_pages_go_back_before_the_arena_grows() {
    let (shim, mut mm) = device();
    drop(mm.reserve(&shim, 4 * MIB, PageUpdate::Allow).unwrap());
    assert_eq!(
        shim.live_pages.get(),
        1,
        "kept for reuse while nothing needs more"
    );
    let small = mm.reserve(&shim, 3 * MIB, PageUpdate::Allow).unwrap();
    assert_eq!(shim.live_pages.get(), 1, "reused");
    drop(small);
    // An AddOnly reservation releases nothing.
    let _x = mm.reserve(&shim, 8 * MIB, PageUpdate::AddOnly).unwrap();
    assert_eq!(shim.live_bytes.get(), 12 * MIB);
    // A growth under Allow gives the empty page back first.
    let _y = mm.reserve(&shim, 16 * MIB, PageUpdate::Allow).unwrap();
    assert_eq!(shim.live_bytes.get(), 24 * MIB);
    assert_eq!(pool(&mut mm, PoolKind::Arena).pages, 2);
}

#[test]
fn the_page_size_stops_at_the_largest_page_and_past_it_is_too_big() {
    let (shim, mut mm) = setup(1 << 30, 32, 16 * MIB);
    let _a = mm.reserve(&shim, MIB, PageUpdate::Allow).unwrap();
    let _b = mm.reserve(&shim, 16 * MIB, PageUpdate::Allow).unwrap();
    assert_eq!(pool(&mut mm, PoolKind::Arena).reserved, 18 * MIB);
    let before = mm.report();
    let e = mm
        .reserve(&shim, 16 * MIB + 1, PageUpdate::Allow)
        .unwrap_err();
    assert!(matches!(e, IoError::BufferTooBig { max_page, .. } if max_page == 16 * MIB));
    assert_eq!(
        mm.report(),
        before,
        "an impossible size leaves the pages alone"
    );
    let e = mm.reserve(&shim, 1 << 50, PageUpdate::Allow).unwrap_err();
    assert!(matches!(e, IoError::BufferTooBig { .. }));
    assert!(matches!(
        mm.reserve(&shim, u64::MAX, PageUpdate::Allow),
        Err(IoError::BufferTooBig { .. })
    ));
}

#[test]
fn a_refused_growth_leaves_the_pages_as_they_were() {
    let (shim, mut mm) = device();
    shim.device_limit.set(8 * MIB);
    let _a = mm.reserve(&shim, MIB, PageUpdate::Allow).unwrap();
    let e = mm.reserve(&shim, 10 * MIB, PageUpdate::Allow).unwrap_err();
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
    let _b = mm.reserve(&shim, MIB / 2, PageUpdate::Allow).unwrap();
    let r = pool(&mut mm, PoolKind::Arena);
    assert_eq!((r.pages, r.reserved), (1, 2 * MIB));
}

#[test]
fn forbidden_updates_serve_only_the_room_held() {
    let (shim, mut mm) = device();
    let a = mm.reserve(&shim, MIB, PageUpdate::Allow).unwrap();
    drop(a);
    let _b = mm.reserve(&shim, MIB, PageUpdate::Forbidden).unwrap();
    let e = mm
        .reserve(&shim, 4 * MIB, PageUpdate::Forbidden)
        .unwrap_err();
    let IoError::PageUpdateForbidden { size, room } = e else {
        panic!("expected PageUpdateForbidden, got {e:?}");
    };
    assert_eq!(size, 4 * MIB);
    assert!(room < 4 * MIB && room > 0, "the room held is named: {room}");
    assert!(!e.may_succeed_after_reclaim());
    assert_eq!(pool(&mut mm, PoolKind::Arena).pages, 1);
}

#[test]
fn persistent_windows_nest_and_reuse_by_exact_size() {
    let (shim, mut mm) = device();
    mm.set_mode(AllocationMode::Persistent);
    mm.set_mode(AllocationMode::Persistent);
    mm.set_mode(AllocationMode::Auto);
    let a = mm.reserve(&shim, 1024, PageUpdate::Allow).unwrap();
    let r = pool(&mut mm, PoolKind::Persistent);
    assert_eq!((r.in_use, r.reserved), (1024, 1024));
    assert_eq!(mm.report().pools.len(), 1, "nothing dynamic was touched");
    drop(a);
    let _b = mm.reserve(&shim, 1024, PageUpdate::Allow).unwrap();
    assert_eq!(pool(&mut mm, PoolKind::Persistent).reserved, 1024, "reused");
    let _c = mm.reserve(&shim, 1025, PageUpdate::Allow).unwrap();
    assert_eq!(
        pool(&mut mm, PoolKind::Persistent).pages,
        2,
        "other size, new page"
    );
    mm.set_mode(AllocationMode::Auto);
    let _d = mm.reserve(&shim, 1024, PageUpdate::Allow).unwrap();
    assert_eq!(pool(&mut mm, PoolKind::Small).pages, 1);
}

#[test]
fn persistent_pages_go_back_only_on_explicit_cleanup() {
    let (shim, mut mm) = device();
    mm.set_mode(AllocationMode::Persistent);
    drop(mm.reserve(&shim, 100 * MIB, PageUpdate::Allow).unwrap());
    mm.cleanup(&shim, Cleanup::Periodic);
    assert_eq!(shim.live_pages.get(), 1);
    mm.cleanup(&shim, Cleanup::Explicit);
    assert_eq!(shim.live_pages.get(), 0);
}

#[test]
fn dedicated_allocations_are_released_at_the_next_tick_once_freed() {
    let (shim, mut mm) = device();
    mm.set_mode(AllocationMode::Persistent);
    mm.set_mode(AllocationMode::Dedicated);
    let probe = mm.reserve(&shim, 200 * MIB, PageUpdate::Allow).unwrap();
    mm.set_mode(AllocationMode::Auto);
    let _w = mm.reserve(&shim, MIB, PageUpdate::Allow).unwrap();
    assert_eq!(pool(&mut mm, PoolKind::Persistent).in_use, MIB);
    assert_eq!(mm.report().device().reserved, 201 * MIB);
    drop(probe);
    mm.set_mode(AllocationMode::Auto);
    let _x = mm.reserve(&shim, MIB, PageUpdate::Allow).unwrap();
    assert_eq!(mm.report().device().reserved, MIB + 2 * MIB);
}

#[test]
fn a_dedicated_page_freed_under_a_guard_is_released_once_the_guard_goes() {
    let (shim, mut mm) = device();
    mm.set_mode(AllocationMode::Dedicated);
    let probe = mm.reserve(&shim, 200 * MIB, PageUpdate::Allow).unwrap();
    mm.set_mode(AllocationMode::Auto);
    let guard = mm.guard(&probe).unwrap();
    drop(probe);
    // Freed but guarded: kept through the next tick (the device may still use it).
    let _w = mm.reserve(&shim, MIB, PageUpdate::Allow).unwrap();
    assert_eq!(mm.report().device().reserved, 200 * MIB + 2 * MIB);
    // The guard goes: the next tick gives the page back, as for a page freed unguarded.
    drop(guard);
    let _x = mm.reserve(&shim, MIB, PageUpdate::Allow).unwrap();
    assert_eq!(mm.report().device().reserved, 2 * MIB);
}

#[test]
fn handles_mutate_only_when_alone() {
    let (shim, mut mm) = device();
    let a = mm.reserve(&shim, 100, PageUpdate::Allow).unwrap();
    let c = a.clone();
    assert!(!a.can_mut());
    drop(c);
    assert!(a.can_mut());
}

#[test]
fn foreign_and_out_of_range_handles_are_errors() {
    let (shim, mut mm) = device();
    let other_issuer = Issuer {
        device: 2,
        stream: 0,
    };
    let mut other: MemoryManager<TestShim> = MemoryManager::new(
        &shim.facts,
        MemoryConfig::default(),
        other_issuer,
        MemoryBudget::new(None),
    );
    let foreign = other.lazy_handle(10);
    assert!(matches!(
        mm.resolve(&foreign).unwrap_err(),
        IoError::ForeignHandle {
            issued_by: 2,
            used_on: 1,
            ..
        }
    ));
    let h = mm.reserve(&shim, 100, PageUpdate::Allow).unwrap();
    let big = mm.lazy_handle(200);
    let e = mm.bind(h, &big).unwrap_err();
    assert!(
        matches!(
            e,
            IoError::RoomTooSmall {
                room: 100,
                needs: 200
            }
        ),
        "{e:?}"
    );
}

#[test]
fn a_guarded_page_keeps_its_place_and_serves_nothing_new() {
    let (shim, mut mm) = device();
    let a = mm.reserve(&shim, MIB, PageUpdate::Allow).unwrap();
    let guard = mm.guard(&a).unwrap();
    let page = mm.resolve(&a).unwrap().page;
    assert_eq!(guard.page(), page);
    drop(a);
    let b = mm.reserve(&shim, MIB, PageUpdate::Allow).unwrap();
    assert_ne!(mm.resolve(&b).unwrap().page, page);
    mm.cleanup(&shim, Cleanup::Explicit);
    assert!(
        mm.pages().iter().any(|p| p.page == page && p.guarded),
        "kept while guarded"
    );
    drop(guard);
    drop(b);
    mm.cleanup(&shim, Cleanup::Explicit);
    assert_eq!(mm.report().device().reserved, 0);
    assert_eq!(shim.live_pages.get(), 0);
}

#[test]
fn the_budget_is_never_exceeded_and_the_refusal_names_it() {
    let shim = TestShim::new(1 << 30, 32, 256 * MIB);
    let budget = MemoryBudget::new(Some(20 * MIB));
    let mut mm = manager(&shim, MemoryConfig::default(), budget.clone());
    let a = mm.reserve(&shim, 12 * MIB, PageUpdate::Allow).unwrap();
    let e = mm.reserve(&shim, 10 * MIB, PageUpdate::Allow).unwrap_err();
    assert_eq!(
        e,
        IoError::OutOfMemory {
            size: 10 * MIB,
            held: 12 * MIB,
            budget: Some(20 * MIB),
            source: None
        }
    );
    assert!(budget.held() <= 20 * MIB);
    // A reclaim that frees a fitting page lets the request succeed.
    drop(a);
    let _b = mm.reserve(&shim, 10 * MIB, PageUpdate::Allow).unwrap();
    assert!(budget.held() <= 20 * MIB);
}

#[test]
fn fenced_release_retires_pages_until_the_owner_frees_them() {
    let shim = TestShim::new(1 << 30, 32, 256 * MIB);
    let budget = MemoryBudget::new(None);
    let mut mm = MemoryManager::new(
        &shim.facts,
        MemoryConfig::default(),
        Issuer {
            device: 1,
            stream: 0,
        },
        budget.clone(),
    );
    drop(mm.reserve(&shim, MIB, PageUpdate::Allow).unwrap());
    mm.cleanup(&shim, Cleanup::Explicit);
    assert_eq!((shim.live_pages.get(), mm.retired_bytes()), (1, 2 * MIB));
    assert_eq!(budget.held(), 2 * MIB, "retired pages still count");
    // SAFETY: no device work exists in this test.
    unsafe { mm.free_retired(&shim) };
    assert_eq!((shim.live_pages.get(), budget.held()), (0, 0));
}

#[test]
fn zero_size_reservations_succeed() {
    let (shim, mut mm) = device();
    let h = mm.reserve(&shim, 0, PageUpdate::Allow).unwrap();
    assert_eq!(mm.resolve(&h).unwrap().len, 0);
}

#[test]
fn the_report_reads_well() {
    let (shim, mut mm) = device();
    let _a = mm.reserve(&shim, 1000, PageUpdate::Allow).unwrap();
    let _b = mm.reserve(&shim, 3 * MIB, PageUpdate::Allow).unwrap();
    let text = alloc::format!("{}", mm.report());
    assert!(
        text.contains("small") && text.contains("arena") && text.contains("total"),
        "{text}"
    );
    assert!(text.contains("2 MiB") && text.contains("6 MiB"), "{text}");
}

#[path = "manager_lookup_tests.rs"]
mod lookup;

#[path = "manager_budget_tests.rs"]
mod budget;

#[path = "manager_vm_tests.rs"]
mod vm;

#[path = "manager_idle_tests.rs"]
mod idle;

#[path = "manager_span_tests.rs"]
mod spans;

#[path = "manager_fenced_tests.rs"]
mod fenced;

#[test]
fn an_alignment_past_two_gib_is_honoured_as_two_gib() {
    // A slice's padding is kept in 32 bits (`sliced.rs`): a device asking for 8 GiB of alignment
    // gets slices aligned to 2 GiB, with the bytes asked for and the padding counted exactly.
    let (shim, mut mm) = setup(1 << 40, 1 << 33, 1 << 34);
    assert_eq!(mm.alignment(), 1 << 31);
    let a = mm.reserve(&shim, 40, PageUpdate::Allow).unwrap();
    let b = mm.reserve(&shim, 40, PageUpdate::Allow).unwrap();
    let r = mm.report();
    assert_eq!(
        (
            r.device().allocations,
            r.device().in_use,
            r.device().padding
        ),
        (2, 80, 2 * ((1 << 31) - 40))
    );
    drop((a, b));
    let r = mm.report();
    assert_eq!(
        (
            r.device().allocations,
            r.device().in_use,
            r.device().padding
        ),
        (0, 0, 0)
    );
}

#[test]
fn a_handle_knows_when_its_manager_is_gone() {
    let (shim, mut mm) = device();
    let h = mm.reserve(&shim, 100, PageUpdate::Allow).unwrap();
    let view = h.view(0, 10).unwrap();
    assert!(!h.is_orphaned() && !view.is_orphaned());
    drop(mm);
    assert!(h.is_orphaned() && view.is_orphaned());
}

#[test]
fn a_guard_that_outlives_a_release_all_names_no_page_of_the_next_pools() {
    let (shim, mut mm) = device();
    mm.set_mode(crate::memory::AllocationMode::Persistent);
    let h = mm.reserve(&shim, 4096, PageUpdate::Allow).unwrap();
    let g = mm.guard(&h).unwrap();
    drop(h);
    // SAFETY: the test shim runs no work.
    unsafe { mm.release_all(&shim) };
    // A new page takes the old one's number; freed, it is on the free list once.
    drop(mm.reserve(&shim, 4096, PageUpdate::Allow).unwrap());
    mm.cleanup(&shim, Cleanup::Periodic);
    drop(g);
    mm.cleanup(&shim, Cleanup::Periodic);
    let a = mm.reserve(&shim, 4096, PageUpdate::Allow).unwrap();
    let b = mm.reserve(&shim, 4096, PageUpdate::Allow).unwrap();
    let (ra, rb) = (mm.resolve(&a).unwrap(), mm.resolve(&b).unwrap());
    assert_ne!(ra.addr, rb.addr, "two live handles on one page");
}
