//! Lookup and binding: from a handle to the memory bound to it.
//!
//! Owns [`MemoryManager::bind`], [`MemoryManager::resolve`] and [`MemoryManager::guard`], the check
//! that a handle was issued by this manager's device and stream, the rule that a handle resolves
//! only to memory bound to it, the engine's short path that takes the address a handle's record
//! keeps (`span_issued`: no pool read, checked against the pools in debug builds), and the routing
//! of a [`Pool`] to the manager's field that holds it.
//! Does not own placement (`reserve.rs`), nor freeing what a handle let go or noticing dropped
//! guards (`release.rs`).

use super::MemoryManager;
use crate::error::IoError;
use crate::memory::binding::{AsBinding, BindingRef};
use crate::memory::handle::{Handle, check_range};
use crate::memory::pool::{Location, Placed, Pool, Size, Whole};
use crate::memory::sliced::{SlicedPool, Used};
use crate::memory::types::{PageGuard, PageRef, RawPage, Resolved};
use crate::memory::vm::GranulePool;
use crate::memory::whole::WholePagePool;
use crate::shim::{DeviceAddr, DeviceSpan, Shim};
use alloc::sync::Arc;

impl<S: Shim> MemoryManager<S> {
    /// Gives the room of `reserved` to `target` (a lazy handle, or one whose memory is replaced).
    /// Afterwards `reserved` resolves to nothing.
    ///
    /// # Errors
    ///
    /// [`IoError::SelfBind`] when `target` is `reserved`, a clone or a view of it;
    /// [`IoError::NotFound`] when `reserved` does not hold room of this manager, or when either
    /// handle was made by another manager ([`NotFoundReason::OtherManager`](crate::error::NotFoundReason));
    /// [`IoError::ForeignHandle`] for a handle of another device; [`IoError::WrongStream`] for a
    /// handle of another stream; [`IoError::RoomTooSmall`] when `target` is larger than the room;
    /// [`IoError::InUse`] when `target`'s memory is still used by in-flight work;
    /// [`IoError::Exposed`] when the room's raw address was handed out and a binding of
    /// `reserved` is still out (a managed resource, uncollected work). On any error nothing
    /// changes (but for an error devcmd cannot reach: a [`IoError::StorageHandleNotFound`] after
    /// `target`'s old room was freed leaves `target` unbound); the room goes back when `reserved`
    /// drops. `target` counts as exposed afterwards if `reserved` was.
    pub fn bind(&mut self, reserved: Handle, target: &Handle) -> Result<(), IoError> {
        let (location, room) = self.check_bind(&reserved, target)?;
        if let Ok((old, _)) = target.as_binding().placed(&self.returns) {
            // Freed only if `target` still owns it (a stale location frees nothing): never the
            // room being bound, which `reserved` owns.
            self.free_location(old, target.id());
            // Never left naming freed room, even should the rebind below fail.
            target.set_location(None, false);
            self.ring();
        }
        if !self.rebind(location, reserved.id(), target.id()) {
            // Unreachable: `reserved` owns the room (found above) and only `target`'s own room
            // was freed since. Refused rather than a panic should that ever change.
            return Err(IoError::StorageHandleNotFound {
                handle: reserved.id(),
                page: location.block,
            });
        }
        let addr = room.addr.0 - reserved.offset();
        target.set_location(Some(Placed { location, addr }), false);
        // `target` inherits the exposure, so its memory is never handed on as if no one outside
        // the layer knew its address.
        if reserved.is_exposed() {
            target.expose();
        }
        reserved.set_location(None, true);
        Ok(())
    }

    /// Every refusal of [`Self::bind`], changing nothing: the caller checks before it orders
    /// the stream after the room's other uses (a refused bind then leaves no wait behind).
    /// Returns the room's location and range.
    ///
    /// # Errors
    ///
    /// As [`Self::bind`].
    pub(crate) fn check_bind(
        &self,
        reserved: &Handle,
        target: &Handle,
    ) -> Result<(Location, Resolved), IoError> {
        self.check_issuer(target.as_binding())?;
        if reserved.as_binding().same_allocation(&target.as_binding()) {
            return Err(IoError::SelfBind {
                handle: reserved.id(),
            });
        }
        let (location, used, room) = self.find(reserved.as_binding())?;
        if target.allocation_size() > used.size {
            return Err(IoError::RoomTooSmall {
                room: used.size,
                needs: target.allocation_size(),
            });
        }
        Self::check_handover(reserved)?;
        // Bindings of `target`'s old memory (in-flight work, a managed resource) would follow
        // the handle to the new memory, and the old memory would be reused under that work.
        if target.as_binding().placed(&self.returns).is_ok() && target.is_bound() {
            return Err(IoError::InUse {
                handle: target.id(),
            });
        }
        Ok((location, room))
    }

    /// Whether the room of `reserved` may change hands as far as its exposure goes: a room
    /// whose raw address was handed out (exposed for good) may not while a binding of it is out
    /// (a managed resource, or work not yet collected: the count cannot tell them apart), as that
    /// binding keeps `reserved`, not the room's new owner.
    ///
    /// # Errors
    ///
    /// [`IoError::Exposed`].
    pub(crate) fn check_handover(reserved: &Handle) -> Result<(), IoError> {
        if reserved.is_exposed() && reserved.is_bound() {
            return Err(IoError::Exposed {
                handle: reserved.id(),
            });
        }
        Ok(())
    }

    fn check_issuer(&self, b: BindingRef<'_>) -> Result<(), IoError> {
        let issuer = b.issuer();
        if issuer.device != self.issuer.device {
            return Err(IoError::foreign_handle(issuer.device, self.issuer.device));
        }
        if issuer.stream != self.issuer.stream {
            return Err(IoError::WrongStream {
                handle: b.id(),
                owner: issuer.stream,
                used_on: self.issuer.stream,
            });
        }
        b.check_made_by(&self.returns)
    }

    #[inline]
    fn find(&self, b: BindingRef<'_>) -> Result<(Location, Used, Resolved), IoError> {
        self.check_issuer(b)?;
        self.find_issued(b)
    }

    /// [`Self::find`] for a binding whose issuer was checked already (this manager's device
    /// and stream).
    #[inline]
    fn find_issued(&self, b: BindingRef<'_>) -> Result<(Location, Used, Resolved), IoError> {
        debug_assert_eq!(b.issuer(), self.issuer, "the caller checked the issuer");
        let (location, _) = b.placed(&self.returns)?;
        let stale = IoError::NotFound {
            handle: b.id(),
            reason: crate::error::NotFoundReason::Stale,
        };
        let (used, page, addr) = match location.pool {
            Pool::Whole(w) => {
                let (used, addr) = self.whole(w).used(location.block, b.id()).ok_or(stale)?;
                (used, location.block, addr)
            }
            Pool::Granules(size) => {
                let vm = self
                    .granule_pool(size)
                    .ok_or(IoError::StorageHandleNotFound {
                        handle: b.id(),
                        page: location.block,
                    })?;
                let (used, _, addr) = vm.pool.used(location.block, b.id()).ok_or(stale)?;
                // Named by the first granule it touches.
                (used, vm.span(addr, 1).0, addr)
            }
            Pool::Pages(size) => self
                .sliced(size)
                .used(location.block, b.id())
                .ok_or(stale)?,
        };
        check_range(b.offset(), b.len(), b.allocation_size())?;
        let resolved = Resolved {
            addr: DeviceAddr(addr + b.offset()),
            len: b.len(),
            page: PageRef {
                pool: location.pool,
                page,
            },
        };
        Ok((location, used, resolved))
    }

    /// The device range `handle` (or binding) names.
    ///
    /// # Errors
    ///
    /// [`IoError::ForeignHandle`], [`IoError::NotFound`] (never bound, handed over, stale, made
    /// by another manager),
    /// [`IoError::OutOfRange`] for a view past its allocation.
    #[inline]
    pub fn resolve(&self, handle: &impl AsBinding) -> Result<Resolved, IoError> {
        self.find(handle.as_binding()).map(|(_, _, r)| r)
    }

    /// [`Self::resolve`] for a handle the caller found to be issued by this manager's device and
    /// stream ([`Device::owner_of`](crate::Device) does, once per handle per operation): the
    /// issuer is not checked twice.
    #[inline]
    pub(crate) fn resolve_issued(&self, handle: &impl AsBinding) -> Result<Resolved, IoError> {
        self.find_issued(handle.as_binding()).map(|(_, _, r)| r)
    }

    /// The device range of a handle the caller found to be issued by this manager's device and
    /// stream, as [`Self::resolve_issued`] but from the handle's own record: the address its
    /// allocation was placed at, which the identity keeps (where it fits a `usize`), so the pools
    /// are not read. The engine's path, once per buffer of every operation.
    ///
    /// Sound because a live handle's location is always a block it holds: only the manager
    /// that made a handle writes its location (every lookup and `bind` refuse another
    /// manager's handle, [`NotFoundReason::OtherManager`](crate::error::NotFoundReason)), and
    /// a block is freed only when its last handle and binding are gone (the return queue), or
    /// when `bind` moves a handle to other room (which sets its location again at once), or by
    /// the teardown of the device that owns this manager ([`Self::release_all`],
    /// [`Self::forget_all`]), after which nothing resolves through it. Debug builds check every
    /// answer against the pools.
    ///
    /// # Errors
    ///
    /// As [`Self::resolve_issued`].
    #[inline]
    pub(crate) fn span_issued(&self, handle: &impl AsBinding) -> Result<DeviceSpan, IoError> {
        let b = handle.as_binding();
        let (location, kept) = b.placed(&self.returns)?;
        let Some(addr) = kept else {
            return self.find_issued(b).map(|(_, _, r)| r.span());
        };
        check_range(b.offset(), b.len(), b.allocation_size())?;
        let span = DeviceSpan {
            addr: DeviceAddr(addr + b.offset()),
            len: b.len(),
        };
        debug_assert_eq!(
            self.find_issued(b).map(|(l, _, r)| (l, r.span())).ok(),
            Some((location, span)),
            "a handle's kept address is its block's"
        );
        Ok(span)
    }

    /// The raw page `page` names and its first device address.
    pub(super) fn raw_page(&self, page: PageRef) -> Option<(&RawPage<S>, u64)> {
        match page.pool {
            Pool::Whole(w) => self.whole(w).page(page.page).map(|p| (&p.raw, p.addr)),
            // Granule pools hold device memory only: no host page behind them.
            Pool::Granules(_) => None,
            Pool::Pages(size) => self.sliced(size).page(page.page).map(|p| (&p.raw, p.addr)),
        }
    }

    /// The pool of pages serving `size`.
    pub(super) fn sliced(&self, size: Size) -> &SlicedPool<RawPage<S>> {
        match size {
            Size::Small => &self.small,
            Size::Arena => &self.arena,
        }
    }

    pub(super) fn sliced_mut(&mut self, size: Size) -> &mut SlicedPool<RawPage<S>> {
        match size {
            Size::Small => &mut self.small,
            Size::Arena => &mut self.arena,
        }
    }

    /// The granule pool serving `size`, once its range is reserved.
    pub(super) fn granule_pool(&self, size: Size) -> Option<&GranulePool> {
        if !S::VIRTUAL_MEMORY {
            return None; // compiled out: see `Shim::VIRTUAL_MEMORY`
        }
        self.vm[size.slot()].as_deref()
    }

    pub(super) fn granule_pool_mut(&mut self, size: Size) -> Option<&mut GranulePool> {
        if !S::VIRTUAL_MEMORY {
            return None;
        }
        self.vm[size.slot()].as_deref_mut()
    }

    /// The pool of whole pages `w` names.
    pub(super) fn whole(&self, w: Whole) -> &WholePagePool<RawPage<S>> {
        [&self.persistent, &self.dedicated][w.slot()]
    }

    pub(super) fn whole_mut(&mut self, w: Whole) -> &mut WholePagePool<RawPage<S>> {
        if w == Whole::Persistent {
            &mut self.persistent
        } else {
            &mut self.dedicated
        }
    }

    /// Binds the room at `location` that `owner` holds to `new_owner`; false when `owner` holds
    /// none there.
    fn rebind(&mut self, location: Location, owner: u64, new_owner: u64) -> bool {
        let block = location.block;
        match location.pool {
            Pool::Whole(w) => self.whole_mut(w).rebind(block, owner, new_owner),
            Pool::Granules(size) => self
                .granule_pool_mut(size)
                .is_some_and(|g| g.pool.rebind(block, owner, new_owner)),
            Pool::Pages(size) => self.sliced_mut(size).rebind(block, owner, new_owner),
        }
    }

    /// Guards the page `handle`'s memory lies on.
    ///
    /// # Errors
    ///
    /// As [`Self::resolve`].
    pub fn guard(&mut self, handle: &impl AsBinding) -> Result<PageGuard, IoError> {
        let page = self.resolve(handle)?.page;
        self.set_guard(page, true);
        let token = Arc::new(page);
        self.guards.push(Arc::clone(&token));
        Ok(PageGuard { token })
    }

    pub(super) fn set_guard(&mut self, page: PageRef, add: bool) {
        match page.pool {
            Pool::Whole(w) => {
                // A freed dedicated page whose last guard went is released at the next
                // periodic cleanup, as one freed unguarded is.
                if self.whole_mut(w).guard(page.page, add) && w == Whole::Dedicated {
                    self.dedicated_freed = true;
                }
            }
            // A guard keeps the granule mapped; new allocations may still share its free bytes
            // (nothing on it moves either way).
            Pool::Granules(size) => {
                if let Some(p) = self.granule_pool_mut(size) {
                    p.guard(page.page, add);
                }
            }
            Pool::Pages(size) => {
                let p = self.sliced_mut(size);
                p.guard(page.page, add);
                if !add && size == Size::Arena && p.page(page.page).is_some_and(|p| p.live == 0) {
                    self.arena_empty.push(page.page);
                }
            }
        }
    }
}
