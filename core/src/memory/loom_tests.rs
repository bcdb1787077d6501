//! Model tests of the return queue, of the last reference's return and of a retiring mapping's
//! token (taken back or unmapped), under loom: every
//! interleaving of the threads below, with the identity's atomics, the queue's lock and the
//! attention word it rings as loom's (`crate::sync`), so a missing order or a lost return fails
//! here rather than once in a million runs. Not modelled: that the queue outlives its last use
//! (its `Arc` is `alloc`'s; miri's runs of `handle_tests.rs`' races check that).
//!
//! Run alone (the core's other tests use no loom model, and loom's atomics refuse to run outside
//! one):
//!
//! ```sh
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p devcmd --lib --release loom_
//! ```

use super::handle::{Handle, ReturnQueue};
use super::pool::{Location, Placed, Pool, Size};
use super::types::Issuer;
use crate::attention::Attention;
use alloc::sync::Arc;
use alloc::vec::Vec;
use loom::thread;

fn queue() -> Arc<ReturnQueue> {
    ringing(None)
}

/// A manager's queue that rings `attention` (if any) after every push, as a device's do.
fn ringing(attention: Option<Arc<Attention>>) -> Arc<ReturnQueue> {
    Arc::new(ReturnQueue::issued_by(
        Issuer {
            device: 1,
            stream: 0,
        },
        attention,
    ))
}

fn at(block: u32) -> Option<Placed> {
    Some(Placed {
        location: Location {
            pool: Pool::Pages(Size::Small),
            block,
        },
        addr: 0x1000 * u64::from(block),
    })
}

/// A bound handle, as the manager makes one.
fn placed(id: u64, block: u32, q: &Arc<ReturnQueue>) -> Handle {
    let h = Handle::new(id, 64, q);
    h.set_location(at(block), false);
    h
}

/// A bound handle `id` cloned onto another thread, which drops the clone while this (device)
/// thread sets its location to `placed` (`handed_over`) and drops it: what the queue holds
/// then, once both drops are through.
fn moved_then_dropped(id: u64, placed: Option<Placed>, handed_over: bool) -> Vec<(u64, u32)> {
    let q = queue();
    let h = self::placed(id, 1, &q);
    let c = h.clone();
    let t = thread::spawn(move || drop(c));
    h.set_location(placed, handed_over);
    drop(h);
    t.join().unwrap();
    drained(&q)
}

/// Everything the queue holds now, as (id, block).
fn drained(q: &ReturnQueue) -> Vec<(u64, u32)> {
    let mut out = Vec::new();
    q.drain_into(&mut out);
    out.iter().map(|r| (r.id, r.location.block)).collect()
}

#[test]
fn loom_the_last_of_a_handle_and_a_binding_dropped_on_two_threads_returns_it_once() {
    loom::model(|| {
        let q = queue();
        let h = placed(7, 3, &q);
        let b = h.binding();
        let t = thread::spawn(move || drop(b));
        drop(h);
        t.join().unwrap();
        assert_eq!(drained(&q), [(7, 3)], "returned once, where it lies");
        assert!(q.is_empty());
    });
}

#[test]
fn loom_a_location_written_before_the_device_thread_drops_is_what_the_last_drop_returns() {
    // The device thread moves the allocation (a new location, plain relaxed stores) and drops
    // its handle while another thread drops the other: whichever drop is last, the `refs`
    // count orders the write before it, and the return names the new block.
    loom::model(|| {
        assert_eq!(moved_then_dropped(9, at(5), false), [(9, 5)]);
    });
}

#[test]
fn loom_a_drain_racing_a_return_takes_it_then_or_at_the_next_drain() {
    // The drain's fast path is one load of the queue's length: a return it misses is taken by
    // the next drain, never lost, and the two never both take it.
    loom::model(|| {
        let q = queue();
        let h = placed(2, 4, &q);
        let t = thread::spawn(move || drop(h));
        let first = drained(&q);
        t.join().unwrap();
        let second = drained(&q);
        let all: Vec<_> = first.iter().chain(&second).copied().collect();
        assert_eq!(all, [(2, 4)], "first {first:?}, then {second:?}");
        assert!(q.is_empty());
    });
}

#[test]
fn loom_returns_racing_the_close_are_freed_by_it_or_refused_and_the_queue_goes() {
    // The manager goes (its queue closed and dropped) while two handles are dropped on another
    // thread: each returned identity is dropped by the close or refused by it, none stays in
    // the closed queue, and the last identity takes the queue with it.
    loom::model(|| {
        let q = queue();
        let handles = [placed(1, 1, &q), placed(2, 2, &q)];
        let weak = Arc::downgrade(&q);
        let t = thread::spawn(move || drop(handles));
        q.close();
        assert!(drained(&q).is_empty(), "a closed queue holds nothing");
        drop(q);
        t.join().unwrap();
        assert!(
            weak.upgrade().is_none(),
            "no identity was left holding the queue"
        );
    });
}

#[test]
fn loom_an_identity_returned_from_another_thread_is_reused_as_soon_as_it_is_drained() {
    // The device thread drains as often as it likes (here: until the return arrives) and gives
    // the returned identity's heap block to a new handle at once, while the returning thread
    // may still be leaving `push`: nothing it touches after the push is the identity's.
    loom::model(|| {
        let q = queue();
        let h = placed(3, 2, &q);
        let t = thread::spawn(move || drop(h));
        let mut out = Vec::new();
        while out.is_empty() {
            q.drain_into(&mut out);
            if out.is_empty() {
                thread::yield_now();
            }
        }
        let back = out.pop().expect("drained one");
        assert_eq!((back.id, back.location.block), (3, 2));
        let reused = Handle::reusing(Some(back.identity), 8, 64, at(6), &q);
        assert!(
            reused.can_mut() && !reused.is_bound(),
            "counted anew: one owner, no binding"
        );
        drop(reused);
        assert_eq!(
            drained(&q),
            [(8, 6)],
            "the reused identity returns as the new handle"
        );
        t.join().unwrap();
    });
}

#[test]
fn loom_a_return_rings_the_device_after_it_can_be_drained() {
    // The device drains its queues only when its attention word was rung since it last looked
    // (`Attention::answer`): the ring must come after the push, or the device could take the
    // ring, find the queue empty, and miss the return until something else rings.
    loom::model(|| {
        let attention = Arc::new(Attention::default());
        let q = ringing(Some(Arc::clone(&attention)));
        let h = placed(4, 7, &q);
        let t = thread::spawn(move || drop(h));
        let look = |q: &ReturnQueue| {
            if attention.answer() {
                drained(q)
            } else {
                Vec::new()
            }
        };
        let first = look(&q);
        t.join().unwrap();
        let second = look(&q);
        let all: Vec<_> = first.iter().chain(&second).copied().collect();
        assert_eq!(all, [(4, 7)], "first {first:?}, then {second:?}");
    });
}

#[test]
fn loom_a_handle_whose_room_was_handed_over_returns_nothing_whichever_drop_is_last() {
    // The device thread hands the allocation's room to another handle (the location cleared,
    // relaxed stores) and drops its handle while another thread drops a clone: the last drop,
    // on either thread, must see the handover and return nothing (returning the old block would
    // free room another handle now owns).
    loom::model(|| {
        assert!(
            moved_then_dropped(5, None, true).is_empty(),
            "nothing returned for room handed over"
        );
    });
}

#[test]
fn loom_a_retiring_mapping_is_taken_back_or_unmapped_never_both_nor_mapped_over() {
    // The drop queue's thread unmaps a retiring mapping after its fence while the manager,
    // placing over it, takes it back: either the manager wins (the unmap never runs) or the
    // unmap is through, budget given back, before the manager maps the address again. A wait
    // for the unmap before the cancel lost this race (the manager mapped over an unmap in
    // progress).
    use super::retire::RetireToken;
    use loom::sync::atomic::{AtomicBool, AtomicU8, Ordering};
    loom::model(|| {
        let token = Arc::new(RetireToken::pending());
        // What the device holds there (1: mapped) and the bytes the budget has back.
        let device = Arc::new(AtomicU8::new(1));
        let given_back = Arc::new(AtomicBool::new(false));
        let queue = {
            let (token, device, given_back) = (token.clone(), device.clone(), given_back.clone());
            thread::spawn(move || {
                token.unmap_unless_taken_back(|| {
                    assert_eq!(device.swap(0, Ordering::Relaxed), 1, "unmapped once");
                    given_back.store(true, Ordering::Relaxed);
                })
            })
        };
        let taken_back = token.take_back();
        if !taken_back {
            // The manager maps the address again: nothing may be mapped there any more.
            assert_eq!(device.load(Ordering::Relaxed), 0, "mapped over an unmap");
            assert!(
                given_back.load(Ordering::Relaxed),
                "the budget is back first"
            );
            device.store(1, Ordering::Relaxed);
        }
        let unmapped = queue.join().unwrap();
        assert_ne!(taken_back, unmapped, "exactly one side wins");
        assert_eq!(
            device.load(Ordering::Relaxed),
            1,
            "mapped at the end, by one side"
        );
    });
}
