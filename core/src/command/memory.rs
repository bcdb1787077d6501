//! The memory operations of a command: reservation (with the one reclaim-and-retry), binding,
//! holding room ahead of a recording, host buffers, cleanup and the drop queue.
//!
//! Owns when reclaim runs and what its fences mean for the streams it touches. Does not own the
//! pools (`memory/`) nor the fence decisions (`fault.rs`).

use super::Command;
use crate::capture::Stance;
use crate::drop_queue::DropItem;
use crate::error::{IoError, ServerError};
use crate::host::HostBuffer;
use crate::memory::{Handle, PageUpdate};
use crate::shim::Shim;
use alloc::vec::Vec;

impl<S: Shim> Command<'_, S> {
    /// Reserves `size` bytes on this stream. A failure that reclaiming might cure, on a
    /// reservation that may change the pages, makes room on every stream once and retries once.
    ///
    /// # Errors
    ///
    /// The second failure, or the first when reclaim cannot help (see
    /// [`IoError::may_succeed_after_reclaim`](crate::error::IoError::may_succeed_after_reclaim)); [`ServerError::DeviceLost`];
    /// [`ServerError::StreamFaulted`].
    pub fn reserve(&mut self, size: u64) -> Result<Handle, ServerError> {
        self.begin()?;
        self.reserve_room(size)
    }

    /// [`Self::reserve`] once the operation has begun: the one reclaim-and-retry.
    pub(super) fn reserve_room(&mut self, size: u64) -> Result<Handle, ServerError> {
        let update = self.page_update();
        let (shim, s) = self.parts();
        match s.memory.try_reserve(shim, size, update) {
            Ok(handle) => Ok(handle),
            Err(e) => self.reserve_refused(size, update, e),
        }
    }

    /// The rest of [`Self::reserve_room`] once the first try was refused (`first`): the retry
    /// after making room where that may help, and the refusal's bookkeeping.
    #[cold]
    #[inline(never)]
    fn reserve_refused(
        &mut self,
        size: u64,
        update: PageUpdate,
        first: crate::error::IoError,
    ) -> Result<Handle, ServerError> {
        let result = if update == PageUpdate::Allow
            && first.may_succeed_after_reclaim()
            && !first.is_device_lost()
        {
            debug!(
                "reserve of {} bytes failed; making room on every stream",
                size
            );
            self.make_room()?;
            let (shim, s) = self.parts();
            s.memory.try_reserve(shim, size, update)
        } else {
            Err(first)
        };
        result.map_err(|e| {
            if let Some(cause) = e.driver_error() {
                self.device.ledger.call_failed(*cause);
            }
            let e: ServerError = e.into();
            // No page may be added while recording: the recording cannot go on without the room.
            self.discard_recording(&e);
            e
        })
    }

    /// Makes room on every stream of the device: drains their queues, releases their empty pages.
    /// Another stream's fault does not fail this stream's reservation: it stays with that stream
    /// (its next operation, read or sync reports it), unless the device is lost.
    fn make_room(&mut self) -> Result<(), ServerError> {
        let device = &mut *self.device;
        for (i, s) in device.streams.iter_mut().enumerate() {
            let Some(s) = s else { continue };
            let fenced = s.cleanup(&device.shim);
            if i == self.stream {
                device.ledger.answer(i, fenced)?;
            } else {
                device.ledger.defer(i, fenced)?;
            }
        }
        Ok(())
    }

    /// An allocation of `size` bytes (its bytes are whatever the page held: write them first).
    ///
    /// # Errors
    ///
    /// As [`Self::reserve`].
    pub fn empty(&mut self, size: u64) -> Result<Handle, ServerError> {
        self.reserve(size)
    }

    /// A handle of `size` bytes with no memory yet; [`Self::initialize`] or [`Self::bind`] gives
    /// it some.
    pub fn lazy(&mut self, size: u64) -> Handle {
        self.current().memory.lazy_handle(size)
    }

    /// Gives the room of `reserved` (from [`Self::reserve`]) to `handle`.
    ///
    /// The room may still be in use by another stream's work (a kernel that read or wrote
    /// `reserved`): this stream is ordered after that work first, so what is later written into
    /// `handle` here cannot overtake it. The exception is room whose raw address was handed out
    /// ([`Self::managed_resource`]): it is refused while any binding of it is out, the
    /// resource's or uncollected work's ([`IoError::Exposed`]), and `handle` counts as exposed
    /// once it has the room.
    ///
    /// # Errors
    ///
    /// As [`crate::memory::MemoryManager::bind`]; the failures of cross-stream order.
    pub fn bind(&mut self, reserved: Handle, handle: &Handle) -> Result<(), ServerError> {
        self.begin()?;
        self.bind_room(reserved, handle)
    }

    /// [`Self::bind`] once the operation has begun.
    fn bind_room(&mut self, reserved: Handle, handle: &Handle) -> Result<(), ServerError> {
        // Memory a graph's replays (or the open recording) use stays with the handle they know.
        let recorded = self
            .device
            .capture
            .window()
            .is_some_and(|w| w.touches(reserved.id()));
        if reserved.is_kept_by_graph() || recorded {
            return Err(IoError::KeptByGraph {
                handle: reserved.id(),
            }
            .into());
        }
        // Every refusal before any wait is enqueued, so a refused bind leaves nothing behind
        // (the manager's `bind`, public on its own, checks again).
        self.current().memory.check_bind(&reserved, handle)?;
        // A bind inside a recording enqueues nothing, so it cannot wait: the room's other uses
        // follow it to `handle`, and the replays that use `handle` wait for them.
        let recording = self.stance() == Stance::Record;
        if !recording {
            let t = self.device.target(&reserved)?;
            self.device.order_after(self.stream, &reserved, t.owner)?;
        }
        let room = reserved.id();
        self.current().memory.bind(reserved, handle)?;
        // The room's records follow its bytes to `handle`, after the bookkeeping: it drops the
        // records of the memory `handle` let go (its id is among the freed), and would drop the
        // records handed over with them. Its failure marks always; its cross-stream uses only
        // inside a recording (outside one they were waited for above).
        if !self.device.failures.is_empty() || !self.device.foreign_uses.is_empty() {
            self.device.collect();
        }
        if !self.device.failures.is_empty() {
            self.device.failures.hand_over(room, handle.id());
        }
        if !self.device.foreign_uses.is_empty() {
            if recording {
                // Nothing waited for the other streams' uses of the room: each of those streams
                // keeps it alive, now as `handle`'s, until its work so far is done (as it kept
                // the room), so `handle` dropped before any replay cannot free it under that work.
                for (user, _) in self
                    .device
                    .foreign_uses
                    .others(room, self.stream, self.stream)
                {
                    if let Some(Some(s)) = self.device.streams.get_mut(user) {
                        s.drops.push(DropItem::Binding(handle.binding()));
                    }
                }
                self.device.foreign_uses.hand_over(room, handle.id());
            } else {
                self.device.foreign_uses.forget(room);
            }
        }
        Ok(())
    }

    /// Gives memory to a lazy handle.
    ///
    /// # Errors
    ///
    /// As [`Self::reserve`] and [`Self::bind`].
    pub fn initialize(&mut self, handle: &Handle) -> Result<(), ServerError> {
        self.begin()?;
        let reserved = self.reserve_room(handle.allocation_size())?;
        self.bind_room(reserved, handle)
    }

    /// Holds room on this stream for reservations of `sizes` (in the current allocation mode),
    /// so a recording can make them without a new page: each is reserved (largest first, so the
    /// pools grow to the largest request before the others are placed), then freed. The room
    /// stays held until a cleanup gives empty pages back (`memory_cleanup`, or reclaim when a
    /// reservation fails). A warm-up run of the work to record holds its room the same way.
    ///
    /// # Errors
    ///
    /// [`Validation::Recording`](crate::Validation::Recording) while a stream of the device records; as [`Self::reserve`].
    pub fn hold(&mut self, sizes: &[u64]) -> Result<(), ServerError> {
        self.begin()?;
        self.refuse_while_recording("hold")?;
        let mut sorted = sizes.to_vec();
        sorted.sort_unstable_by(|a, b| b.cmp(a));
        let mut held = Vec::with_capacity(sorted.len());
        for size in sorted {
            held.push(self.reserve_room(size)?);
        }
        drop(held);
        // The freed room goes back to the pools now.
        self.device.collect();
        Ok(())
    }

    /// `len` bytes of host memory for copies: pinned when asked and the pool can serve it,
    /// otherwise the heap. While a stream of the device records, pinned memory comes only from
    /// pinned pages already held (no page is allocated then). The bytes are not cleared: a
    /// pinned buffer holds what its memory last held (zeros on a new page), so fill it whole.
    ///
    /// # Errors
    ///
    /// [`ServerError::DeviceLost`];
    /// [`IoError::HostAllocFailed`] when neither the
    /// pinned pool nor the heap can hold `len` bytes.
    pub fn reserve_host(&mut self, len: usize, pinned: bool) -> Result<HostBuffer, ServerError> {
        self.device.ledger.check_device()?;
        self.end_abandoned();
        self.host_buffer(len, pinned)
    }

    /// Flushes this stream's drop queue: waits for the last flush's fence, releases what it
    /// covered, and records a fence for what is queued now.
    ///
    /// # Errors
    ///
    /// [`ServerError::DeviceLost`]; [`Validation::Recording`](crate::Validation::Recording) while a stream of the device
    /// records (no fence may be waited for then); what the fence reveals ([`ServerError::StreamFaulted`], or
    /// [`ServerError::Device`] for a wait of unknown outcome: what it covered is then leaked; or
    /// with [`Fault::Busy`](crate::Fault::Busy) for a wait the shim refused for now, when a stream
    /// of another device of the process records: the fence and what it covers stay queued).
    pub fn flush_drops(&mut self) -> Result<(), ServerError> {
        self.device.ledger.check_device()?;
        self.end_abandoned();
        self.refuse_while_recording("flush_drops")?;
        let (shim, s) = self.parts();
        let fenced = s.flush(shim);
        self.device.ledger.answer(self.stream, fenced)
    }

    /// The steady loop's release, without blocking: releases what this stream's drop queue holds
    /// whose fence has passed and, when no fence is pending then, records one for what was
    /// queued since (dropped uploads' host buffers, other streams' memory this stream's work
    /// used, pages let go). So a loop that calls it once per iteration gets each dropped item
    /// back one or two iterations after the work that used it finished, with no blocking wait
    /// and without knowing the queue's [`DropPolicy`](crate::drop_queue::DropPolicy). A stream
    /// that used another stream's memory holds it in its own queue: poll every stream the loop
    /// uses.
    ///
    /// Returns whether the queue is empty now (nothing awaits a fence): a loop that polls until
    /// `true` (with the device running in between) has everything queued before it back. While
    /// a stream of another device of the process records (CUDA's global capture mode), fences
    /// may not be asked about and polls answer `false` until that recording ends.
    ///
    /// ```
    /// use devcmd::{Device, DeviceConfig, StreamId};
    /// use devcmd_std::StdShim;
    ///
    /// # fn main() -> Result<(), devcmd::ServerError> {
    /// let mut device = Device::new(StdShim::new(), DeviceConfig::default());
    /// let mut cmd = device.command(StreamId(0))?;
    /// let x = cmd.create(&[7; 4096])?; // the upload's staging buffer waits for a fence
    /// drop(x);
    /// assert!(!cmd.poll_drops()?, "a fence was recorded for the staging buffer");
    /// while !cmd.poll_drops()? {
    ///     std::thread::yield_now(); // a real loop does its other work here
    /// }
    /// assert_eq!(device.memory_report().awaiting_fence().host, 0);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`ServerError::DeviceLost`]; [`Validation::Recording`](crate::Validation::Recording) while a stream of the device
    /// records; what the fence reveals, as [`Self::flush_drops`].
    pub fn poll_drops(&mut self) -> Result<bool, ServerError> {
        self.device.ledger.check_device()?;
        self.end_abandoned();
        self.refuse_while_recording("poll_drops")?;
        // What came back since the last operation (dropped handles, what dropped futures left)
        // and the pages the manager let go join the queue first: a loop that only polls gets
        // them back too.
        self.device.collect();
        let (shim, s) = self.parts();
        s.queue_retired();
        let mark = s.mark();
        match s.drops.poll(shim, &s.raw, mark) {
            None => Ok(false),
            Some(fenced) => {
                self.device.ledger.answer(self.stream, fenced)?;
                Ok(self.current().drops.is_empty())
            }
        }
    }

    /// Drains the drop queue, releases every empty page of this stream's pools and its pinned
    /// pool. Refused while any stream records.
    ///
    /// # Errors
    ///
    /// [`Validation::Recording`](crate::Validation::Recording), [`ServerError::DeviceLost`], [`ServerError::StreamFaulted`],
    /// a fence's failure.
    pub fn memory_cleanup(&mut self) -> Result<(), ServerError> {
        self.begin()?;
        self.refuse_while_recording("memory_cleanup")?;
        let (shim, s) = self.parts();
        let fenced = s.cleanup(shim);
        self.device.ledger.answer(self.stream, fenced)
    }
}
