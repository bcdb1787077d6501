//! Copies between two devices of one process: [`Command::copy_from`], a range of one device's
//! allocation into another device's allocation, peer to peer where the shims allow it
//! ([`Shim::peer_access`]), through host memory otherwise.
//!
//! Owns the steps of the copy across the pair and the rules that hold across it:
//!
//! - **Order.** The copy runs on the destination's stream, after the source stream's work (an
//!   event of the source device waited by the destination stream) and after every stream's work
//!   on either range (each device's own order, `order/`). After the copy the source stream waits
//!   for an event the destination stream recorded behind it: from then on the source device's
//!   own fences cover the copy, so its drop queue frees nothing the copy still reads and its
//!   later work on the range cannot overtake the copy. The price: a fault of the destination
//!   stream's earlier work, not yet heard of, travels to the source stream with that wait (the
//!   contract's third rule) and faults it too — a failure is never hidden, and on CUDA a kernel
//!   fault loses every context of the process anyway. A fault already on record on either side
//!   refuses the copy.
//! - **The failure rule.** Source bytes that carry a failure are not copied: the destination's
//!   bytes carry a new failure on the destination device whose root is the source's, and the
//!   call returns [`ServerError::Skipped`].
//! - **The drop queue.** The destination stream keeps the destination's memory as for any
//!   write; the source stream's wait after the copy keeps the source's: what its drop queue
//!   frees later waits for a fence recorded after that wait, and the slices it reuses at once
//!   are written only by work enqueued after it. Where that wait cannot be enqueued, the call
//!   marks the destination's bytes failed, waits on the host for the destination's event after
//!   the copy, and fails; where even that event is missing or its wait inconclusive, the
//!   source's allocation is leaked rather than freed while the copy may still read it. Where the
//!   host wait is refused for now ([`Fault::Busy`](crate::Fault::Busy): another device of the
//!   process records), the destination stream's next fence still covers the copy: the source's
//!   allocation waits in that stream's drop queue instead. Either way its room is never handed
//!   to another handle (`bind`), and the source device's teardown waits for the copy's event
//!   again ([`PeerRead`]): it frees its memory once that passed, and otherwise keeps all of it,
//!   and its shim (a CUDA context released takes its memory with it).
//! - **Capture.** Refused while a stream of either device records: a recording cannot wait on
//!   another device's work.
//! - **Staged** (no peer access): a read of the source into host memory on the source device
//!   (pipelined through its pinned ring when large), waited for, then an upload on the
//!   destination (staged through its pinned pool). Two whole operations, one per device, ordered
//!   by the host's wait; each device's rules hold on its own side.
//!
//! Does not own either device's order, failure records or drop queues (it calls them), nor what
//! a shim does for a peer copy (`shim/`).

use super::Command;
use super::engine::view;
use super::transfer::ReadRequest;
use crate::error::{IoError, ServerError, Validation};
use crate::fault::FenceOutcome;
use crate::host::HostBuffer;
use crate::memory::Handle;
use crate::order::Target;
use crate::peer::PeerRead;
use crate::shim::Shim;
use alloc::sync::Arc;

/// How [`Command::copy_from`] moved the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum CopyPath {
    /// Device to device, by the destination device ([`Shim::copy_peer`]).
    Peer,
    /// Through host memory: read on the source device, uploaded on the destination device.
    Staged,
    /// Nothing to copy (empty views).
    Empty,
}

impl<S: Shim> Command<'_, S> {
    /// Copies the bytes of `src`'s view, on the device `from` drives, into `dst`'s view on this
    /// command's device (views of the same length; use [`Handle::view`] for ranges). The copy
    /// runs on this command's stream, ordered after `from`'s stream and every other stream's
    /// work on both ranges; `from`'s stream is ordered after the copy. Peer to peer where the
    /// shim allows it ([`Shim::peer_access`]), else through host memory (then this call blocks
    /// until the source's bytes are read). See the module documentation for the rules that
    /// hold across the two devices.
    ///
    /// # Errors
    ///
    /// [`Validation::ViewLengths`] for views of different lengths; [`IoError::HostAllocFailed`]
    /// when the copy goes through host memory and the heap cannot hold the source;
    /// [`IoError::ForeignHandle`] (naming both devices) for a
    /// handle used on the wrong side; [`Validation::Recording`] while a stream of either device
    /// records; [`ServerError::Skipped`] when source bytes carry a failure (the destination's
    /// bytes then carry it); a fault on record on either side; the shim's refusal (the
    /// destination's range is then marked failed).
    pub fn copy_from(
        &mut self,
        dst: &Handle,
        from: &mut Command<'_, S>,
        src: &Handle,
    ) -> Result<CopyPath, ServerError> {
        const OP: &str = "copy_from";
        self.begin()?;
        from.begin()?;
        // Two commands borrow two devices: one device cannot be on both sides.
        debug_assert_ne!(self.device.id, from.device.id);
        self.refuse_while_recording(OP)?;
        from.refuse_while_recording(OP)?;
        if src.len() != dst.len() {
            return Err(Validation::ViewLengths {
                dst: dst.len(),
                src: src.len(),
            }
            .into());
        }
        let source = from.device.target(src)?;
        let target = self.device.target(dst)?;
        // The failure rule across the pair: the source's failure becomes the destination's.
        if let Some(f) = from.carried(core::iter::once(view(src))) {
            let root = from.device.failures.report(f, src.id());
            let failures = &mut self.device.failures;
            let g = failures.new_failure(root);
            let w = view(dst);
            failures.mark(w.id, w.start, w.end, g);
            failures.skipped(g, OP);
            return Err(ServerError::Skipped {
                kernel: OP,
                failure: g,
            });
        }
        if src.is_empty() {
            return Ok(CopyPath::Empty);
        }
        if !self.device.shim.peer_access(&from.device.shim) {
            return self.staged(dst, from, src);
        }
        self.peer(dst, target, from, src, source)
    }

    /// The copy by the destination device ([`Shim::copy_peer`]), between the waits that order
    /// it (see the module documentation); `target` and `source` are `dst` and `src` resolved.
    fn peer(
        &mut self,
        dst: &Handle,
        target: Target,
        from: &mut Command<'_, S>,
        src: &Handle,
        source: Target,
    ) -> Result<CopyPath, ServerError> {
        from.device.order_after(from.stream, src, source.owner)?;
        self.device.order_after(self.stream, dst, target.owner)?;
        // The destination stream waits for the source stream (which waited for every stream's
        // work on the source range just now).
        let (d, s) = (&mut *self.device, &mut *from.device);
        let (draw, sraw) = (
            &d.streams[self.stream].as_ref().expect("exists").raw,
            &s.streams[from.stream].as_ref().expect("exists").raw,
        );
        let before = s
            .shim
            .record_event(sraw)
            .map_err(|e| s.ledger.call_failed(e))?;
        d.shim
            .stream_wait_event(draw, &before)
            .map_err(|e| d.ledger.call_failed(e))?;
        // SAFETY: both ranges were resolved just now to live ranges of their allocations (the
        // target's checks), of `src.len()` bytes each; the destination's allocation is kept as
        // for any write on its stream, the source's by the source stream's wait after the copy
        // (or, where that wait fails, by a host wait for the copy or a leak), so neither page is
        // freed before the copy is done.
        let copied = unsafe {
            d.shim
                .copy_peer(draw, target.span.addr, &s.shim, source.span.addr, src.len())
        }
        .map_err(|e| ServerError::from(d.ledger.call_failed(e)));
        self.settle_writes(core::iter::once(view(dst)), &copied);
        copied?;
        // The source stream waits for the copy: its own fences cover it from now on.
        let (d, s) = (&mut *self.device, &mut *from.device);
        let dstream = d.streams[self.stream].as_ref().expect("exists");
        let sstream = s.streams[from.stream].as_ref().expect("exists");
        let after = d
            .shim
            .record_event(&dstream.raw)
            .map_err(|e| d.ledger.call_failed(e));
        let waited = match &after {
            Ok(after) => s
                .shim
                .stream_wait_event(&sstream.raw, after)
                .map_err(|e| s.ledger.call_failed(e)),
            Err(e) => Err(*e),
        };
        if let Err(e) = waited {
            // The source's fences do not cover the copy, and later source work could overtake
            // it: the destination's bytes are not trusted, and this call waits until the
            // destination is done with the source's memory. Where nothing says when that is
            // (the event could not be recorded, or its wait was refused or inconclusive), the
            // source's memory is kept, never handed out while the copy may read it, and its
            // device's teardown asks again.
            let error = ServerError::from(e);
            self.settle_writes(core::iter::once(view(dst)), &Err(error.clone()));
            let outcome = match &after {
                Ok(ev) => FenceOutcome::wait(&*self.device.shim, ev),
                // Unless the destination is lost, nothing says when the copy is done.
                Err(e) => FenceOutcome::unrecorded(*e),
            };
            if outcome.completed() {
                return Err(error);
            }
            if let FenceOutcome::Refused(_) = outcome {
                // The wait was refused for now (another device of the process records): this
                // stream's next fence, recorded after the copy, covers it, so the source is kept
                // in this stream's drop queue until then.
                self.current()
                    .drops
                    .push(crate::drop_queue::DropItem::Binding(src.binding()));
            } else {
                warn!(
                    "copy_from: the end of a copy to another device is unknown: leaking its source"
                );
                core::mem::forget(src.binding());
            }
            // Marked as used by work the source device does not see: no `bind` hands its room to
            // another handle (whose drop could free it under the copy), and no zero-copy read
            // lends its bytes. The source device's teardown waits for the copy's event (again)
            // and keeps all its memory if it still cannot tell that the copy is done.
            src.expose();
            from.device.peer_reads.push(PeerRead {
                shim: Arc::clone(&self.device.shim),
                after: after.ok(),
                recording: self.device.capture.flag(),
            });
            return Err(error);
        }
        if self.current().drops.should_flush() {
            self.flush_after_enqueue()?;
        }
        Ok(CopyPath::Peer)
    }

    /// The copy through host memory: `src` read on `from`'s device and waited for, then
    /// uploaded into `dst` here.
    fn staged(
        &mut self,
        dst: &Handle,
        from: &mut Command<'_, S>,
        src: &Handle,
    ) -> Result<CopyPath, ServerError> {
        // The whole source passes through host memory: a heap that cannot hold it is an error,
        // not an abort.
        let len =
            usize::try_from(src.len()).map_err(|_| IoError::HostAllocFailed { len: src.len() })?;
        let buffer = HostBuffer::try_zeroed(len)?;
        let read = from
            .read_to(ReadRequest::whole(src), buffer)
            .and_then(|pending| pending.wait());
        let bytes = match read {
            Ok(bytes) => bytes,
            Err(e) => {
                // The destination's bytes carry what the read met.
                self.settle_writes(core::iter::once(view(dst)), &Err(e.clone()));
                return Err(e);
            }
        };
        self.write_from(dst, bytes.as_slice())?;
        Ok(CopyPath::Staged)
    }
}
