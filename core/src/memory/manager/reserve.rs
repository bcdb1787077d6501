//! Placement: where a reservation's room comes from.
//!
//! Owns [`MemoryManager::reserve`] and [`MemoryManager::try_reserve`], the routing of a request by
//! mode and size to the small pool, the arena (each a granule pool first where there is one) or a
//! whole-page pool, the sizing of a new arena page (fitted to the budget), and the asking for
//! pages (budget first, then the device, with the device's refusal turned into an [`IoError`]). Does not own what happens to room once it is
//! placed: binding and lookup are in `lookup.rs`, giving it back in `release.rs`.

use super::{MemoryManager, round_up};
use crate::error::{DriverError, Fault, IoError};
use crate::memory::handle::Handle;
use crate::memory::pool::{Location, Placed, Pool, Size, Whole};
use crate::memory::sliced::Used;
use crate::memory::types::{AllocationMode, Cleanup, PageUpdate, RawPage};
use crate::shim::Shim;

impl<S: Shim> MemoryManager<S> {
    /// Reserves `size` bytes, with one reclaim and retry when the first attempt fails with an
    /// error reclaiming may cure and `update` is [`PageUpdate::Allow`].
    ///
    /// With [`PageRelease::Fenced`] the reclaim can only retire pages; the device's reclaim also
    /// waits for its streams and frees them, then retries through [`Self::try_reserve`].
    ///
    /// [`PageRelease::Fenced`]: crate::memory::PageRelease::Fenced
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
    /// [`IoError::Shim`] when the device refuses otherwise (a lost device among those: see
    /// [`IoError::is_device_lost`]).
    pub fn try_reserve(
        &mut self,
        shim: &S,
        size: u64,
        update: PageUpdate,
    ) -> Result<Handle, IoError> {
        if update == PageUpdate::Allow {
            self.cleanup(shim, Cleanup::Periodic); // collects the returns first
            // Pools made before new pages stopped coming from them (`map_pages(true)`) are
            // trimmed too.
            if S::VIRTUAL_MEMORY && self.vm.iter().any(Option::is_some) {
                self.trim_idle(shim);
            }
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
                    budget: self.budget_bounding_pages(),
                });
            }
        };
        let id = self.next_id;
        let used = Used { owner: id, size };
        let placed = match self.mode() {
            AllocationMode::Persistent => {
                self.reserve_whole(shim, Whole::Persistent, aligned, used, update)?
            }
            AllocationMode::Dedicated => {
                self.reserve_whole(shim, Whole::Dedicated, aligned, used, update)?
            }
            AllocationMode::Auto if aligned <= self.config.small_max_slice => {
                self.reserve_small(shim, aligned, used, update)?
            }
            AllocationMode::Auto => self.reserve_arena(shim, aligned, used, update)?,
        };
        self.next_id += 1;
        Ok(self.new_handle(id, size, Some(placed)))
    }

    fn reserve_whole(
        &mut self,
        shim: &S,
        w: Whole,
        aligned: u64,
        used: Used,
        update: PageUpdate,
    ) -> Result<Placed, IoError> {
        let pool = Pool::Whole(w);
        let whole = self.whole_mut(w);
        if let Some((block, addr)) = whole.try_reuse(aligned, used) {
            return Ok(Placed {
                location: Location { pool, block },
                addr,
            });
        }
        if update == PageUpdate::Forbidden {
            return Err(IoError::PageUpdateForbidden {
                size: used.size,
                room: whole.largest_free(),
            });
        }
        let (raw, addr) = self.alloc_page(shim, aligned, used.size)?;
        let block = self.whole_mut(w).add(raw, addr, aligned, used);
        Ok(Placed {
            location: Location { pool, block },
            addr,
        })
    }

    fn reserve_small(
        &mut self,
        shim: &S,
        aligned: u64,
        used: Used,
        update: PageUpdate,
    ) -> Result<Placed, IoError> {
        if let Some(placed) = self.reserve_granules(shim, Size::Small, aligned, used, update)? {
            return Ok(placed);
        }
        if let Some(c) = self.small.carve_or_release(used.size, aligned, used) {
            return Ok(c.placed(Pool::Pages(Size::Small)));
        }
        if update == PageUpdate::Forbidden {
            return Err(IoError::PageUpdateForbidden {
                size: used.size,
                room: self.small.largest_free(),
            });
        }
        // As in the arena: a page gives up its size before a request that fits the budget's
        // last bytes fails.
        let page_size = self.fit_to_budget(self.small.page_size, aligned);
        let (raw, addr) = self.alloc_page(shim, page_size, used.size)?;
        self.small.add_page(raw, addr, page_size);
        let c = self
            .small
            .try_carve(used.size, aligned, used)
            .expect("a fresh page fits a small slice");
        Ok(c.placed(Pool::Pages(Size::Small)))
    }

    /// The size of a new arena page for a request of `aligned` bytes: the request rounded up to
    /// the arena's granule, at least its smallest page, at most the largest page.
    fn arena_page_size(&self, aligned: u64) -> u64 {
        let c = &self.config;
        let rounded = aligned
            .checked_next_multiple_of(c.arena_granule)
            .and_then(|s| round_up(s, self.alignment))
            .unwrap_or(self.max_page);
        let min =
            round_up(c.arena_min_page.min(self.max_page), self.alignment).unwrap_or(self.max_page);
        rounded.max(min).min(self.max_page)
    }

    /// `page_size`, or less when the room the budget has left is smaller but still holds
    /// `aligned`: a new page gives up its rounding before the request fails.
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
    ) -> Result<Placed, IoError> {
        if let Some(placed) = self.reserve_granules(shim, Size::Arena, aligned, used, update)? {
            return Ok(placed);
        }
        if let Some(c) = self.arena.carve_or_release(used.size, aligned, used) {
            return Ok(c.placed(Pool::Pages(Size::Arena)));
        }
        if update == PageUpdate::Forbidden {
            return Err(IoError::PageUpdateForbidden {
                size: used.size,
                room: self.arena.largest_free(),
            });
        }
        // No free block fits: the empty pages are all too small for it. They go back first, so
        // the memory held grows only by what the request needs.
        if update == PageUpdate::Allow {
            self.release_empty_arena_pages(shim);
        }
        let page_size = self.fit_to_budget(self.arena_page_size(aligned), aligned);
        let (raw, addr) = self.alloc_page(shim, page_size, used.size)?;
        self.arena.add_page(raw, addr, page_size);
        let c = self
            .arena
            .try_carve(used.size, aligned, used)
            .expect("a page sized for the request fits it");
        Ok(c.placed(Pool::Pages(Size::Arena)))
    }

    fn alloc_page(
        &mut self,
        shim: &S,
        page_size: u64,
        asked: u64,
    ) -> Result<(RawPage<S>, u64), IoError> {
        self.budget
            .take(page_size)
            .map_err(|r| IoError::OutOfMemory {
                size: asked,
                held: r.held,
                budget: Some(r.limit),
                source: None,
            })?;
        if self.mapped_pages
            && let Some(mapped) = Self::alloc_mapped(shim, page_size)
        {
            self.made_mapped = true;
            return Ok(mapped);
        }
        match shim.device_alloc(page_size) {
            Ok(raw) => {
                let addr = shim.device_page_addr(&raw).0;
                Ok((RawPage::Device(raw), addr))
            }
            Err(e) => {
                self.budget.give_back(page_size);
                Err(self.page_error(e, asked, page_size))
            }
        }
    }

    /// A pinned host page the device addresses in place, or `None` (after giving back what it
    /// got) when the shim cannot make one: the caller then asks for a device page.
    fn alloc_mapped(shim: &S, page_size: u64) -> Option<(RawPage<S>, u64)> {
        let size = usize::try_from(page_size).ok()?;
        let page = crate::pinned::alloc_host_page(shim, size).ok()?;
        match shim.host_page_device_addr(&page) {
            Some(addr) => Some((RawPage::Mapped(page, alloc::sync::Arc::default()), addr.0)),
            None => {
                // SAFETY: the page was never handed to any work.
                unsafe { shim.host_free_pinned(page) };
                None
            }
        }
    }

    /// The budget's limit, when it is what bounds the largest page (it rounds down to it).
    fn budget_bounding_pages(&self) -> Option<u64> {
        self.budget
            .limit()
            .filter(|&b| b / self.alignment * self.alignment <= self.max_page)
    }

    pub(super) fn page_error(&self, e: DriverError, asked: u64, page_size: u64) -> IoError {
        match e.fault {
            Fault::TooBig => IoError::BufferTooBig {
                size: page_size.max(asked),
                max_page: self.max_page,
                budget: self.budget_bounding_pages(),
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
}
