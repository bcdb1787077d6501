//! The window of an open recording: what it has collected so far.
//!
//! Owns the allocations the recorded work touched (one binding each, which keeps the allocation
//! alive for the graph), the byte ranges it reads from outside itself and the ranges it writes
//! (for the failure rule at each replay), the host bytes of recorded uploads, and the event that
//! marks where the stream stood when the recording began (other streams wait on it instead of on
//! recorded work). Does not decide what may be recorded (the operations do) nor seal anything
//! (`graph.rs`).

use crate::host::HostBuffer;
use crate::memory::{Binding, BindingRef};
use crate::shim::Shim;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::sync::atomic::AtomicBool;
use hashbrown::HashSet;

/// A byte range of an allocation: `start .. end` from the allocation's first byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Span {
    pub id: u64,
    pub start: u64,
    pub end: u64,
}

impl Span {
    fn covers(&self, other: &Span) -> bool {
        self.id == other.id && self.start <= other.start && other.end <= self.end
    }
}

/// What an open recording has collected.
pub(crate) struct Window<S: Shim> {
    /// The graph's name (named by failure chains and stream faults of its replays).
    pub name: &'static str,
    /// The stream's cursor when the recording began: commands after it are recorded, not run.
    pub began_at: u64,
    /// An event recorded on the stream just before the recording began: other streams wait on
    /// it for the stream's earlier work (an event recorded now would lie inside the recording).
    /// `None` when the stream had nothing to wait for.
    pub pre_event: Option<S::Event>,
    /// Set when the caller dropped the [`Recording`](super::Recording).
    pub abandoned: Arc<AtomicBool>,
    /// One binding per allocation the recorded work touched, in first-touch order.
    pub touched: Vec<Binding>,
    ids: HashSet<u64>,
    /// Ranges the recording reads that it did not write before.
    pub reads: Vec<Span>,
    /// Ranges the recording writes.
    pub writes: Vec<Span>,
    /// Host bytes recorded uploads read: the graph owns them.
    pub host: Vec<HostBuffer>,
}

impl<S: Shim> core::fmt::Debug for Window<S> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Window")
            .field("name", &self.name)
            .field("began_at", &self.began_at)
            .field("touched", &self.touched.len())
            .field("reads", &self.reads.len())
            .field("writes", &self.writes.len())
            .field("host", &self.host.len())
            .finish_non_exhaustive()
    }
}

impl<S: Shim> Window<S> {
    pub fn new(
        name: &'static str,
        began_at: u64,
        pre_event: Option<S::Event>,
        abandoned: Arc<AtomicBool>,
    ) -> Self {
        Self {
            name,
            began_at,
            pre_event,
            abandoned,
            touched: Vec::new(),
            ids: HashSet::new(),
            reads: Vec::new(),
            writes: Vec::new(),
            host: Vec::new(),
        }
    }

    /// Whether recorded work touched the allocation `id`.
    pub fn touches(&self, id: u64) -> bool {
        self.ids.contains(&id)
    }

    /// Recorded work uses the allocation `binding` names: the graph keeps it.
    pub fn touch(&mut self, binding: BindingRef<'_>) {
        if self.ids.insert(binding.id()) {
            self.touched.push(binding.to_binding());
        }
    }

    /// Recorded work reads `span`: an input of the graph where the recording did not write it
    /// first (the parts no earlier write covers, however many writes cover the rest: a graph
    /// that rewrites a buffer piece by piece before reading it whole takes nothing from it).
    pub fn read(&mut self, span: Span) {
        if span.start >= span.end {
            return;
        }
        let meets = |w: &&Span| w.id == span.id && w.start < span.end && span.start < w.end;
        if !self.writes.iter().any(|w| meets(&w)) {
            self.reads.push(span);
            return;
        }
        if self.writes.iter().any(|w| w.covers(&span)) {
            return;
        }
        // Walk the span: past every write covering the point reached, else up to the next
        // write's start, a part no write covers. No sort (a firmware would pay for its code):
        // each step moves past a write's end or start, so a span met by n of the recording's W
        // writes takes at most 2n + 1 steps, each a pass over the W.
        let mut at = span.start;
        while at < span.end {
            let meeting = self.writes.iter().filter(meets);
            if let Some(end) = meeting
                .filter(|w| w.start <= at && at < w.end)
                .map(|w| w.end)
                .max()
            {
                at = end;
                continue;
            }
            let next = self
                .writes
                .iter()
                .filter(meets)
                .map(|w| w.start)
                .filter(|&s| s > at)
                .min()
                .map_or(span.end, |s| s.min(span.end));
            self.reads.push(Span {
                id: span.id,
                start: at,
                end: next,
            });
            at = next;
        }
    }

    /// Recorded work writes `span`.
    pub fn write(&mut self, span: Span) {
        if span.start < span.end {
            self.writes.push(span);
        }
    }

    /// The host bytes of a recorded upload: kept as long as the graph.
    pub fn retain(&mut self, bytes: HostBuffer) {
        self.host.push(bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_shim::TestShim;

    #[test]
    fn a_read_of_bytes_the_recording_wrote_first_is_no_input() {
        let mut w = Window::<TestShim>::new("g", 0, None, Arc::default());
        let span = |id, start, end| Span { id, start, end };
        w.read(span(1, 0, 8));
        w.write(span(2, 0, 16));
        w.read(span(2, 4, 8));
        w.read(span(2, 8, 24));
        w.read(span(3, 0, 0));
        assert_eq!(w.reads, [span(1, 0, 8), span(2, 16, 24)]);
        assert_eq!(w.writes, [span(2, 0, 16)]);
    }

    #[test]
    fn writes_that_cover_a_read_together_leave_only_its_uncovered_parts() {
        let mut w = Window::<TestShim>::new("g", 0, None, Arc::default());
        let span = |id, start, end| Span { id, start, end };
        w.write(span(2, 8, 16));
        w.write(span(2, 0, 8));
        w.write(span(2, 20, 24));
        w.read(span(2, 0, 16));
        assert!(w.reads.is_empty(), "two writes cover it: {:?}", w.reads);
        w.read(span(2, 4, 30));
        w.read(span(1, 0, 16));
        assert_eq!(w.reads, [span(2, 16, 20), span(2, 24, 30), span(1, 0, 16)]);
    }

    /// Against a byte model: after random writes, a read's inputs are exactly the bytes no
    /// write covered, as maximal runs in order (a small generator, many windows).
    #[test]
    fn a_reads_inputs_are_the_bytes_no_write_covered() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let rounds = if cfg!(miri) { 20 } else { 2000 };
        for _ in 0..rounds {
            let mut w = Window::<TestShim>::new("g", 0, None, Arc::default());
            // Another allocation's write over the same offsets: never counted.
            w.write(Span {
                id: 8,
                start: 0,
                end: 32,
            });
            let mut written = [false; 32];
            for _ in 0..next(6) {
                let (a, b) = (next(32), next(33));
                w.write(Span {
                    id: 7,
                    start: a,
                    end: b,
                });
                (a..b.max(a)).for_each(|i| written[i as usize] = true);
            }
            let (start, end) = (next(32), next(33));
            w.read(Span { id: 7, start, end });
            let mut expected = Vec::new();
            let mut i = start;
            while i < end {
                if written[i as usize] {
                    i += 1;
                    continue;
                }
                let from = i;
                while i < end && !written[i as usize] {
                    i += 1;
                }
                expected.push(Span {
                    id: 7,
                    start: from,
                    end: i,
                });
            }
            assert_eq!(
                w.reads, expected,
                "writes {:?}, read {start}..{end}",
                w.writes
            );
        }
    }
}
