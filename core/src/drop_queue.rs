//! The drop queue: host buffers, bindings and pages the device may still use, released only once
//! a fence says it is done with them.
//!
//! Owns two batches: *staged* (no fence yet) and *pending* (covered by one fence). A flush waits
//! for the pending batch's fence (recorded one flush earlier, so usually passed), releases it,
//! makes staged the new pending batch and records one fence for it. Does not decide when to flush
//! (the command does, by [`DropQueue::should_flush`] and the staging rules) and never flushes by
//! itself: no helper thread, everything is released by fences polled or waited.
//!
//! While a stream of the device records a graph the queue is *frozen*: a flush or a poll does
//! nothing (a host wait is illegal then, on any stream); the queue resumes when it ends.

use crate::capture::{Recorded, RecordingFlag};
use crate::fault::{FenceMark, FenceOutcome, Fenced};
use crate::host::HostBuffer;
use crate::memory::{Binding, Released, RetiredPage};
use crate::shim::Shim;
use alloc::vec::Vec;

/// When the staged batch asks to be flushed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct DropPolicy {
    /// Items staged.
    pub max_items: u64,
    /// Bytes staged.
    pub max_bytes: u64,
    /// A test aid: released host buffers (staging, pinned slices, the caller's uploads) are
    /// filled with this byte before they go, so a fence that passed too early shows up as wrong
    /// bytes rather than as a timing accident. `None` (the default) leaves them as they are.
    pub fill_released: Option<u8>,
}

impl Default for DropPolicy {
    fn default() -> Self {
        Self {
            max_items: 64,
            max_bytes: 64 << 20,
            fill_released: None,
        }
    }
}

/// Something the device may still use.
#[derive(Debug)]
pub enum DropItem<S: Shim> {
    /// A host buffer a copy reads or writes (staging, the caller's own, pinned slices).
    Host(HostBuffer),
    /// Device memory another stream's work uses: the owner must not reuse it before then.
    Binding(Binding),
    /// A device page, or a granule's memory, the manager let go.
    Page(RetiredPage<Released<S>>),
    /// A graph replayed on the stream: what it touches must outlive the replay.
    Graph(alloc::sync::Arc<Recorded<S>>),
}

impl<S: Shim> DropItem<S> {
    fn bytes(&self) -> u64 {
        match self {
            Self::Host(h) => h.len() as u64,
            Self::Binding(b) => b.len(),
            Self::Page(p) => p.bytes_on_the_way_out(),
            // Counted by the replays' number, not by what the graph holds: a graph's bytes are
            // not freed by its replays' fences.
            Self::Graph(_) => 0,
        }
    }

    fn release(self, shim: &S, fill: Option<u8>) {
        match self {
            // SAFETY: items are released only after the fence covering their last use passed
            // (or the device is lost and will touch nothing again).
            Self::Page(p) => unsafe { p.free(shim) },
            Self::Host(mut h) => {
                if let Some(byte) = fill {
                    // Read-only (external) bytes give an empty slice: they are the caller's.
                    h.as_mut_slice().fill(byte);
                }
                drop(h);
            }
            Self::Binding(b) => drop(b),
            Self::Graph(g) => drop(g),
        }
    }
}

/// Bytes a drop queue holds until a fence passes, by kind: the memory a host dropped that is
/// not free yet.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Awaiting {
    /// Device pages the stream's manager let go (counted in the device's `held`).
    pub pages: u64,
    /// Allocations the stream's own work used, kept from their owner's pools until the work is
    /// done (another stream's memory, or memory whose handle is dropped).
    pub bindings: u64,
    /// Host buffers copies read or write (staging, pinned slices, the caller's uploads).
    pub host: u64,
}

/// What the queue has done, for reports. Every counter saturates.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct DropStats {
    /// Fences recorded over a batch, by flushes and by polls.
    pub flushes: u64,
    /// Fences waited on (blocking).
    pub fences_waited: u64,
    /// Fences found passed by a non-blocking poll.
    pub fences_polled: u64,
    /// Items released.
    pub items_released: u64,
    /// Bytes released.
    pub bytes_released: u64,
    /// Items leaked on purpose after an inconclusive fence.
    pub items_leaked: u64,
}

/// The two-batch drop queue of one stream. Laid out in the order of its fields: what
/// [`Self::should_flush`] reads after every operation comes first, in one cache line.
#[derive(Debug)]
#[repr(C)]
pub struct DropQueue<S: Shim> {
    policy: DropPolicy,
    staged_items: u64,
    staged_bytes: u64,
    staged: Vec<DropItem<S>>,
    pending: Vec<DropItem<S>>,
    /// The fence covering the pending batch, with where it was recorded.
    fence: Option<(S::Event, FenceMark)>,
    /// Set while a stream of the device records: no fence is recorded, waited for or polled.
    recording: RecordingFlag,
    stats: DropStats,
}

impl<S: Shim> DropQueue<S> {
    /// An empty queue with `policy`, frozen while `recording` is set.
    pub fn new(policy: DropPolicy, recording: RecordingFlag) -> Self {
        Self {
            policy,
            staged: Vec::new(),
            staged_items: 0,
            staged_bytes: 0,
            pending: Vec::new(),
            fence: None,
            recording,
            stats: DropStats::default(),
        }
    }

    /// Stages what a replay of a graph must keep alive until a fence after it: nothing new when
    /// the last item staged is the same graph (the fence that will cover that one is recorded
    /// after this replay too), so replays back to back cost no queue traffic.
    pub(crate) fn push_graph(&mut self, graph: &alloc::sync::Arc<Recorded<S>>) {
        if let Some(DropItem::Graph(last)) = self.staged.last()
            && alloc::sync::Arc::ptr_eq(last, graph)
        {
            return;
        }
        self.push(DropItem::Graph(alloc::sync::Arc::clone(graph)));
    }

    /// Stages `item`; it is released at the second flush from now.
    pub fn push(&mut self, item: DropItem<S>) {
        self.staged_items = self.staged_items.saturating_add(1);
        self.staged_bytes = self.staged_bytes.saturating_add(item.bytes());
        self.staged.push(item);
    }

    /// Whether the staged batch reached the item or byte threshold.
    pub fn should_flush(&self) -> bool {
        self.staged_items >= self.policy.max_items || self.staged_bytes >= self.policy.max_bytes
    }

    /// Items staged (no fence yet).
    pub fn staged_len(&self) -> usize {
        self.staged.len()
    }

    /// Items pending (covered by the last fence).
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// What the queue has done.
    pub fn stats(&self) -> DropStats {
        self.stats
    }

    /// Releases the pending batch once its fence passed, makes the staged batch pending and
    /// records one fence on `stream` for it (at `mark`). Does nothing (and records no fence) when
    /// both batches are empty.
    ///
    /// Returns the graver outcome of the wait and of recording the new fence, with the mark of the
    /// fence waited for: failed work (the fence completed) releases the pending batch and the
    /// flush goes on; a lost device releases it and stops; a wait of unknown outcome leaks it and
    /// stops; a wait the shim refused for now ([`FenceOutcome::Refused`]) keeps the fence and its
    /// batch for the next flush and stops. A fence that could not be recorded leaves the batch
    /// pending: the next flush records one that covers it.
    pub(crate) fn flush(&mut self, shim: &S, stream: &S::Stream, mark: FenceMark) -> Fenced {
        if self.recording.is_set() || (self.staged.is_empty() && self.pending.is_empty()) {
            return Fenced::NOTHING;
        }
        let mut waited = Fenced::NOTHING;
        if !self.pending.is_empty() {
            let (fence, fence_mark) = match self.fence.take() {
                Some(f) => f,
                // The last fence could not be recorded: one now covers the pending batch too.
                None => match shim.record_event(stream) {
                    Ok(f) => (f, mark),
                    Err(e) => {
                        return Fenced {
                            outcome: FenceOutcome::unrecorded(e),
                            mark,
                        };
                    }
                },
            };
            waited = Fenced {
                outcome: FenceOutcome::wait(shim, &fence),
                mark: fence_mark,
            };
            if let FenceOutcome::Refused(_) = waited.outcome {
                // Nothing was waited for: the fence stands, and its batch waits for a later flush.
                self.fence = Some((fence, fence_mark));
                return waited;
            }
            self.stats.fences_waited = self.stats.fences_waited.saturating_add(1);
            self.release_pending(shim, waited.outcome);
            match waited.outcome {
                FenceOutcome::Passed | FenceOutcome::PassedOverFailedWork(_) => {}
                // Nothing more is worth a fence: the device is gone or its state unknown.
                FenceOutcome::Refused(_)
                | FenceOutcome::Unknown(_)
                | FenceOutcome::DeviceLost(_) => {
                    return waited;
                }
            }
        }
        core::mem::swap(&mut self.pending, &mut self.staged);
        self.staged_items = 0;
        self.staged_bytes = 0;
        if self.pending.is_empty() {
            // Nothing to cover: a fence would cost a device call and cover nothing.
            return waited;
        }
        self.stats.flushes = self.stats.flushes.saturating_add(1);
        match shim.record_event(stream) {
            Ok(f) => {
                self.fence = Some((f, mark));
                waited
            }
            Err(e) => waited.and(Fenced {
                outcome: FenceOutcome::unrecorded(e),
                mark,
            }),
        }
    }

    /// Releases the pending batch if its fence has passed, without blocking, and then covers the
    /// staged batch with a fence when nothing is pending, so a loop that only polls releases
    /// what finished (each staged item goes at the second poll that finds its fence passed, as
    /// at the second flush). Returns `None` while the pending batch's fence has not passed, and
    /// otherwise the outcome of the fence that settled it (the batch is then released or leaked
    /// as in a flush; a lost device or a wait of unknown outcome records no new fence). A
    /// pending batch whose fence could not be recorded gets one now (at `mark`), so a loop that
    /// polls until the queue is empty ends; a refusal is returned as the fence's outcome and the
    /// batch stays pending.
    pub(crate) fn poll(&mut self, shim: &S, stream: &S::Stream, mark: FenceMark) -> Option<Fenced> {
        if self.recording.is_set() {
            return None;
        }
        if self.fence.is_none() && !self.pending.is_empty() {
            match shim.record_event(stream) {
                Ok(f) => self.fence = Some((f, mark)),
                Err(e) => {
                    return Some(Fenced {
                        outcome: FenceOutcome::unrecorded(e),
                        mark,
                    });
                }
            }
        }
        let mut settled = Fenced::NOTHING;
        if let Some((fence, fence_mark)) = self.fence.as_ref() {
            settled = Fenced {
                outcome: FenceOutcome::query(shim, fence)?,
                mark: *fence_mark,
            };
            self.fence = None;
            if settled.outcome == FenceOutcome::Passed {
                self.stats.fences_polled = self.stats.fences_polled.saturating_add(1);
            }
            self.release_pending(shim, settled.outcome);
            match settled.outcome {
                FenceOutcome::Passed | FenceOutcome::PassedOverFailedWork(_) => {}
                // A refused query is "not yet" (`FenceOutcome::query`): never met here.
                FenceOutcome::Refused(_)
                | FenceOutcome::Unknown(_)
                | FenceOutcome::DeviceLost(_) => {
                    return Some(settled);
                }
            }
        }
        // The settled fence's mark goes back to the ledger unless covering the staged items failed.
        Some(self.cover_staged(stream, shim, mark).and(settled))
    }

    /// Whether nothing waits in the queue: no staged item, no pending one.
    pub fn is_empty(&self) -> bool {
        self.staged.is_empty() && self.pending.is_empty()
    }

    /// Bytes waiting in the queue for a fence (staged and pending), by kind.
    pub fn awaiting(&self) -> Awaiting {
        let mut a = Awaiting::default();
        for item in self.staged.iter().chain(&self.pending) {
            let n = item.bytes();
            match item {
                DropItem::Host(_) => a.host = a.host.saturating_add(n),
                DropItem::Binding(_) => a.bindings = a.bindings.saturating_add(n),
                DropItem::Page(_) => a.pages = a.pages.saturating_add(n),
                DropItem::Graph(_) => {}
            }
        }
        a
    }

    /// With nothing pending, makes the staged batch pending under one new fence (at `mark`).
    /// Returns the outcome of recording it: a refusal leaves the batch pending without a fence,
    /// and the next poll or flush records one.
    fn cover_staged(&mut self, stream: &S::Stream, shim: &S, mark: FenceMark) -> Fenced {
        if !self.pending.is_empty() || self.staged.is_empty() {
            return Fenced::NOTHING;
        }
        core::mem::swap(&mut self.pending, &mut self.staged);
        self.staged_items = 0;
        self.staged_bytes = 0;
        self.stats.flushes = self.stats.flushes.saturating_add(1);
        match shim.record_event(stream) {
            Ok(f) => {
                self.fence = Some((f, mark));
                Fenced::NOTHING
            }
            Err(e) => Fenced {
                outcome: FenceOutcome::unrecorded(e),
                mark,
            },
        }
    }

    /// Releases everything the queue holds without a fence: only for a device that is lost, where
    /// nothing will touch the memory again.
    pub(crate) fn release_all(&mut self, shim: &S) {
        self.fence = None;
        let items = core::mem::take(&mut self.staged)
            .into_iter()
            .chain(core::mem::take(&mut self.pending));
        for item in items {
            self.stats.items_released = self.stats.items_released.saturating_add(1);
            self.stats.bytes_released = self.stats.bytes_released.saturating_add(item.bytes());
            item.release(shim, self.policy.fill_released);
        }
        self.staged_items = 0;
        self.staged_bytes = 0;
    }

    /// Flushes twice, whatever the first flush met: when both fences pass, everything pushed
    /// before is released; after an unknown or lost outcome what the failed wait covered is
    /// leaked, and what the second flush fenced stays pending (callers go by the outcome).
    /// Returns the graver outcome of the two.
    pub(crate) fn drain(&mut self, shim: &S, stream: &S::Stream, mark: FenceMark) -> Fenced {
        let first = self.flush(shim, stream, mark);
        let second = self.flush(shim, stream, mark);
        first.and(second)
    }

    /// Releases the pending batch after its fence ended with `outcome`: at once if the device is
    /// done with it; otherwise it is leaked on purpose, because freeing memory the device may
    /// still use could hand it to someone else.
    ///
    /// The batch is emptied in place: its vector keeps its capacity, so a queue that cycles under
    /// its policy stages and releases without allocating once it is warm.
    fn release_pending(&mut self, shim: &S, outcome: FenceOutcome) {
        let batch = self.pending.drain(..);
        match outcome {
            FenceOutcome::Passed
            | FenceOutcome::PassedOverFailedWork(_)
            | FenceOutcome::DeviceLost(_) => {
                for item in batch {
                    self.stats.items_released = self.stats.items_released.saturating_add(1);
                    self.stats.bytes_released =
                        self.stats.bytes_released.saturating_add(item.bytes());
                    item.release(shim, self.policy.fill_released);
                }
            }
            // A refused wait never gets here (its batch stays pending, `flush`); were it to, the
            // device may still use the batch, so it goes as an unknown one does.
            FenceOutcome::Refused(e) | FenceOutcome::Unknown(e) => {
                debug_assert!(!matches!(outcome, FenceOutcome::Refused(_)));
                let leaked = batch.len();
                warn!(
                    "fence wait failed (status {}): leaking {} items the device may still use",
                    e.status, leaked
                );
                self.stats.items_leaked = self.stats.items_leaked.saturating_add(leaked as u64);
                batch.for_each(core::mem::forget);
            }
        }
    }
}

impl<S: Shim> Drop for DropQueue<S> {
    fn drop(&mut self) {
        // Whatever is still here was never covered by a fence that passed (a drain failed):
        // the device may still use it, so it is leaked on purpose rather than freed.
        let left = self.staged.len() + self.pending.len();
        if left > 0 {
            warn!(
                "drop queue dropped with {} items not released: leaking them",
                left
            );
            core::mem::forget(core::mem::take(&mut self.staged));
            core::mem::forget(core::mem::take(&mut self.pending));
        }
    }
}

#[cfg(test)]
#[path = "drop_queue_tests.rs"]
mod tests;
