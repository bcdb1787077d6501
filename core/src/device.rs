//! The device: owner of the streams and of the device-wide state; hands out commands.
//!
//! Owns the shim, the streams (created on first use), the memory budget shared by their
//! managers, the failure records, whether the device is lost and which streams ran failed work
//! (and so which streams ordered after them cannot be trusted either). Resolves the order between
//! streams when a command uses memory another stream owns. Does not own the operations
//! themselves (`command.rs`).

use crate::command::Command;
use crate::copy::StagingPolicy;
use crate::drop_queue::{DropItem, DropPolicy, DropQueue, DropStats};
use crate::error::{DriverError, Fault, IoError, ServerError, Validation};
use crate::failure::Failures;
use crate::memory::ReadableBytes;
use crate::memory::{AsBinding, Issuer, MemoryBudget, MemoryConfig, MemoryManager, MemoryReport};
use crate::pinned::{PinnedConfig, PinnedPool};
use crate::shim::{DeviceFacts, Shim};
use crate::stream::{Stream, StreamId};
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicU32, Ordering};
use hashbrown::HashMap;

static NEXT_DEVICE: AtomicU32 = AtomicU32::new(1);

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
        }
    }
}

#[derive(Debug, Default)]
struct FaultState {
    device: Option<DriverError>,
    /// Per stream: the fault of its own work that ran, if any.
    streams: Vec<Option<DriverError>>,
    /// Per stream: the streams it was ever ordered after (a device-side wait), so a fault found
    /// later on one of those reaches it too.
    waited_on: Vec<Vec<usize>>,
}

/// Whether the device is lost, and which streams' work failed while it ran: shared with the
/// futures of reads and syncs, which may be the ones to find out.
#[derive(Debug, Clone, Default)]
pub(crate) struct Poison(Arc<spin::Mutex<FaultState>>);

impl Poison {
    /// The fault that lost the device, if any.
    pub fn get(&self) -> Option<DriverError> {
        self.0.lock().device
    }

    /// The fault that made `stream`'s work untrustworthy, if any: its own, or that of a stream
    /// it was ordered after, directly or through others (what that stream wrote may have been
    /// read). Returns the faulted stream with its fault.
    pub fn stream_fault(&self, stream: usize) -> Option<(usize, DriverError)> {
        let s = self.0.lock();
        if s.streams.iter().all(Option::is_none) {
            return None;
        }
        let mut seen: Vec<usize> = Vec::new();
        let mut todo: Vec<usize> = alloc::vec![stream];
        while let Some(x) = todo.pop() {
            if seen.contains(&x) {
                continue;
            }
            seen.push(x);
            if let Some(Some(e)) = s.streams.get(x) {
                return Some((x, *e));
            }
            if let Some(deps) = s.waited_on.get(x) {
                todo.extend(deps.iter().copied());
            }
        }
        None
    }

    /// Records that `stream` was ordered after `other` on the device.
    pub fn waited(&self, stream: usize, other: usize) {
        let mut s = self.0.lock();
        if s.waited_on.len() <= stream {
            s.waited_on.resize_with(stream + 1, Vec::new);
        }
        if !s.waited_on[stream].contains(&other) {
            s.waited_on[stream].push(other);
        }
    }

    /// Records `e` if it poisons the device.
    pub fn note(&self, e: &DriverError) {
        if e.loses_device() {
            self.0.lock().device.get_or_insert(*e);
        }
    }

    /// Records `e`, seen on `stream`: a poisoning fault loses the device; a fault of work that
    /// ran ([`Fault::WorkFailed`]) taints the stream for good.
    pub fn note_at(&self, stream: usize, e: &DriverError) {
        let mut s = self.0.lock();
        if e.loses_device() {
            s.device.get_or_insert(*e);
        } else if e.fault == Fault::WorkFailed {
            if s.streams.len() <= stream {
                s.streams.resize(stream + 1, None);
            }
            s.streams[stream].get_or_insert(*e);
        }
    }
}

/// The memory report of a whole device: one report per stream created. Device memory and
/// pinned host memory are kept apart, in the totals as in each stream's report.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceReport {
    /// Per stream: its id and the figures of its pools (its device pools, then its pinned host
    /// pool; [`MemoryReport::device`] and [`MemoryReport::pinned_host`] total them apart).
    pub streams: Vec<(StreamId, MemoryReport)>,
    /// Bytes of device pages held on the device: in the pools, retired and waiting for a fence in
    /// a drop queue, or leaked after an inconclusive fence (the budget's count). Host memory is
    /// never counted here.
    pub held: u64,
    /// The device's budget, if any (it bounds `held`, not pinned host memory).
    pub budget: Option<u64>,
    /// Bytes of pinned host pages held by every stream's pinned pool.
    pub pinned_host: u64,
}

impl core::fmt::Display for DeviceReport {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        for (id, report) in &self.streams {
            writeln!(f, "stream {}:", id.0)?;
            writeln!(f, "{report}")?;
        }
        write!(f, "device pages held: {}", ReadableBytes(self.held))?;
        if let Some(b) = self.budget {
            write!(f, " of a {} budget", ReadableBytes(b))?;
        }
        write!(
            f,
            "\npinned host pages held: {}",
            ReadableBytes(self.pinned_host)
        )
    }
}

/// A device: the shim, its streams and the device-wide state. Driven by one thread at a time;
/// wrap it in a `spin::Mutex` to share it.
#[derive(Debug)]
pub struct Device<S: Shim> {
    pub(crate) shim: Arc<S>,
    pub(crate) id: u32,
    pub(crate) facts: DeviceFacts,
    pub(crate) config: DeviceConfig,
    pub(crate) budget: MemoryBudget,
    /// Boxed: a stream's state is kilobytes, and the vector grows as streams are first used.
    pub(crate) streams: Vec<Option<alloc::boxed::Box<Stream<S>>>>,
    pub(crate) failures: Failures,
    pub(crate) poison: Poison,
    /// Scratch for freed allocation ids.
    pub(crate) freed: Vec<u64>,
    /// Allocations used by streams other than their owner: which streams, at which cursor. A
    /// later use on any other stream waits for those; entries go when the allocation is freed.
    pub(crate) foreign_uses: HashMap<u64, Vec<(usize, u64)>>,
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
            id: NEXT_DEVICE.fetch_add(1, Ordering::Relaxed),
            facts,
            config,
            budget: MemoryBudget::new(limit),
            streams: Vec::new(),
            failures: Failures::default(),
            poison: Poison::default(),
            freed: Vec::new(),
            foreign_uses: HashMap::new(),
        }
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

    /// A command on `stream` (created on first use).
    ///
    /// Cross-stream order is resolved by each operation for the handles it uses: an operation on
    /// memory another stream owns (or used) first makes this stream wait, on the device, for that
    /// stream's work, and keeps the memory alive until this stream's work on it passed a fence.
    ///
    /// # Errors
    ///
    /// [`ServerError::DeviceLost`]; a stream index past the limit; the shim's refusal to create
    /// the stream.
    pub fn command(&mut self, stream: StreamId) -> Result<Command<'_, S>, ServerError> {
        if let Some(cause) = self.poison.get() {
            return Err(ServerError::DeviceLost { cause });
        }
        let index = self.ensure_stream(stream)?;
        // The command's work is issued at the new cursor: uses recorded by its operations carry
        // it, so a later waiter on this stream waits for this command's work, not only what came
        // before.
        if let Some(s) = self.streams[index].as_mut() {
            s.cursor += 1;
        }
        Ok(Command::new(self, index))
    }

    pub(crate) fn ensure_stream(&mut self, stream: StreamId) -> Result<usize, ServerError> {
        // Handle ids carry the stream in their top 16 bits: at most 65 536 streams.
        let max = self.config.max_streams.min(1 << 16);
        if stream.0 >= max {
            return Err(Validation::StreamOutOfRange {
                stream: stream.0,
                max,
            }
            .into());
        }
        let index = stream.0 as usize;
        if self.streams.len() <= index {
            self.streams.resize_with(index + 1, || None);
        }
        if self.streams[index].is_none() {
            let raw = self
                .shim
                .create_stream()
                .inspect_err(|e| self.poison.note(e))?;
            let issuer = Issuer {
                device: self.id,
                stream: stream.0,
            };
            let memory_config = self.config.memory;
            let mut memory =
                MemoryManager::new(&self.facts, memory_config, issuer, self.budget.clone());
            memory.track_frees();
            self.streams[index] = Some(alloc::boxed::Box::new(Stream {
                raw,
                memory,
                pinned: PinnedPool::new(self.config.pinned),
                drops: DropQueue::new(self.config.drops),
                capture: Default::default(),
                cursor: 0,
                synced: Vec::new(),
                fault: None,
            }));
        }
        Ok(index)
    }

    /// Orders stream `current` after the owner of `binding`, if another stream owns it.
    pub(crate) fn order_after(
        &mut self,
        current: usize,
        binding: &impl AsBinding,
    ) -> Result<(), ServerError> {
        let b = binding.as_binding();
        let issuer = b.issuer();
        if issuer.device != self.id {
            return Err(IoError::ForeignHandle {
                issued_by: issuer.device,
                used_on: self.id,
            }
            .into());
        }
        let owner = issuer.stream as usize;
        let Some(owner_cursor) = self
            .streams
            .get(owner)
            .and_then(Option::as_ref)
            .map(|s| s.cursor)
        else {
            return Err(IoError::NotFound {
                handle: b.id(),
                reason: crate::error::NotFoundReason::Stale,
            }
            .into());
        };
        // Resolve first: a handle that names no memory must leave no trace (no wait, no
        // keep-alive, no record of a use).
        if let Some(o) = self.streams[owner].as_ref() {
            o.memory.resolve(binding)?;
        }
        if let Some((stream, cause)) = self.poison.stream_fault(owner) {
            return Err(ServerError::StreamFaulted {
                stream: stream as u32,
                cause,
            });
        }
        let id = b.id();
        if owner != current {
            self.wait_for(current, owner, owner_cursor)?;
            let cursor = self.streams[current].as_ref().map_or(0, |s| s.cursor);
            let uses = self.foreign_uses.entry(id).or_default();
            match uses.iter_mut().find(|u| u.0 == current) {
                Some(u) => u.1 = cursor,
                None => uses.push((current, cursor)),
            }
            let c = self.streams[current].as_mut().expect("current exists");
            c.drops.push(DropItem::Binding(binding_of(binding)));
        }
        // Other streams that used this allocation (a kernel on another stream may have written
        // it): order after their work too, or this use could overtake theirs.
        if let Some(uses) = self.foreign_uses.get(&id) {
            let waits: Vec<(usize, u64)> = uses
                .iter()
                .copied()
                .filter(|&(user, _)| user != current && user != owner)
                .collect();
            for (user, used_at) in waits {
                self.wait_for(current, user, used_at)?;
            }
            if current == owner {
                // The owner has waited for every foreign use: later owner uses need no wait.
                self.foreign_uses.remove(&id);
            }
        }
        Ok(())
    }

    /// Makes stream `current` wait on the device for the work stream `other` issued up to
    /// cursor `other_cursor`, unless it already did.
    fn wait_for(
        &mut self,
        current: usize,
        other: usize,
        other_cursor: u64,
    ) -> Result<(), ServerError> {
        // Work ordered after a stream whose work failed would read what it left unwritten.
        if let Some((stream, cause)) = self.poison.stream_fault(other) {
            return Err(ServerError::StreamFaulted {
                stream: stream as u32,
                cause,
            });
        }
        let synced = self.streams[current]
            .as_ref()
            .and_then(|s| s.synced.get(other).copied())
            .unwrap_or(0);
        if other_cursor > synced {
            let event = {
                let o = self.streams[other].as_ref().expect("checked by the caller");
                self.shim
                    .record_event(&o.raw)
                    .inspect_err(|e| self.poison.note_at(other, e))?
            };
            let c = self.streams[current].as_mut().expect("current exists");
            self.shim
                .stream_wait_event(&c.raw, &event)
                .inspect_err(|e| self.poison.note_at(current, e))?;
            if c.synced.len() <= other {
                c.synced.resize(other + 1, 0);
            }
            c.synced[other] = other_cursor;
            self.poison.waited(current, other);
        }
        Ok(())
    }

    /// The memory report of every stream; device and pinned host memory are totalled apart.
    pub fn memory_report(&mut self) -> DeviceReport {
        let mut streams = Vec::new();
        let mut pinned_host = 0;
        for (i, s) in self.streams.iter_mut().enumerate() {
            if let Some(s) = s {
                let mut report = s.memory.report();
                report.pools.push(s.pinned.report());
                pinned_host += report.pinned_host().reserved;
                streams.push((StreamId(i as u32), report));
            }
        }
        DeviceReport {
            streams,
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

    /// Moves freed allocation ids into the failure records and retired pages into drop queues.
    pub(crate) fn settle(&mut self) {
        for s in self.streams.iter_mut().flatten() {
            s.memory.take_freed(&mut self.freed);
            s.queue_retired();
        }
        if self.failures.is_empty() && self.foreign_uses.is_empty() {
            self.freed.clear();
            return;
        }
        for id in self.freed.drain(..) {
            self.failures.forget(id);
            self.foreign_uses.remove(&id);
        }
    }
}

fn binding_of(b: &impl AsBinding) -> crate::memory::Binding {
    b.as_binding().to_binding()
}

impl<S: Shim> Drop for Device<S> {
    fn drop(&mut self) {
        let poison = self.poison.clone();
        // Every stream first: another stream may still read this one's memory. The drain
        // releases what the queue covers; the sync covers work that left nothing in it (a
        // launch, a read), which may still use pages about to be freed. A fault of work that ran
        // still means the fence completed: the stream is done with its memory.
        let mut all_done = true;
        for (i, s) in self.streams.iter_mut().enumerate() {
            let Some(s) = s else { continue };
            let synced = s.drain_noting(&self.shim, &poison, i).and_then(|()| {
                s.sync(&self.shim).or_else(|e| {
                    poison.note_at(i, &e);
                    // The fence completed over failed work: the stream is done all the same.
                    if e.fault == Fault::WorkFailed {
                        Ok(())
                    } else {
                        Err(e)
                    }
                })
            });
            all_done &= synced.is_ok();
        }
        let poisoned = poison.get().is_some();
        if !(all_done || poisoned) {
            warn!("a stream could not be drained at teardown: leaking the device's memory");
            for s in self.streams.iter_mut().flatten() {
                s.memory.forget_all();
            }
            return;
        }
        for s in self.streams.iter_mut().flatten() {
            if poisoned {
                // Nothing will run again: what the queues still hold can go.
                s.drops.release_all(&self.shim);
            }
            // SAFETY: every stream of the device was drained and synchronised above (or the
            // device is poisoned and runs nothing), so no work can use any page.
            unsafe { s.memory.release_all(&self.shim) };
            s.pinned.cleanup(&self.shim);
        }
    }
}
