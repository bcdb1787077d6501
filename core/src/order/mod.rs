//! Cross-stream order: before a stream uses memory another stream owns or used, it waits for that
//! stream's work on the device.
//!
//! Owns where a handle's memory is as an operation sees it (the stream that owns it and its device
//! range: [`Device::owner_of`], [`Device::target`]), the record of foreign uses (which streams
//! used an allocation besides its owner, and at which cursor) and the one function every operation
//! calls for each handle it touches ([`Device::order_after`]); the record itself is `foreign.rs`.
//! A wait is made once per other stream until that stream issues more
//! work (`Stream::synced`), and not at all for work a clean fence already covered. Does not own
//! the waits' faults: work ordered after a stream's failed work is refused while the fault is on
//! record (`fault.rs`), and a stream that waited before anyone heard of it learns of it from its
//! own fences (the shim contract's third rule).
//!
//! While a stream records, its own uses are recorded, not run: they wait for nothing (each replay
//! orders itself) and are bound to the recording instead. Another stream's use of memory the
//! recording touched is refused; its use of the recording stream's other memory waits for the
//! work enqueued before the recording began, on the event recorded then.

mod foreign;

pub(crate) use foreign::ForeignUses;

use crate::device::Device;
use crate::drop_queue::DropItem;
use crate::error::{CaptureError, IoError, NotFoundReason, ServerError};
use crate::memory::{AsBinding, Issuer};
use crate::shim::{DeviceSpan, Shim};
use crate::stream::Stream;

/// Where a handle's memory is: the stream that owns it and the device range it names. Found once
/// per handle per operation ([`Device::target`]), before anything is enqueued.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Target {
    /// The stream whose manager holds the memory.
    pub owner: usize,
    /// The device range.
    pub span: DeviceSpan,
}

impl<S: Shim> Device<S> {
    /// Where `binding`'s memory is, with no side effect: a handle that names no memory leaves no
    /// trace (no wait, no keep-alive, no record of a use).
    ///
    /// # Errors
    ///
    /// [`IoError::ForeignHandle`](crate::IoError::ForeignHandle),
    /// [`IoError::NotFound`](crate::IoError::NotFound),
    /// [`IoError::OutOfRange`](crate::IoError::OutOfRange).
    #[inline]
    pub(crate) fn target(&self, binding: &impl AsBinding) -> Result<Target, IoError> {
        let (owner, stream) = self.owner_of(binding)?;
        let span = stream.memory.span_issued(binding)?;
        Ok(Target { owner, span })
    }

    /// The stream whose manager holds `binding`'s memory: its index and the stream.
    ///
    /// # Errors
    ///
    /// [`IoError::ForeignHandle`] for a handle of another device; [`IoError::NotFound`] (stale)
    /// for a stream this device no longer has.
    #[inline]
    pub(crate) fn owner_of(
        &self,
        binding: &impl AsBinding,
    ) -> Result<(usize, &Stream<S>), IoError> {
        let b = binding.as_binding();
        // The usual case: the stream the id names made it, as the identity's queue, read beside
        // the id, proves; the queue itself, which holds the issuer, is read only past it.
        let named = crate::memory::stream_named(b.id());
        if let Some(Some(s)) = self.streams.get(named)
            && s.memory.made(binding)
        {
            debug_assert_eq!(
                s.memory.issuer(),
                Issuer {
                    device: self.id,
                    stream: named as u32
                },
                "a device's stream i issues as (device, i)"
            );
            return Ok((named, s));
        }
        let issuer = b.issuer();
        if issuer.device != self.id {
            return Err(IoError::foreign_handle(issuer.device, self.id));
        }
        let owner = issuer.stream as usize;
        match self.streams.get(owner) {
            Some(Some(s)) => Ok((owner, s)),
            _ => Err(IoError::NotFound {
                handle: b.id(),
                reason: NotFoundReason::Stale,
            }),
        }
    }

    /// Orders stream `current` after every other stream's work on the memory `binding` names
    /// (owned by stream `owner`, as [`Self::target`] found): its owner's and any other stream's
    /// that used it. Called by every operation for every handle it touches, once its checks passed
    /// and before it enqueues anything; the binding rides this stream's drop queue when another
    /// stream owns the memory.
    ///
    /// # Errors
    ///
    /// [`CaptureError::RecordedElsewhere`]; a stream ordered after failed work
    /// ([`ServerError::StreamFaulted`]); the shim's refusal to record or wait.
    #[inline]
    pub(crate) fn order_after(
        &mut self,
        current: usize,
        binding: &impl AsBinding,
        owner: usize,
    ) -> Result<(), ServerError> {
        self.order(current, binding, owner, true)
    }

    /// As [`Self::order_after`], for work that keeps its memory alive itself until a fence after
    /// it passes (a replay: its graph rides the drop queue), so no binding is queued for it.
    pub(crate) fn order_kept(
        &mut self,
        current: usize,
        binding: &impl AsBinding,
    ) -> Result<(), ServerError> {
        let target = self.target(binding)?;
        self.order(current, binding, target.owner, false)
    }

    /// Whether ordering a stream after others has nothing to do for memory that stream owns: no
    /// recording, no fault on record and no other stream's use of anything (each step
    /// of the slow path would pass). Asked once per operation; memory another stream owns is
    /// ordered either way.
    #[inline]
    pub(crate) fn order_is_quiet(&self) -> bool {
        self.recording().is_none() && self.ledger.clean() && self.foreign_uses.is_empty()
    }

    #[inline]
    fn order(
        &mut self,
        current: usize,
        binding: &impl AsBinding,
        owner: usize,
        keep_alive: bool,
    ) -> Result<(), ServerError> {
        // The usual case, with nothing to do: the stream's own memory, and nothing else to do.
        if owner == current && self.order_is_quiet() {
            return Ok(());
        }
        self.order_slow(current, binding, owner, keep_alive)
    }

    /// [`Self::order`] when some step may have something to do.
    #[inline(never)]
    fn order_slow(
        &mut self,
        current: usize,
        binding: &impl AsBinding,
        owner: usize,
        keep_alive: bool,
    ) -> Result<(), ServerError> {
        let b = binding.as_binding();
        let owner_cursor = self.streams[owner].as_ref().map_or(0, |o| o.cursor);
        if let Some(r) = self.recording()
            && let Some(window) = self.capture.window_mut()
        {
            if r == current {
                // Recorded, not run: nothing to wait for now (each replay orders itself), and
                // the recording keeps the memory.
                window.touch(b);
                return Ok(());
            }
            if window.touches(b.id()) {
                return Err(CaptureError::RecordedElsewhere {
                    stream: current as u32,
                    recording: r as u32,
                    handle: b.id(),
                }
                .into());
            }
        }
        // What the owner wrote is untrustworthy if its work may have failed.
        self.ledger.check_stream_at(owner, owner_cursor)?;
        let id = b.id();
        if owner != current {
            self.wait_for(current, owner, owner_cursor)?;
            let c = self.streams[current].as_mut().expect("current exists");
            let cursor = c.cursor;
            if keep_alive {
                c.drops.push(DropItem::Binding(b.to_binding()));
            }
            self.foreign_uses.record(id, current, cursor);
        }
        // Other streams that used this allocation (a kernel on another stream may have written
        // it): order after their work too, or this use could overtake theirs.
        if self.foreign_uses.is_empty() {
            return Ok(());
        }
        for (user, used_at) in self.foreign_uses.others(id, current, owner) {
            self.wait_for(current, user, used_at)?;
        }
        if current == owner {
            // The owner has waited for every foreign use: later owner uses need no wait.
            self.foreign_uses.forget(id);
        }
        Ok(())
    }

    /// Makes stream `current` wait on the device for the work stream `other` issued up to
    /// cursor `other_cursor`, unless it already did. When `other` records, only its work from
    /// before the recording is waited for (what it recorded since has not run), on the event
    /// recorded when the recording began.
    fn wait_for(
        &mut self,
        current: usize,
        other: usize,
        other_cursor: u64,
    ) -> Result<(), ServerError> {
        let recording = self.recording() == Some(other);
        let other_cursor = match self.capture.window() {
            Some(w) if recording => other_cursor.min(w.began_at),
            _ => other_cursor,
        };
        if self.ledger.clean_through(other, other_cursor) {
            // That work completed cleanly (a fence after it passed): nothing to wait for.
            return Ok(());
        }
        // Work ordered after a stream whose work failed would read what it left unwritten.
        self.ledger.check_stream_at(other, other_cursor)?;
        let synced = self.streams[current]
            .as_ref()
            .and_then(|s| s.synced.get(other).copied())
            .unwrap_or(0);
        if other_cursor <= synced {
            return Ok(());
        }
        let o = self.streams[other].as_ref().expect("checked by the caller");
        let c = self.streams[current].as_ref().expect("current exists");
        if recording {
            // `begin_capture` records the event; without one there was nothing to wait for.
            if let Some(pre) = self.capture.window().and_then(|w| w.pre_event.as_ref()) {
                self.shim
                    .stream_wait_event(&c.raw, pre)
                    .map_err(|e| self.ledger.call_failed(e))?;
            }
        } else {
            let event = self
                .shim
                .record_event(&o.raw)
                .map_err(|e| self.ledger.call_failed(e))?;
            self.shim
                .stream_wait_event(&c.raw, &event)
                .map_err(|e| self.ledger.call_failed(e))?;
        }
        let c = self.streams[current].as_mut().expect("current exists");
        if c.synced.len() <= other {
            c.synced.resize(other + 1, 0);
        }
        c.synced[other] = other_cursor;
        Ok(())
    }
}
