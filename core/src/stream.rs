//! A stream of the device: its queue on the shim and everything the core keeps per stream.
//!
//! Owns the stream's device memory manager, pinned pool, drop queue and cursor
//! (how many commands it has issued), and what it last waited for on each other stream. Does not
//! own cross-stream decisions (`order.rs`) nor what a fence's outcome means (`fault.rs`).

use crate::drop_queue::{DropItem, DropQueue};
use crate::fault::{FenceMark, FenceOutcome, Fenced};
use crate::memory::{Cleanup, MemoryManager};
use crate::pinned::PinnedPool;
use crate::shim::Shim;
use crate::staging::StagingRing;
use alloc::vec::Vec;

pub use crate::id::StreamId;

/// The core's state of one stream.
#[derive(Debug)]
#[repr(C)]
#[cfg_attr(target_pointer_width = "64", repr(align(64)))]
pub(crate) struct Stream<S: Shim> {
    /// The last kernel launched on the stream: named when a later fence reports failed work.
    pub last_kernel: Option<&'static str>,
    /// Commands issued on this stream.
    pub cursor: u64,
    /// Its policy check after every operation lies beside the two above (the fields are laid
    /// out in their order, what every operation touches first: one cache line on 64-bit hosts).
    pub drops: DropQueue<S>,
    pub raw: S::Stream,
    pub memory: MemoryManager<S>,
    pub pinned: PinnedPool<S>,
    /// The pinned buffers pipelined copies cycle through (`staging.rs`).
    pub ring: StagingRing<S>,
    /// For each other stream (by index): its cursor when this stream last waited for it.
    pub synced: Vec<u64>,
}

impl<S: Shim> Stream<S> {
    /// Moves the pages the manager retired into the drop queue: they go back once this stream's
    /// fence passes (other streams' use of their slices was covered before they emptied).
    #[inline]
    pub fn queue_retired(&mut self) {
        if !self.memory.has_retired() {
            return;
        }
        for page in self.memory.take_retired() {
            self.drops.push(DropItem::Page(page));
        }
    }

    /// Where a fence recorded now would be: the cursor and the last kernel launched.
    pub fn mark(&self) -> FenceMark {
        FenceMark {
            cursor: self.cursor,
            kernel: self.last_kernel,
        }
    }

    /// Flushes the drop queue (retired pages included); nothing while a stream of the device
    /// records (the queue is frozen then: a fence would land in the graph).
    pub fn flush(&mut self, shim: &S) -> Fenced {
        self.queue_retired();
        let mark = self.mark();
        self.drops.flush(shim, &self.raw, mark)
    }

    /// Releases everything the drop queue holds, retired pages included, each once the fence
    /// covering it passed. Work that put nothing in the queue (a launch, a read) is not waited
    /// for when the queue was empty: see [`Self::sync`].
    pub fn drain(&mut self, shim: &S) -> Fenced {
        self.queue_retired();
        let mark = self.mark();
        self.drops.drain(shim, &self.raw, mark)
    }

    /// Drains the queue, returns the stream's empty pages and its idle pinned pages to the device
    /// (the staging ring's too): the cleanup every reclaim runs.
    pub fn cleanup(&mut self, shim: &S) -> Fenced {
        self.ring.retire_into(&mut self.drops);
        let drained = self.drain(shim);
        if !drained.outcome.completed() {
            return drained;
        }
        self.memory.cleanup(shim, Cleanup::Explicit);
        let drained = drained.and(self.drain(shim));
        if drained.outcome.completed() {
            self.pinned.cleanup(shim);
        }
        drained
    }

    /// Waits for everything enqueued on the stream so far: its queue, then its last work.
    pub fn sync(&mut self, shim: &S) -> Fenced {
        let drained = self.drain(shim);
        match drained.outcome {
            FenceOutcome::Passed | FenceOutcome::PassedOverFailedWork(_) => drained.and(Fenced {
                outcome: FenceOutcome::sync(shim, &self.raw),
                mark: self.mark(),
            }),
            FenceOutcome::Refused(_) | FenceOutcome::Unknown(_) | FenceOutcome::DeviceLost(_) => {
                drained
            }
        }
    }
}
