//! The memory manager of one stream: routes reservations to pools, holds the allocation modes,
//! runs cleanup, and keeps the device-wide budget.
//!
//! Owns the pools and the pages in them, the page sizes (fitted to the device and the budget
//! when the manager is built: see [`MemoryManager::new`]), and the rule that a handle resolves
//! only to memory bound to it. Does not own the device calls (it takes the shim as an argument),
//! nor fences: a page it lets go is *retired* until its owner says no device work can touch it
//! (see [`PageRelease`]).
//!
//! The public surface is what a user of the manager needs: reserve, lazy handles and `bind`,
//! resolve, guards, modes, cleanup and the report. A manager used on its own, with no device
//! around it (allocator benchmarks, tests), opts in to freeing pages at once
//! ([`MemoryManager::release_pages_immediately`]) and is torn down with
//! [`MemoryManager::release_all`]. The device's plumbing (tracking freed ids, handing retired
//! pages to a drop queue, leaking on an inconclusive teardown) is crate-private.

use super::budget::MemoryBudget;
use super::config::{MemoryConfig, PageRelease};
use super::handle::{
    AsBinding, BindingRef, Handle, Issuer, Location, POOL_ARENA_BASE, POOL_DEDICATED,
    POOL_PERSISTENT, POOL_SMALL, PoolId, ReturnQueue, Returned, check_range,
};
use super::report::{MemoryReport, PoolKind, PoolReport};
use super::sliced::{SlicedPool, Used};
use super::whole::WholePagePool;
use crate::error::{DriverError, Fault, IoError};
use crate::shim::{DeviceAddr, DeviceFacts, Shim};
use alloc::sync::Arc;
use alloc::vec::Vec;

/// How new reservations are served. Modes nest: see [`MemoryManager::set_mode`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum AllocationMode {
    /// The pools chosen by size (small pool, adaptive arena). Closes the innermost window.
    Auto,
    /// Exact-size reuse, kept until an explicit cleanup (weights). Opens a window.
    Persistent,
    /// One page per reservation, released at the next cleanup once freed. Opens a window.
    Dedicated,
}

/// What a reservation may do to the set of pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum PageUpdate {
    /// Run the periodic cleanup and add pages as needed.
    Allow,
    /// Add pages, never release or renumber any (another stream records a graph).
    AddOnly,
    /// Only room already held (this stream records a graph).
    Forbidden,
}

/// Explicit or periodic cleanup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Cleanup {
    /// On every `Allow` reservation: freed dedicated pages and empty outdated pages go back.
    Periodic,
    /// Every empty, unguarded page of every pool goes back, and freed persistent pages.
    Explicit,
}

/// A device address range a handle resolved to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Resolved {
    /// First byte of the handle's view.
    pub addr: DeviceAddr,
    /// Bytes of the view.
    pub len: u64,
    /// The stream cursor stamped when the memory was bound.
    pub cursor: u64,
    /// The page it lies on.
    pub page: PageRef,
}

/// A page of a manager, as named in guards and checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct PageRef {
    pool: PoolId,
    page: u32,
}

/// Keeps one page exactly as it is while alive: nothing new is carved from it, it is never
/// released, and what lives on it keeps its address. May be dropped from any thread; the manager
/// notices at its next cleanup.
#[derive(Debug, Clone)]
pub struct PageGuard {
    token: Arc<PageRef>,
}

impl PageGuard {
    /// The guarded page.
    pub fn page(&self) -> PageRef {
        *self.token
    }
}

/// A live allocation, for checks and diagnostics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocationInfo {
    /// The handle id it is bound to.
    pub owner: u64,
    /// First device address.
    pub addr: u64,
    /// Bytes asked for.
    pub size: u64,
    /// Bytes it spans (size + padding).
    pub span: u64,
    /// The page it lies on.
    pub page: PageInfo,
}

/// A page held, for checks and diagnostics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageInfo {
    /// The pool it belongs to.
    pub kind: PoolKind,
    /// Which page.
    pub page: PageRef,
    /// First device address.
    pub addr: u64,
    /// Bytes.
    pub size: u64,
    /// Whether a guard holds it.
    pub guarded: bool,
}

/// A page the manager let go that must wait for the device before it is freed. The device takes
/// them from its streams' managers into their drop queues (hence public: a drop-queue item).
#[derive(Debug)]
pub struct RetiredPage<P> {
    raw: P,
    size: u64,
    budget: MemoryBudget,
}

impl<P> RetiredPage<P> {
    /// Bytes of the page.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Frees the page on the device and gives its bytes back to the device's budget.
    ///
    /// # Safety
    ///
    /// No work that may use the page is pending on any stream of the device (or the device is
    /// poisoned).
    pub unsafe fn free<S: Shim<DevicePage = P>>(self, shim: &S) {
        // SAFETY: the caller guarantees no pending work uses the page.
        unsafe { shim.device_free(self.raw) };
        self.budget.give_back(self.size);
    }
}

/// The memory manager of one stream. See the module documentation.
#[derive(Debug)]
pub struct MemoryManager<S: Shim> {
    config: MemoryConfig,
    issuer: Issuer,
    alignment: u64,
    max_page: u64,
    budget: MemoryBudget,
    returns: Arc<ReturnQueue>,
    returned: Vec<Returned>,
    next_id: u64,
    small: SlicedPool<S::DevicePage>,
    /// Boxed so the 64 slots cost a pointer each until used (a pool carries its free index).
    arena: Vec<Option<alloc::boxed::Box<SlicedPool<S::DevicePage>>>>,
    current: Option<usize>,
    persistent: WholePagePool<S::DevicePage>,
    dedicated: WholePagePool<S::DevicePage>,
    modes: Vec<AllocationMode>,
    /// Pages of outdated arena classes that became empty: released at the next cleanup tick.
    outdated_empty: Vec<PageRef>,
    dedicated_freed: bool,
    guards: Vec<Arc<PageRef>>,
    retired: Vec<RetiredPage<S::DevicePage>>,
    /// Ids of allocations released or rebound, when the owner tracks them (failure marks).
    freed: Option<Vec<u64>>,
    release: PageRelease,
}

fn round_up(value: u64, to: u64) -> Option<u64> {
    value.checked_next_multiple_of(to)
}

impl<S: Shim> MemoryManager<S> {
    /// A manager for the stream `issuer.stream` of a device with `facts`, counting its pages
    /// against `budget` (shared by every stream of the device).
    ///
    /// The page sizes of `config` are fitted to the memory the manager may ever hold (the
    /// budget's limit or the device's total memory, whichever is smaller), so that the defaults
    /// suit a board of a few MiB as well as a GPU: no page is larger than that memory, the small
    /// pool's page is at most an eighth of it, the arena's smallest page at most a quarter, its
    /// slack and granule at most an eighth. [`Self::config`] gives the sizes in effect.
    pub fn new(
        facts: &DeviceFacts,
        config: MemoryConfig,
        issuer: Issuer,
        budget: MemoryBudget,
    ) -> Self {
        let alignment = facts.page_alignment.max(1).next_power_of_two();
        // The memory every page of this manager must fit in (a total of 0 means unknown).
        let memory = match (budget.limit(), facts.total_memory) {
            (Some(limit), 0) => limit,
            (Some(limit), total) => limit.min(total),
            (None, 0) => u64::MAX,
            (None, total) => total,
        };
        // Rounds down to the alignment, never below one aligned unit.
        let fit = |bytes: u64| (bytes / alignment * alignment).max(alignment);
        let max_page = fit(facts.max_page_size.min(memory));
        let small_page = fit(round_up(config.small_page_size.max(1), alignment)
            .unwrap_or(max_page)
            .min(max_page)
            .min(memory / 8));
        let config = MemoryConfig {
            small_page_size: small_page,
            // A configuration must not be able to route a request to a pool that cannot hold it.
            small_max_slice: config.small_max_slice.min(small_page),
            arena_min_page: config.arena_min_page.min(memory / 4),
            arena_slack: config.arena_slack.min(memory / 8),
            arena_granule: config.arena_granule.min(memory / 8),
            arena_classes: config.arena_classes.clamp(1, 64),
        };
        let mut arena = Vec::with_capacity(config.arena_classes);
        arena.resize_with(config.arena_classes, || None);
        Self {
            config,
            issuer,
            alignment,
            max_page,
            budget,
            returns: Arc::default(),
            returned: Vec::new(),
            next_id: u64::from(issuer.stream) << 48,
            small: SlicedPool::new(small_page),
            arena,
            current: None,
            persistent: WholePagePool::default(),
            dedicated: WholePagePool::default(),
            modes: Vec::new(),
            outdated_empty: Vec::new(),
            dedicated_freed: false,
            guards: Vec::new(),
            retired: Vec::new(),
            freed: None,
            release: PageRelease::Fenced,
        }
    }

    /// The sizes in effect: the configuration given to [`Self::new`], fitted to the device and
    /// the budget.
    pub fn config(&self) -> MemoryConfig {
        self.config
    }

    /// The largest page this manager asks for: the device's largest page, or less when the
    /// budget or the device's total memory is smaller. A request past it is
    /// [`IoError::BufferTooBig`].
    pub fn max_page(&self) -> u64 {
        self.max_page
    }

    /// Frees pages through the shim as soon as the manager lets them go, instead of retiring
    /// them until the owner (the device) frees them. For a manager used on its own: without a
    /// device to free them, retired pages would stay held until [`Self::release_all`].
    ///
    /// # Safety
    ///
    /// From now on, whenever a handle of this manager is dropped, no device work that may use its
    /// memory is pending (a synchronous device, or no device work at all: allocator benchmarks,
    /// tests).
    pub unsafe fn release_pages_immediately(&mut self) {
        self.release = PageRelease::Immediate;
    }

    /// Starts recording the ids of allocations released or rebound, for
    /// [`Self::take_freed`] (the device drops their failure marks).
    pub(crate) fn track_frees(&mut self) {
        self.freed.get_or_insert_with(Vec::new);
    }

    /// The ids recorded since the last call (see [`Self::track_frees`]).
    pub(crate) fn take_freed(&mut self, out: &mut Vec<u64>) {
        self.collect_returns();
        if let Some(freed) = &mut self.freed {
            out.append(freed);
        }
    }

    /// Who this manager's handles are issued by.
    pub fn issuer(&self) -> Issuer {
        self.issuer
    }

    /// The budget shared with the device's other streams.
    pub fn budget(&self) -> &MemoryBudget {
        &self.budget
    }

    /// The alignment of every slice.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// A handle of `size` bytes with no memory yet (bind memory to it with [`Self::bind`]).
    pub fn lazy_handle(&mut self, size: u64) -> Handle {
        let id = self.next_id;
        self.next_id += 1;
        Handle::new(id, self.issuer, size, &self.returns)
    }

    /// Opens a `Persistent` or `Dedicated` window, or (`Auto`) closes the innermost one.
    pub fn set_mode(&mut self, mode: AllocationMode) {
        match mode {
            AllocationMode::Auto => {
                self.modes.pop();
            }
            m => self.modes.push(m),
        }
    }

    /// The mode new reservations are served in.
    pub fn mode(&self) -> AllocationMode {
        self.modes.last().copied().unwrap_or(AllocationMode::Auto)
    }

    /// Reserves `size` bytes, with one reclaim and retry when the first attempt fails with an
    /// error reclaiming may cure and `update` is [`PageUpdate::Allow`].
    ///
    /// With [`PageRelease::Fenced`] the reclaim can only retire pages; the device's reclaim also
    /// waits for its streams and frees them, then retries through [`Self::try_reserve`].
    ///
    /// # Errors
    ///
    /// See [`Self::try_reserve`].
    pub fn reserve(&mut self, shim: &S, size: u64, update: PageUpdate) -> Result<Handle, IoError> {
        match self.try_reserve(shim, size, update) {
            Err(e) if update == PageUpdate::Allow && e.may_succeed_after_reclaim() => {
                debug!("reserve of {} bytes failed; reclaiming once", size);
                self.cleanup(shim, Cleanup::Explicit);
                self.try_reserve(shim, size, update)
            }
            other => other,
        }
    }

    /// Reserves `size` bytes, without reclaim. The handle owns the room; to give it to a lazy
    /// handle, [`Self::bind`] it.
    ///
    /// # Errors
    ///
    /// [`IoError::BufferTooBig`] when no page can ever hold the size (past [`Self::max_page`]);
    /// [`IoError::OutOfMemory`] when the device or the budget refuses a page;
    /// [`IoError::PageUpdateForbidden`] when `update` is `Forbidden` and no room is held;
    /// [`IoError::PageSizesExhausted`] when the arena needs a new page size and all classes are
    /// live; [`IoError::Shim`] when the device refuses otherwise (a lost device among those: see
    /// [`IoError::is_device_lost`]).
    pub fn try_reserve(
        &mut self,
        shim: &S,
        size: u64,
        update: PageUpdate,
    ) -> Result<Handle, IoError> {
        if update == PageUpdate::Allow {
            self.cleanup(shim, Cleanup::Periodic); // collects the returns first
        } else {
            self.collect_returns();
        }
        // The alignment is a power of two: a mask rounds without a division.
        let mask = self.alignment - 1;
        let aligned = match size.max(1).checked_add(mask) {
            // No pool holds more than the device's largest page, whatever the mode.
            Some(padded) if padded & !mask <= self.max_page => padded & !mask,
            _ => {
                return Err(IoError::BufferTooBig {
                    size,
                    max_page: self.max_page,
                });
            }
        };
        let id = self.next_id;
        let used = Used {
            owner: id,
            size,
            cursor: 0,
        };
        let location = match self.mode() {
            AllocationMode::Persistent => {
                self.reserve_whole(shim, POOL_PERSISTENT, aligned, used, update)?
            }
            AllocationMode::Dedicated => {
                self.reserve_whole(shim, POOL_DEDICATED, aligned, used, update)?
            }
            AllocationMode::Auto if aligned <= self.config.small_max_slice => {
                self.reserve_small(shim, aligned, used, update)?
            }
            AllocationMode::Auto => self.reserve_arena(shim, aligned, used, update)?,
        };
        self.next_id += 1;
        let handle = Handle::new(id, self.issuer, size, &self.returns);
        handle.set_location(Some(location), false);
        Ok(handle)
    }

    fn reserve_whole(
        &mut self,
        shim: &S,
        pool: PoolId,
        aligned: u64,
        used: Used,
        update: PageUpdate,
    ) -> Result<Location, IoError> {
        let whole = if pool == POOL_PERSISTENT {
            &mut self.persistent
        } else {
            &mut self.dedicated
        };
        if let Some((block, _)) = whole.try_reuse(aligned, used) {
            return Ok(Location { pool, block });
        }
        if update == PageUpdate::Forbidden {
            return Err(IoError::PageUpdateForbidden { size: used.size });
        }
        let (raw, addr) = self.alloc_page(shim, aligned, used.size)?;
        let whole = if pool == POOL_PERSISTENT {
            &mut self.persistent
        } else {
            &mut self.dedicated
        };
        Ok(Location {
            pool,
            block: whole.add(raw, addr, aligned, used),
        })
    }

    fn reserve_small(
        &mut self,
        shim: &S,
        aligned: u64,
        used: Used,
        update: PageUpdate,
    ) -> Result<Location, IoError> {
        if let Some(c) = self.small.try_carve(used.size, aligned, used) {
            return Ok(Location {
                pool: POOL_SMALL,
                block: c.block,
            });
        }
        if update == PageUpdate::Forbidden {
            return Err(IoError::PageUpdateForbidden { size: used.size });
        }
        let (raw, addr) = self.alloc_page(shim, self.small.page_size, used.size)?;
        self.small.add_page(raw, addr);
        let c = self
            .small
            .try_carve(used.size, aligned, used)
            .expect("a fresh page fits a small slice");
        Ok(Location {
            pool: POOL_SMALL,
            block: c.block,
        })
    }

    /// The page size a new arena class gets for a request of `aligned` bytes.
    fn arena_page_size(&self, aligned: u64) -> u64 {
        let c = &self.config;
        let grown = aligned
            .saturating_add(c.arena_slack)
            .checked_next_multiple_of(c.arena_granule.max(1))
            .and_then(|s| round_up(s, self.alignment))
            .unwrap_or(self.max_page);
        let min =
            round_up(c.arena_min_page.min(self.max_page), self.alignment).unwrap_or(self.max_page);
        grown.clamp(min, self.max_page)
    }

    /// `page_size`, or less when the room the budget has left is smaller but still holds
    /// `aligned`: a new class gives up its slack before the request fails.
    fn fit_to_budget(&self, page_size: u64, aligned: u64) -> u64 {
        let Some(limit) = self.budget.limit() else {
            return page_size;
        };
        let room = limit.saturating_sub(self.budget.held()) / self.alignment * self.alignment;
        if page_size > room && aligned <= room {
            room
        } else {
            page_size
        }
    }

    fn reserve_arena(
        &mut self,
        shim: &S,
        aligned: u64,
        used: Used,
        update: PageUpdate,
    ) -> Result<Location, IoError> {
        if aligned > self.max_page {
            return Err(IoError::BufferTooBig {
                size: aligned,
                max_page: self.max_page,
            });
        }
        if let Some(slot) = self.current {
            let pool = self.arena[slot]
                .as_mut()
                .expect("the current class is live");
            let id = POOL_ARENA_BASE + slot as u8;
            if let Some(c) = pool.try_carve(used.size, aligned, used) {
                return Ok(Location {
                    pool: id,
                    block: c.block,
                });
            }
            if update == PageUpdate::Forbidden {
                return Err(IoError::PageUpdateForbidden { size: used.size });
            }
            let page_size = pool.page_size;
            if aligned <= page_size {
                let (raw, addr) = self.alloc_page(shim, page_size, used.size)?;
                let pool = self.arena[slot]
                    .as_mut()
                    .expect("the current class is live");
                pool.add_page(raw, addr);
                let c = pool
                    .try_carve(used.size, aligned, used)
                    .expect("a fresh page fits");
                return Ok(Location {
                    pool: id,
                    block: c.block,
                });
            }
        } else if update == PageUpdate::Forbidden {
            return Err(IoError::PageUpdateForbidden { size: used.size });
        }
        self.grow_arena(shim, aligned, used)
    }

    /// Makes a new current class sized for `aligned`, with its first page; the previous class
    /// becomes outdated. A refused page leaves the classes as they were.
    fn grow_arena(&mut self, shim: &S, aligned: u64, used: Used) -> Result<Location, IoError> {
        // A free slot, or the current class's own when it holds no page (an explicit cleanup
        // emptied it): replacing it then loses nothing.
        let current_is_empty = self
            .current
            .and_then(|c| self.arena[c].as_ref())
            .is_some_and(|p| p.pages_live == 0);
        let (slot, replaces_current) = match self.arena.iter().position(Option::is_none) {
            Some(slot) => (slot, false),
            None if current_is_empty => (self.current.expect("checked above"), true),
            None => {
                return Err(IoError::PageSizesExhausted {
                    size: used.size,
                    classes: self.arena.len(),
                });
            }
        };
        let page_size = self.fit_to_budget(self.arena_page_size(aligned), aligned);
        // A refused page leaves the classes as they were: the slot changes only after this.
        let (raw, addr) = self.alloc_page(shim, page_size, used.size)?;
        if replaces_current {
            self.current = None;
            self.arena[slot] = None;
        }
        let mut pool = SlicedPool::new(page_size);
        pool.add_page(raw, addr);
        let c = pool
            .try_carve(used.size, aligned, used)
            .expect("a page sized for the request fits it");
        if let Some(old) = self.current.replace(slot) {
            let old_pool = self.arena[old].as_mut().expect("the current class is live");
            old_pool.stop_serving();
            let empty: Vec<u32> = old_pool.empty_pages().collect();
            let id = POOL_ARENA_BASE + old as u8;
            self.outdated_empty
                .extend(empty.into_iter().map(|page| PageRef { pool: id, page }));
        }
        self.arena[slot] = Some(alloc::boxed::Box::new(pool));
        Ok(Location {
            pool: POOL_ARENA_BASE + slot as u8,
            block: c.block,
        })
    }

    fn alloc_page(
        &mut self,
        shim: &S,
        page_size: u64,
        asked: u64,
    ) -> Result<(S::DevicePage, u64), IoError> {
        self.budget
            .take(page_size)
            .map_err(|r| IoError::OutOfMemory {
                size: asked,
                held: r.held,
                budget: Some(r.limit),
                source: None,
            })?;
        match shim.device_alloc(page_size) {
            Ok(raw) => {
                let addr = shim.device_page_addr(&raw).0;
                Ok((raw, addr))
            }
            Err(e) => {
                self.budget.give_back(page_size);
                Err(self.page_error(e, asked, page_size))
            }
        }
    }

    fn page_error(&self, e: DriverError, asked: u64, page_size: u64) -> IoError {
        match e.fault {
            Fault::TooBig => IoError::BufferTooBig {
                size: page_size.max(asked),
                max_page: self.max_page,
            },
            Fault::OutOfMemory => IoError::OutOfMemory {
                size: asked,
                held: self.budget.held(),
                budget: self.budget.limit(),
                source: Some(e),
            },
            _ => e.into(),
        }
    }

    /// Gives the room of `reserved` to `target` (a lazy handle, or one whose memory is replaced),
    /// stamping it with `cursor`. Afterwards `reserved` resolves to nothing.
    ///
    /// # Errors
    ///
    /// [`IoError::SelfBind`] when `target` is `reserved`, a clone or a view of it;
    /// [`IoError::NotFound`] when `reserved` does not hold room of this manager;
    /// [`IoError::ForeignHandle`] for a handle of another device; [`IoError::WrongStream`] for a
    /// handle of another stream; [`IoError::OutOfRange`] when `target` is larger than the room;
    /// [`IoError::InUse`] when `target`'s memory is still used by in-flight work. On any error
    /// nothing changes; the room goes back when `reserved` drops.
    pub fn bind(&mut self, reserved: Handle, target: &Handle, cursor: u64) -> Result<(), IoError> {
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
        slot.cursor = cursor;
        target.set_location(Some(location), false);
        reserved.set_location(None, true);
        Ok(())
    }

    fn check_issuer(&self, b: BindingRef<'_>) -> Result<(), IoError> {
        let issuer = b.issuer();
        if issuer.device != self.issuer.device {
            return Err(IoError::ForeignHandle {
                issued_by: issuer.device,
                used_on: self.issuer.device,
            });
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
            cursor: used.cursor,
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
    pub fn resolve(&self, handle: &impl AsBinding) -> Result<Resolved, IoError> {
        self.find(handle.as_binding()).map(|(_, _, r)| r)
    }

    /// Restamps the cursor of `handle`'s memory (new work on it).
    ///
    /// # Errors
    ///
    /// As [`Self::resolve`].
    pub fn stamp(&mut self, handle: &impl AsBinding, cursor: u64) -> Result<(), IoError> {
        let b = handle.as_binding();
        let (location, _, _) = self.find(b)?;
        if let Some(u) = self.used_mut(location, b.id()) {
            u.cursor = cursor;
        }
        Ok(())
    }

    fn sliced(&self, pool: PoolId) -> Option<&SlicedPool<S::DevicePage>> {
        if pool == POOL_SMALL {
            return Some(&self.small);
        }
        self.arena
            .get(usize::from(pool.checked_sub(POOL_ARENA_BASE)?))?
            .as_deref()
    }

    fn sliced_mut(&mut self, pool: PoolId) -> Option<&mut SlicedPool<S::DevicePage>> {
        if pool == POOL_SMALL {
            return Some(&mut self.small);
        }
        self.arena
            .get_mut(usize::from(pool.checked_sub(POOL_ARENA_BASE)?))?
            .as_deref_mut()
    }

    fn used_mut(&mut self, location: Location, owner: u64) -> Option<&mut Used> {
        match location.pool {
            POOL_PERSISTENT => self.persistent.used_mut(location.block, owner),
            POOL_DEDICATED => self.dedicated.used_mut(location.block, owner),
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

    fn set_guard(&mut self, page: PageRef, add: bool) {
        match page.pool {
            POOL_PERSISTENT => self.persistent.guard(page.page, add),
            POOL_DEDICATED => self.dedicated.guard(page.page, add),
            pool => {
                if let Some(p) = self.sliced_mut(pool) {
                    p.guard(page.page, add);
                    if !add && !p.is_serving() && p.page(page.page).is_some_and(|p| p.live == 0) {
                        self.outdated_empty.push(page);
                    }
                }
            }
        }
    }

    /// Frees what was dropped since the last call (handles dropped on any thread).
    fn collect_returns(&mut self) {
        self.returns.drain_into(&mut self.returned);
        if self.returned.is_empty() {
            return;
        }
        let mut returned = core::mem::take(&mut self.returned);
        for r in returned.drain(..) {
            self.free_location(r.location, r.id);
        }
        self.returned = returned;
    }

    fn free_location(&mut self, location: Location, owner: u64) {
        if let Some(freed) = &mut self.freed {
            freed.push(owner);
        }
        match location.pool {
            POOL_PERSISTENT => {
                self.persistent.free(location.block, owner);
            }
            POOL_DEDICATED => {
                self.dedicated_freed |= self.dedicated.free(location.block, owner);
            }
            pool => {
                let Some(sliced) = self.sliced_mut(pool) else {
                    return;
                };
                if let Some(page) = sliced.free(location.block, owner) {
                    let outdated = !sliced.is_serving();
                    if outdated
                        && sliced
                            .page(page)
                            .is_some_and(|p| p.live == 0 && p.guards == 0)
                    {
                        self.outdated_empty.push(PageRef { pool, page });
                    }
                }
            }
        }
    }

    /// Runs a cleanup. Periodic: freed dedicated pages and empty pages of outdated arena classes
    /// go back. Explicit: also every empty, unguarded page of the small pool and the current
    /// arena class, and every freed persistent page.
    pub fn cleanup(&mut self, shim: &S, kind: Cleanup) {
        self.collect_returns();
        // The periodic tick runs on every reservation: with nothing to release it costs nothing.
        if kind == Cleanup::Periodic
            && !self.dedicated_freed
            && self.outdated_empty.is_empty()
            && self.guards.is_empty()
        {
            return;
        }
        self.drop_released_guards();
        let mut released: Vec<(S::DevicePage, u64)> = Vec::new();
        if self.dedicated_freed || kind == Cleanup::Explicit {
            let mut pages = Vec::new();
            self.dedicated.take_free(&mut pages);
            released.extend(pages.into_iter().map(|p| (p.raw, p.size)));
            self.dedicated_freed = false;
        }
        for page in core::mem::take(&mut self.outdated_empty) {
            if let Some(p) = self
                .sliced_mut(page.pool)
                .and_then(|s| s.remove_page_if_empty(page.page))
            {
                released.push((p.raw, p.size));
            }
        }
        if kind == Cleanup::Explicit {
            let mut pages = Vec::new();
            self.persistent.take_free(&mut pages);
            released.extend(pages.into_iter().map(|p| (p.raw, p.size)));
            let sliced_ids: Vec<PoolId> = core::iter::once(POOL_SMALL)
                .chain(
                    (0..self.arena.len())
                        .filter(|&i| self.arena[i].is_some())
                        .map(|i| POOL_ARENA_BASE + i as u8),
                )
                .collect();
            for id in sliced_ids {
                let pool = self.sliced_mut(id).expect("listed above");
                let empty: Vec<u32> = pool.empty_pages().collect();
                for page in empty {
                    if let Some(p) = pool.remove_page_if_empty(page) {
                        released.push((p.raw, p.size));
                    }
                }
            }
        }
        // Outdated classes with no page left free their slot.
        for slot in 0..self.arena.len() {
            let empty_outdated = self.arena[slot]
                .as_ref()
                .is_some_and(|p| !p.is_serving() && p.pages_live == 0);
            if empty_outdated {
                self.arena[slot] = None;
            }
        }
        for (raw, size) in released {
            self.release(shim, raw, size);
        }
    }

    fn drop_released_guards(&mut self) {
        let mut i = 0;
        while i < self.guards.len() {
            if Arc::strong_count(&self.guards[i]) == 1 {
                let page = *self.guards.swap_remove(i);
                self.set_guard(page, false);
            } else {
                i += 1;
            }
        }
    }

    fn release(&mut self, shim: &S, raw: S::DevicePage, size: u64) {
        let page = RetiredPage {
            raw,
            size,
            budget: self.budget.clone(),
        };
        match self.release {
            // SAFETY: `Immediate` is set only through the unsafe `release_pages_immediately`,
            // whose caller promised that no device work uses memory whose handles were dropped;
            // an empty page holds no live allocation.
            PageRelease::Immediate => unsafe { page.free(shim) },
            PageRelease::Fenced => self.retired.push(page),
        }
    }

    /// Takes the pages retired since the last call; each must be freed (see
    /// [`RetiredPage::free`]) once no device work can use it.
    pub(crate) fn take_retired(&mut self) -> Vec<RetiredPage<S::DevicePage>> {
        core::mem::take(&mut self.retired)
    }

    /// Bytes of pages retired and not yet freed.
    pub fn retired_bytes(&self) -> u64 {
        self.retired.iter().map(|p| p.size).sum()
    }

    /// Frees every retired page.
    ///
    /// # Safety
    ///
    /// No work that may use memory of this manager whose handles were dropped is pending on any
    /// stream of the device.
    pub(crate) unsafe fn free_retired(&mut self, shim: &S) {
        for page in core::mem::take(&mut self.retired) {
            // SAFETY: the caller guarantees the device is done with freed memory.
            unsafe { page.free(shim) };
        }
    }

    /// Frees every page the manager holds, live allocations and retired pages included: for the
    /// owner's teardown (the device's, or that of a manager used on its own). Handles still out
    /// resolve to nothing afterwards (their pages are gone from the pools).
    ///
    /// # Safety
    ///
    /// No work that may use any memory of this manager is pending on any stream of the device.
    pub unsafe fn release_all(&mut self, shim: &S) {
        let mut pages: Vec<(S::DevicePage, u64)> = Vec::new();
        let mut sliced: Vec<SlicedPool<S::DevicePage>> = Vec::new();
        let small_page = self.small.page_size;
        sliced.push(core::mem::replace(
            &mut self.small,
            SlicedPool::new(small_page),
        ));
        sliced.extend(self.arena.iter_mut().filter_map(Option::take).map(|b| *b));
        self.current = None;
        for pool in sliced {
            pages.extend(pool.into_pages().map(|p| (p.raw, p.size)));
        }
        for whole in [&mut self.persistent, &mut self.dedicated] {
            pages.extend(core::mem::take(whole).into_pages().map(|p| (p.raw, p.size)));
        }
        self.outdated_empty.clear();
        for (raw, size) in pages {
            let page = RetiredPage {
                raw,
                size,
                budget: self.budget.clone(),
            };
            // SAFETY: the caller guarantees no pending work uses any page of this manager.
            unsafe { page.free(shim) };
        }
        // SAFETY: as above.
        unsafe { self.free_retired(shim) };
    }

    /// Leaks every page on purpose: for a teardown that could not tell whether the device is
    /// done with them.
    pub(crate) fn forget_all(&mut self) {
        let small_page = self.small.page_size;
        core::mem::forget(core::mem::replace(
            &mut self.small,
            SlicedPool::new(small_page),
        ));
        for slot in &mut self.arena {
            core::mem::forget(slot.take());
        }
        self.current = None;
        core::mem::forget(core::mem::take(&mut self.persistent));
        core::mem::forget(core::mem::take(&mut self.dedicated));
        core::mem::forget(core::mem::take(&mut self.retired));
    }

    /// Bytes of pages held by this manager (retired pages included).
    pub fn bytes_held(&mut self) -> u64 {
        self.report().device().reserved + self.retired_bytes()
    }

    /// The figures of every pool (allocations dropped since the last call are freed first).
    pub fn report(&mut self) -> MemoryReport {
        self.collect_returns();
        let mut pools = Vec::new();
        let sliced = |kind, p: &SlicedPool<S::DevicePage>| {
            let usage = p.usage();
            PoolReport {
                kind,
                page_size: p.page_size,
                pages: p.pages_live,
                pages_peak: p.pages_peak,
                allocations: usage.allocations,
                in_use: usage.in_use,
                padding: usage.padding,
                reserved: usage.reserved,
            }
        };
        if self.small.pages_peak > 0 {
            pools.push(sliced(PoolKind::Small, &self.small));
        }
        let current = self.current.and_then(|c| self.arena[c].as_ref());
        if let Some(p) = current {
            pools.push(sliced(PoolKind::Arena { outdated: false }, p));
        }
        for (i, p) in self.arena.iter().enumerate() {
            if let Some(p) = p.as_ref().filter(|_| Some(i) != self.current) {
                pools.push(sliced(PoolKind::Arena { outdated: true }, p));
            }
        }
        for (kind, w) in [
            (PoolKind::Persistent, &self.persistent),
            (PoolKind::Dedicated, &self.dedicated),
        ] {
            if w.pages_peak > 0 {
                let usage = w.usage();
                pools.push(PoolReport {
                    kind,
                    page_size: w.largest_page(),
                    pages: w.pages_live,
                    pages_peak: w.pages_peak,
                    allocations: usage.allocations,
                    in_use: usage.in_use,
                    padding: usage.padding,
                    reserved: usage.reserved,
                });
            }
        }
        MemoryReport { pools }
    }

    /// The page size of the current arena class, if any.
    pub fn arena_page_size_now(&self) -> Option<u64> {
        self.current
            .and_then(|c| self.arena[c].as_ref())
            .map(|p| p.page_size)
    }

    /// Every page held, for checks (allocations dropped since the last call are freed first).
    pub fn pages(&mut self) -> Vec<PageInfo> {
        self.collect_returns();
        let mut out = Vec::new();
        self.each_sliced(|kind, id, pool| {
            for (i, p) in pool.pages() {
                out.push(PageInfo {
                    kind,
                    page: PageRef { pool: id, page: i },
                    addr: p.addr,
                    size: p.size,
                    guarded: p.guards > 0,
                });
            }
        });
        for (kind, id, w) in [
            (PoolKind::Persistent, POOL_PERSISTENT, &self.persistent),
            (PoolKind::Dedicated, POOL_DEDICATED, &self.dedicated),
        ] {
            for (i, p) in w.pages() {
                out.push(PageInfo {
                    kind,
                    page: PageRef { pool: id, page: i },
                    addr: p.addr,
                    size: p.size,
                    guarded: p.guards > 0,
                });
            }
        }
        out
    }

    /// Every live allocation, for checks (allocations dropped since the last call are freed
    /// first).
    pub fn allocations(&mut self) -> Vec<AllocationInfo> {
        self.collect_returns();
        let mut out = Vec::new();
        self.each_sliced(|kind, id, pool| {
            for (page, offset, span, used) in pool.used_blocks() {
                let p = pool.page(page).expect("used blocks lie on live pages");
                let info = PageInfo {
                    kind,
                    page: PageRef { pool: id, page },
                    addr: p.addr,
                    size: p.size,
                    guarded: p.guards > 0,
                };
                out.push(AllocationInfo {
                    owner: used.owner,
                    addr: p.addr + offset,
                    size: used.size,
                    span,
                    page: info,
                });
            }
        });
        for (kind, id, w) in [
            (PoolKind::Persistent, POOL_PERSISTENT, &self.persistent),
            (PoolKind::Dedicated, POOL_DEDICATED, &self.dedicated),
        ] {
            for (i, p) in w.pages() {
                if let Some(used) = p.used {
                    let info = PageInfo {
                        kind,
                        page: PageRef { pool: id, page: i },
                        addr: p.addr,
                        size: p.size,
                        guarded: p.guards > 0,
                    };
                    out.push(AllocationInfo {
                        owner: used.owner,
                        addr: p.addr,
                        size: used.size,
                        span: p.size,
                        page: info,
                    });
                }
            }
        }
        out
    }

    fn each_sliced(&self, mut f: impl FnMut(PoolKind, PoolId, &SlicedPool<S::DevicePage>)) {
        f(PoolKind::Small, POOL_SMALL, &self.small);
        for (i, p) in self.arena.iter().enumerate() {
            if let Some(p) = p {
                f(
                    PoolKind::Arena {
                        outdated: !p.is_serving(),
                    },
                    POOL_ARENA_BASE + i as u8,
                    p,
                );
            }
        }
    }
}

impl<S: Shim> Drop for MemoryManager<S> {
    fn drop(&mut self) {
        if !self.retired.is_empty() {
            warn!(
                "memory manager dropped with {} retired pages not freed: leaking them",
                self.retired.len()
            );
            // Leak on purpose: the device may still use them and only the owner could know.
            core::mem::forget(core::mem::take(&mut self.retired));
        }
    }
}

#[cfg(test)]
#[path = "manager_tests.rs"]
mod tests;
