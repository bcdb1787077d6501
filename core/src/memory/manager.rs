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
//!
//! The manager's `impl` is spread over files, one a concern: this file holds the struct, its
//! construction, settings and modes; `manager/reserve.rs` placement; `manager/granules.rs` the
//! device calls of the granule pools (reserving ranges, mapping and giving back granules);
//! `manager/lookup.rs` binding, resolving and guards; `manager/release.rs` cleanup, retiring and
//! teardown; `manager/report.rs` the report and the lists for checks. The public types are in
//! `memory/types.rs`.
//!
//! # The pools
//!
//! Requests up to [`MemoryConfig::small_max_slice`] go to a small pool, larger ones to the arena,
//! so that small long-lived allocations do not pin the arena's memory. Where the device has virtual
//! memory management (and [`MemoryConfig::virtual_memory`] is on), each is a *granule pool*
//! (`memory/vm.rs`): one reserved address range, placed best-fit anywhere in it, with memory behind
//! only the granules live allocations touch; an arena request up to a granule that would map one is
//! placed in room the small pool already has memory behind, where the small pool's placement
//! (its usual bounded search) finds some, so the two pools share granules instead of each holding
//! a partial one. Elsewhere (or when a range is full or
//! cannot be reserved) each holds pages: fixed pages for the small pool, pages sized to the request
//! rounded up to [`MemoryConfig::arena_granule`] for the arena, best fit across all of them. Either
//! way, memory no allocation uses is kept for reuse, and goes back first when the pools would
//! otherwise grow past the most they ever held (idle granules) or when the arena needs a page none
//! of its empty ones can serve (empty arena pages): the peak of memory held grows only by what live
//! allocations need. Under [`IdleGranules::Slack`](super::IdleGranules::Slack) the granule pools
//! also give back, at every reservation, the idle granules past a slack above the granules in use.
//! An explicit cleanup gives back everything unused.

mod granules;
mod lookup;
mod release;
mod report;
mod reserve;

use super::binding::AsBinding;
use super::budget::MemoryBudget;
use super::config::{MemoryConfig, PageRelease};
use super::handle::{Handle, ReturnQueue, Returned, SpareIdentity};
use super::pool::Placed;
use super::retire::Released;
use super::sliced::SlicedPool;
use super::types::Issuer;
use super::types::{AllocationMode, PageRef, RawPage, RetiredPage};
use super::vm::GranulePool;
use super::whole::WholePagePool;
use crate::attention::Attention;
use crate::shim::{DeviceFacts, Shim};
use alloc::sync::Arc;
use alloc::vec::Vec;

/// A manager numbers its handles from its stream's index shifted this far: an id's top bits name
/// the stream that issued it (a hint: [`MemoryManager::made`] confirms it).
const ID_STREAM_SHIFT: u32 = 48;

/// The stream an allocation id names (see [`ID_STREAM_SHIFT`]).
#[inline]
pub(crate) fn stream_named(id: u64) -> usize {
    (id >> ID_STREAM_SHIFT) as usize
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
    /// Identities of returned allocations, for the next handles (at most
    /// [`MemoryConfig::spare_identities`]).
    spare: Vec<SpareIdentity>,
    next_id: u64,
    small: SlicedPool<RawPage<S>>,
    arena: SlicedPool<RawPage<S>>,
    /// Arena pages that became empty (entries may be stale): given back before the arena grows.
    arena_empty: Vec<u32>,
    /// The granule pools, once their ranges are reserved (small, large); boxed so a manager
    /// without them carries a pointer each.
    vm: [Option<alloc::boxed::Box<GranulePool>>; 2],
    /// The device's granule where the granule pools may be used; 0 where they may not (no
    /// virtual memory, turned off, zero copy, or a range could not be reserved).
    vm_granule: u64,
    /// The most bytes the granule pools held at once since the last explicit cleanup, as seen
    /// at the end of each placement that maps or takes back a granule in its own pool (one
    /// over mapped granules, or shared into the small pool's mapped room, leaves it; granules a
    /// placement refused part-way had mapped stay above it, idle, and go back first): growing
    /// past it gives idle granules back first.
    vm_high_water: u64,
    persistent: WholePagePool<RawPage<S>>,
    dedicated: WholePagePool<RawPage<S>>,
    modes: Vec<AllocationMode>,
    dedicated_freed: bool,
    guards: Vec<Arc<PageRef>>,
    retired: Vec<RetiredPage<Released<S>>>,
    /// Ids of allocations released or rebound, when the owner tracks them (failure marks).
    freed: Option<Vec<u64>>,
    /// The device's attention word, rung when an id is freed or a page retires
    /// ([`Self::tracked`]; the return queue rings it for returns).
    attention: Option<Arc<Attention>>,
    release: PageRelease,
    /// New pages are pinned host pages the device maps (zero copy), where the shim can make them.
    mapped_pages: bool,
    /// Whether a mapped page was ever made (the ones made stay mapped after
    /// `map_pages(false)`): until then no handle has a host address to look up.
    made_mapped: bool,
    /// The memory every page and range must fit in (the budget or the device's total).
    memory: u64,
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
        Self::built(facts, config, issuer, budget, None)
    }

    /// A manager as [`Self::new`] that records the ids of allocations released or rebound, for
    /// [`Self::take_freed`] (the device drops their failure marks) or [`Self::drop_freed`] (the
    /// device has none to drop), and rings `attention` when an allocation comes back, an id is
    /// freed or a page retires (the device's bookkeeping).
    pub(crate) fn tracked(
        facts: &DeviceFacts,
        config: MemoryConfig,
        issuer: Issuer,
        budget: MemoryBudget,
        attention: Arc<Attention>,
    ) -> Self {
        Self::built(facts, config, issuer, budget, Some(attention))
    }

    fn built(
        facts: &DeviceFacts,
        config: MemoryConfig,
        issuer: Issuer,
        budget: MemoryBudget,
        attention: Option<Arc<Attention>>,
    ) -> Self {
        // A power of two; at most `MAX_ALIGNMENT`, so a slice's padding (at most the alignment)
        // fits the 32 bits a block keeps it in, and the rounding up cannot overflow.
        let alignment = facts
            .page_alignment
            .clamp(1, crate::memory::sliced::MAX_ALIGNMENT)
            .next_power_of_two();
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
            arena_granule: config.arena_granule.min(memory / 8).max(1),
            virtual_memory: config.virtual_memory,
            ..config
        };
        // Granule pools need a power-of-two granule no larger than the memory.
        let g = if S::VIRTUAL_MEMORY {
            facts.vm_granule
        } else {
            0
        };
        let vm_granule = if config.virtual_memory && g.is_power_of_two() && g <= memory / 4 {
            g.max(alignment)
        } else {
            0
        };
        Self {
            config,
            issuer,
            alignment,
            max_page,
            budget,
            returns: Arc::new(ReturnQueue::issued_by(issuer, attention.clone())),
            returned: Vec::new(),
            spare: Vec::new(),
            next_id: u64::from(issuer.stream) << ID_STREAM_SHIFT,
            small: SlicedPool::new(small_page),
            arena: SlicedPool::new(config.arena_min_page),
            arena_empty: Vec::new(),
            vm: [None, None],
            vm_granule,
            vm_high_water: 0,
            persistent: WholePagePool::default(),
            dedicated: WholePagePool::default(),
            modes: Vec::new(),
            dedicated_freed: false,
            guards: Vec::new(),
            retired: Vec::new(),
            freed: attention.is_some().then(Vec::new),
            attention,
            release: PageRelease::Fenced,
            mapped_pages: false,
            made_mapped: false,
            memory,
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
    ///
    /// [`IoError::BufferTooBig`]: crate::error::IoError::BufferTooBig
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

    /// From now on, new pages are pinned host pages the device addresses in place (zero copy:
    /// the host writes uploads into them and reads results from them directly), wherever the
    /// shim can make one ([`Shim::host_alloc_pinned`] with a [`Shim::host_page_device_addr`]);
    /// elsewhere device pages as usual. Pages already held stay as they are.
    pub fn map_pages(&mut self, on: bool) {
        self.mapped_pages = on;
        if on {
            // Granule pools hold device memory: zero copy serves every pool from host pages.
            self.vm_granule = 0;
        }
    }

    /// The granule of the granule pools in use (0 when pools hold whole pages).
    pub fn vm_granule(&self) -> u64 {
        self.vm_granule
    }

    /// The host address of the first byte `handle` (issued by this manager's device and stream)
    /// names, when it lies on a page the host can reach (a mapped page: see
    /// [`Self::map_pages`]), with the page's count of lent host buffers; valid while the
    /// allocation lives.
    pub(crate) fn host_ptr(
        &self,
        shim: &S,
        handle: &impl AsBinding,
    ) -> Option<(core::ptr::NonNull<u8>, Arc<core::sync::atomic::AtomicU32>)> {
        if !self.made_mapped {
            return None; // no page of this manager is mapped: no lookup
        }
        let resolved = self.resolve_issued(handle).ok()?;
        let (raw, page_addr) = self.raw_page(resolved.page)?;
        let base = raw.host_ptr(shim)?;
        let lent = Arc::clone(raw.lent()?);
        let offset = usize::try_from(resolved.addr.0.checked_sub(page_addr)?).ok()?;
        // SAFETY: `resolved` lies inside the page (the lookup checked it), so the offset stays
        // inside the page's host allocation.
        Some((unsafe { base.add(offset) }, lent))
    }

    /// Asks for the device's bookkeeping, when the manager is [`Self::tracked`].
    pub(super) fn ring(&self) {
        if let Some(a) = &self.attention {
            a.ring();
        }
    }

    /// Whether ids were recorded since the last [`Self::take_freed`] or [`Self::drop_freed`].
    pub(crate) fn has_freed(&self) -> bool {
        self.freed.as_ref().is_some_and(|f| !f.is_empty())
    }

    /// Frees what was returned since the last look, then moves the ids recorded since the last
    /// call into `out` (see [`Self::tracked`]).
    #[inline]
    pub(crate) fn take_freed(&mut self, out: &mut Vec<u64>) {
        // Nothing dropped since the last look (the usual case between operations): no call.
        self.collect_returns();
        if let Some(freed) = &mut self.freed
            && !freed.is_empty()
        {
            out.append(freed);
        }
    }

    /// Frees what was returned since the last look and drops the ids recorded (for a device
    /// with no failure or cross-stream record to clear them from).
    #[inline]
    pub(crate) fn drop_freed(&mut self) {
        self.collect_returns();
        if let Some(freed) = &mut self.freed {
            freed.clear();
        }
    }

    /// Whether this manager made `binding` (its queue is the identity's: one pointer compare).
    #[inline]
    pub(crate) fn made(&self, binding: &impl AsBinding) -> bool {
        binding.as_binding().made_by(&self.returns)
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
        self.new_handle(id, size, None)
    }

    /// A handle of `size` bytes named `id`, `placed` there (`None`: no memory yet), in a kept
    /// identity's heap block when there is one.
    pub(super) fn new_handle(&mut self, id: u64, size: u64, placed: Option<Placed>) -> Handle {
        Handle::reusing(self.spare.pop(), id, size, placed, &self.returns)
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

    /// Opens a window of `mode` (even `Auto`) and returns the depth to close it back to.
    pub(crate) fn open_mode(&mut self, mode: AllocationMode) -> usize {
        let depth = self.modes.len();
        self.modes.push(mode);
        depth
    }

    /// Closes every window opened at `depth` or above (a scoped window's end).
    pub(crate) fn close_modes_to(&mut self, depth: usize) {
        self.modes.truncate(depth);
    }

    /// The mode new reservations are served in.
    pub fn mode(&self) -> AllocationMode {
        self.modes.last().copied().unwrap_or(AllocationMode::Auto)
    }
}

#[cfg(test)]
#[path = "manager_tests.rs"]
mod tests;
