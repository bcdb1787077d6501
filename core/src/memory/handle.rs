//! Handles and bindings: what a user holds for an allocation, and what in-flight work holds.
//!
//! Owns the identity of an allocation (refcounted, droppable from any thread), its location in
//! the pools, and the queue through which a dropped allocation reaches the device thread. Does not
//! own the memory itself: the pools do, and they check on every lookup that the handle asking is
//! the one the memory is bound to, so a stale handle resolves to an error, never to other memory.
//!
//! An identity is one heap block (an `Arc`). The last handle or binding dropped sends it back to
//! its manager with the allocation, and the manager keeps it ([`SpareIdentity`]) for its next
//! handle: a reserve and drop cycle on warm pools allocates nothing.

use super::pool::Pool;
use crate::error::{IoError, NotFoundReason};
use alloc::sync::{Arc, Weak};
use alloc::vec::Vec;
use core::mem::ManuallyDrop;
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};

const HANDED_OVER: u32 = u32::MAX;

/// Where an allocation lives: a pool of the manager and a block of that pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Location {
    pub pool: Pool,
    pub block: u32,
}

/// An allocation whose last handle and binding were dropped, on its way back to the device thread,
/// with its identity for the manager's next handle.
#[derive(Debug)]
pub(crate) struct Returned {
    pub location: Location,
    pub id: u64,
    pub identity: SpareIdentity,
}

/// The identity of an allocation that came back, kept by its manager for a new handle
/// ([`Handle::reusing`]): its heap block is reused instead of allocating one.
#[derive(Debug)]
pub(crate) struct SpareIdentity(Arc<Identity>);

/// Dropped allocations, pushed from any thread, drained by the device thread. The device memory
/// manager queues [`Returned`]; the pinned pool queues its own slices.
#[derive(Debug)]
pub(crate) struct ReturnQueue<T = Returned> {
    len: AtomicUsize,
    items: spin::Mutex<Vec<T>>,
}

impl<T> Default for ReturnQueue<T> {
    fn default() -> Self {
        Self {
            len: AtomicUsize::new(0),
            items: spin::Mutex::new(Vec::new()),
        }
    }
}

impl<T> ReturnQueue<T> {
    pub(crate) fn push(&self, item: T) {
        let mut items = self.items.lock();
        items.push(item);
        self.len.store(items.len(), Ordering::Release);
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
        out.append(&mut items);
        self.len.store(0, Ordering::Release);
    }
}

/// Who issued a handle: the device and the stream whose manager holds its memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Issuer {
    /// The device's id (unique in the process).
    pub device: u32,
    /// The stream's index on that device.
    pub stream: u32,
}

#[derive(Debug)]
pub(crate) struct Identity {
    id: u64,
    issuer: Issuer,
    size: u64,
    /// User handles (clones of [`Handle`]); bindings do not count.
    owners: AtomicU32,
    /// Handles and bindings: the last one dropped returns the allocation (see [`release`]).
    refs: AtomicU32,
    /// Whether its device address was ever handed out raw (a managed resource): work the core
    /// does not see may then use it, so the host is never lent its bytes (zero copy).
    exposed: AtomicBool,
    /// Live graphs that keep the allocation (their replays use it): while any does, its memory
    /// may not be given to another handle.
    graphs: AtomicU32,
    /// Packed location: the pool's [`Pool::code`] in `pool` ([`Pool::NO_CODE`]: none), the
    /// block in `block`. Written on the device
    /// thread only; read there and by the last reference's [`release`], which `refs` orders after
    /// every write.
    pool: AtomicU32,
    block: AtomicU32,
    /// Weak: a returned allocation in the queue holds its identity, which must not keep the
    /// queue alive in turn (a manager dropped with returns queued would leak both).
    returns: Weak<ReturnQueue>,
}

impl Identity {
    fn location(&self) -> Result<Location, NotFoundReason> {
        let pool = Pool::from_code(self.pool.load(Ordering::Relaxed));
        let block = self.block.load(Ordering::Relaxed);
        match (pool, block) {
            (Some(pool), _) => Ok(Location { pool, block }),
            (None, HANDED_OVER) => Err(NotFoundReason::HandedOver),
            (None, _) => Err(NotFoundReason::NeverBound),
        }
    }

    fn set_location(&self, location: Option<Location>, handed_over: bool) {
        let (pool, block) = match location {
            Some(l) => (l.pool.code(), l.block),
            None if handed_over => (Pool::NO_CODE, HANDED_OVER),
            None => (Pool::NO_CODE, 0),
        };
        self.pool.store(pool, Ordering::Relaxed);
        self.block.store(block, Ordering::Relaxed);
    }
}

/// The end of one reference to an allocation (a handle's or a binding's). The last one sends a
/// bound allocation back to its manager's return queue, with the identity for reuse; an
/// unbound one, or one whose manager is gone, just drops.
fn release(identity: Arc<Identity>) {
    // AcqRel: the last reference sees every location written before the others went (as an
    // `Arc`'s last drop does).
    if identity.refs.fetch_sub(1, Ordering::AcqRel) != 1 {
        return;
    }
    let Ok(location) = identity.location() else {
        return;
    };
    let Some(returns) = identity.returns.upgrade() else {
        return;
    };
    let id = identity.id;
    returns.push(Returned {
        location,
        id,
        identity: SpareIdentity(identity),
    });
}

/// What a user holds for an allocation. Cloning shares the allocation; the memory goes back to
/// its pool once every handle and every [`Binding`] is dropped (from any thread).
///
/// A handle may view a byte range of its allocation ([`Handle::view`]); lookups check the range
/// against the allocation.
#[derive(Debug)]
pub struct Handle {
    /// Taken out by `drop` (for [`release`]), never touched afterwards.
    identity: ManuallyDrop<Arc<Identity>>,
    offset: u64,
    len: u64,
}

impl Handle {
    #[cfg(test)]
    pub(crate) fn new(id: u64, issuer: Issuer, size: u64, returns: &Arc<ReturnQueue>) -> Self {
        Self::reusing(None, id, issuer, size, returns)
    }

    /// A new handle, in the heap block of `spare` when it is free to reuse (no reference to it is
    /// left: a binding dropped on another thread may still be on its way out), else a new one.
    pub(crate) fn reusing(
        spare: Option<SpareIdentity>,
        id: u64,
        issuer: Issuer,
        size: u64,
        returns: &Arc<ReturnQueue>,
    ) -> Self {
        let fresh = |returns: Weak<ReturnQueue>| Identity {
            id,
            issuer,
            size,
            owners: AtomicU32::new(1),
            refs: AtomicU32::new(1),
            exposed: AtomicBool::new(false),
            graphs: AtomicU32::new(0),
            pool: AtomicU32::new(Pool::NO_CODE),
            block: AtomicU32::new(0),
            returns,
        };
        let identity = match spare {
            Some(SpareIdentity(mut block)) => match Arc::get_mut(&mut block) {
                Some(slot) => {
                    // The same manager's queue: its weak reference is kept as it is (no two
                    // atomic updates to replace it with itself).
                    let kept = core::mem::take(&mut slot.returns);
                    let same = core::ptr::eq(kept.as_ptr(), Arc::as_ptr(returns));
                    *slot = fresh(if same { kept } else { Arc::downgrade(returns) });
                    block
                }
                None => Arc::new(fresh(Arc::downgrade(returns))),
            },
            None => Arc::new(fresh(Arc::downgrade(returns))),
        };
        Self {
            identity: ManuallyDrop::new(identity),
            offset: 0,
            len: size,
        }
    }

    /// The allocation's id (unique on its device, never reused).
    pub fn id(&self) -> u64 {
        self.identity.id
    }

    /// Who issued the handle.
    pub fn issuer(&self) -> Issuer {
        self.identity.issuer
    }

    /// Bytes of the whole allocation.
    pub fn allocation_size(&self) -> u64 {
        self.identity.size
    }

    /// First byte of this handle's view, from the start of the allocation.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Bytes of this handle's view.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the view is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A handle on `len` bytes from `offset` of this view, sharing the allocation.
    ///
    /// # Errors
    ///
    /// [`IoError::OutOfRange`] when the range passes the end of this view.
    pub fn view(&self, offset: u64, len: u64) -> Result<Handle, IoError> {
        check_range(offset, len, self.len)?;
        let mut h = self.clone();
        h.offset += offset;
        h.len = len;
        Ok(h)
    }

    /// Whether this is the only user handle: the memory may be updated in place. Bindings held by
    /// in-flight work do not count.
    pub fn can_mut(&self) -> bool {
        self.identity.owners.load(Ordering::Acquire) == 1
    }

    /// Whether some binding (in-flight work, a raw address handed out) is outstanding.
    pub fn is_bound(&self) -> bool {
        self.identity.refs.load(Ordering::Acquire) > self.identity.owners.load(Ordering::Acquire)
    }

    /// Marks the allocation's device address as handed out raw (for good).
    pub(crate) fn expose(&self) {
        self.identity.exposed.store(true, Ordering::Release);
    }

    /// Whether a live graph keeps the allocation (its replays use it).
    pub fn is_kept_by_graph(&self) -> bool {
        self.identity.graphs.load(Ordering::Acquire) > 0
    }

    /// Whether the allocation's device address was ever handed out raw
    /// ([`Command::managed_resource`](crate::Command::managed_resource)).
    pub fn is_exposed(&self) -> bool {
        self.identity.exposed.load(Ordering::Acquire)
    }

    /// Whether `other` names the same allocation (itself, a clone or a view of it): one
    /// pointer compare.
    pub(crate) fn same_allocation(&self, other: &Handle) -> bool {
        Arc::ptr_eq(&self.identity, &other.identity)
    }

    /// A binding for in-flight work: keeps the memory alive without counting as an owner.
    pub fn binding(&self) -> Binding {
        self.as_binding().to_binding()
    }

    pub(crate) fn set_location(&self, location: Option<Location>, handed_over: bool) {
        self.identity.set_location(location, handed_over);
    }
}

impl Clone for Handle {
    fn clone(&self) -> Self {
        self.identity.owners.fetch_add(1, Ordering::AcqRel);
        self.identity.refs.fetch_add(1, Ordering::Relaxed);
        Self {
            identity: ManuallyDrop::new(Arc::clone(&self.identity)),
            offset: self.offset,
            len: self.len,
        }
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.identity.owners.fetch_sub(1, Ordering::AcqRel);
        // SAFETY: taken once, here; the field is not used again.
        release(unsafe { ManuallyDrop::take(&mut self.identity) });
    }
}

/// A handle's view used by in-flight work: keeps the allocation alive, owns nothing.
#[derive(Debug)]
pub struct Binding {
    /// Taken out by `drop` (for [`release`]), never touched afterwards.
    identity: ManuallyDrop<Arc<Identity>>,
    offset: u64,
    len: u64,
}

impl Clone for Binding {
    fn clone(&self) -> Self {
        self.as_binding().to_binding()
    }
}

impl Drop for Binding {
    fn drop(&mut self) {
        // SAFETY: taken once, here; the field is not used again.
        release(unsafe { ManuallyDrop::take(&mut self.identity) });
    }
}

impl Binding {
    /// Counts one more live graph keeping the allocation (undone by [`Self::release_graph`]).
    pub(crate) fn keep_for_graph(&self) {
        self.identity.graphs.fetch_add(1, Ordering::AcqRel);
    }

    /// Undoes one [`Self::keep_for_graph`].
    pub(crate) fn release_graph(&self) {
        self.identity.graphs.fetch_sub(1, Ordering::AcqRel);
    }

    /// The allocation's id.
    pub fn id(&self) -> u64 {
        self.identity.id
    }

    /// Who issued the allocation.
    pub fn issuer(&self) -> Issuer {
        self.identity.issuer
    }

    /// First byte of the view.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Bytes of the view.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the view is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes of the whole allocation.
    pub fn allocation_size(&self) -> u64 {
        self.identity.size
    }
}

/// Something that names an allocation: a handle or a binding.
pub trait AsBinding {
    /// The binding view of it.
    fn as_binding(&self) -> BindingRef<'_>;
}

/// A borrowed view of a handle or binding, for lookups.
#[derive(Debug, Clone, Copy)]
pub struct BindingRef<'a> {
    identity: &'a Arc<Identity>,
    offset: u64,
    len: u64,
}

impl BindingRef<'_> {
    /// An owned binding of the same view.
    pub fn to_binding(&self) -> Binding {
        // Relaxed, as an `Arc` clone: the reference this one is made from keeps the count above 0.
        self.identity.refs.fetch_add(1, Ordering::Relaxed);
        Binding {
            identity: ManuallyDrop::new(Arc::clone(self.identity)),
            offset: self.offset,
            len: self.len,
        }
    }

    pub(crate) fn id(&self) -> u64 {
        self.identity.id
    }
    pub(crate) fn issuer(&self) -> Issuer {
        self.identity.issuer
    }
    pub(crate) fn offset(&self) -> u64 {
        self.offset
    }
    pub(crate) fn len(&self) -> u64 {
        self.len
    }
    pub(crate) fn allocation_size(&self) -> u64 {
        self.identity.size
    }
    /// Whether `other` names the same allocation (itself, a clone, a view or a binding of it).
    pub(crate) fn same_allocation(&self, other: &BindingRef<'_>) -> bool {
        Arc::ptr_eq(self.identity, other.identity)
    }
    pub(crate) fn location(&self) -> Result<Location, IoError> {
        self.identity
            .location()
            .map_err(|reason| IoError::NotFound {
                handle: self.identity.id,
                reason,
            })
    }
}

impl AsBinding for Handle {
    fn as_binding(&self) -> BindingRef<'_> {
        BindingRef {
            identity: &self.identity,
            offset: self.offset,
            len: self.len,
        }
    }
}

impl AsBinding for Binding {
    fn as_binding(&self) -> BindingRef<'_> {
        BindingRef {
            identity: &self.identity,
            offset: self.offset,
            len: self.len,
        }
    }
}

/// Checks that `offset .. offset + len` lies inside `size` bytes.
pub(crate) fn check_range(offset: u64, len: u64, size: u64) -> Result<(), IoError> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(IoError::OutOfRange { offset, len, size }),
    }
}

#[cfg(test)]
#[path = "handle_tests.rs"]
mod tests;
