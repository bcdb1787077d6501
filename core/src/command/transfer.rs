//! The transfers of a command: uploads (staged through pinned memory by the staging rules) and
//! reads back to the host.
//!
//! Owns the checks every copy makes (length, layout against the view, failed bytes), in
//! `Command::copy_check`, and the failure marks a copy leaves. Does not own the staging
//! decision (`copy.rs`) nor the fences (`futures.rs`).

use super::Command;
use super::futures::{Fence, ReadFuture};
use crate::capture::Span;
use crate::copy::{CopyLayout, Staging};
use crate::drop_queue::DropItem;
use crate::error::{IoError, ServerError, Validation};
use crate::host::HostBuffer;
use crate::memory::{Binding, Handle, Resolved};
use crate::shim::Shim;
use alloc::vec::Vec;

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

/// The byte ranges of `handle`'s allocation a copy with `layout` touches, from the start of the
/// allocation: one per row.
fn rows(handle: &Handle, layout: CopyLayout) -> impl Iterator<Item = (u64, u64)> {
    let base = handle.offset();
    layout
        .rows()
        .map(move |r| (base + r.device, base + r.device + r.len))
}

impl<S: Shim> Command<'_, S> {
    /// Uploads `data` into the whole view of `handle`: `data` must be exactly as long as the view
    /// (use [`Self::write_layout`] to write part of it).
    ///
    /// # Errors
    ///
    /// [`Validation::LengthMismatch`] when `data` is not the view's length; as
    /// [`Self::write_layout`].
    pub fn write(&mut self, handle: &Handle, data: HostBuffer) -> Result<(), ServerError> {
        self.write_layout(handle, data, CopyLayout::linear(handle.len()))
    }

    /// Uploads `data` (packed rows) into `handle`'s view with the device-side `layout`, staging
    /// it through pinned memory when the staging rules say so. The bytes are released once the
    /// device is done with them.
    ///
    /// **Zero copy** ([`crate::DeviceConfig::zero_copy`]): when the view lies on a page the host
    /// reaches in place, there is no staging and no device copy. This waits until the device is
    /// done with every use of the handle enqueued so far (on any stream: a fence on this stream,
    /// ordered after the others'), then the host writes the rows straight into the page, and
    /// `data` is released at once.
    ///
    /// **While this stream records**, the copy is recorded: the bytes it sends (`data`, or its
    /// staging copy) belong to the graph and are sent again by every replay; zero copy does not
    /// apply (the replay copies into the page). A refusal discards the recording. While another
    /// stream records, a zero-copy write is a device copy too (it cannot wait for the device).
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
        self.begin()?;
        let Some(r) = self.copy_target(handle, layout, data.len() as u64)? else {
            return Ok(());
        };
        let recording = self.current().capture.is_recording();
        // In place needs a host wait, illegal while any stream records: the device copies then.
        if self.device.recording().is_none()
            && let Some((dst, _)) = self.host_view(handle, &r)
        {
            return self.write_in_place(handle, dst, data.as_slice(), layout);
        }
        let staging = Staging::of(
            layout.packed_bytes(),
            data.origin(),
            &self.device.config.staging,
        );
        let source = if staging.through_pinned {
            let mut staged = self.reserve_host(data.len(), true)?;
            staged.as_mut_slice().copy_from_slice(data.as_slice());
            staged
        } else {
            data
        };
        let (shim, s) = self.parts();
        // SAFETY: `source` stays alive and unchanged in the drop queue until a fence after this
        // copy passes; `r` is a live range of `r.len >= device_span` bytes in one page.
        let copied = unsafe {
            shim.copy_to_device(
                &s.raw,
                source.as_ptr(),
                source.origin().memory(),
                r.addr,
                layout,
            )
        };
        if recording {
            return self.record_write(handle, layout, source, copied);
        }
        let failures = &mut self.device.failures;
        if let Err(e) = copied {
            let error: ServerError = self.device.ledger.call_failed(e).into();
            let f = failures.new_failure(error.clone());
            for (start, end) in rows(handle, layout) {
                failures.mark(handle.id(), start, end, f);
            }
            failures.prune(f);
            return Err(error);
        }
        if !failures.is_empty() {
            // Only the rows were written: marks on the padding between them stay.
            for (start, end) in rows(handle, layout) {
                failures.written(handle.id(), start, end);
            }
        }
        let s = self.current();
        s.drops.push(DropItem::Host(source));
        if staging.flush_after || s.drops.should_flush() {
            self.flush_after_enqueue()?;
        }
        Ok(())
    }

    /// The end of a write recorded into this stream's recording: the rows are its outputs and
    /// `source` its own; a refusal discards the recording (its outputs, these rows among them,
    /// carry the failure).
    fn record_write(
        &mut self,
        handle: &Handle,
        layout: CopyLayout,
        source: HostBuffer,
        copied: Result<(), crate::DriverError>,
    ) -> Result<(), ServerError> {
        let copied = copied.map_err(|e| ServerError::from(self.device.ledger.call_failed(e)));
        if let Some(w) = self.current().capture.window_mut() {
            for (start, end) in rows(handle, layout) {
                w.write(Span {
                    id: handle.id(),
                    start,
                    end,
                });
            }
            if copied.is_ok() {
                w.retain(source);
            }
        }
        if let Err(e) = &copied {
            self.discard_recording(e);
        }
        copied
    }

    /// The zero-copy upload: waits for every use of `handle` enqueued so far, then writes the
    /// packed rows of `src` through the host address `dst` of the view's first byte.
    fn write_in_place(
        &mut self,
        handle: &Handle,
        dst: core::ptr::NonNull<u8>,
        src: &[u8],
        layout: CopyLayout,
    ) -> Result<(), ServerError> {
        // `copy_target` ordered this stream after the other streams' uses of the handle: a fence
        // here passes once every use enqueued so far is done.
        self.sync()?.wait()?;
        for row in layout.rows() {
            // Offsets fit a usize: the rows lie in `src` (its length was checked against the
            // layout) and in the view, which lies in a page the host addresses.
            let (host, device, len) = (row.host as usize, row.device as usize, row.len as usize);
            // SAFETY: `dst + device .. + len` lies in the view (`copy_check` checked the layout
            // against it) on a live mapped page; no device work uses it now (the fence above
            // passed and this stream enqueued nothing since); `src` is a separate host buffer.
            unsafe {
                core::ptr::copy_nonoverlapping(
                    src.as_ptr().add(host),
                    dst.as_ptr().add(device),
                    len,
                )
            };
        }
        let failures = &mut self.device.failures;
        if !failures.is_empty() {
            for (start, end) in rows(handle, layout) {
                failures.written(handle.id(), start, end);
            }
        }
        Ok(())
    }

    /// The checks every copy makes, with no side effect: the device range it targets, or `None`
    /// for an empty copy (nothing to do, nothing checked but the length).
    fn copy_check(
        &mut self,
        handle: &Handle,
        layout: CopyLayout,
        host_len: u64,
    ) -> Result<Option<Resolved>, ServerError> {
        let expected = layout.packed_bytes();
        if host_len != expected {
            return Err(Validation::LengthMismatch {
                expected,
                found: host_len,
            }
            .into());
        }
        if expected == 0 {
            return Ok(None);
        }
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

    /// [`Self::copy_check`], then this stream ordered after other streams' use of `handle`.
    fn copy_target(
        &mut self,
        handle: &Handle,
        layout: CopyLayout,
        host_len: u64,
    ) -> Result<Option<Resolved>, ServerError> {
        let r = self.copy_check(handle, layout, host_len)?;
        if r.is_some() {
            self.device.order_after(self.stream, handle)?;
        }
        Ok(r)
    }

    /// The failure a read of `handle` with `layout` would return, if its bytes are marked failed.
    /// Only the rows are read: a mark on the padding between them does not matter.
    fn unwritten(&self, handle: &Handle, layout: CopyLayout) -> Result<(), ServerError> {
        let failures = &self.device.failures;
        if failures.is_empty() {
            return Ok(());
        }
        match rows(handle, layout)
            .find_map(|(start, end)| failures.failure(handle.id(), start, end))
        {
            Some(f) => Err(failures.report(f, handle.id())),
            None => Ok(()),
        }
    }

    /// Uploads borrowed bytes into the whole view of `handle`: they are copied into a staging
    /// buffer (pinned when the pool can serve it) before this returns, so `data` is free to reuse.
    ///
    /// # Errors
    ///
    /// As [`Self::write`].
    pub fn write_from(&mut self, handle: &Handle, data: &[u8]) -> Result<(), ServerError> {
        if data.len() as u64 != handle.len() {
            return Err(Validation::LengthMismatch {
                expected: handle.len(),
                found: data.len() as u64,
            }
            .into());
        }
        let mut staged = self.reserve_host(data.len(), true)?;
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

    /// Enqueues a copy of `handle`'s view into `dst` (device to host): the read primitive under
    /// [`Self::read_async`]. The caller must keep `dst` until a fence after this passes
    /// ([`Self::sync`]): the drop queue cannot, because the caller reads it afterwards.
    ///
    /// # Errors
    ///
    /// [`Validation::Recording`] while a stream of the device records; a read of failed bytes
    /// ([`ServerError::Unwritten`]), a handle that does not resolve, a
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
        self.begin()?;
        self.refuse_while_recording("read_into")?;
        // SAFETY: the caller's contract is this one.
        unsafe { self.enqueue_read(request, dst) }
    }

    /// [`Self::read_into`] once the operation has begun.
    ///
    /// # Safety
    ///
    /// As [`Self::read_into`].
    unsafe fn enqueue_read(
        &mut self,
        request: ReadRequest<'_>,
        dst: &mut HostBuffer,
    ) -> Result<(), ServerError> {
        let ReadRequest { handle, layout } = request;
        if !dst.is_empty() && dst.as_mut_slice().is_empty() {
            return Err(Validation::ReadOnlyDestination.into());
        }
        let Some(r) = self.copy_target(handle, layout, dst.len() as u64)? else {
            return Ok(());
        };
        self.unwritten(handle, layout)?;
        let (shim, s) = self.parts();
        let memory = dst.origin().memory();
        // SAFETY: the caller keeps `dst` untouched until a later fence; `r` is a live range.
        unsafe { shim.copy_to_host(&s.raw, r.addr, dst.as_mut_ptr(), memory, layout) }
            .map_err(|e| self.device.ledger.call_failed(e).into())
    }

    /// Reads every request back to the host. Every request is checked first (handle, layout,
    /// failed bytes, a host buffer the host can hold); then the copies are enqueued, then one
    /// fence; the future resolves once it passes. If a copy fails after others were enqueued,
    /// this waits for those before their buffers are dropped (and leaks them if the wait is
    /// inconclusive).
    ///
    /// # Errors
    ///
    /// [`Validation::Recording`] while a stream of the device records; the failure of any
    /// request (a read
    /// of failed bytes is [`ServerError::Unwritten`]; a
    /// layout the host cannot hold is [`IoError::HostAllocFailed`]), a fault kept for this
    /// stream's next read.
    pub fn read_async(
        &mut self,
        requests: &[ReadRequest<'_>],
    ) -> Result<ReadFuture<S>, ServerError> {
        self.begin()?;
        self.refuse_while_recording("read_async")?;
        self.device.ledger.take_deferred(self.stream)?;
        // Checked before any host memory is reserved or any wait made: a bad request costs
        // nothing.
        for req in requests {
            self.copy_check(req.handle, req.layout, req.layout.packed_bytes())?;
            self.unwritten(req.handle, req.layout)?;
            usize::try_from(req.layout.packed_bytes()).map_err(|_| IoError::HostAllocFailed {
                len: req.layout.packed_bytes(),
            })?;
        }
        let mut buffers: Vec<HostBuffer> = Vec::with_capacity(requests.len());
        let mut held: Vec<Binding> = Vec::with_capacity(requests.len());
        let mut failed = None;
        for req in requests {
            // Fits a usize: checked above.
            let mut buffer = match self.reserve_host(req.layout.packed_bytes() as usize, true) {
                Ok(b) => b,
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            };
            // SAFETY: `buffer` moves into `buffers` (its heap address does not change) and is
            // neither read nor dropped before the fence below passed (or the wait in the error
            // path returned).
            match unsafe { self.enqueue_read(*req, &mut buffer) } {
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
        let fence = self.fence();
        let mut future = ReadFuture::new(fence, buffers, held);
        match failed {
            // Dropping the future waits for the copies already enqueued, then releases (or
            // leaks) their buffers as a completed read would.
            Some(e) => {
                drop(future);
                Err(e)
            }
            None => {
                future.check_recorded()?;
                Ok(future)
            }
        }
    }

    /// Reads `handle`'s whole view back, giving the handle up.
    ///
    /// **Zero copy** ([`crate::DeviceConfig::zero_copy`]): when the view lies on a page the host
    /// reaches in place and `handle` is the allocation's only handle, nothing is copied: once the
    /// fence after every use enqueued so far passes, the future yields the allocation's own bytes
    /// as a [`HostBuffer`], which keeps the allocation until it drops (the memory then goes back
    /// to its pool). Otherwise (another handle or view of the allocation is alive, or its address
    /// was handed out raw by [`Self::managed_resource`], so later work could still write it; or
    /// the device copies) it is [`Self::read_async`] of the view, and `handle` is dropped once the
    /// copy is enqueued.
    ///
    /// # Errors
    ///
    /// As [`Self::read_async`].
    pub fn read_owned(&mut self, handle: Handle) -> Result<ReadFuture<S>, ServerError> {
        self.begin()?;
        self.refuse_while_recording("read_owned")?;
        self.device.ledger.take_deferred(self.stream)?;
        let layout = CopyLayout::linear(handle.len());
        let lent = match self.copy_check(&handle, layout, handle.len())? {
            // A binding out (a graph that replays into it, another stream's work) means later
            // work may still write the allocation, and an address handed out raw may be used
            // by anyone: only a copy is safe then.
            Some(r) if handle.can_mut() && !handle.is_exposed() && !handle.is_bound() => {
                self.host_view(&handle, &r)
            }
            _ => None,
        };
        let Some((ptr, count)) = lent else {
            return self.read_async(&[ReadRequest::whole(&handle)]);
        };
        self.unwritten(&handle, layout)?;
        // Fits a usize: the view lies on a page the host addresses.
        let len = handle.len() as usize;
        self.device.order_after(self.stream, &handle)?;
        // SAFETY: `ptr .. ptr + len` is the host view of `handle`'s allocation on a mapped page
        // whose lent count is `count`; `handle` is the allocation's only handle (checked above)
        // and moves into the buffer, so no new work can name it; the future hands the buffer out
        // only once the fence below, after every use enqueued so far, passed.
        let buffer = unsafe { HostBuffer::mapped(ptr, len, handle, count) };
        let fence = self.fence();
        let mut future = ReadFuture::new(fence, alloc::vec![buffer], Vec::new());
        future.check_recorded()?;
        Ok(future)
    }

    /// A fence recorded now on this stream, for a future.
    pub(super) fn fence(&mut self) -> Fence<S> {
        let (shim, s) = self.parts();
        let recorded = shim.record_event(&s.raw);
        let mark = s.mark();
        let recorded = recorded.map_err(|e| self.device.ledger.call_failed(e));
        Fence::new(
            alloc::sync::Arc::clone(&self.device.shim),
            recorded,
            self.device.ledger.clone(),
            self.stream,
            mark,
        )
    }
}
