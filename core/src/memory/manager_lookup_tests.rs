//! The manager's lookups: binding room to a handle, and the address a handle's record keeps.

use super::*;
use alloc::string::ToString;

#[test]
fn bind_hands_the_room_over_and_the_reservation_goes_stale() {
    let (shim, mut mm) = device();
    let user = mm.lazy_handle(100);
    assert_eq!(
        mm.resolve(&user).unwrap_err(),
        IoError::NotFound {
            handle: user.id(),
            reason: NotFoundReason::NeverBound
        }
    );
    let reserved = mm.reserve(&shim, 100, PageUpdate::Allow).unwrap();
    let stale = reserved.clone();
    let addr = mm.resolve(&reserved).unwrap().addr;
    mm.bind(reserved, &user).unwrap();
    let r = mm.resolve(&user).unwrap();
    assert_eq!(r.addr, addr);
    assert_eq!(
        mm.resolve(&stale).unwrap_err(),
        IoError::NotFound {
            handle: stale.id(),
            reason: NotFoundReason::HandedOver
        }
    );
    drop(stale);
    assert_eq!(
        mm.report().device().allocations,
        1,
        "the stale clone frees nothing"
    );
}

#[test]
fn a_released_location_never_resolves_to_its_next_owner() {
    let (shim, mut mm) = device();
    let a = mm.reserve(&shim, 100, PageUpdate::Allow).unwrap();
    let binding = a.binding();
    let user = mm.lazy_handle(100);
    mm.bind(a, &user).unwrap();
    // Rebinding `user` frees its first room, which the next reservation reuses.
    let again = mm.reserve(&shim, 100, PageUpdate::Allow).unwrap();
    mm.bind(again, &user).unwrap();
    let other = mm.reserve(&shim, 100, PageUpdate::Allow).unwrap();
    assert!(matches!(
        mm.resolve(&binding),
        Err(IoError::NotFound { .. })
    ));
    assert_ne!(
        mm.resolve(&other).unwrap().addr,
        mm.resolve(&user).unwrap().addr
    );
}

/// Checks that the engine's short path (the address the handle's record keeps) names the same
/// range as the lookup through the pools, for `h` and a view of it.
pub(super) fn assert_kept_address_is_the_pools(mm: &MemoryManager<TestShim>, h: &Handle) {
    let from_pools = mm.resolve(h).unwrap();
    assert_eq!(mm.span_issued(h), Ok(from_pools.span()), "{h:?}");
    if h.len() > 1 {
        let v = h.view(1, h.len() - 1).unwrap();
        assert_eq!(mm.span_issued(&v), Ok(mm.resolve(&v).unwrap().span()));
    }
}

#[test]
fn the_address_a_handle_keeps_is_where_its_pool_placed_it() {
    let (shim, mut mm) = device();
    let mut held = Vec::new();
    for (mode, size) in [
        (AllocationMode::Auto, 100),
        (AllocationMode::Auto, 3 * MIB),
        (AllocationMode::Persistent, 5000),
        (AllocationMode::Dedicated, 7000),
    ] {
        mm.set_mode(mode);
        let h = mm.reserve(&shim, size, PageUpdate::Allow).unwrap();
        assert_kept_address_is_the_pools(&mm, &h);
        held.push(h);
        mm.set_mode(AllocationMode::Auto);
    }
    // Freed room reused by a new handle (a recycled identity), and room bound to another
    // handle: the address follows the room, and the reservation keeps none.
    drop(held.remove(0));
    let again = mm.reserve(&shim, 64, PageUpdate::Allow).unwrap();
    assert_kept_address_is_the_pools(&mm, &again);
    let user = mm.lazy_handle(64);
    assert!(matches!(
        mm.span_issued(&user),
        Err(IoError::NotFound {
            reason: NotFoundReason::NeverBound,
            ..
        })
    ));
    let reserved = again.clone();
    drop(again);
    mm.bind(reserved.clone(), &user).unwrap();
    assert_kept_address_is_the_pools(&mm, &user);
    assert!(matches!(
        mm.span_issued(&reserved),
        Err(IoError::NotFound {
            reason: NotFoundReason::HandedOver,
            ..
        })
    ));
}

#[test]
fn binding_moves_the_kept_address_of_a_handle_that_had_room() {
    let (shim, mut mm) = device();
    let target = mm.reserve(&shim, 256, PageUpdate::Allow).unwrap();
    let old = mm.resolve(&target).unwrap().addr;
    // A view of a larger reservation gives its whole room: the address kept is the block's,
    // not the view's.
    let room = mm.reserve(&shim, 4096, PageUpdate::Allow).unwrap();
    let start = mm.resolve(&room).unwrap().addr;
    let view = room.view(1024, 512).unwrap();
    drop(room);
    mm.bind(view, &target).unwrap();
    assert_kept_address_is_the_pools(&mm, &target);
    assert_eq!(mm.span_issued(&target).unwrap().addr, start);
    assert_ne!(start, old, "the handle's old room was left");
    // Its old room went back: the next reservation of that size is placed there again.
    let again = mm.reserve(&shim, 256, PageUpdate::Allow).unwrap();
    assert_eq!(mm.resolve(&again).unwrap().addr, old);
}

/// Whether `e` refuses a handle another manager made.
fn refused<T>(e: Result<T, IoError>) -> bool {
    matches!(
        e,
        Err(IoError::NotFound {
            reason: NotFoundReason::OtherManager,
            ..
        })
    )
}

#[test]
fn another_managers_handle_is_refused_by_every_lookup_and_by_bind() {
    // Two managers a user made with one issuer number their handles alike (both first handles
    // have one id and sit in block 0 of their small pool), so only the manager that made a
    // handle may resolve it, bind room to it, or take room from it.
    let (shim, mut mm) = device();
    let mut other = manager(&shim, MemoryConfig::default(), MemoryBudget::new(None));
    let ours = mm.reserve(&shim, 64, PageUpdate::Allow).unwrap();
    let theirs = other.reserve(&shim, 64, PageUpdate::Allow).unwrap();
    assert_eq!(ours.id(), theirs.id(), "the ids collide");
    assert!(refused(mm.span_issued(&theirs)));
    assert!(refused(mm.resolve_issued(&theirs)));
    assert!(refused(mm.resolve(&theirs)));
    assert!(refused(mm.guard(&theirs)));
    // Room of the other manager bound to our handle would be read by our engine as ours.
    let room = other.reserve(&shim, 64, PageUpdate::Allow).unwrap();
    assert!(refused(other.bind(room.clone(), &ours)));
    assert!(refused(mm.bind(room, &ours)));
    let ours_room = mm.reserve(&shim, 64, PageUpdate::Allow).unwrap();
    assert!(refused(mm.bind(ours_room, &theirs)));
    // Nothing moved: each still resolves where its own manager placed it.
    assert_kept_address_is_the_pools(&mm, &ours);
    assert_eq!(
        other.resolve(&theirs).unwrap().addr,
        other.span_issued(&theirs).unwrap().addr
    );
    let text = mm.resolve(&theirs).unwrap_err().to_string();
    assert!(text.contains("another memory manager"), "{text}");
}
