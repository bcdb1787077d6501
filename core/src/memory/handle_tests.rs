//! Tests of handles, bindings and the return queue.

use super::*;
use crate::memory::pool::Size;

const SMALL: Pool = Pool::Pages(Size::Small);
const ARENA: Pool = Pool::Pages(Size::Arena);

fn issuer() -> Issuer {
    Issuer {
        device: 1,
        stream: 0,
    }
}

#[test]
fn clones_share_and_only_a_single_owner_may_mutate() {
    let q = Arc::new(ReturnQueue::default());
    let h = Handle::new(7, issuer(), 64, &q);
    assert!(h.can_mut());
    let c = h.clone();
    assert!(!h.can_mut());
    drop(c);
    assert!(h.can_mut());
    let b = h.binding();
    assert!(h.can_mut(), "a binding is not an owner");
    assert!(h.is_bound());
    drop(b);
    assert!(!h.is_bound());
}

#[test]
fn the_last_drop_returns_a_bound_allocation_from_any_thread() {
    let q = Arc::new(ReturnQueue::default());
    let h = Handle::new(7, issuer(), 64, &q);
    h.set_location(
        Some(Location {
            pool: ARENA,
            block: 3,
        }),
        false,
    );
    let b = h.binding();
    drop(h);
    let mut out = Vec::new();
    q.drain_into(&mut out);
    assert!(out.is_empty(), "the binding keeps it alive");
    std::thread::spawn(move || drop(b)).join().unwrap();
    q.drain_into(&mut out);
    assert_eq!(out.len(), 1);
    assert_eq!(
        (out[0].id, out[0].location),
        (
            7,
            Location {
                pool: ARENA,
                block: 3
            }
        )
    );
}

#[test]
fn an_unbound_or_handed_over_handle_returns_nothing_and_says_why() {
    let q = Arc::new(ReturnQueue::default());
    let lazy = Handle::new(1, issuer(), 8, &q);
    assert_eq!(
        lazy.as_binding().location(),
        Err(IoError::NotFound {
            handle: 1,
            reason: NotFoundReason::NeverBound
        })
    );
    let reserved = Handle::new(2, issuer(), 8, &q);
    reserved.set_location(None, true);
    assert_eq!(
        reserved.as_binding().location(),
        Err(IoError::NotFound {
            handle: 2,
            reason: NotFoundReason::HandedOver
        })
    );
    drop((lazy, reserved));
    let mut out = Vec::new();
    q.drain_into(&mut out);
    assert!(out.is_empty());
}

#[test]
fn a_returned_identity_is_reused_unless_a_reference_is_left() {
    let q = Arc::new(ReturnQueue::default());
    let h = Handle::new(7, issuer(), 64, &q);
    h.set_location(
        Some(Location {
            pool: ARENA,
            block: 3,
        }),
        false,
    );
    let block = Arc::as_ptr(&h.identity);
    let b = h.binding();
    drop(h);
    drop(b);
    let mut out = Vec::new();
    q.drain_into(&mut out);
    let spare = out.pop().expect("the last drop returned it").identity;
    let reused = Handle::reusing(Some(spare), 8, issuer(), 32, &q);
    assert_eq!(Arc::as_ptr(&reused.identity), block, "same heap block");
    assert_eq!((reused.id(), reused.len(), reused.can_mut()), (8, 32, true));
    assert!(!reused.is_bound() && !reused.is_exposed());
    assert_eq!(
        reused.as_binding().location(),
        Err(IoError::NotFound {
            handle: 8,
            reason: NotFoundReason::NeverBound
        })
    );
    // A reference still on its way out (another thread's drop): a new block, nothing shared.
    reused.set_location(
        Some(Location {
            pool: ARENA,
            block: 4,
        }),
        false,
    );
    let held = Arc::clone(&reused.identity);
    drop(reused);
    q.drain_into(&mut out);
    let spare = out.pop().expect("returned").identity;
    let fresh = Handle::reusing(Some(spare), 9, issuer(), 16, &q);
    assert_ne!(Arc::as_ptr(&fresh.identity), Arc::as_ptr(&held));
    assert_eq!(held.id, 8, "the old block is left as it was");
}

#[test]
fn a_queue_dropped_with_returns_in_it_frees_them() {
    // Returned identities point at their queue weakly: no cycle keeps either alive (miri's
    // leak check sees it).
    let q = Arc::new(ReturnQueue::default());
    let h = Handle::new(1, issuer(), 8, &q);
    h.set_location(
        Some(Location {
            pool: SMALL,
            block: 0,
        }),
        false,
    );
    drop(h);
    drop(q);
    // A handle outliving its queue drops without returning anything.
    let q = Arc::new(ReturnQueue::default());
    let h = Handle::new(2, issuer(), 8, &q);
    h.set_location(
        Some(Location {
            pool: SMALL,
            block: 1,
        }),
        false,
    );
    drop(q);
    drop(h);
}

#[test]
fn views_stay_inside_their_allocation() {
    let q = Arc::new(ReturnQueue::default());
    let h = Handle::new(1, issuer(), 100, &q);
    let v = h.view(10, 50).unwrap();
    assert_eq!((v.offset(), v.len()), (10, 50));
    assert_eq!(
        v.view(40, 20).unwrap_err(),
        IoError::OutOfRange {
            offset: 40,
            len: 20,
            size: 50
        }
    );
    assert!(h.view(u64::MAX, 2).is_err());
}
