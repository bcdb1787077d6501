//! Cross-stream order: before a stream uses memory another stream owns or used, it waits for that
//! stream's work on the device.
//!
//! Owns the record of foreign uses (which streams used an allocation besides its owner, and at
//! which cursor) and the one function every operation calls for each handle it touches
//! ([`Device::order_after`]). A wait is made once per other stream until that stream issues more
//! work (`Stream::synced`), and not at all for work a clean fence already covered. Does not own
//! the waits' faults: work ordered after a stream's failed work is refused while the fault is on
//! record (`fault.rs`), and a stream that waited before anyone heard of it learns of it from its
//! own fences (the shim contract's third rule).
//!
//! While a stream records, its own uses are recorded, not run: they wait for nothing (each replay
//! orders itself) and are bound to the recording instead. Another stream's use of memory the
//! recording touched is refused; its use of the recording stream's other memory waits for the
//! work enqueued before the recording began, on the event recorded then.

use crate::device::Device;
use crate::drop_queue::DropItem;
use crate::error::{CaptureError, ServerError};
use crate::memory::{AsBinding, Resolved};
use crate::shim::Shim;
use alloc::vec::Vec;
use hashbrown::HashMap;

/// Allocations used by streams other than their owner: which streams, at which cursor. A later
/// use on any other stream (the owner included) waits for those; entries go when the owner has
/// waited for them all or the allocation is freed.
#[derive(Debug, Default)]
pub(crate) struct ForeignUses(HashMap<u64, Vec<(usize, u64)>>);

impl ForeignUses {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The allocation `id` is gone: nothing can use it again.
    pub fn forget(&mut self, id: u64) {
        self.0.remove(&id);
    }

    /// The memory of allocation `from` now belongs to `to` (a bind): its uses follow it, for a
    /// later use of `to` to wait for (a bind inside a recording cannot wait itself).
    pub fn hand_over(&mut self, from: u64, to: u64) {
        if let Some(uses) = self.0.remove(&from) {
            for (stream, cursor) in uses {
                self.record(to, stream, cursor);
            }
        }
    }

    fn record(&mut self, id: u64, stream: usize, cursor: u64) {
        let uses = self.0.entry(id).or_default();
        match uses.iter_mut().find(|u| u.0 == stream) {
            Some(u) => u.1 = cursor,
            None => uses.push((stream, cursor)),
        }
    }

    /// The uses of `id` by streams other than `current` and `owner`.
    fn others(&self, id: u64, current: usize, owner: usize) -> Vec<(usize, u64)> {
        self.0.get(&id).map_or_else(Vec::new, |uses| {
            uses.iter()
                .copied()
                .filter(|&(user, _)| user != current && user != owner)
                .collect()
        })
    }
}

impl<S: Shim> Device<S> {
    /// Orders stream `current` after every other stream's work on the memory `binding` names: its
    /// owner's and any other stream's that used it. Called by every operation for every handle it
    /// touches, before it enqueues anything. Returns the device range the binding names.
    ///
    /// # Errors
    ///
    /// A handle of another device or one that names no memory (nothing is then recorded); a
    /// stream ordered after failed work ([`ServerError::StreamFaulted`]); the shim's refusal to
    /// record or wait.
    pub(crate) fn order_after(
        &mut self,
        current: usize,
        binding: &impl AsBinding,
    ) -> Result<Resolved, ServerError> {
        self.order(current, binding, true)
    }

    /// As [`Self::order_after`], for work that keeps its memory alive itself until a fence after
    /// it passes (a replay: its graph rides the drop queue), so no binding is queued for it.
    pub(crate) fn order_kept(
        &mut self,
        current: usize,
        binding: &impl AsBinding,
    ) -> Result<Resolved, ServerError> {
        self.order(current, binding, false)
    }

    fn order(
        &mut self,
        current: usize,
        binding: &impl AsBinding,
        keep_alive: bool,
    ) -> Result<Resolved, ServerError> {
        let b = binding.as_binding();
        let owner = self.owner_of(binding)?;
        let o = self.streams[owner].as_ref().expect("owner_of found it");
        // Resolve first: a handle that names no memory must leave no trace (no wait, no
        // keep-alive, no record of a use).
        let resolved = o.memory.resolve(binding)?;
        let owner_cursor = o.cursor;
        if let Some(r) = self.recording() {
            let window = self.streams[r]
                .as_mut()
                .and_then(|s| s.capture.window_mut())
                .expect("a recording stream has a window");
            if r == current {
                // Recorded, not run: nothing to wait for now (each replay orders itself), and
                // the recording keeps the memory.
                window.touch(b);
                return Ok(resolved);
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
            return Ok(resolved);
        }
        for (user, used_at) in self.foreign_uses.others(id, current, owner) {
            self.wait_for(current, user, used_at)?;
        }
        if current == owner {
            // The owner has waited for every foreign use: later owner uses need no wait.
            self.foreign_uses.forget(id);
        }
        Ok(resolved)
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
        let other_cursor = match self.streams[other]
            .as_ref()
            .and_then(|o| o.capture.window())
        {
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
            if let Some(pre) = o.capture.window().and_then(|w| w.pre_event.as_ref()) {
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
