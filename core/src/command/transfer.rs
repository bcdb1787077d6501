//! The transfers of a command, as declarations: uploads and reads back to the host. Each begins
//! once and hands its host side to the engine (`host_side.rs`); none calls another public
//! operation.
//!
//! Owns the public signatures and what each promises. Does not own the steps (`engine.rs`,
//! `host_side.rs`), the staging decision (`staging.rs`) nor the fences (`futures.rs`).

use super::Command;
use super::futures::{ReadFuture, ReadToFuture};
use super::host_side::Source;
use crate::copy::CopyLayout;
use crate::error::{IoError, ServerError, Validation};
use crate::host::HostBuffer;
use crate::memory::{Binding, Handle};
use crate::order::Target;
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

/// Requests of one [`Command::read_async`] whose targets are kept on the stack.
const INLINE_READS: usize = 2;

impl<'a> ReadRequest<'a> {
    /// The whole view of `handle`, packed.
    pub fn whole(handle: &'a Handle) -> Self {
        Self {
            handle,
            layout: CopyLayout::linear(handle.len()),
        }
    }
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

    /// Uploads `data` (packed rows) into `handle`'s view with the device-side `layout`. `data`
    /// is staged through pinned memory when the staging rules say so and the pinned pool can
    /// serve it; otherwise (pinned or registered bytes, large heap data, no pinned memory left)
    /// the device reads `data` itself. Either way the bytes are released once the device is
    /// done with them.
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
        self.upload(handle, Source::Owned(data), layout)
    }

    /// Uploads borrowed bytes into the whole view of `handle`: they are copied once before this
    /// returns (into pinned memory when the pool can serve it, else one heap buffer; on zero
    /// copy straight into the page), so `data` is free to reuse.
    ///
    /// # Errors
    ///
    /// As [`Self::write`].
    pub fn write_from(&mut self, handle: &Handle, data: &[u8]) -> Result<(), ServerError> {
        self.begin()?;
        self.upload(
            handle,
            Source::Borrowed(data),
            CopyLayout::linear(handle.len()),
        )
    }

    /// A new allocation holding a copy of `data`.
    ///
    /// # Errors
    ///
    /// As [`Self::empty`] and [`Self::write`].
    pub fn create(&mut self, data: &[u8]) -> Result<Handle, ServerError> {
        self.begin()?;
        let handle = self.reserve_room(data.len() as u64)?;
        let layout = CopyLayout::linear(handle.len());
        self.upload(&handle, Source::Borrowed(data), layout)?;
        Ok(handle)
    }

    /// Enqueues a copy of `handle`'s view into `dst` (device to host): the read primitive under
    /// [`Self::read_async`]. The caller must keep `dst` until a fence after this passes
    /// ([`Self::sync`]): the drop queue cannot, because the caller reads it afterwards.
    ///
    /// **Pipelined** (a heap `dst` of at least
    /// [`StagingPolicy::pipeline_from`](crate::staging::StagingPolicy::pipeline_from) bytes,
    /// the `pipeline` feature): the copy runs through the stream's staging ring and this
    /// returns once every byte is in `dst`; it waits for the stream's earlier work, so a fault
    /// of that work is this call's error.
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
        unsafe { self.read_one(request, dst, false) }.map(|_| ())
    }

    /// The checks and the copy of one read into the caller's `dst`, once begun.
    ///
    /// # Safety
    ///
    /// As [`Self::read_into`].
    ///
    /// With `may_stage`, a small heap `dst` ([`StagingPolicy::stages_read`]) is not written:
    /// the copy lands in a pinned buffer of the stream's pool, returned, which the caller copies
    /// into `dst` once a fence after this passed (and keeps as it keeps `dst` until then).
    ///
    /// [`StagingPolicy::stages_read`]: crate::staging::StagingPolicy::stages_read
    unsafe fn read_one(
        &mut self,
        request: ReadRequest<'_>,
        dst: &mut HostBuffer,
        may_stage: bool,
    ) -> Result<Option<HostBuffer>, ServerError> {
        let ReadRequest { handle, layout } = request;
        if !dst.is_empty() && dst.as_mut_slice().is_empty() {
            return Err(Validation::ReadOnlyDestination.into());
        }
        let Some(t) = self.copy_target(handle, layout, dst.len() as u64)? else {
            return Ok(None);
        };
        self.unwritten(handle, layout)?;
        let stages = may_stage && {
            let (size, policy) = (layout.packed_bytes(), self.device.config.staging);
            let pipelined = cfg!(feature = "pipeline") && policy.pipelines(size);
            policy.stages_read(size, dst.origin(), pipelined)
        };
        if stages && let Some(mut staging) = self.pinned_buffer(dst.len(), true) {
            // SAFETY: the staging buffer is returned to the caller, who keeps it as `dst`;
            // it is the layout's length (the pool serves what is asked).
            unsafe { self.read_rows(handle, layout, &t, &mut staging)? };
            return Ok(Some(staging));
        }
        // SAFETY: the caller's contract is this one; `dst` is the layout's length.
        unsafe { self.read_rows(handle, layout, &t, dst) }?;
        Ok(None)
    }

    /// Reads `request` into `buffer`, the caller's own (as long as the request's packed bytes),
    /// and gives it back filled: the read of a host loop that keeps one buffer (a pinned one from
    /// [`Self::reserve_host`], say) and reuses it, with no allocation on warm pools. The checks
    /// and the order are those of [`Self::read_async`]. A heap buffer of at least
    /// [`StagingPolicy::pipeline_from`](crate::staging::StagingPolicy::pipeline_from) bytes is
    /// filled through the stream's staging ring before this returns (the future is then ready
    /// at once), at DMA speed rather than the driver's pageable path; see [`Self::read_into`].
    /// A smaller heap buffer ([`StagingPolicy::stages_read`](crate::staging::StagingPolicy::stages_read))
    /// is read into pinned memory of the stream's pool and copied into the buffer when the
    /// future resolves (where the pool has no room, the device copies into it directly).
    ///
    /// # Errors
    ///
    /// As [`Self::read_async`]; [`Validation::LengthMismatch`] when `buffer` is not the
    /// request's length, [`Validation::ReadOnlyDestination`] for an external buffer. The buffer
    /// is dropped with the error.
    pub fn read_to(
        &mut self,
        request: ReadRequest<'_>,
        mut buffer: HostBuffer,
    ) -> Result<ReadToFuture<S>, ServerError> {
        self.begin()?;
        self.device.ledger.take_deferred(self.stream)?;
        self.refuse_while_recording("read_to")?;
        // SAFETY: `buffer` (or the staging buffer the copy lands in) moves into the future below
        // (its bytes do not move with it) and is neither read nor dropped before the fence
        // recorded after the copy passed (or the wait in the error path returned). When the
        // copy is refused nothing was enqueued.
        let staged = unsafe { self.read_one(request, &mut buffer, true)? };
        let held = request.handle.binding();
        ReadToFuture::new(self.fence(), buffer, staged, held)
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
    /// request (a read of failed bytes is [`ServerError::Unwritten`]; a layout the host cannot
    /// hold is [`IoError::HostAllocFailed`]), a fault kept for this stream's next read.
    pub fn read_async(
        &mut self,
        requests: &[ReadRequest<'_>],
    ) -> Result<ReadFuture<S>, ServerError> {
        self.begin()?;
        self.refuse_while_recording("read_async")?;
        self.device.ledger.take_deferred(self.stream)?;
        self.read_requests(requests)
    }

    /// [`Self::read_async`] once begun: every request checked (each handle resolved once), then
    /// the copies, then one fence.
    fn read_requests(
        &mut self,
        requests: &[ReadRequest<'_>],
    ) -> Result<ReadFuture<S>, ServerError> {
        // Checked before any host memory is reserved or any wait made: a bad request costs
        // nothing. Where each handle lies is kept for the copies (on the stack for the reads of
        // a host loop, a few requests at a time).
        let mut inline: heapless::Vec<Option<Target>, INLINE_READS> = heapless::Vec::new();
        let mut spilled: Vec<Option<Target>> = Vec::new();
        if requests.len() > INLINE_READS {
            spilled.reserve_exact(requests.len());
        }
        for req in requests {
            let packed = req.layout.packed_bytes();
            let t = self.copy_target(req.handle, req.layout, packed)?;
            self.unwritten(req.handle, req.layout)?;
            usize::try_from(packed).map_err(|_| IoError::HostAllocFailed { len: packed })?;
            if let Err(t) = inline.push(t) {
                spilled.push(t);
            }
        }
        let targets: &[Option<Target>] = if spilled.is_empty() {
            &inline
        } else {
            spilled.splice(0..0, inline.iter().copied());
            &spilled
        };
        let mut buffers: Vec<HostBuffer> = Vec::with_capacity(requests.len());
        let mut held: Vec<Binding> = Vec::with_capacity(requests.len());
        let mut failed = None;
        for (req, t) in requests.iter().zip(targets) {
            // Fits a usize: checked above.
            let mut buffer = match self.host_buffer(req.layout.packed_bytes() as usize, true) {
                Ok(b) => b,
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            };
            let enqueued = match t {
                None => Ok(()),
                // SAFETY: `buffer` moves into `buffers` (its heap address does not change) and
                // is neither read nor dropped before the fence below passed (or the wait in
                // the error path returned); it is the request's packed length.
                Some(t) => unsafe { self.read_rows(req.handle, req.layout, t, &mut buffer) },
            };
            match enqueued {
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
        let future = ReadFuture::new(self.fence(), buffers, held);
        match failed {
            // Dropping the future waits for the copies already enqueued, then releases (or
            // leaks) their buffers as a completed read would.
            Some(e) => {
                drop(future);
                Err(e)
            }
            None => future.recorded(),
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
        let t = self.copy_target(&handle, layout, handle.len())?;
        // A binding out (a graph that replays into it, another stream's work) means later work
        // may still write the allocation, and an address handed out raw may be used by anyone:
        // only a copy is safe then.
        let lent = match &t {
            Some(t) if handle.can_mut() && !handle.is_exposed() && !handle.is_bound() => self
                .device
                .streams
                .get(t.owner)
                .and_then(Option::as_ref)
                .and_then(|o| o.memory.host_ptr(&self.device.shim, &handle)),
            _ => None,
        };
        let (Some(t), Some((ptr, count))) = (t, lent) else {
            return self.read_requests(&[ReadRequest::whole(&handle)]);
        };
        self.unwritten(&handle, layout)?;
        // Fits a usize: the view lies on a page the host addresses.
        let len = handle.len() as usize;
        self.device.order_after(self.stream, &handle, t.owner)?;
        // SAFETY: `ptr .. ptr + len` is the host view of `handle`'s allocation on a mapped page
        // whose lent count is `count`; `handle` is the allocation's only handle (checked above)
        // and moves into the buffer, so no new work can name it; the future hands the buffer out
        // only once the fence below, after every use enqueued so far, passed.
        let buffer = unsafe { HostBuffer::mapped(ptr, len, handle, count) };
        ReadFuture::new(self.fence(), alloc::vec![buffer], Vec::new()).recorded()
    }
}
