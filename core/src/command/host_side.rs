//! The engine's host side: the steps of a copy between host bytes and device memory, run once
//! each for every upload and read, in the engine's order (begin, check, resolve once, order,
//! stance, the device call, the outcome, flush).
//!
//! Owns where an upload's bytes come from (a buffer handed over or bytes borrowed), staging them
//! at most once (through pinned memory when the staging rules say so and the pool can serve, and
//! never into a second heap buffer), zero copy (the host writes the rows in place once the
//! device is done with the memory), and the checks every copy makes (length, layout against the
//! view, failed bytes for a read). Does not own the staging rules (`staging.rs`), the pinned pool
//! (`pinned.rs`), the futures a read returns (`futures.rs`) nor the public operations
//! (`transfer.rs`).

use super::Command;
use crate::capture::{Span, Stance};
use crate::copy::CopyLayout;
use crate::drop_queue::DropItem;
use crate::error::{ServerError, Validation};
use crate::fault::{FenceOutcome, Fenced};
use crate::host::{HostBuffer, HostOrigin};
use crate::memory::{Handle, PageUpdate};
use crate::order::Target;
use crate::shim::{HostCopy, Shim};
use crate::staging::Staging;

/// The host side of an upload.
pub(super) enum Source<'a> {
    /// A buffer handed over: sent as it is when it is pinned or registered, when the staging
    /// rules say so, or when the pinned pool cannot serve; otherwise staged once into pinned
    /// memory. Never copied into another heap buffer, but for a mapped file when no pinned memory
    /// is left (a file may fault while the device reads it: it is always staged).
    Owned(HostBuffer),
    /// Bytes the caller keeps: copied once before the upload returns (into pinned memory, or the
    /// heap when the pool cannot serve), or written in place on zero copy.
    Borrowed(&'a [u8]),
}

impl Source<'_> {
    fn bytes(&self) -> &[u8] {
        match self {
            Self::Owned(b) => b.as_slice(),
            Self::Borrowed(b) => b,
        }
    }
}

/// The byte ranges of `handle`'s allocation a copy with `layout` touches, from the start of the
/// allocation: one per row.
pub(super) fn rows(handle: &Handle, layout: CopyLayout) -> impl Iterator<Item = Span> {
    let (id, base) = (handle.id(), handle.offset());
    layout.rows().map(move |r| Span {
        id,
        start: base + r.device,
        end: base + r.device + r.len,
    })
}

impl<S: Shim> Command<'_, S> {
    /// `len` bytes of host memory for copies: pinned when asked and the pool can serve it (while
    /// a stream records, only from pinned pages already held), otherwise the heap.
    pub(super) fn host_buffer(
        &mut self,
        len: usize,
        pinned: bool,
    ) -> Result<HostBuffer, ServerError> {
        match self.pinned_buffer(len, pinned) {
            Some(b) => Ok(b),
            None => Ok(HostBuffer::try_zeroed(len)?),
        }
    }

    /// Copies `bytes` into `pinned` (as long) for the device to read next: the shim's host copy
    /// ([`Shim::host_copy`], [`HostCopy::Stage`]), which on an OS splits a large copy among
    /// threads and writes past the caches where that lets the device read it sooner.
    fn stage(&self, pinned: &mut HostBuffer, bytes: &[u8]) {
        let dst = pinned.as_mut_slice();
        debug_assert_eq!(
            dst.len(),
            bytes.len(),
            "a staging buffer is the bytes' length"
        );
        let len = dst.len().min(bytes.len());
        // SAFETY: both hold at least `len` bytes; the pinned buffer is a separate allocation no
        // device work uses yet.
        unsafe {
            self.device
                .shim
                .host_copy(dst.as_mut_ptr(), bytes.as_ptr(), len, HostCopy::Stage)
        };
    }

    /// A pinned buffer of `len` bytes when `pinned` and the pool can serve it.
    pub(super) fn pinned_buffer(&mut self, len: usize, pinned: bool) -> Option<HostBuffer> {
        if !pinned {
            return None;
        }
        let may_add = self.page_update() != PageUpdate::Forbidden;
        let (shim, s) = self.parts();
        s.pinned.reserve(shim, len, may_add).map(HostBuffer::pinned)
    }

    /// Checks a copy of `host_len` packed bytes with `layout` into or out of `handle`, with no
    /// side effect: where its memory is, or `None` for an empty copy (nothing to do, nothing
    /// checked but the length). The handle is resolved here, once (zero copy asks the pools
    /// again for a mapped page's host address: [`Self::host_address`]).
    pub(super) fn copy_target(
        &self,
        handle: &Handle,
        layout: CopyLayout,
        host_len: u64,
    ) -> Result<Option<Target>, ServerError> {
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
        let t = self.device.target(handle)?;
        if layout.device_span() > t.span.len {
            return Err(Validation::LayoutPastView {
                span: layout.device_span(),
                view: t.span.len,
            }
            .into());
        }
        Ok(Some(t))
    }

    /// The failure a read of `handle` with `layout` would return, if its bytes are marked failed.
    /// Only the rows are read: a mark on the padding between them does not matter.
    pub(super) fn unwritten(&self, handle: &Handle, layout: CopyLayout) -> Result<(), ServerError> {
        match self.carried(rows(handle, layout)) {
            Some(f) => Err(self.device.failures.report(f, handle.id())),
            None => Ok(()),
        }
    }

    /// The one upload, once the operation has begun: `source` (packed rows) into `handle`'s view
    /// with the device-side `layout`.
    pub(super) fn upload(
        &mut self,
        handle: &Handle,
        source: Source<'_>,
        layout: CopyLayout,
    ) -> Result<(), ServerError> {
        let Some(t) = self.copy_target(handle, layout, source.bytes().len() as u64)? else {
            return Ok(());
        };
        let stance = self.stance();
        // Zero copy: in place needs a host wait, illegal while any stream records (the device
        // copies then, and a recording replays the copy).
        if stance == Stance::Run
            && let Some(dst) = self.host_address(handle, &t)
        {
            self.device.order_after(self.stream, handle, t.owner)?;
            return self.write_in_place(handle, dst, source.bytes(), layout);
        }
        let staging = Staging::of(
            layout.packed_bytes(),
            match &source {
                Source::Owned(b) => b.origin(),
                Source::Borrowed(_) => HostOrigin::Heap,
            },
            &self.device.config.staging,
        );
        // Pipelined through the staging ring: it waits for its buffers' fences, so only while
        // nobody records (a recording keeps the bytes it sends, below).
        #[cfg(feature = "pipeline")]
        if staging.pipelined
            && stance == Stance::Run
            && self.upload_pipelined(handle, &t, source.bytes(), layout)?
        {
            return Ok(());
        }
        let sent = match source {
            Source::Owned(buffer) if !staging.through_pinned => buffer,
            Source::Owned(buffer) => match self.pinned_buffer(buffer.len(), true) {
                Some(mut pinned) => {
                    self.stage(&mut pinned, buffer.as_slice());
                    pinned
                }
                // No pinned memory: a mapped file is still copied once (it may fault while the
                // device reads it); any other buffer handed over is sent as it is.
                None if buffer.origin() == HostOrigin::FileMapped => {
                    HostBuffer::try_copy_of(buffer.as_slice())?
                }
                None => buffer,
            },
            Source::Borrowed(bytes) => match self.pinned_buffer(bytes.len(), true) {
                Some(mut pinned) => {
                    self.stage(&mut pinned, bytes);
                    pinned
                }
                None => HostBuffer::try_copy_of(bytes)?,
            },
        };
        // Ordered once the bytes are ready: a staging buffer the host cannot give leaves no trace.
        self.device.order_after(self.stream, handle, t.owner)?;
        let (shim, s) = self.parts();
        // SAFETY: `sent` stays alive and unchanged (in the drop queue, or owned by the recording)
        // until a fence after this copy passes; the target is a live range of at least
        // `layout.device_span()` bytes in one page (checked above).
        let copied = unsafe {
            shim.copy_to_device(
                &s.raw,
                sent.as_ptr(),
                sent.origin().memory(),
                t.span.addr,
                layout,
            )
        };
        let copied = copied.map_err(|e| ServerError::from(self.device.ledger.call_failed(e)));
        if stance == Stance::Record {
            if let Some(w) = self.device.capture.window_mut() {
                rows(handle, layout).for_each(|r| w.write(r));
                if copied.is_ok() {
                    w.retain(sent);
                }
            }
            if let Err(e) = &copied {
                self.discard_recording(e);
            }
            return copied;
        }
        // Only the rows were written: marks on the padding between them stay.
        self.settle_writes(rows(handle, layout), &copied);
        copied?;
        let s = self.current();
        s.drops.push(DropItem::Host(sent));
        if staging.flush_after || s.drops.should_flush() {
            self.flush_after_enqueue()?;
        }
        Ok(())
    }

    /// The host address of the first byte of `handle`'s range (`t`, its target), when it lies
    /// on a page the host reaches in place (zero copy: [`crate::DeviceConfig::zero_copy`]).
    pub(super) fn host_address(
        &self,
        handle: &Handle,
        t: &Target,
    ) -> Option<core::ptr::NonNull<u8>> {
        let owner = self.device.streams.get(t.owner)?.as_ref()?;
        owner
            .memory
            .host_ptr(&self.device.shim, handle)
            .map(|(ptr, _)| ptr)
    }

    /// Waits on the host until this stream passed everything enqueued on it so far (which, once
    /// ordered, covers other streams' uses of the memory it touches), as a fence of this
    /// operation: a fault it reveals is this operation's answer. Only while nobody records.
    pub(super) fn wait_here(&mut self) -> Result<(), ServerError> {
        let (shim, s) = self.parts();
        let mark = s.mark();
        let outcome = match shim.record_event(&s.raw) {
            Ok(event) => FenceOutcome::wait(shim, &event),
            Err(e) => FenceOutcome::unrecorded(e),
        };
        self.device
            .ledger
            .answer(self.stream, Fenced { outcome, mark })
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
        // This stream was ordered after the other streams' uses of the handle: a fence here
        // passes once every use enqueued so far is done.
        self.wait_here()?;
        for row in layout.rows() {
            // Offsets fit a usize: the rows lie in `src` (its length was checked against the
            // layout) and in the view, which lies in a page the host addresses.
            let (host, device, len) = (row.host as usize, row.device as usize, row.len as usize);
            // SAFETY: `dst + device .. + len` lies in the view (`copy_target` checked the layout
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
        self.settle_writes(rows(handle, layout), &Ok(()));
        Ok(())
    }

    /// Reads `layout` of `handle` (at `t`, checked) into `dst`, once the operation has begun:
    /// pipelined through the staging ring when `dst` is heap memory large enough for it (done
    /// when this returns), otherwise one device copy enqueued ([`Self::enqueue_read`]).
    ///
    /// # Safety
    ///
    /// As [`Self::enqueue_read`].
    pub(super) unsafe fn read_rows(
        &mut self,
        handle: &Handle,
        layout: CopyLayout,
        t: &Target,
        dst: &mut HostBuffer,
    ) -> Result<(), ServerError> {
        #[cfg(feature = "pipeline")]
        if dst.origin() == HostOrigin::Heap
            && self.stance() == Stance::Run
            && self.device.config.staging.pipelines(layout.packed_bytes())
            && self.read_pipelined(handle, t, layout, dst.as_mut_slice())?
        {
            return Ok(());
        }
        // SAFETY: the caller's contract is this one.
        unsafe { self.enqueue_read(handle, layout, t, dst) }
    }

    /// Enqueues a checked read of `layout` of `handle` (at `t`) into `dst`, once the operation
    /// has begun: this stream is ordered after other streams' work on it first.
    ///
    /// # Safety
    ///
    /// `dst` is as long as the layout's packed bytes and is neither dropped nor accessed until a
    /// fence recorded after this call completes.
    unsafe fn enqueue_read(
        &mut self,
        handle: &Handle,
        layout: CopyLayout,
        t: &Target,
        dst: &mut HostBuffer,
    ) -> Result<(), ServerError> {
        self.device.order_after(self.stream, handle, t.owner)?;
        let memory = dst.origin().memory();
        let (shim, s) = self.parts();
        // SAFETY: the caller keeps `dst` untouched until a later fence; the target is a live
        // range the layout fits (checked by `copy_target`).
        unsafe { shim.copy_to_host(&s.raw, t.span.addr, dst.as_mut_ptr(), memory, layout) }
            .map_err(|e| self.device.ledger.call_failed(e).into())
    }
}
