//! Lookup and binding: from a handle to the memory bound to it.
//!
//! Owns [`MemoryManager::bind`], [`MemoryManager::resolve`] and
//! [`MemoryManager::guard`], the check that a handle was issued by this manager's device and
//! stream, the rule that a handle resolves only to memory bound to it, and the routing of a pool
//! id to its pool. Does not own placement (`reserve.rs`), nor freeing what a handle let go or
//! noticing dropped guards (`release.rs`).

use super::MemoryManager;
use crate::error::IoError;
use crate::memory::handle::{
    AsBinding, BindingRef, Handle, Location, POOL_ARENA, POOL_DEDICATED, POOL_PERSISTENT,
    POOL_SMALL, POOL_VM_LARGE, POOL_VM_SMALL, PoolId, check_range,
};
use crate::memory::sliced::{SlicedPool, Used};
use crate::memory::types::{PageGuard, PageRef, RawPage, Resolved};
use crate::memory::vm::GranulePool;
use crate::shim::{DeviceAddr, Shim};
use alloc::sync::Arc;

impl<S: Shim> MemoryManager<S> {
    /// Gives the room of `reserved` to `target` (a lazy handle, or one whose memory is replaced).
    /// Afterwards `reserved` resolves to nothing.
    ///
    /// # Errors
    ///
    /// [`IoError::SelfBind`] when `target` is `reserved`, a clone or a view of it;
    /// [`IoError::NotFound`] when `reserved` does not hold room of this manager;
    /// [`IoError::ForeignHandle`] for a handle of another device; [`IoError::WrongStream`] for a
    /// handle of another stream; [`IoError::OutOfRange`] when `target` is larger than the room;
    /// [`IoError::InUse`] when `target`'s memory is still used by in-flight work. On any error
    /// nothing changes; the room goes back when `reserved` drops.
    pub fn bind(&mut self, reserved: Handle, target: &Handle) -> Result<(), IoError> {
        self.check_issuer(target.as_binding())?;
        if reserved.as_binding().same_allocation(&target.as_binding()) {
            return Err(IoError::SelfBind {
                handle: reserved.id(),
            });
        }
        let (location, used, _) = self.find(reserved.as_binding())?;
        if target.allocation_size() > used.size {
            return Err(IoError::OutOfRange {
                offset: 0,
                len: target.allocation_size(),
                size: used.size,
            });
        }
        if let Ok(old) = target.as_binding().location() {
            // Bindings of the old memory (in-flight work, a managed resource) would follow the
            // handle to the new memory, and the old memory would be reused under that work.
            if target.is_bound() {
                return Err(IoError::InUse {
                    handle: target.id(),
                });
            }
            // Freed only if `target` still owns it (a stale location frees nothing): never the
            // room being bound, which `reserved` owns.
            self.free_location(old, target.id());
        }
        let Some(slot) = self.used_mut(location, reserved.id()) else {
            // Unreachable: `reserved` owns the room (found above) and only `target`'s own room
            // was freed since. Refused rather than a panic should that ever change.
            return Err(IoError::StorageHandleNotFound {
                handle: reserved.id(),
                page: location.block,
            });
        };
        slot.owner = target.id();
        target.set_location(Some(location), false);
        reserved.set_location(None, true);
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
        Ok(())
    }

    #[inline]
    fn find(&self, b: BindingRef<'_>) -> Result<(Location, Used, Resolved), IoError> {
        self.check_issuer(b)?;
        let location = b.location()?;
        let stale = IoError::NotFound {
            handle: b.id(),
            reason: crate::error::NotFoundReason::Stale,
        };
        let (used, page, addr) = match location.pool {
            POOL_PERSISTENT | POOL_DEDICATED => {
                let whole = if location.pool == POOL_PERSISTENT {
                    &self.persistent
                } else {
                    &self.dedicated
                };
                let (used, addr) = whole.used(location.block, b.id()).ok_or(stale)?;
                (used, location.block, addr)
            }
            POOL_VM_SMALL | POOL_VM_LARGE => {
                let vm =
                    self.granule_pool(location.pool)
                        .ok_or(IoError::StorageHandleNotFound {
                            handle: b.id(),
                            page: location.block,
                        })?;
                let (used, _, addr) = vm.pool.used(location.block, b.id()).ok_or(stale)?;
                // Named by the first granule it touches.
                (used, vm.span(addr, 1).0, addr)
            }
            pool => {
                let sliced = self.sliced(pool).ok_or(IoError::StorageHandleNotFound {
                    handle: b.id(),
                    page: location.block,
                })?;
                sliced.used(location.block, b.id()).ok_or(stale)?
            }
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
    /// [`IoError::ForeignHandle`], [`IoError::NotFound`] (never bound, handed over, stale),
    /// [`IoError::OutOfRange`] for a view past its allocation.
    #[inline]
    pub fn resolve(&self, handle: &impl AsBinding) -> Result<Resolved, IoError> {
        self.find(handle.as_binding()).map(|(_, _, r)| r)
    }

    /// The raw page `page` names and its first device address.
    pub(super) fn raw_page(&self, page: PageRef) -> Option<(&RawPage<S>, u64)> {
        match page.pool {
            POOL_PERSISTENT => self.persistent.page(page.page).map(|p| (&p.raw, p.addr)),
            POOL_DEDICATED => self.dedicated.page(page.page).map(|p| (&p.raw, p.addr)),
            // Granule pools hold device memory only: no host page behind them.
            POOL_VM_SMALL | POOL_VM_LARGE => None,
            pool => self.sliced(pool)?.page(page.page).map(|p| (&p.raw, p.addr)),
        }
    }

    /// The pool of pages `pool` names (granule pools are reached through [`Self::granule_pool`]).
    fn sliced(&self, pool: PoolId) -> Option<&SlicedPool<RawPage<S>>> {
        match pool {
            POOL_SMALL => Some(&self.small),
            POOL_ARENA => Some(&self.arena),
            _ => None,
        }
    }

    pub(super) fn sliced_mut(&mut self, pool: PoolId) -> Option<&mut SlicedPool<RawPage<S>>> {
        match pool {
            POOL_SMALL => Some(&mut self.small),
            POOL_ARENA => Some(&mut self.arena),
            _ => None,
        }
    }

    /// The granule pool `pool` names, once its range is reserved.
    pub(super) fn granule_pool(&self, pool: PoolId) -> Option<&GranulePool<RawPage<S>>> {
        match pool {
            POOL_VM_SMALL => self.vm[0].as_deref(),
            POOL_VM_LARGE => self.vm[1].as_deref(),
            _ => None,
        }
    }

    fn used_mut(&mut self, location: Location, owner: u64) -> Option<&mut Used> {
        match location.pool {
            POOL_PERSISTENT => self.persistent.used_mut(location.block, owner),
            POOL_DEDICATED => self.dedicated.used_mut(location.block, owner),
            POOL_VM_SMALL => self.vm[0].as_mut()?.pool.used_mut(location.block, owner),
            POOL_VM_LARGE => self.vm[1].as_mut()?.pool.used_mut(location.block, owner),
            pool => self.sliced_mut(pool)?.used_mut(location.block, owner),
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
            POOL_PERSISTENT => self.persistent.guard(page.page, add),
            POOL_DEDICATED => self.dedicated.guard(page.page, add),
            // A guard keeps the granule mapped; new allocations may still share its free bytes
            // (nothing on it moves either way).
            POOL_VM_SMALL => {
                if let Some(p) = self.vm[0].as_mut() {
                    p.guard(page.page, add);
                }
            }
            POOL_VM_LARGE => {
                if let Some(p) = self.vm[1].as_mut() {
                    p.guard(page.page, add);
                }
            }
            pool => {
                if let Some(p) = self.sliced_mut(pool) {
                    p.guard(page.page, add);
                    if !add && pool == POOL_ARENA && p.page(page.page).is_some_and(|p| p.live == 0)
                    {
                        self.arena_empty.push(page.page);
                    }
                }
            }
        }
    }
}
