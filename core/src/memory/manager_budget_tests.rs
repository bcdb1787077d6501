//! The manager's page sizes under a budget, degenerate configurations.

use super::*;
use crate::memory::IdleGranules;

#[test]
fn a_degenerate_configuration_cannot_route_a_request_to_a_pool_too_small() {
    let shim = TestShim::new(1 << 30, 32, 256 * MIB);
    let config = MemoryConfig {
        small_page_size: 0,
        small_max_slice: u64::MAX,
        arena_min_page: 0,
        arena_granule: 0,
        virtual_memory: false,
        spare_identities: 8,
        idle_granules: IdleGranules::UpToPeak,
        map_spans: false,
    };
    let mut mm = manager(&shim, config, MemoryBudget::new(None));
    for size in [0, 1, 31, 32, 33, 4096, MIB, 256 * MIB] {
        let h = mm.reserve(&shim, size, PageUpdate::Allow).unwrap();
        assert_eq!(mm.resolve(&h).unwrap().len, size);
    }
    assert!(matches!(
        mm.reserve(&shim, 256 * MIB + 1, PageUpdate::Allow),
        Err(IoError::BufferTooBig { .. })
    ));
}

#[test]
fn a_handle_whose_memory_is_in_use_is_not_rebound() {
    let (shim, mut mm) = device();
    let user = mm.lazy_handle(100);
    let first = mm.reserve(&shim, 100, PageUpdate::Allow).unwrap();
    mm.bind(first, &user).unwrap();
    let in_flight = user.binding();
    let addr = mm.resolve(&in_flight).unwrap().addr;
    let second = mm.reserve(&shim, 100, PageUpdate::Allow).unwrap();
    assert_eq!(
        mm.bind(second, &user).unwrap_err(),
        IoError::InUse { handle: user.id() }
    );
    assert_eq!(
        mm.resolve(&in_flight).unwrap().addr,
        addr,
        "the work keeps its memory"
    );
    assert_eq!(
        mm.report().device().allocations,
        1,
        "the refused room went back"
    );
    drop(in_flight);
    let third = mm.reserve(&shim, 100, PageUpdate::Allow).unwrap();
    mm.bind(third, &user).unwrap();
}

#[test]
fn a_handle_of_another_stream_says_so() {
    let (shim, mm) = device();
    let mut other: MemoryManager<TestShim> = MemoryManager::new(
        &shim.facts,
        MemoryConfig::default(),
        Issuer {
            device: 1,
            stream: 3,
        },
        MemoryBudget::new(None),
    );
    let theirs = other.lazy_handle(10);
    assert_eq!(
        mm.resolve(&theirs).unwrap_err(),
        IoError::WrongStream {
            handle: theirs.id(),
            owner: 3,
            used_on: 0
        }
    );
}

#[test]
fn binding_a_reservation_to_itself_or_a_view_of_it_is_an_error_not_a_panic() {
    let (shim, mut mm) = device();
    let reserved = mm.reserve(&shim, 100, PageUpdate::Allow).unwrap();
    let addr = mm.resolve(&reserved).unwrap().addr;
    let id = reserved.id();
    let view = reserved.view(10, 50).unwrap();
    let clone = reserved.clone();
    for target in [&clone, &view] {
        assert_eq!(
            mm.bind(reserved.clone(), target).unwrap_err(),
            IoError::SelfBind { handle: id }
        );
    }
    let text = alloc::format!("{}", IoError::SelfBind { handle: id });
    assert!(
        text.contains(&alloc::format!("handle {id}")) && text.contains("another handle"),
        "{text}"
    );
    // Nothing changed: the room is still the reservation's, and can go to another handle.
    assert_eq!(mm.resolve(&view).unwrap().addr.0, addr.0 + 10);
    assert_eq!(mm.allocations().len(), 1);
    let user = mm.lazy_handle(100);
    mm.bind(reserved, &user).unwrap();
    assert_eq!(mm.resolve(&user).unwrap().addr, addr);
    drop((clone, view, user));
    assert_eq!(mm.report().device().allocations, 0);
}

#[test]
fn page_sizes_fit_a_small_budget_many_small_slices_and_one_mib_are_served() {
    let shim = TestShim::new(1 << 30, 32, 256 * MIB);
    let budget = MemoryBudget::new(Some(4 * MIB));
    let mut mm = manager(&shim, MemoryConfig::default(), budget.clone());
    let c = mm.config();
    assert_eq!(
        (c.small_page_size, c.arena_min_page, mm.max_page()),
        (MIB / 2, MIB, 4 * MIB),
        "the small page is an eighth of the budget, the arena's smallest page a quarter"
    );
    let small: Vec<Handle> = (0..1000)
        .map(|i| {
            mm.reserve(&shim, 64, PageUpdate::Allow)
                .unwrap_or_else(|e| panic!("small allocation {i} under a 4 MiB budget: {e}"))
        })
        .collect();
    let big = mm
        .reserve(&shim, MIB, PageUpdate::Allow)
        .unwrap_or_else(|e| panic!("1 MiB under a 4 MiB budget: {e}"));
    assert_eq!(mm.resolve(&big).unwrap().len, MIB);
    assert_eq!(pool(&mut mm, PoolKind::Small).pages, 1);
    assert!(budget.held() <= 4 * MIB, "{}", mm.report());
    // Past the budget is a size no page can hold, not a shortage reclaim could cure.
    assert!(matches!(
        mm.reserve(&shim, 4 * MIB + 1, PageUpdate::Allow),
        Err(IoError::BufferTooBig { max_page, .. }) if max_page == 4 * MIB
    ));
    drop((small, big));
}

#[test]
fn the_devices_total_memory_fits_the_page_sizes_as_a_budget_does() {
    let shim = TestShim::new(2 * MIB, 32, 2 * MIB);
    let mut mm = manager(&shim, MemoryConfig::default(), MemoryBudget::new(None));
    assert_eq!(mm.config().small_page_size, MIB / 4);
    let _a = mm.reserve(&shim, 64, PageUpdate::Allow).unwrap();
    let _b = mm.reserve(&shim, MIB, PageUpdate::Allow).unwrap();
    assert!(shim.live_bytes.get() <= 2 * MIB);
}

#[test]
fn a_new_page_gives_up_its_rounding_before_the_budget_refuses_it() {
    let shim = TestShim::new(1 << 30, 32, 256 * MIB);
    let budget = MemoryBudget::new(Some(4 * MIB));
    let mut mm = manager(&shim, MemoryConfig::default(), budget.clone());
    mm.set_mode(AllocationMode::Persistent);
    let _odd = mm.reserve(&shim, 100 * 1024, PageUpdate::Allow).unwrap();
    mm.set_mode(AllocationMode::Auto);
    // 3.8 MiB rounds up to 4 MiB, past the 3.9 MiB the budget has left: the page is fitted to
    // the room instead.
    let big = mm
        .reserve(&shim, 4 * MIB - 200 * 1024, PageUpdate::Allow)
        .unwrap();
    assert_eq!(
        pool(&mut mm, PoolKind::Arena).reserved,
        4 * MIB - 100 * 1024
    );
    assert_eq!(budget.held(), 4 * MIB);
    assert_eq!(mm.resolve(&big).unwrap().len, 4 * MIB - 200 * 1024);
}

#[test]
fn a_small_slice_fits_the_budgets_last_bytes_below_a_small_page() {
    let shim = TestShim::new(1 << 30, 32, 256 * MIB);
    let budget = MemoryBudget::new(Some(4 * MIB));
    let mut mm = manager(&shim, MemoryConfig::default(), budget.clone());
    assert_eq!(mm.config().small_page_size, MIB / 2);
    mm.set_mode(AllocationMode::Persistent);
    let _most = mm
        .reserve(&shim, 4 * MIB - 256 * 1024, PageUpdate::Allow)
        .unwrap();
    mm.set_mode(AllocationMode::Auto);
    // 256 KiB left, under the 512 KiB small page: the page is fitted to the room (as the
    // arena's is) instead of refusing a 64-byte request.
    let small = mm
        .reserve(&shim, 64, PageUpdate::Allow)
        .unwrap_or_else(|e| panic!("64 B with 256 KiB of budget left: {e}"));
    assert_eq!(pool(&mut mm, PoolKind::Small).reserved, 256 * 1024);
    assert_eq!(budget.held(), 4 * MIB);
    drop(small);
    // What truly does not fit is still refused as out of memory.
    assert!(matches!(
        mm.reserve(&shim, 512 * 1024, PageUpdate::Allow),
        Err(IoError::OutOfMemory { .. })
    ));
}
