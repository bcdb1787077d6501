//! The return queue: what dropped handles (and the pinned pool's slices, and finished graphs)
//! send back to the device thread.
//!
//! Owns the queue itself: a push from any thread, a drain on the device thread that costs one
//! atomic load when nothing came back, and the close that breaks the circle between a manager's
//! queue and the identities it holds, and ringing the device's [`Attention`] after a push when the
//! drainer asked for it. A manager's queue also keeps who issued its handles, once for all of them
//! (each identity points to its queue). Does not own what is queued (handles, `handle.rs`; the
//! pinned pool's slices, `pinned.rs`) nor what the drainer does with it.

use alloc::sync::Arc;
use alloc::vec::Vec;
use core::sync::atomic::Ordering;

use super::types::Issuer;
use crate::attention::Attention;
use crate::sync::{AtomicUsize, Mutex};

/// Dropped allocations, pushed from any thread, drained by the device thread. The device memory
/// manager queues [`Returned`](super::handle::Returned); the pinned pool queues its own slices.
///
/// The manager's queue is held by the identities it issued (strongly: no upgrade per return), and
/// a returned identity in the queue holds the queue in turn; the manager breaks that circle when
/// it goes ([`Self::close`]): the queue is emptied and takes nothing more.
#[derive(Debug)]
pub(crate) struct Queue<T> {
    len: AtomicUsize,
    /// The items, and whether the queue is closed.
    items: Mutex<(Vec<T>, bool)>,
    /// Rung after every push, when the drainer asked for it ([`Self::issued_by`]).
    attention: Option<Arc<Attention>>,
    /// Who issued what is queued: the manager's device and stream, kept here once for every
    /// handle it issues (a handle's identity reaches it through its queue). A manager's queue is
    /// always made by [`Self::issued_by`]; the queues made by `Default` (the pinned pool's, the
    /// graphs') hold no handle, and their issuer (device 0, which no device has) is never read.
    issuer: Issuer,
}

impl<T> Default for Queue<T> {
    fn default() -> Self {
        Self {
            len: AtomicUsize::new(0),
            items: Mutex::new((Vec::new(), false)),
            attention: None,
            issuer: Issuer {
                device: 0,
                stream: 0,
            },
        }
    }
}

impl<T> Queue<T> {
    /// An empty queue for what `issuer` issues, that rings `attention` (if any) after every
    /// push.
    pub(crate) fn issued_by(issuer: Issuer, attention: Option<Arc<Attention>>) -> Self {
        Self {
            attention,
            issuer,
            ..Self::default()
        }
    }

    /// Who issued what is queued (see [`Self::issued_by`]).
    #[inline]
    pub(crate) fn issuer(&self) -> Issuer {
        self.issuer
    }

    /// Queues `item`, or hands it back when the queue is closed; for a caller that holds the
    /// queue itself (the item does not).
    pub(crate) fn push(&self, item: T) -> Result<(), T> {
        // SAFETY: `self` is live for the whole call.
        unsafe { Self::push_held_by_item(self, item) }
    }

    /// Queues `item`, or hands it back when the queue is closed (the caller drops it, after this
    /// call: dropping it may free the queue): for an item that holds the queue, the caller's last
    /// hold on it (a handle's last drop).
    ///
    /// A pointer, not `&self`: once the lock is released the drainer may drop the item, and with
    /// it the last hold on the queue, before this call returns; a reference argument would have to
    /// stay valid for the whole call (Rust's aliasing rules), a local one only until its last use.
    ///
    /// # Safety
    ///
    /// `this` points at a live queue until the lock is taken here (the item pushed holds it from
    /// then on, or, refused, is handed back).
    pub(crate) unsafe fn push_held_by_item(this: *const Self, item: T) -> Result<(), T> {
        // SAFETY: live until the lock is taken (the caller's promise), then held by the item
        // pushed until the lock is released, after `queue`'s last use; a refused item goes back
        // to the caller, who holds it.
        let queue = unsafe { &*this };
        let mut items = queue.items.lock();
        if items.1 {
            return Err(item);
        }
        items.0.push(item);
        queue.len.store(items.0.len(), Ordering::Release);
        // Under the lock: once it is released the drainer may drop the item, and with it the
        // last hold on this queue.
        if let Some(a) = &queue.attention {
            a.ring();
        }
        Ok(())
    }

    /// Closes the queue: what it holds is dropped and later pushes are handed back.
    pub(crate) fn close(&self) {
        let items = {
            let mut items = self.items.lock();
            items.1 = true;
            self.len.store(0, Ordering::Release);
            core::mem::take(&mut items.0)
        };
        drop(items); // outside the lock: an item's drop may push to another queue
    }

    /// Whether the queue was closed (its manager is gone).
    pub(crate) fn is_closed(&self) -> bool {
        self.items.lock().1
    }

    /// Whether nothing was returned since the last drain (one atomic load).
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.len.load(Ordering::Acquire) == 0
    }

    /// Moves every returned allocation into `out` (cheap when there is none).
    pub(crate) fn drain_into(&self, out: &mut Vec<T>) {
        if self.len.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut items = self.items.lock();
        if out.is_empty() {
            // The usual case (the drainer empties `out` before the next drain): the two vectors
            // trade places, no item is copied, and the next pushes go into `out`'s capacity.
            core::mem::swap(out, &mut items.0);
        } else {
            out.append(&mut items.0);
        }
        self.len.store(0, Ordering::Release);
    }
}
