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
use crate::memory::{Binding, RawPage, RetiredPage};
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
    /// A device page the manager let go.
    Page(RetiredPage<RawPage<S>>),
    /// A graph replayed on the stream: what it touches must outlive the replay.
    Graph(alloc::sync::Arc<Recorded<S>>),
}

impl<S: Shim> DropItem<S> {
    fn bytes(&self) -> u64 {
        match self {
            Self::Host(h) => h.len() as u64,
            Self::Binding(b) => b.len(),
            Self::Page(p) => p.size(),
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

/// What the queue has done, for reports. Every counter saturates.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct DropStats {
    /// Flushes that recorded a fence.
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

/// The two-batch drop queue of one stream.
#[derive(Debug)]
pub struct DropQueue<S: Shim> {
    policy: DropPolicy,
    staged: Vec<DropItem<S>>,
    staged_items: u64,
    staged_bytes: u64,
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
    /// stops. A fence that could not be recorded leaves the batch pending: the next flush records
    /// one that covers it.
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
            self.stats.fences_waited = self.stats.fences_waited.saturating_add(1);
            self.release_pending(shim, waited.outcome);
            match waited.outcome {
                FenceOutcome::Passed | FenceOutcome::PassedOverFailedWork(_) => {}
                // Nothing more is worth a fence: the device is gone or its state unknown.
                FenceOutcome::Unknown(_) | FenceOutcome::DeviceLost(_) => return waited,
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

    /// Releases the pending batch if its fence has passed, without blocking. Returns `None` while
    /// its fence has not passed, and otherwise the outcome of the fence that settled it (the
    /// batch is then released or leaked as in a flush). A pending batch whose fence could not be
    /// recorded gets one now (at `mark`), so a loop that polls until nothing is pending ends; a
    /// refusal is returned as the fence's outcome and the batch stays pending.
    pub(crate) fn poll(&mut self, shim: &S, stream: &S::Stream, mark: FenceMark) -> Option<Fenced> {
        if self.recording.is_set() {
            return None;
        }
        if self.fence.is_none() {
            if self.pending.is_empty() {
                return Some(Fenced::NOTHING);
            }
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
        let (fence, mark) = self.fence.as_ref()?;
        let fenced = Fenced {
            outcome: FenceOutcome::query(shim, fence)?,
            mark: *mark,
        };
        self.fence = None;
        if fenced.outcome == FenceOutcome::Passed {
            self.stats.fences_polled = self.stats.fences_polled.saturating_add(1);
        }
        self.release_pending(shim, fenced.outcome);
        Some(fenced)
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

    /// Flushes twice, whatever the first flush met: everything pushed before is released, or
    /// leaked after a wait whose outcome is unknown. Returns the graver outcome of the two.
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
            FenceOutcome::Unknown(e) => {
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
mod tests {
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
}
