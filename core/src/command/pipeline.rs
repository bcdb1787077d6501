//! The pipelined copy: a large upload from, or read into, ordinary memory, cut into pieces that
//! cycle through the stream's staging ring (see [`crate::staging`] for the design).
//!
//! Owns the walk (piece by piece: a slot, the host copy, the device copy, a fence), the waits
//! for a slot's last fence (each one a fence of this operation: a fault it reveals is this
//! operation's answer), and the failure rule of a pipelined write (any failed piece fails the
//! whole write). Does not own the decision to pipeline (`staging.rs`), the ring itself
//! (`staging.rs`), the checks and ordering every copy makes (`host_side.rs`), nor the public
//! operations (`transfer.rs`).

use super::Command;
use super::host_side::rows;
use crate::copy::{CopyLayout, CopyPiece};
use crate::error::{IoError, ServerError};
use crate::fault::{FenceOutcome, Fenced};
use crate::host::HostBuffer;
use crate::memory::Handle;
use crate::order::Target;
use crate::shim::{HostCopy, HostMemory, Shim};
use crate::staging::MAX_DEPTH;

impl<S: Shim> Command<'_, S> {
    /// The slot of the stream's staging ring for the next piece: the slot whose turn it is when
    /// the device is done with it (its last fence passed); otherwise a new pinned buffer while
    /// the ring holds fewer than its depth and the pool can serve one (so a stream of small
    /// uploads keeps one or two buffers, and only uploads that outrun the device grow the ring);
    /// otherwise the slot in turn, once its fence passed. `None` when the ring is empty and the
    /// pool cannot serve (no pinned memory: the caller takes another path).
    ///
    /// # Errors
    ///
    /// The fault a wait reveals (the stream's earlier work failed, or the device is lost). A
    /// wait that says nothing about completion leaves the slot's buffer to the device: it is
    /// taken out of the ring and leaked, never reused. A wait the shim refused for now
    /// ([`Fault::Busy`](crate::Fault::Busy)) is the error, and the slot keeps its fence.
    ///
    /// For a read (`read`), the ring first grows to
    /// [`StagingPolicy::read_buffers`](crate::staging::StagingPolicy::read_buffers) even when
    /// the slot in turn is done, while the pinned pool has room to spare: see the spread in
    /// [`crate::staging`].
    fn ring_slot(&mut self, read: bool) -> Result<Option<usize>, ServerError> {
        let policy = self.device.config.staging;
        // Fits a usize: a chunk larger than the host addresses is no pinned page.
        let chunk = usize::try_from(policy.chunk).unwrap_or(usize::MAX);
        let (shim, s) = self.parts();
        // A read first spreads the ring, while the pool has room to spare for it.
        if read && s.ring.len() < policy.read_buffers() {
            // Only while nobody records (the callers check), so the pool may add pages.
            if let Some(slice) = s.pinned.reserve_spare(shim, chunk) {
                return Ok(Some(s.ring.push(HostBuffer::pinned(slice))));
            }
        }
        let turn = s.ring.peek();
        // The slot in turn, if the device is done with it already.
        let done = match turn.map(|i| (i, s.ring.slot_mut(i).fence.as_ref())) {
            Some((i, None)) => Some((i, None)),
            Some((i, Some((event, _)))) => {
                FenceOutcome::query(shim, event).map(|outcome| (i, Some(outcome)))
            }
            None => None,
        };
        let i = match done {
            Some((i, outcome)) => {
                s.ring.advance();
                let fence = s.ring.slot_mut(i).fence.take();
                if let (Some(outcome), Some((_, mark))) = (outcome, fence) {
                    self.settle_slot(i, outcome, mark)?;
                }
                return Ok(Some(i));
            }
            None if s.ring.len() < policy.ring_depth() => {
                // Only while nobody records (the callers check), so the pool may add pages.
                if let Some(slice) = s.pinned.reserve(shim, chunk, true) {
                    return Ok(Some(s.ring.push(HostBuffer::pinned(slice))));
                }
                match turn {
                    Some(i) => i,
                    None => return Ok(None),
                }
            }
            None => match turn {
                Some(i) => i,
                None => return Ok(None),
            },
        };
        s.ring.advance();
        self.wait_slot(i)?;
        Ok(Some(i))
    }

    /// Waits for the fence after slot `i`'s last copy, if it has one, and settles it. A wait the
    /// shim refused for now leaves the fence on the slot (nothing reuses it before a wait
    /// passes) and is this operation's error.
    fn wait_slot(&mut self, i: usize) -> Result<(), ServerError> {
        let (shim, s) = self.parts();
        let Some((event, mark)) = s.ring.slot_mut(i).fence.take() else {
            return Ok(());
        };
        let outcome = FenceOutcome::wait(shim, &event);
        if let FenceOutcome::Refused(e) = outcome {
            s.ring.slot_mut(i).fence = Some((event, mark));
            return Err(ServerError::Device(e));
        }
        self.settle_slot(i, outcome, mark)
    }

    /// What the fence after slot `i`'s last copy said: told to the ledger as this operation's
    /// fence. A fence that says nothing about completion leaves the buffer to the device: it
    /// leaves the ring and is leaked, never reused.
    fn settle_slot(
        &mut self,
        i: usize,
        outcome: FenceOutcome,
        mark: crate::fault::FenceMark,
    ) -> Result<(), ServerError> {
        if let FenceOutcome::Unknown(_) = outcome {
            core::mem::forget(self.current().ring.take(i));
        }
        self.device
            .ledger
            .answer(self.stream, Fenced { outcome, mark })
    }

    /// Records the fence after the device copy that uses slot `i`. A fence that cannot be
    /// recorded leaves the copy uncovered: the buffer leaves the ring for the drop queue, whose
    /// next fence covers it.
    fn fence_slot(&mut self, i: usize) -> Result<(), ServerError> {
        let (shim, s) = self.parts();
        let mark = s.mark();
        match shim.record_event(&s.raw) {
            Ok(event) => {
                s.ring.slot_mut(i).fence = Some((event, mark));
                Ok(())
            }
            Err(e) => {
                let buffer = s.ring.take(i);
                s.drops.push(crate::drop_queue::DropItem::Host(buffer));
                Err(self.device.ledger.call_failed(e).into())
            }
        }
    }

    /// Uploads `src` (packed rows) into `handle`'s view at `t` with `layout`, pipelined through
    /// the staging ring; returns `false`, having done nothing, when the ring has no buffer and
    /// the pool cannot serve one. Only while no stream records. A failed piece (or a failed
    /// wait for a later buffer) fails the whole write: the pieces enqueued before it still land,
    /// but every row of the write is marked failed (the failure rule), so none is read as data.
    /// A failed wait for the first buffer, or a failed order after other streams, returns before
    /// anything is enqueued: the rows keep their bytes and marks.
    pub(super) fn upload_pipelined(
        &mut self,
        handle: &Handle,
        t: &Target,
        src: &[u8],
        layout: CopyLayout,
    ) -> Result<bool, ServerError> {
        let Some(first) = self.ring_slot(false)? else {
            return Ok(false);
        };
        self.device.order_after(self.stream, handle, t.owner)?;
        let chunk = self.device.config.staging.chunk;
        let mut outcome = Ok(());
        for (k, piece) in layout.pieces(chunk).enumerate() {
            let slot = if k == 0 {
                Ok(Some(first))
            } else {
                self.ring_slot(false)
            };
            outcome = match slot {
                Ok(Some(i)) => self.upload_piece(i, t, src, piece),
                // The ring lost its last buffer and the pool has none: the rest cannot be staged.
                Ok(None) => Err(IoError::HostAllocFailed { len: chunk }.into()),
                Err(e) => Err(e),
            };
            if outcome.is_err() {
                break;
            }
        }
        self.settle_writes(rows(handle, layout), &outcome);
        outcome.map(|()| true)
    }

    /// One piece of a pipelined upload through slot `i`: the host copy, the device copy, the
    /// fence.
    fn upload_piece(
        &mut self,
        i: usize,
        t: &Target,
        src: &[u8],
        piece: CopyPiece,
    ) -> Result<(), ServerError> {
        let (shim, s) = self.parts();
        let buffer = &mut s.ring.slot_mut(i).buffer;
        // Fit a usize: the piece lies in `src` (its length was checked against the layout) and
        // in the buffer (pieces are at most a chunk, the buffer's length).
        let (host, len) = (piece.host as usize, piece.layout.packed_bytes() as usize);
        // SAFETY: `src[host .. host + len]` lies in `src`; the buffer holds at least `len`
        // bytes, and the device is done with it (its last fence passed, or it is new); the two
        // are separate allocations.
        unsafe {
            shim.host_copy(
                buffer.as_mut_ptr(),
                src.as_ptr().add(host),
                len,
                HostCopy::Stage,
            )
        };
        let ptr = buffer.as_ptr();
        // SAFETY: the buffer stays in the ring, unchanged, until the fence recorded next passed
        // (or, if that fence cannot be recorded, in the drop queue until a later one did); the
        // piece lies in the view at `t` (its rows are rows of the checked layout).
        let copied = unsafe {
            shim.copy_to_device(
                &s.raw,
                ptr,
                HostMemory::Pinned,
                t.span.addr.offset(piece.device),
                piece.layout,
            )
        };
        copied.map_err(|e| ServerError::from(self.device.ledger.call_failed(e)))?;
        self.fence_slot(i)
    }

    /// Reads `handle`'s view at `t` with `layout` into `dst` (packed), pipelined through the
    /// staging ring: the device copies each piece into the next ring buffer; the host copies a
    /// piece out when its buffer comes round again, or once every piece is enqueued, while the
    /// device copies the later ones. Returns once every byte is in `dst`; `false`, having done nothing, when the
    /// ring has no buffer and the pool cannot serve one. Only while no stream records.
    ///
    /// # Errors
    ///
    /// The fault a wait reveals, the shim's refusal of a copy or a fence. `dst` then holds some
    /// of the bytes. A buffer the device may still write stays fenced in the ring, or, where its
    /// fence could not be recorded, goes to the drop queue for the next fence; one whose fence
    /// could not be read is leaked.
    pub(super) fn read_pipelined(
        &mut self,
        handle: &Handle,
        t: &Target,
        layout: CopyLayout,
        dst: &mut [u8],
    ) -> Result<bool, ServerError> {
        let Some(first) = self.ring_slot(true)? else {
            return Ok(false);
        };
        self.device.order_after(self.stream, handle, t.owner)?;
        let chunk = self.device.config.staging.chunk;
        // Fits a usize: the ring's buffers are `chunk` bytes of host memory.
        let chunk_bytes = usize::try_from(chunk).unwrap_or(usize::MAX);
        let spread = self.device.config.staging.read_buffers() > 0;
        // The pieces on their way into ring buffers, as (slot, offset in it, piece), oldest
        // first: they are copied out in the order the device fills them, wherever the ring's
        // turn started (waiting for a later piece first would leave the earlier ones' copies
        // for after the last DMA). At most one per slot.
        let mut pending: heapless::Vec<(usize, usize, CopyPiece), { MAX_DEPTH as usize }> =
            heapless::Vec::new();
        for (k, piece) in layout.pieces(chunk).enumerate() {
            let i = if k == 0 {
                first
            } else {
                // Once the ring is full the slot in turn holds an earlier piece: its fence was
                // waited for in `ring_slot`, and the piece is copied out before the slot is
                // reused.
                self.ring_slot(true)?
                    .ok_or(IoError::HostAllocFailed { len: chunk })?
            };
            if let Some(at) = pending.iter().position(|&(slot, _, _)| slot == i) {
                let (_, offset, done) = pending.remove(at);
                self.copy_out(i, offset, done, dst);
            }
            let (shim, s) = self.parts();
            let slot = s.ring.slot_mut(i);
            // Fits a usize: a piece is at most a chunk.
            let len = piece.layout.packed_bytes() as usize;
            let offset = if spread {
                slot.place_read(len, chunk_bytes)
            } else {
                0
            };
            // SAFETY: `offset` plus the piece's bytes lie in the buffer (`place_read`), which
            // holds a chunk; the buffer stays in the ring and is not read until the fence
            // recorded next passed; the piece lies in the view at `t`.
            let copied = unsafe {
                shim.copy_to_host(
                    &s.raw,
                    t.span.addr.offset(piece.device),
                    slot.buffer.as_mut_ptr().add(offset),
                    HostMemory::Pinned,
                    piece.layout,
                )
            };
            copied.map_err(|e| ServerError::from(self.device.ledger.call_failed(e)))?;
            self.fence_slot(i)?;
            if pending.push((i, offset, piece)).is_err() {
                // Unreachable: one entry per slot, and the ring holds at most `MAX_DEPTH`.
                return Err(IoError::HostAllocFailed { len: chunk }.into());
            }
        }
        for (i, offset, piece) in pending {
            self.wait_slot(i)?;
            self.copy_out(i, offset, piece, dst);
        }
        Ok(true)
    }

    /// Copies `piece` out of slot `i` (whose last fence passed), where it landed at `offset`,
    /// into `dst`.
    fn copy_out(&mut self, i: usize, offset: usize, piece: CopyPiece, dst: &mut [u8]) {
        let (shim, s) = self.parts();
        // SAFETY: `offset` lies in the buffer (`place_read` chose it for this piece).
        let src = unsafe { s.ring.slot_mut(i).buffer.as_ptr().add(offset) };
        // Fit a usize: the piece lies in `dst` (checked against the layout by the caller).
        let (host, len) = (piece.host as usize, piece.layout.packed_bytes() as usize);
        let dst = &mut dst[host..host + len];
        // SAFETY: the slot holds `len` bytes from `offset` on that the device finished writing
        // (its fence passed); `dst` is `len` bytes of a separate buffer.
        unsafe { shim.host_copy(dst.as_mut_ptr(), src, len, HostCopy::Unstage) };
    }
}
