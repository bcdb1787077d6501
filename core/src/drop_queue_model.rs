//! Model-based property test of the drop queue: random push / flush / poll / drain sequences,
//! with fence records, waits and queries that succeed, fail with an unknown outcome, fail over
//! work that ran, lose the device or are refused for now, checked after every step against a
//! plain model of the queue's two batches: an item is released at the second flush after its
//! push once that flush's wait succeeds (or reports failed work, or a lost device); a wait of
//! unknown outcome leaks the batch; a refused wait keeps the batch and its fence for a later
//! flush; nothing is released by a poll that finds the device busy (or whose query is
//! refused), and a
//! poll that finds nothing pending covers the staged batch with a fence; whatever no fence covered is leaked
//! when the queue drops. Cases: `DEVCMD_PROPTEST_CASES` (default 2000, 8 under miri).

use crate::drop_queue::{DropItem, DropPolicy, DropQueue};
use crate::error::Fault;
use crate::fault::{FenceMark, FenceOutcome};
use crate::memory::pool::{Pool, Size};
use crate::memory::{Handle, Issuer, Location, Placed, ReturnQueue, Returned};
use crate::test_shim::TestShim;
use alloc::sync::Arc;
use alloc::vec::Vec;
use proptest::prelude::*;

#[derive(Debug, Clone, Copy)]
struct Faults {
    record: Option<Fault>,
    wait: Option<Fault>,
}

#[derive(Debug, Clone)]
enum Op {
    Push,
    Flush(Faults),
    /// `wait`: the fault of the wait that confirms a query's report of failed work.
    Poll {
        busy: bool,
        query: Option<Fault>,
        wait: Option<Fault>,
    },
    Drain(Faults),
}

fn fault() -> impl Strategy<Value = Option<Fault>> {
    prop_oneof![
        12 => Just(None),
        1 => Just(Some(Fault::Failed)),
        1 => Just(Some(Fault::WorkFailed)),
        1 => Just(Some(Fault::DeviceLost)),
        1 => Just(Some(Fault::Busy)),
    ]
}

fn faults() -> impl Strategy<Value = Faults> {
    (fault(), fault()).prop_map(|(record, wait)| Faults { record, wait })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => Just(Op::Push),
        4 => faults().prop_map(Op::Flush),
        2 => (any::<bool>(), fault(), fault())
            .prop_map(|(busy, query, wait)| Op::Poll { busy, query, wait }),
        1 => faults().prop_map(Op::Drain),
    ]
}

/// The model: ids staged, ids pending (and whether a fence covers them), ids released and
/// leaked, and the device calls the queue should have made.
#[derive(Debug, Default)]
struct Model {
    staged: Vec<u64>,
    pending: Vec<u64>,
    fenced: bool,
    released: Vec<u64>,
    leaked: Vec<u64>,
    waits: u32,
    records: u32,
}

impl Model {
    /// What happens to the pending batch after a wait (or query) that ended with `fault`.
    fn release_pending(&mut self, fault: Option<Fault>) {
        let batch = core::mem::take(&mut self.pending);
        match fault {
            Some(Fault::Failed | Fault::OutOfMemory | Fault::TooBig | Fault::Unsupported) => {
                self.leaked.extend(batch)
            }
            _ => self.released.extend(batch),
        }
    }

    /// One record; the first of an operation may fail.
    fn record(&mut self, fault: &mut Option<Fault>) -> bool {
        self.records += 1;
        fault.take().is_none()
    }

    /// One flush; the faults armed for the operation hit its first record and first wait.
    fn flush(&mut self, f: &mut Faults) -> bool {
        if self.staged.is_empty() && self.pending.is_empty() {
            return true;
        }
        let mut ok = true;
        if !self.pending.is_empty() {
            if !self.fenced && !self.record(&mut f.record) {
                return false;
            }
            self.waits += 1;
            let wait = f.wait.take();
            if wait == Some(Fault::Busy) {
                // Refused for now: the batch keeps its fence for a later flush.
                self.fenced = true;
                return false;
            }
            self.release_pending(wait);
            match wait {
                None => {}
                Some(Fault::WorkFailed) => ok = false,
                Some(_) => {
                    self.fenced = false;
                    return false;
                }
            }
        }
        self.fenced = false;
        self.pending = core::mem::take(&mut self.staged);
        if self.pending.is_empty() {
            return ok;
        }
        if !self.record(&mut f.record) {
            return false;
        }
        self.fenced = true;
        ok
    }

    fn poll(&mut self, busy: bool, query: Option<Fault>, wait: Option<Fault>) -> Option<bool> {
        if !self.fenced && !self.pending.is_empty() {
            // A pending batch whose fence could not be recorded gets one now.
            self.records += 1;
            self.fenced = true;
        }
        let mut ok = true;
        if self.fenced {
            match query {
                Some(Fault::WorkFailed) => {
                    // The queue waits for the fence before it releases anything.
                    self.waits += 1;
                    match wait {
                        // The wait refused for now: "not yet", the fence stays.
                        Some(Fault::Busy) => return Some(false),
                        // A wait of unknown outcome: the batch is leaked.
                        Some(
                            f @ (Fault::Failed
                            | Fault::OutOfMemory
                            | Fault::TooBig
                            | Fault::Unsupported),
                        ) => {
                            self.fenced = false;
                            self.release_pending(Some(f));
                            return None;
                        }
                        // Lost: released, and nothing more is fenced.
                        Some(Fault::DeviceLost) => {
                            self.fenced = false;
                            self.release_pending(None);
                            return None;
                        }
                        None | Some(Fault::WorkFailed) => {
                            self.fenced = false;
                            self.release_pending(None);
                            ok = false;
                        }
                    }
                }
                // A refused query is "not yet", as a busy device's.
                Some(Fault::Busy) => return Some(false),
                Some(f) => {
                    self.fenced = false;
                    self.release_pending(Some(f));
                    return None;
                }
                None if busy => return Some(false),
                None => {
                    self.fenced = false;
                    self.release_pending(None);
                }
            }
        }
        // Nothing pending: the staged batch gets a fence, so a loop that only polls releases it.
        if self.pending.is_empty() && !self.staged.is_empty() {
            self.pending = core::mem::take(&mut self.staged);
            self.records += 1;
            self.fenced = true;
        }
        ok.then_some(true)
    }
}

/// A binding whose release shows up in `returns` with its id.
fn tracked(id: u64, returns: &Arc<ReturnQueue>) -> DropItem<TestShim> {
    let h = Handle::new(id, 1, returns);
    h.set_location(
        Some(Placed {
            location: Location {
                pool: Pool::Pages(Size::Small),
                block: id as u32,
            },
            addr: 0,
        }),
        false,
    );
    DropItem::Binding(h.binding())
}

fn arm(shim: &TestShim, f: Faults) {
    shim.fail_next_record.set(f.record);
    shim.fail_next_wait.set(f.wait);
}

fn disarm(shim: &TestShim) {
    shim.fail_next_record.set(None);
    shim.fail_next_wait.set(None);
    shim.fail_next_query.set(None);
    shim.busy.set(false);
}

/// Cases: `DEVCMD_PROPTEST_CASES`, or 2000 (8 under miri).
fn cases() -> u32 {
    std::env::var("DEVCMD_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if cfg!(miri) { 8 } else { 2000 })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn the_queue_matches_the_model(ops in proptest::collection::vec(op(), 1..80)) {
        let shim = TestShim::new(1 << 30, 32, 1 << 28);
        let returns = Arc::new(ReturnQueue::issued_by(Issuer { device: 1, stream: 0 }, None));
        let mut q = DropQueue::<TestShim>::new(DropPolicy { max_items: 4, max_bytes: 1 << 20, fill_released: None }, Default::default());
        let mut m = Model::default();
        let mut next = 0u64;
        for op in &ops {
            match *op {
                Op::Push => {
                    next += 1;
                    q.push(tracked(next, &returns));
                    m.staged.push(next);
                    prop_assert_eq!(q.should_flush(), m.staged.len() >= 4);
                }
                Op::Flush(f) => {
                    arm(&shim, f);
                    prop_assert_eq!(q.flush(&shim, &(), FenceMark::default()).outcome == FenceOutcome::Passed, m.flush(&mut f.clone()), "flush {:?}", f);
                }
                Op::Poll { busy, query, wait } => {
                    shim.busy.set(busy);
                    shim.fail_next_query.set(query);
                    shim.fail_next_wait.set(wait);
                    shim.fail_next_record.set(None);
                    let polled = match q.poll(&shim, &(), FenceMark::default()).map(|f| f.outcome) {
                        None => Some(false),
                        Some(FenceOutcome::Passed) => Some(true),
                        Some(_) => None,
                    };
                    prop_assert_eq!(polled, m.poll(busy, query, wait), "poll");
                }
                Op::Drain(f) => {
                    arm(&shim, f);
                    let mut armed = f;
                    let first = m.flush(&mut armed);
                    let second = m.flush(&mut armed);
                    prop_assert_eq!(q.drain(&shim, &(), FenceMark::default()).outcome == FenceOutcome::Passed, first && second, "drain {:?}", f);
                }
            }
            disarm(&shim);
            let mut out: Vec<Returned> = Vec::new();
            returns.drain_into(&mut out);
            let mut released: Vec<u64> = out.iter().map(|r| r.id).collect();
            released.sort_unstable();
            let mut expected = core::mem::take(&mut m.released);
            expected.sort_unstable();
            prop_assert_eq!(released, expected, "released ids after {:?}", op);
            prop_assert_eq!((q.staged_len(), q.pending_len()), (m.staged.len(), m.pending.len()));
            prop_assert_eq!(shim.events_waited.get(), m.waits, "waits after {:?}", op);
            prop_assert_eq!(shim.events_recorded.get(), m.records, "records after {:?}", op);
            prop_assert_eq!(q.stats().items_leaked, m.leaked.len() as u64);
        }
        // Whatever is left was never covered by a fence that passed: the queue leaks it.
        drop(q);
        let mut out: Vec<Returned> = Vec::new();
        returns.drain_into(&mut out);
        prop_assert!(out.is_empty(), "{} items freed without a fence", out.len());
    }
}
