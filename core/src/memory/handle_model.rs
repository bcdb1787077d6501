//! Model-based property test of handles, bindings and the return queue: random sequences of
//! reservations, clones, bindings, drops (on this thread or on another one) and collections
//! against a plain model of who holds what. After every step each live handle and binding
//! resolves to its allocation's first range, and no two live allocations share a byte; after a
//! collection exactly the allocations whose last reference went are freed (the manager's freed
//! ids, once each; a collection that drops the ids frees them all the same), the report counts
//! the live ones, and a new reservation never reuses an id.
//! The manager keeps two spare identities, so both recycled and freed identities are exercised.
//! Cases: `DEVCMD_PROPTEST_CASES` (default 500; under miri, as the CI sets it).

use crate::attention::Attention;
use crate::memory::{
    Binding, Cleanup, Handle, Issuer, MemoryBudget, MemoryConfig, MemoryManager, PageUpdate,
};
use crate::test_shim::TestShim;
use alloc::collections::{BTreeMap, BTreeSet};
use alloc::sync::Arc;
use alloc::vec::Vec;
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Reserve(u64),
    Clone(usize),
    Bind(usize),
    Drop(usize),
    DropElsewhere(usize),
    Collect,
    /// A collection whose ids nothing needs (the device with no failure or cross-stream record).
    CollectDropping,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1u64..=96 << 10).prop_map(Op::Reserve),
        2 => any::<usize>().prop_map(Op::Clone),
        2 => any::<usize>().prop_map(Op::Bind),
        4 => any::<usize>().prop_map(Op::Drop),
        1 => any::<usize>().prop_map(Op::DropElsewhere),
        2 => Just(Op::Collect),
        1 => Just(Op::CollectDropping),
    ]
}

/// What the test holds: a user handle or a binding.
enum Held {
    Handle(Handle),
    Binding(Binding),
}

impl Held {
    fn id(&self) -> u64 {
        match self {
            Self::Handle(h) => h.id(),
            Self::Binding(b) => b.id(),
        }
    }
}

fn cases() -> u32 {
    std::env::var("DEVCMD_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(500)
}

/// Runs `ops` and checks the manager against the model after each one.
fn run(ops: &[Op]) {
    let shim = TestShim::new(1 << 32, 256, 1 << 30);
    let config = MemoryConfig {
        spare_identities: 2,
        ..MemoryConfig::default()
    };
    let issuer = Issuer {
        device: 1,
        stream: 0,
    };
    let attention = Arc::new(Attention::default());
    let mut mm = MemoryManager::tracked(
        &shim.facts,
        config,
        issuer,
        MemoryBudget::new(None),
        attention,
    );
    // SAFETY: the test shim runs no device work.
    unsafe { mm.release_pages_immediately() };
    // The model: references held per live allocation, each allocation's range, what must be
    // freed at the next collection, and every id ever freed.
    let mut held: Vec<Held> = Vec::new();
    let mut refs: BTreeMap<u64, usize> = BTreeMap::new();
    let mut ranges: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    let mut due: BTreeSet<u64> = BTreeSet::new();
    let mut ever_freed: BTreeSet<u64> = BTreeSet::new();
    let mut last_id: Option<u64> = None;
    let mut freed = Vec::new();
    for op in ops {
        let pick = |i: &usize, n: usize| (n > 0).then(|| i % n);
        match op {
            Op::Reserve(size) => {
                let h = mm.reserve(&shim, *size, PageUpdate::Allow).expect("room");
                assert!(last_id.is_none_or(|l| h.id() > l), "ids are never reused");
                last_id = Some(h.id());
                let r = mm.resolve(&h).expect("a new handle resolves");
                ranges.insert(h.id(), (r.addr.0, r.len));
                refs.insert(h.id(), 1);
                held.push(Held::Handle(h));
            }
            Op::Clone(i) => {
                if let Some(k) = pick(i, held.len())
                    && let Held::Handle(h) = &held[k]
                {
                    *refs.get_mut(&h.id()).expect("live") += 1;
                    let c = h.clone();
                    held.push(Held::Handle(c));
                }
            }
            Op::Bind(i) => {
                if let Some(k) = pick(i, held.len()) {
                    let b = match &held[k] {
                        Held::Handle(h) => h.binding(),
                        Held::Binding(b) => b.clone(),
                    };
                    *refs.get_mut(&b.id()).expect("live") += 1;
                    held.push(Held::Binding(b));
                }
            }
            Op::Drop(i) | Op::DropElsewhere(i) => {
                if let Some(k) = pick(i, held.len()) {
                    let gone = held.swap_remove(k);
                    let id = gone.id();
                    if matches!(op, Op::DropElsewhere(_)) {
                        std::thread::spawn(move || drop(gone))
                            .join()
                            .expect("the drop on another thread");
                    } else {
                        drop(gone);
                    }
                    let n = refs.get_mut(&id).expect("live");
                    *n -= 1;
                    if *n == 0 {
                        refs.remove(&id);
                        ranges.remove(&id);
                        due.insert(id);
                    }
                }
            }
            Op::Collect => {
                mm.cleanup(&shim, Cleanup::Periodic);
                freed.clear();
                mm.take_freed(&mut freed);
                let got: BTreeSet<u64> = freed.iter().copied().collect();
                assert_eq!(got.len(), freed.len(), "an id freed twice: {freed:?}");
                assert_eq!(got, due, "freed at this collection");
                assert!(
                    got.is_disjoint(&ever_freed),
                    "an allocation freed again: {got:?}"
                );
                ever_freed.extend(core::mem::take(&mut due));
                assert_eq!(
                    mm.report().device().allocations,
                    refs.len() as u64,
                    "the report counts the live allocations"
                );
            }
            Op::CollectDropping => {
                mm.drop_freed();
                assert!(!mm.has_freed(), "the ids recorded are dropped");
                ever_freed.extend(core::mem::take(&mut due));
                assert_eq!(
                    mm.report().device().allocations,
                    refs.len() as u64,
                    "what came back is freed all the same"
                );
            }
        }
        // Every live reference resolves to its allocation's range; live ranges are disjoint.
        for h in &held {
            let r = match h {
                Held::Handle(h) => mm.resolve(h),
                Held::Binding(b) => mm.resolve(b),
            }
            .expect("a live reference resolves");
            assert_eq!(Some(&(r.addr.0, r.len)), ranges.get(&h.id()), "{}", h.id());
        }
        let mut spans: Vec<(u64, u64)> = ranges.values().copied().collect();
        spans.sort_unstable();
        for w in spans.windows(2) {
            assert!(w[0].0 + w[0].1 <= w[1].0, "live allocations overlap: {w:?}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn handles_bindings_and_returns_follow_the_model(
        ops in proptest::collection::vec(op(), 1..60)
    ) {
        run(&ops);
    }
}
