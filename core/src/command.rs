//! One unit of work against the device: every operation that touches memory or launches goes
//! through a [`Command`], so every policy rule is written once.
//!
//! Owns the operations: reservation with reclaim-and-retry, binding, host buffers and staging,
//! uploads, reads, launches, the failure rule, cleanup and flushing. Does not own ordering across
//! streams (resolved by [`Device::command`] before a command exists, and again for each handle an
//! operation uses) nor the pools (`memory/`).

use crate::copy::{CopyLayout, Staging};
use crate::device::{Device, DeviceReport, Poison};
use crate::drop_queue::DropItem;
use crate::error::{DriverError, IoError, LaunchError, ServerError, Validation};
use crate::host::HostBuffer;
use crate::memory::{AllocationMode, AsBinding, Binding, Cleanup, Handle, PageUpdate, Resolved};
use crate::shim::{DeviceSpan, Grid, Shim};
use crate::stream::{Stream, StreamId};
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};

/// A kernel launch: the kernel, a name for failure reports, the grid, the buffers it reads and
/// writes, and its scalar arguments. The shim receives the inputs' spans then the outputs'.
#[derive(Debug)]
pub struct Launch<'a, S: Shim> {
    /// The loaded kernel.
    pub kernel: &'a S::Kernel,
    /// Its name, carried in failure chains.
    pub name: &'static str,
    /// The grid.
    pub grid: Grid,
    /// Buffers it reads.
    pub inputs: &'a [&'a Handle],
    /// Buffers it writes.
    pub outputs: &'a [&'a Handle],
    /// Scalar arguments, passed through.
    pub args: &'a S::Args,
}

/// A device range resolved for a caller outside the layer, with the binding that keeps the
/// allocation alive (and unmoved) while this value lives.
#[derive(Debug, Clone)]
pub struct ManagedResource {
    /// The range.
    pub resource: Resolved,
    binding: Binding,
}

impl ManagedResource {
    /// The binding held.
    pub fn binding(&self) -> &Binding {
        &self.binding
    }
}

/// One read of a [`Command::read_async`]: a handle's view copied to the host with a layout.
#[derive(Debug, Clone, Copy)]
pub struct ReadRequest<'a> {
    /// The memory to read.
    pub handle: &'a Handle,
    /// Its device-side layout (the host side is packed).
    pub layout: CopyLayout,
}

impl<'a> ReadRequest<'a> {
    /// The whole view of `handle`, packed.
    pub fn whole(handle: &'a Handle) -> Self {
        Self {
            handle,
            layout: CopyLayout::linear(handle.len()),
        }
    }
}

/// One unit of work on one stream of a device. See the module documentation.
#[derive(Debug)]
pub struct Command<'a, S: Shim> {
    device: &'a mut Device<S>,
    stream: usize,
}

impl<'a, S: Shim> Command<'a, S> {
    pub(crate) fn new(device: &'a mut Device<S>, stream: usize) -> Self {
        Self { device, stream }
    }

    fn current(&mut self) -> &mut Stream<S> {
        self.device.streams[self.stream]
            .as_mut()
            .expect("a command's stream exists")
    }

    /// Fails fast when the device is lost or this stream's work failed while it ran.
    fn check_poisoned(&self) -> Result<(), ServerError> {
        if let Some(cause) = self.device.poison.get() {
            return Err(ServerError::DeviceLost { cause });
        }
        match self.device.poison.stream_fault(self.stream) {
            Some((stream, cause)) => Err(ServerError::StreamFaulted {
                stream: stream as u32,
                cause,
            }),
            None => Ok(()),
        }
    }

    /// Records a poisoning fault; returns the error for `?`.
    fn note(&self, e: DriverError) -> DriverError {
        self.device.poison.note_at(self.stream, &e);
        e
    }

    /// The stream this command runs on.
    pub fn stream_id(&self) -> StreamId {
        StreamId(self.stream as u32)
    }

    /// The stream's cursor: commands issued on it so far.
    pub fn cursor(&self) -> u64 {
        self.device.streams[self.stream]
            .as_ref()
            .map_or(0, |s| s.cursor)
    }

    fn page_update(&self) -> PageUpdate {
        let another =
            self.device.streams.iter().enumerate().any(|(i, s)| {
                i != self.stream && s.as_ref().is_some_and(|s| s.capture.is_recording())
            });
        let own = &self.device.streams[self.stream]
            .as_ref()
            .expect("exists")
            .capture;
        own.page_update(another)
    }

    fn any_recording(&self) -> bool {
        self.device
            .streams
            .iter()
            .flatten()
            .any(|s| s.capture.is_recording())
    }

    /// The device range `handle` names, resolved on the stream that owns it.
    ///
    /// # Errors
    ///
    /// [`IoError::ForeignHandle`], [`IoError::NotFound`], [`IoError::OutOfRange`].
    pub fn resource(&mut self, handle: &impl AsBinding) -> Result<Resolved, IoError> {
        let b = handle.as_binding();
        let issuer = b.issuer();
        if issuer.device != self.device.id {
            return Err(IoError::ForeignHandle {
                issued_by: issuer.device,
                used_on: self.device.id,
            });
        }
        match self
            .device
            .streams
            .get(issuer.stream as usize)
            .and_then(Option::as_ref)
        {
            Some(owner) => owner.memory.resolve(handle),
            None => Err(IoError::NotFound {
                handle: b.id(),
                reason: crate::error::NotFoundReason::Stale,
            }),
        }
    }

    /// The device range of `handle` with a binding that keeps it alive for a caller outside the
    /// layer.
    ///
    /// # Errors
    ///
    /// As [`Self::resource`].
    pub fn managed_resource(&mut self, handle: &Handle) -> Result<ManagedResource, IoError> {
        let resource = self.resource(handle)?;
        Ok(ManagedResource {
            resource,
            binding: handle.binding(),
        })
    }

    /// The memory report of the whole device (every stream, pinned pools included).
    pub fn memory_report(&mut self) -> DeviceReport {
        self.device.settle();
        self.device.memory_report()
    }

    /// Opens (`Persistent`, `Dedicated`) or closes (`Auto`) an allocation-mode window on this
    /// stream.
    pub fn allocation_mode(&mut self, mode: AllocationMode) {
        self.current().memory.set_mode(mode);
    }

    /// Flushes this stream's drop queue (unless it records).
    ///
    /// # Errors
    ///
    /// The fence's failure (see the drop queue).
    pub fn flush_drops(&mut self) -> Result<(), ServerError> {
        self.device.settle();
        let shim = Arc::clone(&self.device.shim);
        let stream = self.stream;
        self.current()
            .flush(&shim)
            .map_err(|e| Self::fence_error(stream, self.note(e)))
    }

    /// Releases what this stream's drop queue holds whose fence has passed, without blocking.
    /// Returns whether nothing is left pending.
    ///
    /// # Errors
    ///
    /// A device fault the poll reveals.
    pub fn poll_drops(&mut self) -> Result<bool, ServerError> {
        let shim = Arc::clone(&self.device.shim);
        let stream = self.stream;
        self.current()
            .drops
            .poll(&shim)
            .map_err(|e| Self::fence_error(stream, self.note(e)))
    }

    /// Drains the drop queue, releases every empty page of this stream's pools and its pinned
    /// pool. Refused while any stream records.
    ///
    /// # Errors
    ///
    /// [`Validation::Recording`], a fence's failure.
    pub fn memory_cleanup(&mut self) -> Result<(), ServerError> {
        self.check_poisoned()?;
        if self.any_recording() {
            return Err(Validation::Recording {
                op: "memory_cleanup",
            }
            .into());
        }
        self.cleanup_stream(self.stream)
            .map_err(|e| Self::fence_error(self.stream, e))
    }

    fn cleanup_stream(&mut self, index: usize) -> Result<(), DriverError> {
        self.device.settle();
        let shim = Arc::clone(&self.device.shim);
        let poison = self.device.poison.clone();
        let Some(s) = self.device.streams[index].as_mut() else {
            return Ok(());
        };
        s.drain_noting(&shim, &poison, index)?;
        s.memory.cleanup(&shim, Cleanup::Explicit);
        self.device.settle();
        let s = self.device.streams[index].as_mut().expect("exists");
        s.drain_noting(&shim, &poison, index)?;
        s.pinned.cleanup(&shim);
        Ok(())
    }

    /// The caller's error for a fault a fence of `stream` revealed.
    fn fence_error(stream: usize, e: DriverError) -> ServerError {
        if e.fault == crate::error::Fault::WorkFailed {
            ServerError::StreamFaulted {
                stream: stream as u32,
                cause: e,
            }
        } else {
            e.into()
        }
    }

    /// Makes room on every stream of the device: drains their queues, releases their empty pages.
    /// Another stream's fault does not fail this stream's reservation: it stays with that stream
    /// (its next read or sync reports it), unless the device is lost.
    fn make_room(&mut self) -> Result<(), ServerError> {
        for i in 0..self.device.streams.len() {
            if self.device.streams[i].is_none() {
                continue;
            }
            match self.cleanup_stream(i) {
                Ok(()) => {}
                Err(e) if i == self.stream || e.loses_device() => {
                    return Err(Self::fence_error(i, e));
                }
                Err(e) => {
                    if e.fault != crate::error::Fault::WorkFailed
                        && let Some(s) = self.device.streams[i].as_mut()
                    {
                        s.fault.get_or_insert(e);
                    }
                }
            }
        }
        Ok(())
    }

    /// Reserves `size` bytes on this stream. A failure that reclaiming might cure, on a
    /// reservation that may change the pages, makes room on every stream once and retries once.
    ///
    /// # Errors
    ///
    /// The second failure, or the first when reclaim cannot help (see
    /// [`IoError::may_succeed_after_reclaim`]).
    pub fn reserve(&mut self, size: u64) -> Result<Handle, ServerError> {
        self.check_poisoned()?;
        let update = self.page_update();
        let shim = Arc::clone(&self.device.shim);
        let first = self.current().memory.try_reserve(&shim, size, update);
        let result = match first {
            Err(e)
                if update == PageUpdate::Allow
                    && e.may_succeed_after_reclaim()
                    && !e.is_device_lost() =>
            {
                debug!(
                    "reserve of {} bytes failed; making room on every stream",
                    size
                );
                self.make_room()?;
                self.current().memory.try_reserve(&shim, size, update)
            }
            other => other,
        };
        self.device.settle();
        result.map_err(|e| {
            if let Some(cause) = e.driver_error() {
                self.device.poison.note(cause);
            }
            e.into()
        })
    }

    /// An allocation of `size` bytes, stamped with this stream's cursor.
    ///
    /// # Errors
    ///
    /// As [`Self::reserve`].
    pub fn empty(&mut self, size: u64) -> Result<Handle, ServerError> {
        let handle = self.reserve(size)?;
        let cursor = self.cursor();
        self.current().memory.stamp(&handle, cursor)?;
        Ok(handle)
    }

    /// A handle of `size` bytes with no memory yet; [`Self::initialize`] gives it some.
    pub fn lazy(&mut self, size: u64) -> Handle {
        self.current().memory.lazy_handle(size)
    }

    /// Gives the room of `reserved` (from [`Self::reserve`]) to `handle`.
    ///
    /// # Errors
    ///
    /// As [`crate::memory::MemoryManager::bind`].
    pub fn bind(&mut self, reserved: Handle, handle: &Handle) -> Result<(), ServerError> {
        self.check_poisoned()?;
        let cursor = self.cursor();
        self.current().memory.bind(reserved, handle, cursor)?;
        self.device.settle();
        Ok(())
    }

    /// Gives memory to a lazy handle.
    ///
    /// # Errors
    ///
    /// As [`Self::reserve`] and [`Self::bind`].
    pub fn initialize(&mut self, handle: &Handle) -> Result<(), ServerError> {
        let reserved = self.reserve(handle.allocation_size())?;
        self.bind(reserved, handle)
    }

    /// `len` bytes of host memory for copies: pinned when asked and the pool can serve it,
    /// otherwise (and always while this stream records) the heap.
    pub fn reserve_host(&mut self, len: usize, pinned: bool) -> HostBuffer {
        let update = self.page_update();
        let shim = Arc::clone(&self.device.shim);
        let s = self.current();
        let buffer = if pinned && !s.capture.is_recording() {
            s.pinned
                .reserve(&shim, len, update != PageUpdate::Forbidden)
        } else {
            None
        };
        buffer.unwrap_or_else(|| HostBuffer::zeroed(len))
    }

    /// Uploads `data` into the whole view of `handle` (packed).
    ///
    /// # Errors
    ///
    /// As [`Self::write_layout`].
    pub fn write(&mut self, handle: &Handle, data: HostBuffer) -> Result<(), ServerError> {
        let layout = CopyLayout::linear(data.len() as u64);
        self.write_layout(handle, data, layout)
    }

    /// Uploads `data` (packed rows) into `handle`'s view with the device-side `layout`, staging
    /// it through pinned memory when the staging rules say so. The bytes are released once the
    /// device is done with them.
    ///
    /// # Errors
    ///
    /// [`Validation::LengthMismatch`], [`Validation::LayoutPastView`], a handle that does not
    /// resolve, the shim's refusal (the range is then marked failed).
    pub fn write_layout(
        &mut self,
        handle: &Handle,
        data: HostBuffer,
        layout: CopyLayout,
    ) -> Result<(), ServerError> {
        let Some(r) = self.copy_target(handle, layout, data.len())? else {
            return Ok(());
        };
        let staging = Staging::of(
            layout.packed_bytes(),
            data.origin(),
            &self.device.config.staging,
        );
        let source = if staging.through_pinned {
            let mut staged = self.reserve_host(data.len(), true);
            staged.as_mut_slice().copy_from_slice(data.as_slice());
            staged
        } else {
            data
        };
        let shim = Arc::clone(&self.device.shim);
        let s = self.current();
        // SAFETY: `source` stays alive and unchanged in the drop queue until a fence after this
        // copy passes; `r` is a live range of `r.len >= device_span` bytes in one page.
        let copied = unsafe { shim.copy_to_device(&s.raw, source.as_ptr(), r.addr, layout) };
        if let Err(e) = copied {
            let e = self.note(e);
            let error: ServerError = e.into();
            let f = self.device.failures.new_failure(error.clone());
            for (start, end) in rows(handle, layout) {
                self.device.failures.mark(handle.id(), start, end, f);
            }
            self.device.failures.prune(f);
            return Err(error);
        }
        if !self.device.failures.is_empty() {
            // Only the rows were written: marks on the padding between them stay.
            for (start, end) in rows(handle, layout) {
                self.device.failures.written(handle.id(), start, end);
            }
        }
        let s = self.current();
        s.drops.push(DropItem::Host(source));
        if staging.flush_after || s.drops.should_flush() {
            self.flush_after_enqueue(&shim)?;
        }
        Ok(())
    }

    /// The checks every copy makes, then the device range it targets, ordered after other
    /// streams' use: `None` for an empty copy (nothing to do, nothing checked but the length).
    fn copy_target(
        &mut self,
        handle: &Handle,
        layout: CopyLayout,
        host_len: usize,
    ) -> Result<Option<Resolved>, ServerError> {
        self.check_poisoned()?;
        let expected = layout.packed_bytes();
        if host_len as u64 != expected {
            return Err(Validation::LengthMismatch {
                expected,
                found: host_len as u64,
            }
            .into());
        }
        if expected == 0 {
            return Ok(None);
        }
        self.device.order_after(self.stream, handle)?;
        let r = self.resource(handle)?;
        if layout.device_span() > r.len {
            return Err(Validation::LayoutPastView {
                span: layout.device_span(),
                view: r.len,
            }
            .into());
        }
        Ok(Some(r))
    }

    /// Flushes the drop queue after an enqueue that asked for it. The enqueue itself succeeded: a
    /// fault the flush's fence reveals belongs to earlier work, so it does not fail this call. A
    /// fault of work that ran taints the stream (its next operation fails with it); a wait of
    /// unknown outcome is kept for the next `read_async` or `sync` on this stream (where the
    /// design says asynchronous faults surface). A poisoning fault is returned at once.
    fn flush_after_enqueue(&mut self, shim: &S) -> Result<(), ServerError> {
        match self.current().flush(shim) {
            Ok(()) => Ok(()),
            Err(e) if e.loses_device() => Err(self.note(e).into()),
            // The stream is now tainted: its next operation fails with the fault.
            Err(e) if e.fault == crate::error::Fault::WorkFailed => {
                self.note(e);
                Ok(())
            }
            Err(e) => {
                self.current().fault.get_or_insert(e);
                Ok(())
            }
        }
    }

    /// Returns (once) a fault an earlier internal flush revealed on this stream.
    fn take_pending_fault(&mut self) -> Result<(), ServerError> {
        match self.current().fault.take() {
            Some(e) => Err(ServerError::Device(e)),
            None => Ok(()),
        }
    }

    /// Uploads borrowed bytes into the whole view of `handle`: they are copied into a staging
    /// buffer (pinned when the pool can serve it) before this returns, so `data` is free to reuse.
    ///
    /// # Errors
    ///
    /// As [`Self::write_layout`].
    pub fn write_from(&mut self, handle: &Handle, data: &[u8]) -> Result<(), ServerError> {
        let mut staged = self.reserve_host(data.len(), true);
        staged.as_mut_slice().copy_from_slice(data);
        self.write(handle, staged)
    }

    /// A new allocation holding a copy of `data`.
    ///
    /// # Errors
    ///
    /// As [`Self::empty`] and [`Self::write`].
    pub fn create(&mut self, data: &[u8]) -> Result<Handle, ServerError> {
        let handle = self.empty(data.len() as u64)?;
        self.write_from(&handle, data)?;
        Ok(handle)
    }

    /// Enqueues a copy of `handle`'s view into `dst` (device to host). The caller must keep
    /// `dst` until a fence after this passes ([`Self::sync`]): the drop queue cannot, because the
    /// caller reads it afterwards.
    ///
    /// # Errors
    ///
    /// A read of failed bytes ([`ServerError::Unwritten`]), a handle that does not resolve, a
    /// length mismatch, a read-only destination, the shim's refusal.
    ///
    /// # Safety
    ///
    /// `dst` is neither dropped nor accessed until a fence recorded after this call completes.
    pub unsafe fn read_into(
        &mut self,
        request: ReadRequest<'_>,
        dst: &mut HostBuffer,
    ) -> Result<(), ServerError> {
        let ReadRequest { handle, layout } = request;
        if !dst.is_empty() && dst.as_mut_slice().is_empty() {
            return Err(Validation::ReadOnlyDestination.into());
        }
        let Some(r) = self.copy_target(handle, layout, dst.len())? else {
            return Ok(());
        };
        if !self.device.failures.is_empty() {
            // Only the rows are read: a mark on the padding between them does not matter.
            let failed = rows(handle, layout)
                .find_map(|(start, end)| self.device.failures.failure(handle.id(), start, end));
            if let Some(f) = failed {
                return Err(self.device.failures.report(f, handle.id()));
            }
        }
        let shim = Arc::clone(&self.device.shim);
        let s = self.current();
        // SAFETY: the caller keeps `dst` untouched until a later fence; `r` is a live range.
        unsafe { shim.copy_to_host(&s.raw, r.addr, dst.as_mut_ptr(), layout) }
            .map_err(|e| self.note(e).into())
    }

    /// Reads every request back to the host. The copies are enqueued now, then one fence; the
    /// future resolves once it passes. If a copy fails after others were enqueued, this waits
    /// for those before their buffers are dropped (and leaks them if the wait is inconclusive).
    ///
    /// # Errors
    ///
    /// The failure of any request (a read of failed bytes is [`ServerError::Unwritten`]).
    pub fn read_async(
        &mut self,
        requests: &[ReadRequest<'_>],
    ) -> Result<ReadFuture<S>, ServerError> {
        self.check_poisoned()?;
        self.take_pending_fault()?;
        let mut buffers: Vec<HostBuffer> = Vec::with_capacity(requests.len());
        let mut held: Vec<Binding> = Vec::with_capacity(requests.len());
        let mut failed = None;
        for req in requests {
            let mut buffer = self.reserve_host(req.layout.packed_bytes() as usize, true);
            // SAFETY: `buffer` moves into `buffers` (its heap address does not change) and is
            // neither read nor dropped before the fence below passed (or the wait in the error
            // path returned).
            match unsafe { self.read_into(*req, &mut buffer) } {
                Ok(()) => {
                    buffers.push(buffer);
                    held.push(req.handle.binding());
                }
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        let shim = Arc::clone(&self.device.shim);
        if let Some(e) = failed {
            if !buffers.is_empty() {
                let raw = &self.current().raw;
                let waited = shim.record_event(raw).and_then(|ev| shim.event_wait(&ev));
                if let Err(w) = waited {
                    self.note(w);
                    if !w.loses_device() && w.fault != crate::error::Fault::WorkFailed {
                        warn!(
                            "a partial read could not be waited for: leaking {} buffers",
                            buffers.len()
                        );
                        core::mem::forget((buffers, held));
                    }
                }
            }
            return Err(e);
        }
        let raw = &self.current().raw;
        let event = match shim.record_event(raw) {
            Ok(ev) => ev,
            Err(e) => {
                // No fence covers the copies: completion is unknown, so the buffers are leaked
                // unless the device is lost.
                let e = self.note(e);
                if !e.loses_device() {
                    core::mem::forget((buffers, held));
                }
                return Err(e.into());
            }
        };
        Ok(ReadFuture {
            shim,
            event: Some(event),
            buffers,
            held,
            watch: Watch {
                poison: self.device.poison.clone(),
                stream: self.stream,
            },
        })
    }

    /// A future that resolves once everything enqueued on this stream so far has run.
    ///
    /// # Errors
    ///
    /// The shim's refusal to record the fence.
    pub fn sync(&mut self) -> Result<SyncFuture<S>, ServerError> {
        self.check_poisoned()?;
        self.take_pending_fault()?;
        if self.current().capture.is_recording() {
            return Err(Validation::Recording { op: "sync" }.into());
        }
        let shim = Arc::clone(&self.device.shim);
        let event = shim
            .record_event(&self.current().raw)
            .map_err(|e| self.note(e))?;
        Ok(SyncFuture {
            shim,
            event: Some(event),
            watch: Watch {
                poison: self.device.poison.clone(),
                stream: self.stream,
            },
        })
    }

    /// Launches a kernel. If an input carries a failure, the launch is skipped and its outputs
    /// carry the same failure; if the shim refuses it, its outputs carry the refusal. Flushes the
    /// drop queue when it is over its policy.
    ///
    /// # Errors
    ///
    /// [`ServerError::Skipped`], [`ServerError::Launch`], [`ServerError::DeviceLost`].
    pub fn launch(&mut self, launch: Launch<'_, S>) -> Result<(), ServerError> {
        self.check_poisoned()?;
        let Launch {
            kernel,
            name,
            grid,
            inputs,
            outputs,
            args,
        } = launch;
        let mut spans = Vec::with_capacity(inputs.len() + outputs.len());
        for (index, h) in inputs.iter().chain(outputs.iter()).enumerate() {
            self.device.order_after(self.stream, *h)?;
            let r = self.resource(*h).map_err(|cause| LaunchError::Buffer {
                kernel: name,
                index,
                cause,
            })?;
            spans.push(DeviceSpan {
                addr: r.addr,
                len: r.len,
            });
        }
        if !self.device.failures.is_empty() {
            let carried = inputs.iter().find_map(|h| {
                self.device
                    .failures
                    .failure(h.id(), h.offset(), h.offset() + h.len())
            });
            if let Some(f) = carried {
                self.device.failures.skipped(f, name);
                for h in outputs {
                    self.device
                        .failures
                        .mark(h.id(), h.offset(), h.offset() + h.len(), f);
                }
                return Err(ServerError::Skipped {
                    kernel: name,
                    failure: f,
                });
            }
        }
        let shim = Arc::clone(&self.device.shim);
        // SAFETY: every span was resolved just now to a live range of its allocation, and the
        // kernel's contract is to touch only its buffers.
        let launched = unsafe { shim.launch(&self.current().raw, kernel, grid, &spans, args) };
        if let Err(e) = launched {
            let e = self.note(e);
            let error: ServerError = LaunchError::Refused {
                kernel: name,
                cause: e,
            }
            .into();
            let f = self.device.failures.new_failure(error.clone());
            for h in outputs {
                self.device
                    .failures
                    .mark(h.id(), h.offset(), h.offset() + h.len(), f);
            }
            self.device.failures.prune(f);
            return Err(error);
        }
        for h in outputs {
            self.device
                .failures
                .written(h.id(), h.offset(), h.offset() + h.len());
        }
        let s = self.current();
        if s.drops.should_flush() {
            self.flush_after_enqueue(&shim)?;
        }
        Ok(())
    }
}

/// The byte ranges of `handle`'s allocation a copy with `layout` touches: one per row (one in
/// all for a linear layout), from the start of the allocation.
fn rows(handle: &Handle, layout: CopyLayout) -> impl Iterator<Item = (u64, u64)> {
    let base = handle.offset();
    let (width, pitch) = (layout.width(), layout.pitch());
    let height = if layout.is_linear() {
        1
    } else {
        layout.height()
    };
    let width = if layout.is_linear() {
        layout.device_span()
    } else {
        width
    };
    (0..height).map(move |r| (base + r * pitch, base + r * pitch + width))
}

/// Where a future's fence was recorded, so what it reveals reaches the device's fault state.
#[derive(Debug, Clone)]
struct Watch {
    poison: Poison,
    stream: usize,
}

impl Watch {
    /// A fence that completed cleanly still covers nothing trustworthy if this stream (or one it
    /// was ordered after) turned out to run failed work: another fence may have heard first.
    fn settled(&self, r: Result<(), ServerError>) -> Result<(), ServerError> {
        match (r, self.poison.stream_fault(self.stream)) {
            (Ok(()), Some((stream, cause))) => Err(ServerError::StreamFaulted {
                stream: stream as u32,
                cause,
            }),
            (r, _) => r,
        }
    }

    /// Records what a fence revealed and turns it into the caller's error.
    fn fault(&self, e: DriverError) -> ServerError {
        self.poison.note_at(self.stream, &e);
        if e.fault == crate::error::Fault::WorkFailed {
            ServerError::StreamFaulted {
                stream: self.stream as u32,
                cause: e,
            }
        } else {
            e.into()
        }
    }
}

/// Whether the device is done with what a fence covered, after the fence ended with `e`.
fn fence_completed(e: &ServerError) -> bool {
    e.is_device_lost() || matches!(e, ServerError::StreamFaulted { .. })
}

/// Waits until `event` completes.
fn wait_event<S: Shim>(shim: &S, event: &S::Event, watch: &Watch) -> Result<(), ServerError> {
    watch.settled(shim.event_wait(event).map_err(|e| watch.fault(e)))
}

fn query_event<S: Shim>(
    shim: &S,
    event: &S::Event,
    watch: &Watch,
) -> Poll<Result<(), ServerError>> {
    match shim.event_query(event) {
        Ok(true) => Poll::Ready(watch.settled(Ok(()))),
        Ok(false) => Poll::Pending,
        Err(e) => {
            // What the fence covered is released only once it completed: make sure it did.
            let e = match e.fault {
                crate::error::Fault::WorkFailed => shim.event_wait(event).err().unwrap_or(e),
                _ => e,
            };
            Poll::Ready(Err(watch.fault(e)))
        }
    }
}

/// The bytes of a [`Command::read_async`], once its fence passes.
#[derive(Debug)]
pub struct ReadFuture<S: Shim> {
    shim: Arc<S>,
    event: Option<S::Event>,
    buffers: Vec<HostBuffer>,
    held: Vec<Binding>,
    watch: Watch,
}

impl<S: Shim> ReadFuture<S> {
    fn finish(&mut self, result: Result<(), ServerError>) -> Result<Vec<HostBuffer>, ServerError> {
        self.event = None;
        let buffers = core::mem::take(&mut self.buffers);
        let held = core::mem::take(&mut self.held);
        match result {
            Ok(()) => {
                drop(held);
                Ok(buffers)
            }
            Err(e) => {
                if !fence_completed(&e) {
                    warn!(
                        "a read's fence failed: leaking {} buffers the device may still write",
                        buffers.len()
                    );
                    core::mem::forget((buffers, held));
                }
                Err(e)
            }
        }
    }

    /// Blocks until the copies landed and returns the bytes, one buffer per request.
    ///
    /// # Errors
    ///
    /// A device fault the fence reveals: [`ServerError::StreamFaulted`] for failed work (the fence
    /// completed; the buffers are released), or a fault of unknown outcome (the buffers are then
    /// leaked unless the device is lost).
    pub fn wait(mut self) -> Result<Vec<HostBuffer>, ServerError> {
        let result = match &self.event {
            Some(ev) => wait_event(&*self.shim, ev, &self.watch),
            None => Ok(()),
        };
        self.finish(result)
    }
}

impl<S: Shim> Future for ReadFuture<S>
where
    S::Event: Unpin,
{
    type Output = Result<Vec<HostBuffer>, ServerError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let polled = match &this.event {
            Some(ev) => query_event(&*this.shim, ev, &this.watch),
            None => Poll::Ready(Ok(())),
        };
        match polled {
            Poll::Ready(r) => Poll::Ready(this.finish(r)),
            Poll::Pending => {
                // Devices raise no wake-ups, so the future asks to be polled again: under an
                // executor it spins on a non-blocking query. Hosts with nothing else to run
                // should call `wait`; a firmware main loop polls it between other work.
                cx.waker().wake_by_ref();
                Poll::Pending
            }
        }
    }
}

impl<S: Shim> Drop for ReadFuture<S> {
    fn drop(&mut self) {
        if let Some(ev) = self.event.take() {
            // Dropped before completion: the device may still write the buffers and read the
            // sources. Wait, then release or leak exactly as a completed read would.
            let waited = wait_event(&*self.shim, &ev, &self.watch);
            drop(self.finish(waited));
        }
    }
}

/// Resolves once everything enqueued before it on its stream has run.
#[derive(Debug)]
pub struct SyncFuture<S: Shim> {
    shim: Arc<S>,
    event: Option<S::Event>,
    watch: Watch,
}

impl<S: Shim> SyncFuture<S> {
    /// Blocks until the stream reached the fence.
    ///
    /// # Errors
    ///
    /// A device fault the fence reveals.
    pub fn wait(mut self) -> Result<(), ServerError> {
        match self.event.take() {
            Some(ev) => wait_event(&*self.shim, &ev, &self.watch),
            None => Ok(()),
        }
    }
}

impl<S: Shim> Future for SyncFuture<S>
where
    S::Event: Unpin,
{
    type Output = Result<(), ServerError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let polled = match &this.event {
            Some(ev) => query_event(&*this.shim, ev, &this.watch),
            None => Poll::Ready(Ok(())),
        };
        if polled.is_ready() {
            this.event = None;
        } else {
            cx.waker().wake_by_ref();
        }
        polled
    }
}
