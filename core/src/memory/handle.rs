//! Handles and bindings: what a user holds for an allocation, and what in-flight work holds.
//!
//! Owns the identity of an allocation (refcounted, droppable from any thread), its location in
//! the pools with the device address it was placed at, and what the last reference does: send
//! the allocation back through the return queue (`return_queue.rs`). Bindings, which in-flight
//! work holds, are in `binding.rs`. Does not own the memory itself: the pools do. A lookup
//! through the pools checks that the handle asking is the one the memory is bound to, so a stale
//! handle resolves to an error, never to other memory; the engine's lookup takes the kept address
//! instead, which is sound because a live handle's location always names a block it holds (see
//! `MemoryManager::span_issued`; debug builds check it against the pools).
//!
//! An identity is one heap block (a `Box` with a count of its own: handles and bindings point at
//! it and count in `refs`, so a binding's clone or drop is one atomic update and a handle's two,
//! with its count of owners; no `Arc` header adds its two counts to every allocation). The last
//! handle or binding dropped takes the `Box` back and sends it to its manager with the
//! allocation, and the manager keeps it
//! ([`SpareIdentity`]) for its next handle: a reserve and drop cycle on warm pools allocates
//! nothing.

use super::pool::{Location, Placed, Pool};
use super::return_queue::Queue;
use super::types::Issuer;
use crate::error::{IoError, NotFoundReason};
use crate::sync::{AtomicU32, AtomicUsize, SetMut};
use alloc::boxed::Box;
use alloc::sync::Arc;
use core::fmt;
use core::ptr::NonNull;
use core::sync::atomic::Ordering;

/// The tags of an identity with no location ([`Pool::none`]): never bound, or its room handed
/// over to another handle.
const NEVER_BOUND: u32 = 0;
const HANDED_OVER: u32 = 1;

/// An identity's `addr` when the address is not kept there (it does not fit a `usize`, or is
/// `usize::MAX` itself): lookups read the pools instead.
const NOT_KEPT: usize = usize::MAX;

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
pub(crate) struct SpareIdentity(Box<Identity>);

/// A queue of returns: by default the memory manager's, of [`Returned`] allocations.
pub(crate) type ReturnQueue<T = Returned> = Queue<T>;

/// On 64-bit hosts the fields lie in their order (`repr(C)`): what the engine reads of every
/// buffer (address, queue, size, location, id) in the first 40 bytes, so a launch beside a
/// driver call, which finds the record out of the caches, mostly reads one line of it; 48 bytes,
/// no padding. On 32-bit targets the compiler's order packs it into 40 bytes. Who issued the
/// allocation is its queue's ([`ReturnQueue::issuer`]), not repeated here.
#[cfg_attr(target_pointer_width = "64", repr(C))]
pub(super) struct Identity {
    /// The block's device address ([`NOT_KEPT`] where it does not fit a `usize`, and while the
    /// identity has no location): so the engine resolves a handle from this record alone,
    /// without reading the pools (`MemoryManager::span_issued`). Written on the device thread
    /// only, as `place`; read there and by the last reference's [`release`], which `refs` orders
    /// after every write.
    addr: AtomicUsize,
    /// The manager's queue (which it closes when it goes: see [`ReturnQueue`]), which also says
    /// who issued the allocation.
    returns: Arc<ReturnQueue>,
    pub(super) size: u64,
    /// The location in one word ([`Pool::pack`], or [`Pool::none`] with [`NEVER_BOUND`] or
    /// [`HANDED_OVER`]). Written and read as `addr`.
    place: AtomicU32,
    /// Handles and bindings: the last one dropped returns the allocation (see [`release`]).
    /// Raised only through [`Self::add_ref`], which refuses to pass [`MAX_REFS`].
    refs: AtomicU32,
    pub(super) id: u64,
    /// User handles (clones of [`Handle`]); bindings do not count.
    owners: AtomicU32,
    /// Live graphs that keep the allocation (their replays use it; while any does, its memory
    /// may not be given to another handle) in the low bits, and [`EXPOSED`]: whether its device
    /// address was ever handed out raw (a managed resource: work the core does not see may then
    /// use it, so the host is never lent its bytes, zero copy). One word where a flag beside the
    /// count would pad the identity by 8 bytes where `u64` aligns to 8 (Cortex-M).
    graphs: AtomicU32,
}

// The handles and bindings that point at an identity are shared between threads.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Identity>();
};

// The RAM an allocation costs a firmware (issue 19's target is 48 B for everything): the flag in
// `graphs`, the pool packed with the block and the issuer kept by the queue keep the identity at
// 40 B on 32-bit targets, and its heap block is just that (a `Box`: no `Arc` counts beside it);
// 48 B on 64-bit hosts.
#[cfg(all(target_pointer_width = "32", not(all(test, loom))))] // loom's atomics are larger
const _: () = assert!(core::mem::size_of::<Identity>() <= 40);
#[cfg(all(target_pointer_width = "64", not(all(test, loom))))] // loom's atomics are larger
const _: () = assert!(core::mem::size_of::<Identity>() <= 48);

/// The most references (handles and bindings) one allocation may have: past it,
/// [`Identity::add_ref`] panics, as `Arc` aborts, before the count could wrap (a wrapped count
/// would free the identity under live handles). Only references leaked by the billion
/// (`mem::forget`) get there.
const MAX_REFS: u32 = i32::MAX as u32;

/// The bit of [`Identity`]'s `graphs` word that says the device address was handed out raw (the
/// count of graphs, below it, never reaches it: each graph holds a binding, and bindings stop at
/// [`MAX_REFS`]).
const EXPOSED: u32 = 1 << 31;

impl fmt::Debug for Identity {
    /// Everything but the queue (which would print every identity it holds).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let graphs = self.graphs.load(Ordering::Relaxed);
        f.debug_struct("Identity")
            .field("id", &self.id)
            .field("issuer", &self.returns.issuer())
            .field("size", &self.size)
            .field("owners", &self.owners)
            .field("refs", &self.refs)
            .field("exposed", &(graphs & EXPOSED != 0))
            .field("graphs", &(graphs & !EXPOSED))
            .field("location", &self.location())
            .finish_non_exhaustive()
    }
}

impl Identity {
    /// Counts one more reference (a handle or a binding made from a live one).
    ///
    /// # Panics
    ///
    /// Past [`MAX_REFS`] references (leaked ones count).
    pub(super) fn add_ref(&self) {
        // Relaxed, as an `Arc` clone: the reference this one is made from keeps the count above 0.
        let before = self.refs.fetch_add(1, Ordering::Relaxed);
        if before >= MAX_REFS {
            // Taken back before the panic, which may be caught: refused references must not
            // pile up until the count wraps (threads racing here overshoot by one each at most).
            self.refs.fetch_sub(1, Ordering::Relaxed);
            let id = self.id;
            panic!("allocation {id} has {before} handles and bindings (leaked count): no more fit");
        }
    }

    /// Counts one more live graph keeping the allocation, or (`keep` false) one fewer.
    pub(super) fn keep_for_graph(&self, keep: bool) {
        // Paired (a sealed graph keeps, its drop releases): a release with no graph would borrow
        // from the exposed flag, a keep past the count's bits would set it.
        if keep {
            let before = self.graphs.fetch_add(1, Ordering::AcqRel);
            debug_assert!(before & !EXPOSED < !EXPOSED, "graph count full");
        } else {
            let before = self.graphs.fetch_sub(1, Ordering::AcqRel);
            debug_assert!(
                before & !EXPOSED > 0,
                "a graph released that was never kept"
            );
        }
    }

    fn new(id: u64, size: u64, placed: Option<Placed>, returns: &Arc<ReturnQueue>) -> Self {
        let (place, addr) = packed(placed, false);
        Self {
            id,
            size,
            owners: AtomicU32::new(1),
            refs: AtomicU32::new(1),
            graphs: AtomicU32::new(0),
            place: AtomicU32::new(place),
            addr: AtomicUsize::new(addr),
            returns: Arc::clone(returns),
        }
    }

    /// Makes a returned identity new again, as [`Self::new`] would, with no atomic update (it is
    /// this thread's alone) but where the queue changes.
    fn reset(&mut self, id: u64, size: u64, placed: Option<Placed>, returns: &Arc<ReturnQueue>) {
        (self.id, self.size) = (id, size);
        self.owners.set_mut(1);
        self.refs.set_mut(1);
        self.graphs.set_mut(0);
        let (place, addr) = packed(placed, false);
        self.place.set_mut(place);
        self.addr.set_mut(addr);
        if !Arc::ptr_eq(&self.returns, returns) {
            self.returns = Arc::clone(returns);
        }
    }

    #[inline]
    pub(super) fn location(&self) -> Result<Location, NotFoundReason> {
        match Pool::unpack(self.place.load(Ordering::Relaxed)) {
            Ok((pool, block)) => Ok(Location { pool, block }),
            Err(HANDED_OVER) => Err(NotFoundReason::HandedOver),
            Err(_) => Err(NotFoundReason::NeverBound),
        }
    }

    /// Who issued the allocation: its queue's manager.
    pub(super) fn issuer(&self) -> Issuer {
        self.returns.issuer()
    }

    /// Whether the manager whose queue is `returns` made this identity: only it places the
    /// allocation, so only it may read or write the location (a manager a user made with the
    /// same issuer numbers its handles as this one does).
    #[inline]
    pub(super) fn made_by(&self, returns: &ReturnQueue) -> bool {
        core::ptr::eq(Arc::as_ptr(&self.returns), returns)
    }

    /// The location and, where kept, the block's device address (`None`: look it up in the
    /// pools), for the manager whose queue is `returns` (another manager's handle is
    /// [`NotFoundReason::OtherManager`]).
    #[inline]
    pub(super) fn placed(
        &self,
        returns: &ReturnQueue,
    ) -> Result<(Location, Option<u64>), NotFoundReason> {
        if !self.made_by(returns) {
            return Err(NotFoundReason::OtherManager);
        }
        let location = self.location()?;
        let addr = self.addr.load(Ordering::Relaxed);
        // A `usize` is at most 64 bits: the address fits a `u64`.
        Ok((location, (addr != NOT_KEPT).then_some(addr as u64)))
    }

    fn set_location(&self, placed: Option<Placed>, handed_over: bool) {
        let (place, addr) = packed(placed, handed_over);
        self.place.store(place, Ordering::Relaxed);
        self.addr.store(addr, Ordering::Relaxed);
    }
}

/// An identity's `place` and `addr` words for `placed` (no location: never bound, or
/// `handed_over`).
#[inline]
fn packed(placed: Option<Placed>, handed_over: bool) -> (u32, usize) {
    match placed {
        Some(p) => (
            p.location.pool.pack(p.location.block),
            usize::try_from(p.addr).unwrap_or(NOT_KEPT),
        ),
        None if handed_over => (Pool::none(HANDED_OVER), NOT_KEPT),
        None => (Pool::none(NEVER_BOUND), NOT_KEPT),
    }
}

/// The end of one reference to an allocation (a handle's or a binding's). The last one sends a
/// bound allocation back to its manager's return queue, with the identity for reuse; an
/// unbound one, or one whose manager is gone (its queue closed), just drops.
///
/// # Safety
///
/// `identity` is a reference counted in its `refs` (a handle's or a binding's pointer, from
/// [`Box::into_raw`]), given up here: the caller does not use it again.
pub(super) unsafe fn release(identity: NonNull<Identity>) {
    // AcqRel: the last reference sees every location written before the others went (as an
    // `Arc`'s last drop does), and owns the block after.
    // SAFETY: the identity lives while `refs` counts this reference (the caller's contract).
    if unsafe { identity.as_ref() }
        .refs
        .fetch_sub(1, Ordering::AcqRel)
        != 1
    {
        return;
    }
    // SAFETY: the last reference: no handle or binding points at the identity any more, and
    // the pointer came from `Box::into_raw` of the identity's one `Box`, taken back once, here.
    let identity = unsafe { Box::from_raw(identity.as_ptr()) };
    let Ok(location) = identity.location() else {
        return;
    };
    let returns: *const ReturnQueue = Arc::as_ptr(&identity.returns);
    let id = identity.id;
    let returned = Returned {
        location,
        id,
        identity: SpareIdentity(identity),
    };
    // SAFETY: the queue lives while the identity (moved into `returned`, then into the queue)
    // holds it; a refused item is dropped only after `push` returned.
    if let Err(refused) = unsafe { ReturnQueue::push_held_by_item(returns, returned) } {
        drop(refused);
    }
}

/// What a user holds for an allocation. Cloning shares the allocation; the memory goes back to
/// its pool once every handle and every [`Binding`](super::Binding) is dropped (from any thread).
/// A clone or binding past 2³¹ − 1 of them (leaked ones count) panics, as `Arc`'s count aborts.
///
/// A handle may view a byte range of its allocation ([`Handle::view`]); lookups check the range
/// against the allocation.
pub struct Handle {
    /// The identity, counted in its `refs` (see [`release`]).
    identity: NonNull<Identity>,
    offset: u64,
    len: u64,
}

// SAFETY: a handle is a shared pointer to a boxed identity, counted in the identity's own `refs`
// (the last reference, on whatever thread, takes the `Box` back to recycle or free it), and
// `Identity` is `Send + Sync` (atomics, and fields written only while no handle points at it).
unsafe impl Send for Handle {}
// SAFETY: as for `Send`.
unsafe impl Sync for Handle {}

impl fmt::Debug for Handle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        debug_view(f, "Handle", self.identity(), self.offset, self.len)
    }
}

impl Handle {
    #[cfg(test)]
    pub(crate) fn new(id: u64, size: u64, returns: &Arc<ReturnQueue>) -> Self {
        Self::reusing(None, id, size, None, returns)
    }

    /// A new handle, `placed` there (`None`: no memory yet), in the heap block of `spare` when
    /// there is one (a spare is owned whole: its last reference gave it up), else in a new one.
    #[inline]
    pub(crate) fn reusing(
        spare: Option<SpareIdentity>,
        id: u64,
        size: u64,
        placed: Option<Placed>,
        returns: &Arc<ReturnQueue>,
    ) -> Self {
        let identity = match spare {
            Some(SpareIdentity(mut block)) => {
                block.reset(id, size, placed, returns);
                block
            }
            None => Box::new(Identity::new(id, size, placed, returns)),
        };
        Self {
            // SAFETY: `Box::into_raw` is never null.
            identity: unsafe { NonNull::new_unchecked(Box::into_raw(identity)) },
            offset: 0,
            len: size,
        }
    }

    /// The identity's pointer and this view's range (for [`BindingRef`](super::BindingRef)).
    pub(super) fn parts(&self) -> (NonNull<Identity>, u64, u64) {
        (self.identity, self.offset, self.len)
    }

    fn identity(&self) -> &Identity {
        // SAFETY: this handle counts in the identity's `refs`, which keeps it alive.
        unsafe { self.identity.as_ref() }
    }

    /// The allocation's id (unique on its device, never reused).
    pub fn id(&self) -> u64 {
        self.identity().id
    }

    /// Who issued the handle.
    pub fn issuer(&self) -> Issuer {
        self.identity().issuer()
    }

    /// Whether the manager that issued the handle is gone (its device dropped): what a caller
    /// keeps beside it (a library's per-stream state) may go too. Takes a lock: not for hot paths.
    pub fn is_orphaned(&self) -> bool {
        self.identity().returns.is_closed()
    }

    /// Bytes of the whole allocation.
    pub fn allocation_size(&self) -> u64 {
        self.identity().size
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
        self.identity().owners.load(Ordering::Acquire) == 1
    }

    /// Whether some binding (in-flight work, a raw address handed out) is outstanding. Two
    /// loads: a clone of the handle made on another thread between them can make it answer
    /// `false` for one binding out; the caller holds a handle, so this needs a clone racing on
    /// another thread.
    pub fn is_bound(&self) -> bool {
        self.identity().refs.load(Ordering::Acquire)
            > self.identity().owners.load(Ordering::Acquire)
    }

    /// Marks the allocation's device address as handed out raw (for good).
    pub(crate) fn expose(&self) {
        self.identity().graphs.fetch_or(EXPOSED, Ordering::Release);
    }

    /// Whether a live graph keeps the allocation (its replays use it).
    pub fn is_kept_by_graph(&self) -> bool {
        self.identity().graphs.load(Ordering::Acquire) & !EXPOSED > 0
    }

    /// Whether the allocation's device address was ever handed out raw
    /// ([`Command::managed_resource`](crate::Command::managed_resource)).
    pub fn is_exposed(&self) -> bool {
        self.identity().graphs.load(Ordering::Acquire) & EXPOSED != 0
    }

    /// Whether `other` names the same allocation (itself, a clone or a view of it): one
    /// pointer compare.
    pub(crate) fn same_allocation(&self, other: &Handle) -> bool {
        self.identity == other.identity
    }

    pub(crate) fn set_location(&self, placed: Option<Placed>, handed_over: bool) {
        self.identity().set_location(placed, handed_over);
    }
}

impl Clone for Handle {
    fn clone(&self) -> Self {
        self.identity().add_ref();
        self.identity().owners.fetch_add(1, Ordering::AcqRel);
        Self {
            identity: self.identity,
            offset: self.offset,
            len: self.len,
        }
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.identity().owners.fetch_sub(1, Ordering::AcqRel);
        // SAFETY: the handle's reference, given up once, here.
        unsafe { release(self.identity) };
    }
}

/// Checks that `offset .. offset + len` lies inside `size` bytes.
pub(crate) fn check_range(offset: u64, len: u64, size: u64) -> Result<(), IoError> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(IoError::OutOfRange { offset, len, size }),
    }
}

/// The `Debug` of a handle, binding or borrowed view: its identity and its byte range.
pub(super) fn debug_view(
    f: &mut fmt::Formatter<'_>,
    name: &str,
    identity: &Identity,
    offset: u64,
    len: u64,
) -> fmt::Result {
    f.debug_struct(name)
        .field("identity", identity)
        .field("offset", &offset)
        .field("len", &len)
        .finish()
}

#[cfg(test)]
#[path = "handle_tests.rs"]
mod tests;
