//! The device: owner of the streams and of the device-wide state; hands out commands.
//!
//! Owns the shim, the streams (created on first use or borrowed), the memory budget shared by
//! their managers, the failure records, the fault ledger, the capture state (`capture/state.rs`
//! decides; this file makes the device calls its transitions ask for), the bookkeeping every
//! operation begins with (`Device::collect`: the end of the dropped-handle path), and teardown.
//! Does not own the operations (`command/`: `Device::command` lives there), cross-stream order
//! (`order/`), what a fence's outcome means (`fault.rs`) nor the capture rules (`capture/`).

use crate::capture::CaptureState;
pub use crate::device_report::DeviceReport;
use crate::drop_queue::{DropItem, DropPolicy, DropQueue, DropStats};
use crate::error::{ServerError, Validation};
use crate::failure::Failures;
use crate::fault::FaultLedger;
use crate::host::{ExternalBytes, HostBuffer};
use crate::memory::{Issuer, MemoryBudget, MemoryConfig, MemoryManager};
use crate::order::ForeignUses;
use crate::peer::PeerRead;
use crate::pinned::{PinnedConfig, PinnedPool};
use crate::shim::{DeviceFacts, Shim};
use crate::staging::StagingPolicy;
use crate::stream::{Stream, StreamId};
use alloc::sync::Arc;
use alloc::vec::Vec;

/// Everything configurable about a device, with the design's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceConfig {
    /// Pool sizes of every stream's memory manager.
    pub memory: MemoryConfig,
    /// Drop-queue thresholds.
    pub drops: DropPolicy,
    /// Staging thresholds.
    pub staging: StagingPolicy,
    /// Pinned pool sizes.
    pub pinned: PinnedConfig,
    /// Streams the device may create.
    pub max_streams: u32,
    /// A budget for device pages, tighter than the shim's own (`None`: the shim's).
    pub memory_budget: Option<u64>,
    /// Zero copy: device memory is pinned host memory the device maps, so uploads are written by
    /// the host straight into it and results are read back from it in place (see
    /// [`Command::write_layout`](crate::Command::write_layout) and [`Command::read_owned`](crate::Command::read_owned)). `None` (the default) turns it on
    /// exactly where the device says it is integrated and can map host memory (Jetson: host
    /// memory is device memory there); `Some(true)` asks for it on any device that can map host
    /// memory (a discrete GPU then reaches the pages over PCIe: slower for data kernels re-read;
    /// useful to test the path); `Some(false)` turns it off. A device that cannot map host memory
    /// never uses it. [`Device::zero_copy`] says what was decided.
    pub zero_copy: Option<bool>,
}

impl Default for DeviceConfig {
    fn default() -> Self {
        Self {
            memory: MemoryConfig::default(),
            drops: DropPolicy::default(),
            staging: StagingPolicy::default(),
            pinned: PinnedConfig::default(),
            max_streams: 16,
            memory_budget: None,
            zero_copy: None,
        }
    }
}

/// A device: the shim, its streams and the device-wide state. Driven by one thread at a time;
/// wrap it in a `spin::Mutex` to share it.
///
/// Laid out in the order of its fields, what every operation reads first: the ledger's pointers
/// (to its attention word among them), the shim, the streams and the id lie together, the
/// capture, cross-stream and failure records follow (the capture state first: one line fewer
/// per launch under callgrind's cache model); what only setup and reports read comes last. A
/// driver call between two operations leaves the device cold, and each line read misses.
#[derive(Debug)]
#[repr(C)]
#[cfg_attr(target_pointer_width = "64", repr(align(64)))]
pub struct Device<S: Shim> {
    pub(crate) ledger: FaultLedger,
    pub(crate) shim: Arc<S>,
    /// Boxed: a stream's state is kilobytes, and the vector grows as streams are first used.
    pub(crate) streams: Vec<Option<alloc::boxed::Box<Stream<S>>>>,
    pub(crate) id: u32,
    /// Copies to other devices that may still read this device's memory, their end not known
    /// when they were made (`command/across.rs`): teardown waits for them, and leaks every page
    /// rather than free one under a copy whose end it still cannot tell.
    pub(crate) peer_reads: Vec<PeerRead<S>>,
    /// The capture state: whether a stream records, and the graphs callers dropped.
    pub(crate) capture: CaptureState<S>,
    /// Which streams used each allocation besides its owner (see `order.rs`).
    pub(crate) foreign_uses: ForeignUses,
    pub(crate) failures: Failures,
    /// Scratch for freed allocation ids.
    pub(crate) freed: Vec<u64>,
    /// The spans of a launch of more buffers than fit on the stack, kept for the next one.
    pub(crate) launch_spans: Vec<crate::shim::DeviceSpan>,
    pub(crate) budget: MemoryBudget,
    pub(crate) facts: DeviceFacts,
    pub(crate) config: DeviceConfig,
}

impl<S: Shim> Device<S> {
    /// A device over `shim` with `config`.
    pub fn new(shim: S, config: DeviceConfig) -> Self {
        let facts = shim.facts();
        let limit = match (facts.memory_budget, config.memory_budget) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        Self {
            shim: Arc::new(shim),
            id: crate::live::register(),
            facts,
            config,
            budget: MemoryBudget::new(limit),
            streams: Vec::new(),
            failures: Failures::default(),
            ledger: FaultLedger::default(),
            freed: Vec::new(),
            foreign_uses: ForeignUses::default(),
            launch_spans: Vec::new(),
            capture: CaptureState::default(),
            peer_reads: Vec::new(),
        }
    }

    /// Whether this device runs zero copy (see [`DeviceConfig::zero_copy`]): read from the
    /// device's facts ([`DeviceFacts::integrated`], [`DeviceFacts::can_map_host`]) and the
    /// configuration.
    pub fn zero_copy(&self) -> bool {
        self.facts.can_map_host && self.config.zero_copy.unwrap_or(self.facts.integrated)
    }

    /// The shim.
    pub fn shim(&self) -> &S {
        &self.shim
    }

    /// The device's id (handles carry it).
    pub fn id(&self) -> u32 {
        self.id
    }

    /// The device's facts.
    pub fn facts(&self) -> DeviceFacts {
        self.facts
    }

    /// The budget shared by every stream.
    pub fn budget(&self) -> &MemoryBudget {
        &self.budget
    }

    /// The failure records (for checks: they never outgrow live memory).
    pub fn failures(&self) -> &Failures {
        &self.failures
    }

    /// Makes `stream` a devcmd stream over `native`, a stream the caller's runtime created and
    /// owns (the stream a TensorRT context or PyTorch enqueues on): devcmd orders, guards and
    /// records work on it like on its own streams and never destroys it. Work the runtime
    /// enqueues on `native` by itself is outside devcmd's view: order it with the runtime's own
    /// means, or enqueue it through [`Command::library`](crate::Command::library).
    ///
    /// # Errors
    ///
    /// [`Validation::StreamInUse`] when `stream` already exists (a stream is borrowed before its
    /// first command); a stream index past the limit; the shim's refusal
    /// ([`Shim::borrow_stream`]); [`ServerError::DeviceLost`].
    ///
    /// # Safety
    ///
    /// `native` is a live stream of this device and stays alive until this device is dropped;
    /// it is not the native stream under another stream of this device (two devcmd streams over
    /// one native stream would each believe its work is alone there: a recording on one would
    /// capture the other's work while the other frees what it used); and its owner does not
    /// record it into a graph of its own while this device uses it (devcmd's fences would become
    /// that graph's nodes; the CUDA shim refuses a stream already being recorded).
    pub unsafe fn borrow_stream(
        &mut self,
        stream: StreamId,
        native: &S::NativeStream,
    ) -> Result<(), ServerError> {
        self.ledger.check_device()?;
        self.settle_captures();
        self.check_stream_index(stream)?;
        if let Some(Some(_)) = self.streams.get(stream.0 as usize) {
            return Err(Validation::StreamInUse { stream: stream.0 }.into());
        }
        // SAFETY: the caller's contract is the shim's.
        let raw =
            unsafe { self.shim.borrow_stream(native) }.map_err(|e| self.ledger.call_failed(e))?;
        self.install_stream(stream, raw);
        Ok(())
    }

    fn check_stream_index(&self, stream: StreamId) -> Result<usize, ServerError> {
        // Handle ids carry the stream in their top 16 bits: at most 65 536 streams.
        let max = self.config.max_streams.min(1 << 16);
        if stream.0 >= max {
            return Err(Validation::StreamOutOfRange {
                stream: stream.0,
                max,
            }
            .into());
        }
        Ok(stream.0 as usize)
    }

    pub(crate) fn ensure_stream(&mut self, stream: StreamId) -> Result<usize, ServerError> {
        let index = self.check_stream_index(stream)?;
        if !matches!(self.streams.get(index), Some(Some(_))) {
            let raw = self
                .shim
                .create_stream()
                .map_err(|e| self.ledger.call_failed(e))?;
            self.install_stream(stream, raw);
        }
        Ok(index)
    }

    /// The core's state of a new stream `stream` over `raw`.
    #[inline(never)]
    fn install_stream(&mut self, stream: StreamId, raw: S::Stream) {
        let index = stream.0 as usize;
        if self.streams.len() <= index {
            self.streams.resize_with(index + 1, || None);
        }
        {
            let issuer = Issuer {
                device: self.id,
                stream: stream.0,
            };
            let memory_config = self.config.memory;
            let mut memory = MemoryManager::tracked(
                &self.facts,
                memory_config,
                issuer,
                self.budget.clone(),
                self.ledger.attention(),
            );
            memory.map_pages(self.zero_copy());
            let drops = DropQueue::new(self.config.drops, self.capture.flag());
            self.streams[index] = Some(alloc::boxed::Box::new(Stream {
                raw,
                memory,
                pinned: PinnedPool::new(self.config.pinned),
                drops,
                cursor: 0,
                synced: Vec::new(),
                last_kernel: None,
                ring: crate::staging::StagingRing::new(),
            }));
        }
    }

    /// The stream that records now, if one does.
    pub(crate) fn recording(&self) -> Option<usize> {
        self.capture.recording()
    }

    /// Run by every command before anything else: a recording whose caller dropped its
    /// [`Recording`](crate::Recording) is aborted, and graphs dropped since the last command go,
    /// unless a stream records.
    pub(crate) fn settle_captures(&mut self) {
        if self.capture.abandoned() {
            self.abort_capture();
        }
        self.capture.release_dropped_graphs();
    }

    /// Ends the open recording, if any, and throws it away: the shim's capture is ended as
    /// doomed, the stream is idle again, the drop queues thaw. Nothing is marked failed: the
    /// buffers hold what they held before the recording.
    pub(crate) fn abort_capture(&mut self) {
        let (shim, streams) = (&*self.shim, &self.streams);
        let window = self.capture.abort(|i| {
            if let Some(Some(s)) = streams.get(i) {
                // Ends the recording whatever it answers; a graph from a doomed end is dropped.
                drop(shim.end_capture(&s.raw, true));
            }
        });
        drop(window);
    }

    /// The memory report of every stream; device and pinned host memory are totalled apart.
    pub fn memory_report(&mut self) -> DeviceReport {
        // Dropped handles come back first, and the pages they emptied join the drop queues.
        self.collect();
        let mut streams = Vec::new();
        let mut awaiting = Vec::new();
        let mut pinned_host = 0;
        for (i, s) in self.streams.iter_mut().enumerate() {
            if let Some(s) = s {
                let mut report = s.memory.report();
                report.pools.push(s.pinned.report());
                pinned_host += report.pinned_host().reserved;
                streams.push((StreamId(i as u32), report));
                awaiting.push((StreamId(i as u32), s.drops.awaiting()));
            }
        }
        DeviceReport {
            streams,
            awaiting,
            held: self.budget.held(),
            budget: self.budget.limit(),
            pinned_host,
        }
    }

    /// The drop-queue statistics of every stream.
    pub fn drop_stats(&self) -> Vec<(StreamId, DropStats)> {
        self.streams
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.as_ref().map(|s| (StreamId(i as u32), s.drops.stats())))
            .collect()
    }

    /// Debug builds: whatever the device thread left rang before it was left (another thread's
    /// return may be pushed between a ring's answer and this check: not checked).
    pub(crate) fn debug_assert_nothing_unrung(&self) {
        let unrung = |s: &Stream<S>| s.memory.has_freed() || s.memory.has_retired();
        debug_assert!(
            !self.streams.iter().flatten().any(|s| unrung(s)),
            "bookkeeping left without a ring"
        );
    }

    /// The device's bookkeeping, run at the start of every command operation and at teardown: the
    /// last steps of the dropped-handle path. A dropped handle's allocation comes back through
    /// its stream's return queue into that stream's manager (which frees its slice, and retires a
    /// page that emptied); here the freed ids leave the failure and cross-stream records (when
    /// either holds anything), and the retired pages go into the stream's drop queue, which
    /// frees them on the device once a fence after their last use passed.
    pub(crate) fn collect(&mut self) {
        // Nothing came back, was freed or retired, and no future left anything since the last
        // look (the usual case between operations): one load, no stream visited.
        if !self.ledger.bookkeeping_due() {
            self.debug_assert_nothing_unrung();
            return;
        }
        // Freed (and rebound) ids matter only to the failure and cross-stream records: with
        // neither holding anything (the usual case) there is nothing to forget, and each manager
        // drops its ids where they are instead of handing them over.
        let forget = !(self.failures.is_empty() && self.foreign_uses.is_empty());
        for s in self.streams.iter_mut().flatten() {
            if forget {
                s.memory.take_freed(&mut self.freed);
            } else {
                s.memory.drop_freed();
            }
            s.queue_retired();
        }
        if forget {
            self.forget_freed();
        }
        // What futures could not wait for while a stream recorded: released after a fence.
        if self.ledger.has_orphans() {
            self.queue_orphans();
        }
    }

    /// Hands what futures left behind while a stream recorded to their streams' drop queues.
    #[cold]
    #[inline(never)]
    fn queue_orphans(&mut self) {
        for orphan in self.ledger.take_orphans() {
            let (stream, buffers, held) = orphan;
            if let Some(Some(s)) = self.streams.get_mut(stream) {
                buffers
                    .into_iter()
                    .for_each(|b| s.drops.push(DropItem::Host(b)));
                held.into_iter()
                    .for_each(|b| s.drops.push(DropItem::Binding(b)));
            } else {
                // Streams are never removed, so an orphan's stream exists; were it gone, nothing
                // could fence what it holds, which is then kept, never freed unfenced.
                debug_assert!(false, "an orphan of stream {stream}, which does not exist");
                core::mem::forget((buffers, held));
            }
        }
    }

    /// The freed ids leave the failure and cross-stream records.
    fn forget_freed(&mut self) {
        for id in self.freed.drain(..) {
            self.failures.forget(id);
            self.foreign_uses.forget(id);
        }
    }
}

impl<S: Shim + Send + Sync + 'static> Device<S>
where
    S::Registration: 'static,
{
    /// `bytes` (a memory-mapped weights file, say) page-locked in place by the device
    /// ([`Shim::host_register`]), so uploads from them run by DMA without a staging copy: the
    /// buffer's origin is [`HostOrigin::Registered`](crate::HostOrigin::Registered). The registration is undone when the buffer
    /// drops, which the drop queue delays until the device is done with it.
    ///
    /// Where the device cannot register them (the shim does not support it, the memory cannot be
    /// locked, the bytes are empty), the bytes come back as an ordinary external buffer with
    /// their own origin, staged as usual; the reason is logged. Nothing is lost either way:
    /// check [`HostBuffer::origin`] to know which path a copy takes.
    ///
    /// While a stream records a graph nothing is registered (the device call is illegal then).
    pub fn register_host(&self, bytes: alloc::boxed::Box<dyn ExternalBytes>) -> HostBuffer {
        if self.recording().is_some() {
            return HostBuffer::external(bytes);
        }
        let slice = bytes.bytes();
        let Some(ptr) = core::ptr::NonNull::new(slice.as_ptr().cast_mut()) else {
            return HostBuffer::external(bytes);
        };
        if slice.is_empty() {
            return HostBuffer::external(bytes);
        }
        match self.shim.host_register(ptr, slice.len()) {
            Ok(registration) => {
                let shim = Arc::clone(&self.shim);
                let unregister = alloc::boxed::Box::new(move || {
                    // SAFETY: the buffer holding this closure drops only once no copy from or to
                    // it is pending (`HostBuffer::registered`'s contract, kept below).
                    unsafe { shim.host_unregister(registration) }
                });
                // SAFETY: `unregister` undoes the registration of exactly `bytes.bytes()` (the
                // trait promises the same slice on every call); host buffers handed to copies
                // travel through the drop queue, which drops them once their fences passed.
                unsafe { HostBuffer::registered(bytes, unregister, self.capture.deferral()) }
            }
            Err(e) => {
                debug!(
                    "devcmd: {} bytes not registered (status {}); uploads from them are staged",
                    slice.len(),
                    e.status
                );
                HostBuffer::external(bytes)
            }
        }
    }
}

impl<S: Shim> Drop for Device<S> {
    fn drop(&mut self) {
        crate::live::retire(self.id);
        // A recording still open is ended and thrown away first: nothing may wait on it.
        self.abort_capture();
        self.capture.release_dropped_graphs();
        self.collect();
        // Every stream first: another stream may still read this one's memory. The sync drains
        // the queue (releasing what it covers) and then waits for work that left nothing in it (a
        // launch, a read), which may still use pages about to be freed.
        let mut all_done = true;
        for (i, s) in self.streams.iter_mut().enumerate() {
            let Some(s) = s else { continue };
            // The staging ring's buffers go with the queue, after the fence that covers them.
            s.ring.retire_into(&mut s.drops);
            let fenced = s.sync(&self.shim);
            // Recorded so a lost device is known below; there is no caller to tell.
            let _ = self.ledger.defer(i, fenced);
            // Done with its memory where the fence completed (over failed work, or the device runs
            // nothing again); not where its end is unknown or its wait refused (the device goes).
            all_done &= fenced.outcome.completed();
        }
        let lost = self.ledger.device_lost().is_some();
        let peers_done = PeerRead::all_done(&mut self.peer_reads);
        if !peers_done || !(all_done || lost) {
            warn!(
                "teardown: a stream could not be drained or a copy to another device may still \
                 read this one: leaking the device's memory, and its shim with it"
            );
            // Kept for good with the memory: on CUDA the last reference to a context releases
            // it, and its memory with it, under the work that may still use that memory.
            core::mem::forget(Arc::clone(&self.shim));
            for s in self.streams.iter_mut().flatten() {
                s.memory.forget_all();
                // A peer's copy of unknown end reads device memory, never these host pages:
                // where every stream of this device drained, they go as usual.
                if all_done || lost {
                    s.pinned.cleanup(&self.shim);
                }
            }
            return;
        }
        for s in self.streams.iter_mut().flatten() {
            if lost {
                // Nothing will run again: what the queues still hold can go.
                s.drops.release_all(&self.shim);
            }
            // SAFETY: every stream of the device was drained and synchronised above (or the
            // device is lost and runs nothing), so no work can use any page.
            unsafe { s.memory.release_all(&self.shim) };
            s.pinned.cleanup(&self.shim);
        }
    }
}
