//! A stream of the device: its queue on the shim and everything the core keeps per stream.
//!
//! Owns the stream's device memory manager, pinned pool, drop queue, capture state and cursor
//! (how many commands it has issued), and what it last waited for on each other stream. Does not
//! own cross-stream decisions (the device does).

use crate::capture::CaptureState;
use crate::drop_queue::{DropItem, DropQueue};
use crate::error::DriverError;
use crate::memory::MemoryManager;
use crate::pinned::PinnedPool;
use crate::shim::Shim;
use alloc::vec::Vec;

/// Names a stream of a device: `StreamId(0)`, `StreamId(1)`, … up to the device's limit.
/// Streams are created on first use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct StreamId(pub u32);

/// The core's state of one stream.
#[derive(Debug)]
pub(crate) struct Stream<S: Shim> {
    pub raw: S::Stream,
    pub memory: MemoryManager<S>,
    pub pinned: PinnedPool<S>,
    pub drops: DropQueue<S>,
    pub capture: CaptureState,
    /// Commands issued on this stream.
    pub cursor: u64,
    /// For each other stream (by index): its cursor when this stream last waited for it.
    pub synced: Vec<u64>,
    /// A fault an internal drop-queue flush revealed, kept for the next read or sync.
    pub fault: Option<DriverError>,
}

impl<S: Shim> Stream<S> {
    /// Moves the pages the manager retired into the drop queue: they go back once this stream's
    /// fence passes (other streams' use of their slices was covered before they emptied).
    pub fn queue_retired(&mut self) {
        for page in self.memory.take_retired() {
            self.drops.push(DropItem::Page(page));
        }
    }

    /// Flushes the drop queue unless the stream records (a fence would land in the graph).
    pub fn flush(&mut self, shim: &S) -> Result<(), DriverError> {
        if self.capture.is_recording() {
            return Ok(());
        }
        self.drops.flush(shim, &self.raw)
    }

    /// Releases everything the drop queue holds, retired pages included, each once the fence
    /// covering it passed. Work that put nothing in the queue (a launch, a read) is not waited
    /// for when the queue was empty: see [`Self::sync`].
    pub fn drain(&mut self, shim: &S) -> Result<(), DriverError> {
        self.queue_retired();
        self.drops.drain(shim, &self.raw)
    }

    /// [`Self::drain`], recording what its fences reveal in `poison`. A fault of work that ran
    /// taints the stream but the drain completed (its fences did), so it is not an error here.
    pub fn drain_noting(
        &mut self,
        shim: &S,
        poison: &crate::device::Poison,
        index: usize,
    ) -> Result<(), DriverError> {
        match self.drain(shim) {
            Err(e) if e.fault == crate::error::Fault::WorkFailed => {
                poison.note_at(index, &e);
                Ok(())
            }
            r => r.inspect_err(|e| poison.note_at(index, e)),
        }
    }

    /// Waits for everything enqueued on the stream so far.
    pub fn sync(&mut self, shim: &S) -> Result<(), DriverError> {
        let fence = shim.record_event(&self.raw)?;
        shim.event_wait(&fence)
    }
}
