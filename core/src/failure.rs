//! Failures follow the data: which bytes of which allocation failed work left unwritten, and why.
//!
//! Owns the device-wide failure records and the byte-range marks per allocation. A read returns
//! bytes only if every byte was last written by work that succeeded; otherwise the failure that
//! explains why, with the chain of launches it was carried through. Marks go when memory is
//! rewritten or released, and a record goes with its last mark, so the records never outgrow the
//! live memory. Does not decide what failed (the command does).

use crate::error::ServerError;
use alloc::boxed::Box;
use alloc::vec::Vec;
use hashbrown::HashMap;

/// The newest skipped launches a record keeps (older ones are counted in `skipped_total`).
const CHAIN_LIMIT: usize = 16;

#[derive(Debug)]
struct Record {
    root: ServerError,
    /// Allocations holding at least one range of this failure.
    tagged: u32,
    /// The newest skipped launches, oldest first: a fixed ring, so a long chain of skipped
    /// launches costs no allocation.
    chain: heapless::Deque<&'static str, CHAIN_LIMIT>,
    skipped_total: u64,
}

/// Disjoint, sorted byte ranges of one allocation and the failure each carries.
type Marks = Vec<(u64, u64, u64)>;

/// The failure records of one device.
#[derive(Debug, Default)]
pub struct Failures {
    records: HashMap<u64, Record>,
    marks: HashMap<u64, Marks>,
    next: u64,
}

impl Failures {
    /// Whether no failure is recorded (the fast path of every check).
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Number of failure records and of allocations with marks.
    pub fn len(&self) -> (usize, usize) {
        (self.records.len(), self.marks.len())
    }

    /// A new failure with `root` as its cause; it lives while some range carries it.
    pub fn new_failure(&mut self, root: ServerError) -> u64 {
        self.next += 1;
        let id = self.next;
        self.records.insert(
            id,
            Record {
                root,
                tagged: 0,
                chain: heapless::Deque::new(),
                skipped_total: 0,
            },
        );
        id
    }

    /// Records that `kernel` was skipped because of `failure`.
    pub fn skipped(&mut self, failure: u64, kernel: &'static str) {
        if let Some(r) = self.records.get_mut(&failure) {
            if r.chain.is_full() {
                r.chain.pop_front();
            }
            // Room was made just above.
            let _ = r.chain.push_back(kernel);
            r.skipped_total = r.skipped_total.saturating_add(1);
        }
    }

    /// Marks `start..end` of allocation `alloc` as left unwritten by `failure` (replacing any
    /// other claim on those bytes).
    pub fn mark(&mut self, alloc: u64, start: u64, end: u64, failure: u64) {
        let Some(r) = self.records.get_mut(&failure) else {
            return;
        };
        if start >= end {
            return;
        }
        // Held while the range is cleared: the range may carry this very failure (work that
        // reads and writes it in place was skipped), and clearing its last mark would drop the
        // record before the new mark lands.
        r.tagged += 1;
        self.clear_range(alloc, start, end);
        let marks = self.marks.entry(alloc).or_default();
        let had = marks.iter().any(|m| m.2 == failure);
        let at = marks.partition_point(|m| m.0 < start);
        marks.insert(at, (start, end, failure));
        if had {
            // The allocation was counted already: the hold goes.
            self.untag(failure);
        }
    }

    /// `start..end` of `alloc` was written by work that succeeded: its marks go.
    pub fn written(&mut self, alloc: u64, start: u64, end: u64) {
        if !self.marks.is_empty() {
            self.clear_range(alloc, start, end);
        }
    }

    /// `alloc` was released or rebound: every mark on it goes.
    pub fn forget(&mut self, alloc: u64) {
        if let Some(marks) = self.marks.remove(&alloc) {
            for id in distinct(marks.iter().map(|m| m.2)) {
                self.untag(id);
            }
        }
    }

    /// The memory of allocation `from` now belongs to allocation `to` (a bind handed it over):
    /// its marks follow the bytes, and `to`'s own marks (of memory it let go) are gone.
    pub fn hand_over(&mut self, from: u64, to: u64) {
        self.forget(to);
        if let Some(marks) = self.marks.remove(&from) {
            self.marks.insert(to, marks);
        }
    }

    /// The failure carried by any byte of `start..end` of `alloc`.
    pub fn failure(&self, alloc: u64, start: u64, end: u64) -> Option<u64> {
        let marks = self.marks.get(&alloc)?;
        marks
            .iter()
            .find(|m| m.0 < end && start < m.1 && start < end)
            .map(|m| m.2)
    }

    /// The error a read of `handle` meets because of `failure`.
    pub fn report(&self, failure: u64, handle: u64) -> ServerError {
        match self.records.get(&failure) {
            Some(r) => ServerError::Unwritten {
                failure,
                handle,
                chain: r.chain.iter().copied().collect(),
                skipped_total: r.skipped_total,
                root: Box::new(r.root.clone()),
            },
            None => ServerError::Skipped {
                kernel: "unknown",
                failure,
            },
        }
    }

    /// Drops a failure nothing carries (its work marked no byte).
    pub fn prune(&mut self, failure: u64) {
        if self.records.get(&failure).is_some_and(|r| r.tagged == 0) {
            self.records.remove(&failure);
        }
    }

    fn untag(&mut self, failure: u64) {
        if let Some(r) = self.records.get_mut(&failure) {
            r.tagged = r.tagged.saturating_sub(1);
            if r.tagged == 0 {
                self.records.remove(&failure);
            }
        }
    }

    fn clear_range(&mut self, alloc: u64, start: u64, end: u64) {
        let Some(marks) = self.marks.get_mut(&alloc) else {
            return;
        };
        let before: Vec<u64> = marks.iter().map(|m| m.2).collect();
        let mut kept: Marks = Vec::with_capacity(marks.len() + 1);
        for &(s, e, f) in marks.iter() {
            if e <= start || end <= s {
                kept.push((s, e, f));
                continue;
            }
            if s < start {
                kept.push((s, start, f));
            }
            if end < e {
                kept.push((end, e, f));
            }
        }
        *marks = kept;
        let after: Vec<u64> = marks.iter().map(|m| m.2).collect();
        if marks.is_empty() {
            self.marks.remove(&alloc);
        }
        for id in distinct(before.into_iter().filter(|id| !after.contains(id))) {
            self.untag(id);
        }
    }
}

/// The distinct ids of a short list, in first-seen order (a sort would cost kilobytes of code on
/// firmware for lists of a few entries).
fn distinct(ids: impl Iterator<Item = u64>) -> Vec<u64> {
    let mut out: Vec<u64> = Vec::new();
    for id in ids {
        if !out.contains(&id) {
            out.push(id);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Validation;

    fn root() -> ServerError {
        ServerError::Validation(Validation::ReadOnlyDestination)
    }

    #[test]
    fn a_mark_is_seen_only_where_it_lies() {
        let mut f = Failures::default();
        let id = f.new_failure(root());
        f.mark(1, 10, 20, id);
        assert_eq!(f.failure(1, 0, 10), None);
        assert_eq!(f.failure(1, 19, 30), Some(id));
        assert_eq!(f.failure(2, 10, 20), None);
        assert_eq!(
            f.failure(1, 15, 15),
            None,
            "an empty range overlaps nothing"
        );
    }

    #[test]
    fn rewriting_clears_and_the_record_goes_with_its_last_mark() {
        let mut f = Failures::default();
        let id = f.new_failure(root());
        f.mark(1, 0, 100, id);
        f.mark(2, 0, 100, id);
        f.written(1, 0, 50);
        assert_eq!(f.failure(1, 0, 50), None);
        assert_eq!(f.failure(1, 50, 100), Some(id));
        f.written(1, 40, 100);
        f.forget(2);
        assert!(f.is_empty());
        assert_eq!(f.len(), (0, 0));
    }

    #[test]
    fn a_new_mark_replaces_an_older_claim() {
        let mut f = Failures::default();
        let a = f.new_failure(root());
        let b = f.new_failure(root());
        f.mark(1, 0, 10, a);
        f.mark(1, 0, 10, b);
        assert_eq!(f.failure(1, 0, 10), Some(b));
        assert_eq!(f.len().0, 1, "a, claiming nothing, is gone");
    }

    #[test]
    fn marking_a_range_with_the_failure_it_carries_keeps_it() {
        // Work that reads and writes a range in place (a replay that reads and writes one
        // buffer, a GEMM updating C) is skipped because of the range's own failure, and marks it
        // again with that failure: the record must outlive the re-mark.
        let mut f = Failures::default();
        let id = f.new_failure(root());
        f.mark(1, 0, 10, id);
        f.mark(1, 0, 10, id);
        assert_eq!(f.failure(1, 0, 10), Some(id));
        f.mark(1, 2, 4, id);
        f.mark(2, 0, 4, id);
        assert_eq!(f.failure(1, 0, 10), Some(id));
        f.written(1, 0, 10);
        assert_eq!(f.len(), (1, 1), "allocation 2 still carries it");
        f.written(2, 0, 4);
        assert!(f.is_empty(), "the record went with its last mark");
    }

    #[test]
    fn the_report_carries_the_chain() {
        let mut f = Failures::default();
        let id = f.new_failure(root());
        f.mark(1, 0, 10, id);
        for _ in 0..20 {
            f.skipped(id, "relu");
        }
        match f.report(id, 1) {
            ServerError::Unwritten {
                chain,
                skipped_total,
                ..
            } => {
                assert_eq!((chain.len(), skipped_total), (16, 20));
            }
            other => panic!("{other:?}"),
        }
    }
}
