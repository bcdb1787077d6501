//! The pinned host pool of a stream: page-locked pages from the shim, carved into slices for
//! staging copies.
//!
//! Owns the pinned pages and the slices carved from them (requests larger than a page get a page
//! of their own, reused by exact size, so large uploads do not fall back to fresh heap memory);
//! a slice goes back when the [`HostBuffer`] holding it drops (after the drop queue released it). Does not own the fallback
//! to the heap when the pool cannot serve (the command decides).

use crate::host::HostBuffer;
use crate::memory::sliced::{SlicedPool, Used};
use crate::memory::whole::WholePagePool;
use crate::memory::{Handle, Issuer, PoolKind, PoolReport};
use crate::memory::{POOL_DEDICATED, POOL_SMALL, ReturnQueue, Returned};
use crate::shim::Shim;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::ptr::NonNull;

/// Sizes of a stream's pinned pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct PinnedConfig {
    /// Bytes per pinned page carved into slices; a larger request gets a pinned page of its own
    /// (within `max_bytes`).
    pub page_size: u64,
    /// Pinned bytes a stream may hold in all.
    pub max_bytes: u64,
    /// Alignment of slices.
    pub alignment: u64,
}

impl Default for PinnedConfig {
    fn default() -> Self {
        Self {
            page_size: 32 << 20,
            max_bytes: 256 << 20,
            alignment: 64,
        }
    }
}

/// The pinned pool of one stream.
#[derive(Debug)]
pub(crate) struct PinnedPool<S: Shim> {
    config: PinnedConfig,
    pool: SlicedPool<S::HostPage>,
    /// Requests larger than a page: one pinned page each, reused by exact size.
    large: WholePagePool<S::HostPage>,
    issuer: Issuer,
    returns: Arc<ReturnQueue>,
    returned: Vec<Returned>,
    next_id: u64,
    /// Whether the shim refused a pinned page of the carved size: stop asking until a cleanup.
    refused: bool,
    /// The smallest large page the shim refused: larger ones are not asked for until a cleanup.
    refused_large: Option<u64>,
    /// Most pages of both kinds held at once.
    pages_peak: u32,
}

impl<S: Shim> PinnedPool<S> {
    pub(crate) fn new(config: PinnedConfig, issuer: Issuer) -> Self {
        Self {
            pool: SlicedPool::new(config.page_size.max(1)),
            large: WholePagePool::default(),
            config,
            issuer,
            returns: Arc::default(),
            returned: Vec::new(),
            next_id: 1,
            refused: false,
            refused_large: None,
            pages_peak: 0,
        }
    }

    fn collect_returns(&mut self) {
        self.returns.drain_into(&mut self.returned);
        for r in self.returned.drain(..) {
            if r.location.pool == POOL_DEDICATED {
                self.large.free(r.location.block, r.id);
            } else {
                self.pool.free(r.location.block, r.id);
            }
        }
    }

    /// A pinned buffer of `len` bytes, or `None` when the pool cannot serve it (too large, at its
    /// limit, `may_add` false and no room held, or the shim refused).
    pub(crate) fn reserve(&mut self, shim: &S, len: usize, may_add: bool) -> Option<HostBuffer> {
        self.collect_returns();
        let size = len as u64;
        let aligned = size
            .max(1)
            .checked_next_multiple_of(self.config.alignment.max(1))?;
        let id = self.next_id;
        let used = Used {
            owner: id,
            size,
            cursor: 0,
        };
        let (pool, block, addr) = if aligned > self.pool.page_size {
            match self.large.try_reuse(aligned, used) {
                Some((block, addr)) => (POOL_DEDICATED, block, addr),
                None => {
                    let (page, addr) = self.new_page(shim, aligned, may_add)?;
                    (
                        POOL_DEDICATED,
                        self.large.add(page, addr, aligned, used),
                        addr,
                    )
                }
            }
        } else {
            let carved = match self.pool.try_carve(size, aligned, used) {
                Some(c) => c,
                None => {
                    let (page, addr) = self.new_page(shim, self.pool.page_size, may_add)?;
                    self.pool.add_page(page, addr);
                    self.pool.try_carve(size, aligned, used)?
                }
            };
            (POOL_SMALL, carved.block, carved.addr)
        };
        self.next_id += 1;
        self.pages_peak = self
            .pages_peak
            .max(self.pool.pages_live + self.large.pages_live);
        let handle = Handle::new(id, self.issuer, size, &self.returns);
        handle.set_location(Some(crate::memory::Location { pool, block }), false);
        let ptr = NonNull::new(addr as *mut u8)?;
        // SAFETY: the slice at `addr` spans `aligned >= len` bytes of a live pinned page, owned by
        // `handle` until it drops; a page is freed only once nothing on it is held.
        Some(unsafe { HostBuffer::pinned(ptr, len, handle) })
    }

    /// A new pinned page of `size` bytes, within the pool's limit, or `None`.
    fn new_page(&mut self, shim: &S, size: u64, may_add: bool) -> Option<(S::HostPage, u64)> {
        let large = size > self.pool.page_size;
        let refused = if large {
            self.refused_large.is_some_and(|r| size >= r)
        } else {
            self.refused
        };
        if !may_add || refused || size > self.config.max_bytes {
            return None;
        }
        if self.held().saturating_add(size) > self.config.max_bytes {
            // Free large pages of other sizes are room nothing can use now: give them back.
            self.free_large(shim);
            if self.held().saturating_add(size) > self.config.max_bytes {
                return None;
            }
        }
        let page = match shim.host_alloc_pinned(usize::try_from(size).ok()?) {
            Ok(p) => p,
            Err(e) => {
                debug!(
                    "pinned page refused (status {}): staging from the heap",
                    e.status
                );
                // A refused page stops asking for pages that large until a cleanup; a refused
                // large page says nothing about the carved size.
                if large {
                    self.refused_large = Some(self.refused_large.map_or(size, |r| r.min(size)));
                } else {
                    self.refused = true;
                }
                return None;
            }
        };
        let addr = shim.host_page_ptr(&page).as_ptr() as u64;
        Some((page, addr))
    }

    /// Pinned bytes held, both kinds of pages.
    fn held(&self) -> u64 {
        self.pool.usage().3 + self.large.usage().3
    }

    /// Frees the large pages no buffer holds.
    fn free_large(&mut self, shim: &S) {
        let mut free = Vec::new();
        self.large.take_free(&mut free);
        for p in free {
            // SAFETY: a free large page's buffer was dropped after the fence covering its copies.
            unsafe { shim.host_free_pinned(p.raw) };
        }
    }

    /// Frees every empty pinned page. Slices return only after the drop queue released their
    /// buffers, so an empty page is unused by the device.
    pub(crate) fn cleanup(&mut self, shim: &S) {
        self.collect_returns();
        self.refused = false;
        self.refused_large = None;
        let empty: Vec<u32> = self.pool.empty_pages().collect();
        for page in empty {
            if let Some(p) = self.pool.remove_page_if_empty(page) {
                // SAFETY: the page is empty: every buffer carved from it was dropped after the
                // fence covering its copies.
                unsafe { shim.host_free_pinned(p.raw) };
            }
        }
        self.free_large(shim);
    }

    pub(crate) fn report(&mut self) -> PoolReport {
        self.collect_returns();
        let (n, u, p, r) = self.pool.usage();
        let (ln, lu, lp, lr) = self.large.usage();
        let (allocations, in_use, padding, reserved) = (n + ln, u + lu, p + lp, r + lr);
        PoolReport {
            kind: PoolKind::PinnedHost,
            // The size of the carved pages; large requests' own pages count in `pages`.
            page_size: self.pool.page_size,
            pages: self.pool.pages_live + self.large.pages_live,
            pages_peak: self.pages_peak,
            allocations,
            in_use,
            padding,
            reserved,
        }
    }
}

impl<S: Shim> Drop for PinnedPool<S> {
    fn drop(&mut self) {
        let live = self.pool.pages_live + self.large.pages_live;
        if live > 0 {
            // Buffers may still be out (in a caller's hands or a leaked drop queue): freeing the
            // pages under them would be a use after free, so they are leaked on purpose.
            warn!(
                "pinned pool dropped with {} pages still held: leaking them",
                live
            );
            let pool = core::mem::replace(&mut self.pool, SlicedPool::new(1));
            core::mem::forget(pool);
            core::mem::forget(core::mem::take(&mut self.large));
        }
    }
}
