//! Bindings: what in-flight work holds for an allocation, and the borrowed view lookups take.
//!
//! Owns [`Binding`] (an owned reference that keeps the allocation alive without owning it),
//! [`BindingRef`] (a handle's or binding's view, borrowed) and [`AsBinding`]. Does not own the
//! identity they point at, its count, nor what the last reference does (`handle.rs`).

use super::handle::{Handle, Identity, ReturnQueue, debug_view, release};
use super::pool::Location;
use super::types::Issuer;
use crate::error::{IoError, NotFoundReason};
use core::fmt;
use core::marker::PhantomData;
use core::ptr::NonNull;

/// A handle's view used by in-flight work: keeps the allocation alive, owns nothing.
pub struct Binding {
    /// The identity, counted in its `refs` (see [`release`]).
    identity: NonNull<Identity>,
    offset: u64,
    len: u64,
}

// SAFETY: as for `Handle`.
unsafe impl Send for Binding {}
// SAFETY: as for `Handle`.
unsafe impl Sync for Binding {}

impl fmt::Debug for Binding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        debug_view(f, "Binding", self.identity(), self.offset, self.len)
    }
}

impl Clone for Binding {
    fn clone(&self) -> Self {
        self.as_binding().to_binding()
    }
}

impl Drop for Binding {
    fn drop(&mut self) {
        // SAFETY: the binding's reference, given up once, here.
        unsafe { release(self.identity) };
    }
}

impl Binding {
    fn identity(&self) -> &Identity {
        // SAFETY: this binding counts in the identity's `refs`, which keeps it alive.
        unsafe { self.identity.as_ref() }
    }

    /// Counts one more live graph keeping the allocation (undone by [`Self::release_graph`]).
    pub(crate) fn keep_for_graph(&self) {
        self.identity().keep_for_graph(true);
    }

    /// Undoes one [`Self::keep_for_graph`].
    pub(crate) fn release_graph(&self) {
        self.identity().keep_for_graph(false);
    }

    /// The allocation's id.
    pub fn id(&self) -> u64 {
        self.identity().id
    }

    /// Who issued the allocation.
    pub fn issuer(&self) -> Issuer {
        self.identity().issuer()
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
        self.identity().size
    }
}

/// Something that names an allocation: a handle or a binding.
pub trait AsBinding {
    /// The binding view of it.
    fn as_binding(&self) -> BindingRef<'_>;
}

/// A borrowed view of a handle or binding, for lookups.
#[derive(Clone, Copy)]
pub struct BindingRef<'a> {
    /// The handle's or binding's pointer (not a reference made from it: a binding made from this
    /// one may be the last to go, and gives the identity's memory back through it).
    identity: NonNull<Identity>,
    _borrow: PhantomData<&'a Identity>,
    offset: u64,
    len: u64,
}

// SAFETY: a shared borrow of a handle or binding, which are `Send + Sync`.
unsafe impl Send for BindingRef<'_> {}
// SAFETY: as for `Send`.
unsafe impl Sync for BindingRef<'_> {}

impl fmt::Debug for BindingRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        debug_view(f, "BindingRef", self.identity(), self.offset, self.len)
    }
}

impl BindingRef<'_> {
    fn identity(&self) -> &Identity {
        // SAFETY: borrowed from a handle or binding, whose reference keeps the identity alive.
        unsafe { self.identity.as_ref() }
    }

    /// An owned binding of the same view.
    ///
    /// # Panics
    ///
    /// When the allocation already has 2³¹ − 1 handles and bindings (leaked ones count, as with
    /// `Arc`'s count).
    pub fn to_binding(&self) -> Binding {
        self.identity().add_ref();
        Binding {
            identity: self.identity,
            offset: self.offset,
            len: self.len,
        }
    }

    pub(crate) fn id(&self) -> u64 {
        self.identity().id
    }
    pub(crate) fn issuer(&self) -> Issuer {
        self.identity().issuer()
    }
    pub(crate) fn offset(&self) -> u64 {
        self.offset
    }
    pub(crate) fn len(&self) -> u64 {
        self.len
    }
    pub(crate) fn allocation_size(&self) -> u64 {
        self.identity().size
    }
    /// Whether `other` names the same allocation (itself, a clone, a view or a binding of it).
    pub(crate) fn same_allocation(&self, other: &BindingRef<'_>) -> bool {
        self.identity == other.identity
    }
    /// The location the handle remembers, whichever manager made it (tests; the managers ask
    /// [`Self::placed`], which refuses another manager's handle).
    #[cfg(test)]
    pub(crate) fn location(&self) -> Result<Location, IoError> {
        self.identity().location().map_err(|r| self.not_found(r))
    }
    /// Whether the manager whose queue is `returns` made the allocation.
    #[inline]
    pub(crate) fn made_by(&self, returns: &ReturnQueue) -> bool {
        self.identity().made_by(returns)
    }

    /// Refuses a handle that the manager whose queue is `returns` did not make.
    #[inline]
    pub(crate) fn check_made_by(&self, returns: &ReturnQueue) -> Result<(), IoError> {
        if self.made_by(returns) {
            Ok(())
        } else {
            Err(self.not_found(NotFoundReason::OtherManager))
        }
    }
    /// The location and, where the identity keeps it, the block's device address, for the
    /// manager whose queue is `returns` (see [`Self::check_made_by`]).
    #[inline]
    pub(crate) fn placed(&self, returns: &ReturnQueue) -> Result<(Location, Option<u64>), IoError> {
        self.identity()
            .placed(returns)
            .map_err(|r| self.not_found(r))
    }
    #[cold]
    fn not_found(&self, reason: NotFoundReason) -> IoError {
        IoError::NotFound {
            handle: self.identity().id,
            reason,
        }
    }
}

impl Handle {
    /// A binding for in-flight work: keeps the memory alive without counting as an owner.
    pub fn binding(&self) -> Binding {
        self.as_binding().to_binding()
    }
}

impl AsBinding for Handle {
    fn as_binding(&self) -> BindingRef<'_> {
        let (identity, offset, len) = self.parts();
        BindingRef {
            identity,
            _borrow: PhantomData,
            offset,
            len,
        }
    }
}

impl AsBinding for Binding {
    fn as_binding(&self) -> BindingRef<'_> {
        BindingRef {
            identity: self.identity,
            _borrow: PhantomData,
            offset: self.offset,
            len: self.len,
        }
    }
}
