//! Model-based property test of the drop queue: random push / flush / poll / drain sequences, with
//! fence waits that succeed, fail with an unknown outcome, fail over work that ran, or poison,
//! checked after every step against a plain model of the two batches.

use crate::drop_queue::{DropItem, DropPolicy, DropQueue};
use crate::error::Fault;
use crate::memory::{Handle, Issuer, Location, ReturnQueue, Returned};
use crate::test_shim::TestShim;
use alloc::sync::Arc;
use alloc::vec::Vec;
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Push,
    Flush(Option<Fault>),
    Poll,
    Drain,
}

fn op() -> impl Strategy<Value = Op> {
    let wait = prop_oneof![
        6 => Just(None),
        1 => Just(Some(Fault::Failed)),
        1 => Just(Some(Fault::WorkFailed)),
        1 => Just(Some(Fault::Poisoning)),
    ];
    prop_oneof![
        5 => Just(Op::Push),
        3 => wait.prop_map(Op::Flush),
        1 => Just(Op::Poll),
        1 => Just(Op::Drain),
    ]
}

/// The model: ids staged, ids pending (with whether a fence covers them), ids released, ids
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
    fn settle(&mut self, fault: Option<Fault>) {
        let batch = core::mem::take(&mut self.pending);
        match fault {
            Some(Fault::Failed) => self.leaked.extend(batch),
            _ => self.released.extend(batch),
        }
    }

    fn flush(&mut self, fault: Option<Fault>) -> bool {
        if self.staged.is_empty() && self.pending.is_empty() {
            return true;
        }
        if !self.pending.is_empty() {
            if !self.fenced {
                self.records += 1;
            }
            self.waits += 1;
            self.settle(fault);
            if fault.is_some() {
                self.fenced = false;
                return false;
            }
        }
        self.fenced = false;
        self.pending = core::mem::take(&mut self.staged);
        if !self.pending.is_empty() {
            self.records += 1;
            self.fenced = true;
        }
        true
    }
}

/// A binding whose release shows up in `returns` with its id.
fn tracked(id: u64, returns: &Arc<ReturnQueue>) -> DropItem<TestShim> {
    let h = Handle::new(
        id,
        Issuer {
            device: 1,
            stream: 0,
        },
        1,
        returns,
    );
    h.set_location(
        Some(Location {
            pool: 0,
            block: id as u32,
        }),
        false,
    );
    DropItem::Binding(h.binding())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn the_queue_matches_the_model(ops in proptest::collection::vec(op(), 1..80)) {
        let shim = TestShim::new(1 << 30, 32, 1 << 28);
        let returns = Arc::new(ReturnQueue::default());
        let mut q = DropQueue::<TestShim>::new(DropPolicy { max_items: 4, max_bytes: 1 << 20 });
        let mut m = Model::default();
        let mut next = 0u64;
        for op in &ops {
            match op {
                Op::Push => {
                    next += 1;
                    q.push(tracked(next, &returns));
                    m.staged.push(next);
                    prop_assert_eq!(q.should_flush(), m.staged.len() >= 4);
                }
                Op::Flush(fault) => {
                    shim.fail_next_wait.set(*fault);
                    let ok = q.flush(&shim, &()).is_ok();
                    prop_assert_eq!(ok, m.flush(*fault));
                    shim.fail_next_wait.set(None);
                }
                Op::Poll => {
                    // The test shim's events complete at once: a poll releases what is pending.
                    let done = q.poll(&shim).unwrap();
                    if m.fenced {
                        m.settle(None);
                        m.fenced = false;
                    }
                    prop_assert_eq!(done, m.pending.is_empty());
                }
                Op::Drain => {
                    q.drain(&shim, &()).unwrap();
                    m.flush(None);
                    m.flush(None);
                    prop_assert!(m.staged.is_empty() && m.pending.is_empty());
                }
            }
            let mut out: Vec<Returned> = Vec::new();
            returns.drain_into(&mut out);
            let mut released: Vec<u64> = out.iter().map(|r| r.id).collect();
            released.sort_unstable();
            let mut expected = m.released.clone();
            expected.sort_unstable();
            prop_assert_eq!(released, expected, "released ids after {:?}", op);
            m.released.clear();
            prop_assert_eq!((q.staged_len(), q.pending_len()), (m.staged.len(), m.pending.len()));
            prop_assert_eq!(shim.events_waited.get(), m.waits);
            prop_assert_eq!(shim.events_recorded.get(), m.records);
            prop_assert_eq!(q.stats().items_leaked, m.leaked.len() as u64);
        }
        // Whatever is left is leaked on purpose when the queue drops (no fence covered it).
        let left = m.staged.len() + m.pending.len();
        drop(q);
        let mut out: Vec<Returned> = Vec::new();
        returns.drain_into(&mut out);
        prop_assert!(out.is_empty(), "{} items freed without a fence ({} left)", out.len(), left);
    }
}
