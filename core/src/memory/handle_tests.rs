//! Tests of handles, bindings and the return queue.

use super::*;
use crate::memory::binding::AsBinding;
use crate::memory::pool::Size;
use alloc::vec::Vec;

const SMALL: Pool = Pool::Pages(Size::Small);
const ARENA: Pool = Pool::Pages(Size::Arena);

fn issuer() -> Issuer {
    Issuer {
        device: 1,
        stream: 0,
    }
}

/// A manager's queue: the handles made on it are `issuer()`'s.
fn queue() -> Arc<ReturnQueue> {
    Arc::new(ReturnQueue::issued_by(issuer(), None))
}

#[test]
fn clones_share_and_only_a_single_owner_may_mutate() {
    let q = queue();
    let h = Handle::new(7, 64, &q);
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
    let q = queue();
    let h = Handle::new(7, 64, &q);
    h.set_location(
        Some(Placed {
            location: Location {
                pool: ARENA,
                block: 3,
            },
            addr: 0,
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
    let q = queue();
    let lazy = Handle::new(1, 8, &q);
    assert_eq!(
        lazy.as_binding().location(),
        Err(IoError::NotFound {
            handle: 1,
            reason: NotFoundReason::NeverBound
        })
    );
    let reserved = Handle::new(2, 8, &q);
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
fn a_returned_identity_is_reused_in_its_heap_block() {
    let q = queue();
    let h = Handle::new(7, 64, &q);
    h.set_location(
        Some(Placed {
            location: Location {
                pool: ARENA,
                block: 3,
            },
            addr: 0,
        }),
        false,
    );
    let block = h.identity;
    let b = h.binding();
    drop(h);
    drop(b);
    let mut out = Vec::new();
    q.drain_into(&mut out);
    let spare = out.pop().expect("the last drop returned it").identity;
    let reused = Handle::reusing(Some(spare), 8, 32, None, &q);
    assert_eq!(reused.identity, block, "same heap block");
    assert_eq!((reused.id(), reused.len(), reused.can_mut()), (8, 32, true));
    assert!(!reused.is_bound() && !reused.is_exposed());
    assert_eq!(
        reused.as_binding().location(),
        Err(IoError::NotFound {
            handle: 8,
            reason: NotFoundReason::NeverBound
        })
    );
}

#[test]
fn a_closed_queue_frees_its_returns_and_refuses_later_ones() {
    // Returned identities hold their queue, which holds them: closing it (as the manager does
    // when it goes) breaks the circle, and nothing leaks (miri's leak check sees it).
    let q = queue();
    let h = Handle::new(1, 8, &q);
    h.set_location(
        Some(Placed {
            location: Location {
                pool: SMALL,
                block: 0,
            },
            addr: 0,
        }),
        false,
    );
    drop(h);
    q.close();
    drop(q);
    // A handle outliving its manager (the queue closed) drops without returning anything, and
    // takes the queue with it.
    let q = queue();
    let h = Handle::new(2, 8, &q);
    h.set_location(
        Some(Placed {
            location: Location {
                pool: SMALL,
                block: 1,
            },
            addr: 0,
        }),
        false,
    );
    q.close();
    let weak = Arc::downgrade(&q);
    drop(q);
    assert!(
        weak.upgrade().is_some(),
        "the handle's identity holds the queue"
    );
    drop(h);
    assert!(weak.upgrade().is_none(), "the last handle took it with it");
}

#[test]
fn views_stay_inside_their_allocation() {
    let q = queue();
    let h = Handle::new(1, 100, &q);
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

#[test]
fn returns_racing_the_close_are_either_freed_by_it_or_refused() {
    race_the_close(queue());
}

#[test]
fn returns_racing_the_close_ring_only_a_live_queue() {
    // The same race with a queue that asks for the device's attention on every push: the ring
    // is made under the queue's lock, before the close (or the drainer) can drop the pushed
    // identity and with it the last hold on the queue (miri sees a use after free otherwise).
    let attention = Arc::new(crate::attention::Attention::default());
    race_the_close(Arc::new(ReturnQueue::issued_by(
        issuer(),
        Some(Arc::clone(&attention)),
    )));
    assert_eq!(Arc::strong_count(&attention), 1, "the queue is gone");
}

/// Another thread drops the last handles while the manager closes its queue `q`: each returned
/// identity is dropped by the close or refused by it, never left in a closed queue (miri's leak
/// check and the queue's end both show it).
fn race_the_close(q: Arc<ReturnQueue>) {
    let handles: Vec<Handle> = (0..8)
        .map(|i| {
            let h = Handle::new(i, 8, &q);
            h.set_location(
                Some(Placed {
                    location: Location {
                        pool: SMALL,
                        block: i as u32,
                    },
                    addr: 0,
                }),
                false,
            );
            h
        })
        .collect();
    let weak = Arc::downgrade(&q);
    let dropper = std::thread::spawn(move || drop(handles));
    q.close();
    drop(q);
    dropper.join().unwrap();
    assert!(
        weak.upgrade().is_none(),
        "nothing holds the queue: no identity was left in it"
    );
}

#[test]
fn a_count_that_would_wrap_panics_instead_of_freeing_under_live_handles() {
    // Leaked bindings (2³¹ of them) would wrap the count and free the identity under `h`: the
    // reference past the limit panics instead, as `Arc` aborts. Set near the limit directly (the
    // leaks themselves take seconds).
    let q = queue();
    let h = Handle::new(1, 8, &q);
    h.identity().refs.store(MAX_REFS, Ordering::Relaxed);
    for make in [
        (|h: &Handle| drop(h.binding())) as fn(&Handle),
        |h: &Handle| drop(h.clone()),
    ] {
        let refused = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| make(&h)));
        let message = refused.expect_err("past the limit");
        let message = message
            .downcast_ref::<alloc::string::String>()
            .expect("a formatted message");
        assert!(message.contains("no more fit"), "{message}");
        // The refused reference is not counted: refusals, caught, never wrap the count.
        assert_eq!(h.identity().refs.load(Ordering::Relaxed), MAX_REFS);
    }
    h.identity().refs.store(1, Ordering::Relaxed);
    assert_eq!(h.id(), 1, "the identity is intact");
}

#[test]
fn the_exposed_flag_and_the_graph_count_share_a_word_without_touching() {
    let q = queue();
    let h = Handle::new(1, 8, &q);
    let b = h.binding();
    b.keep_for_graph();
    assert!(h.is_kept_by_graph() && !h.is_exposed());
    h.expose();
    assert!(h.is_kept_by_graph() && h.is_exposed());
    b.release_graph();
    assert!(!h.is_kept_by_graph() && h.is_exposed(), "exposed for good");
}

#[test]
fn the_record_keeps_a_location_and_the_address_where_it_fits() {
    let q = queue();
    let h = Handle::new(9, 64, &q);
    let location = Location {
        pool: ARENA,
        block: crate::memory::pool::MAX_BLOCKS - 1,
    };
    for (addr, kept) in [
        (0x7000, Some(0x7000)),
        // `usize::MAX` itself says "not kept": that address is looked up in the pools.
        (usize::MAX as u64, None),
    ] {
        h.set_location(Some(Placed { location, addr }), false);
        assert_eq!(h.as_binding().placed(&q), Ok((location, kept)));
    }
    // Another manager (one a user made with the same issuer) is refused, the address unread.
    h.set_location(
        Some(Placed {
            location,
            addr: 0x7000,
        }),
        false,
    );
    let other = ReturnQueue::issued_by(issuer(), None);
    assert_eq!(
        h.as_binding().placed(&other),
        Err(IoError::NotFound {
            handle: 9,
            reason: NotFoundReason::OtherManager
        })
    );
    h.set_location(None, true);
    assert_eq!(
        h.as_binding().placed(&q),
        Err(IoError::NotFound {
            handle: 9,
            reason: NotFoundReason::HandedOver
        })
    );
}
