//! Unit tests of the drop queue: thresholds, the two batches, polls, failed waits.

use super::*;
use crate::error::Fault;
use crate::test_shim::TestShim;

fn setup() -> (TestShim, DropQueue<TestShim>) {
    (
        TestShim::new(1 << 30, 32, 1 << 28),
        DropQueue::new(DropPolicy::default(), Default::default()),
    )
}

fn item(len: usize) -> DropItem<TestShim> {
    DropItem::Host(HostBuffer::zeroed(len))
}

#[test]
fn thresholds_trigger_whichever_comes_first() {
    let mut q = DropQueue::<TestShim>::new(
        DropPolicy {
            max_items: 4,
            max_bytes: 100,
            fill_released: None,
        },
        Default::default(),
    );
    assert!(!q.should_flush());
    for _ in 0..3 {
        q.push(item(1));
    }
    assert!(!q.should_flush());
    q.push(item(1));
    assert!(q.should_flush(), "count");
    let mut q = DropQueue::<TestShim>::new(
        DropPolicy {
            max_items: 4,
            max_bytes: 100,
            fill_released: None,
        },
        Default::default(),
    );
    q.push(item(101));
    assert!(q.should_flush(), "size");
    let mut q = DropQueue::<TestShim>::new(
        DropPolicy {
            max_items: 4,
            max_bytes: 100,
            fill_released: None,
        },
        Default::default(),
    );
    q.push(item(60));
    q.push(item(60));
    assert!(q.should_flush(), "both, size first");
}

#[test]
fn counters_saturate() {
    let mut q = DropQueue::<TestShim>::new(
        DropPolicy {
            max_items: u64::MAX,
            max_bytes: u64::MAX,
            fill_released: None,
        },
        Default::default(),
    );
    q.staged_items = u64::MAX;
    q.staged_bytes = u64::MAX - 1;
    q.push(item(8));
    assert_eq!((q.staged_items, q.staged_bytes), (u64::MAX, u64::MAX));
    assert!(q.should_flush());
}

#[test]
fn the_first_flush_waits_for_nothing_and_each_later_one_for_one_fence() {
    let (shim, mut q) = setup();
    q.push(item(1));
    q.flush(&shim, &(), FenceMark::default());
    assert_eq!(shim.events_waited.get(), 0);
    q.push(item(1));
    q.flush(&shim, &(), FenceMark::default());
    assert_eq!(shim.events_waited.get(), 1);
    for _ in 0..8 {
        q.push(item(1));
        q.flush(&shim, &(), FenceMark::default());
    }
    assert_eq!(shim.events_waited.get(), 9, "n - 1 waits after n flushes");
}

#[test]
fn flushing_moves_staged_to_pending_and_replaces_pending() {
    let (shim, mut q) = setup();
    for _ in 0..5 {
        q.push(item(1));
    }
    assert!(q.should_flush() || q.staged_len() == 5);
    q.flush(&shim, &(), FenceMark::default());
    assert_eq!((q.staged_len(), q.pending_len()), (0, 5));
    assert!(!q.should_flush(), "counters reset");
    q.push(item(1));
    q.flush(&shim, &(), FenceMark::default());
    assert_eq!(q.pending_len(), 1);
    assert_eq!(q.stats().items_released, 5);
}

#[test]
fn an_empty_flush_records_no_fence() {
    let (shim, mut q) = setup();
    for _ in 0..3 {
        q.flush(&shim, &(), FenceMark::default());
    }
    assert_eq!(shim.events_recorded.get(), 0);
    q.push(item(1));
    q.drain(&shim, &(), FenceMark::default());
    assert_eq!(q.pending_len(), 0);
    q.flush(&shim, &(), FenceMark::default());
    assert_eq!(
        shim.events_recorded.get(),
        1,
        "drained queue mints nothing more"
    );
}

#[test]
fn poll_releases_a_passed_fence_without_blocking() {
    let (shim, mut q) = setup();
    q.push(item(10));
    q.flush(&shim, &(), FenceMark::default());
    assert_eq!(
        q.poll(&shim, &(), FenceMark::default()).map(|f| f.outcome),
        Some(FenceOutcome::Passed)
    );
    assert_eq!(shim.events_waited.get(), 0);
    assert_eq!(q.stats().bytes_released, 10);
}

#[test]
fn polls_alone_release_what_was_staged() {
    let (shim, mut q) = setup();
    q.push(item(10));
    assert!(q.poll(&shim, &(), FenceMark::default()).is_some());
    assert_eq!(
        (q.staged_len(), q.pending_len(), shim.events_recorded.get()),
        (0, 1, 1),
        "a poll with nothing pending covers the staged batch with a fence"
    );
    assert_eq!(q.awaiting().host, 10);
    shim.busy.set(true);
    assert!(q.poll(&shim, &(), FenceMark::default()).is_none());
    assert_eq!(
        q.stats().items_released,
        0,
        "a busy device releases nothing"
    );
    shim.busy.set(false);
    q.push(item(5));
    assert!(q.poll(&shim, &(), FenceMark::default()).is_some());
    assert_eq!(q.stats().bytes_released, 10, "the first batch went");
    assert_eq!(q.pending_len(), 1, "the second is covered now");
    q.poll(&shim, &(), FenceMark::default());
    assert!(q.is_empty());
    assert_eq!(q.stats().bytes_released, 15);
    assert_eq!(shim.events_waited.get(), 0, "no poll blocked");
}

#[test]
fn a_failed_wait_leaks_unless_the_device_is_lost() {
    let (shim, mut q) = setup();
    q.push(item(1));
    q.flush(&shim, &(), FenceMark::default());
    shim.fail_next_wait.set(Some(Fault::Failed));
    assert_ne!(
        q.flush(&shim, &(), FenceMark::default()).outcome,
        FenceOutcome::Passed
    );
    assert_eq!((q.stats().items_leaked, q.stats().items_released), (1, 0));
    q.push(item(1));
    q.flush(&shim, &(), FenceMark::default());
    shim.fail_next_wait.set(Some(Fault::DeviceLost));
    assert_ne!(
        q.flush(&shim, &(), FenceMark::default()).outcome,
        FenceOutcome::Passed
    );
    assert_eq!(q.stats().items_released, 1, "lost: released");
}

#[test]
fn a_refused_wait_keeps_the_fence_and_its_batch_for_the_next_flush() {
    let (shim, mut q) = setup();
    q.push(item(3));
    q.flush(&shim, &(), FenceMark::default());
    q.push(item(5));
    let recorded = shim.events_recorded.get();
    shim.fail_next_wait.set(Some(Fault::Busy));
    let refused = q.flush(&shim, &(), FenceMark::default()).outcome;
    assert!(matches!(refused, FenceOutcome::Refused(e) if e.fault == Fault::Busy));
    assert_eq!(
        (q.pending_len(), q.staged_len()),
        (1, 1),
        "nothing moved: the pending batch waits under its fence, the staged one behind it"
    );
    assert_eq!(shim.events_recorded.get(), recorded, "no new fence");
    assert_eq!((q.stats().items_leaked, q.stats().items_released), (0, 0));
    // A refused query is "not yet", and so is a query that reports failed work whose
    // confirming wait is refused.
    shim.fail_next_query.set(Some(Fault::Busy));
    assert!(q.poll(&shim, &(), FenceMark::default()).is_none());
    shim.fail_next_query.set(Some(Fault::WorkFailed));
    shim.fail_next_wait.set(Some(Fault::Busy));
    assert!(q.poll(&shim, &(), FenceMark::default()).is_none());
    assert_eq!((q.pending_len(), q.stats().items_leaked), (1, 0));
    // Once the shim takes waits again, the same fence is waited for and its batch released.
    let waited = shim.events_waited.get();
    assert_eq!(
        q.flush(&shim, &(), FenceMark::default()).outcome,
        FenceOutcome::Passed
    );
    assert_eq!(shim.events_waited.get(), waited + 1);
    assert_eq!(
        shim.events_recorded.get(),
        recorded + 1,
        "one fence, for the staged item"
    );
    assert_eq!((q.stats().items_released, q.stats().bytes_released), (1, 3));
    assert_eq!(q.stats().items_leaked, 0);
}

#[test]
fn a_poll_hands_back_the_mark_of_the_fence_it_settled() {
    let (shim, mut q) = setup();
    q.push(item(8));
    let at = |cursor| FenceMark {
        cursor,
        kernel: None,
    };
    q.flush(&shim, &(), at(5));
    // Something staged since: the poll settles the fence of cursor 5 and covers the new item.
    q.push(item(8));
    let settled = q.poll(&shim, &(), at(6)).expect("a fence was pending");
    assert_eq!(settled.outcome, FenceOutcome::Passed);
    assert_eq!(
        settled.mark.cursor, 5,
        "the ledger learns that the work up to cursor 5 completed clean"
    );
}
