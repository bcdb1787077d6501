//! The pinned host pool of a stream: page-locked pages from the shim, carved into slices for
//! staging copies.
//!
//! Owns the pinned pages and the slices carved from them (requests larger than a page get a page
//! of their own, reused by exact size, so large uploads do not fall back to fresh heap memory),
//! and the token of a slice (`PinnedSlice`): the [`HostBuffer`](crate::HostBuffer) carved from the pool holds it,
//! and dropping it (after the drop queue released the buffer, on any thread) gives the slice
//! back. Host memory stays host memory here: slices are named by their own token, not by a
//! device [`Handle`](crate::memory::Handle), and their bytes by pointers derived from the page's
//! own pointer, never by integer addresses. Does not own the fallback to the heap when the pool
//! cannot serve (the command decides), nor device memory (`memory/`).

use crate::error::Fault;
use crate::memory::ReturnQueue;
use crate::memory::sliced::{MAX_ALIGNMENT, SlicedPool, Used};
use crate::memory::whole::WholePagePool;
use crate::memory::{PoolKind, PoolReport};
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
    /// Alignment of slices (at most 2 GiB is honoured: a slice's padding is kept in 32 bits).
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

/// Which of a pinned pool's two pools a slice lies in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SliceKind {
    /// Carved from a page of the configured size.
    Carved,
    /// A page of its own (a request larger than the carved pages).
    Large,
}

/// Where a slice lies in its pool, and whose it is (the pools check it on free).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SliceRef {
    kind: SliceKind,
    block: u32,
    id: u64,
}

/// A slice of a stream's pinned pool: held by the [`HostBuffer`](crate::HostBuffer) carved from it, it gives the
/// slice back to its pool when dropped (from any thread; the pool takes it in at its next call).
#[derive(Debug)]
pub(crate) struct PinnedSlice {
    slice: SliceRef,
    returns: Arc<ReturnQueue<SliceRef>>,
    /// The slice's first byte and its length as asked for.
    ptr: NonNull<u8>,
    len: usize,
}

impl PinnedSlice {
    /// The slice's first byte: `len()` bytes of a live pinned page follow, owned by this token
    /// until it drops (a page is freed only once no slice on it is held).
    pub(crate) fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    /// Bytes asked for.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

// SAFETY: the token owns its bytes exclusively (a pool carves each slice once) and gives the
// slice back through a thread-safe queue.
unsafe impl Send for PinnedSlice {}
// SAFETY: `&PinnedSlice` only reads the pointer's value.
unsafe impl Sync for PinnedSlice {}

impl Drop for PinnedSlice {
    fn drop(&mut self) {
        // Only a memory manager's queue is ever closed: this push always lands.
        let _ = self.returns.push(self.slice);
    }
}

/// The pinned pool of one stream.
#[derive(Debug)]
pub(crate) struct PinnedPool<S: Shim> {
    config: PinnedConfig,
    /// Pages of `config.page_size`, carved. Host pages enter the pools at base 0: what the pools
    /// call an address is an offset in the page; the pointer comes from the page itself.
    pool: SlicedPool<S::HostPage>,
    /// Requests larger than a page: one pinned page each, reused by exact size.
    large: WholePagePool<S::HostPage>,
    returns: Arc<ReturnQueue<SliceRef>>,
    returned: Vec<SliceRef>,
    next_id: u64,
    /// Whether the shim refused a pinned page of the carved size: stop asking until a cleanup.
    refused: bool,
    /// The smallest large page the shim refused: larger ones are not asked for until a cleanup.
    refused_large: Option<u64>,
    /// Most pages of both kinds held at once.
    pages_peak: u32,
}

impl<S: Shim> PinnedPool<S> {
    pub(crate) fn new(config: PinnedConfig) -> Self {
        Self {
            pool: SlicedPool::new(config.page_size.max(1)),
            large: WholePagePool::default(),
            config,
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
            match r.kind {
                SliceKind::Large => {
                    self.large.free(r.block, r.id);
                }
                SliceKind::Carved => {
                    self.pool.free(r.block, r.id);
                }
            }
        }
    }

    /// A pinned buffer of `len` bytes for an optional use (a read's spread over the staging
    /// ring), or `None`: served only while the bytes in use, with it, stay within half the
    /// pool's budget, so it never takes what the caller's own buffers would get.
    #[cfg(feature = "pipeline")]
    pub(crate) fn reserve_spare(&mut self, shim: &S, len: usize) -> Option<PinnedSlice> {
        self.collect_returns();
        let in_use = (self.pool.usage() + self.large.usage()).in_use;
        if in_use.saturating_add(u64::try_from(len).ok()?) > self.config.max_bytes / 2 {
            return None;
        }
        self.reserve(shim, len, true)
    }

    /// A pinned buffer of `len` bytes, or `None` when the pool cannot serve it (too large, at its
    /// limit, `may_add` false and no room held, or the shim refused). Never panics, whatever
    /// `len`: a length no pinned page can hold is `None`.
    pub(crate) fn reserve(&mut self, shim: &S, len: usize, may_add: bool) -> Option<PinnedSlice> {
        self.collect_returns();
        let size = u64::try_from(len).ok()?;
        let aligned = aligned_len(size, self.config.alignment)?;
        let id = self.next_id;
        let used = Used { owner: id, size };
        let (kind, block) = if aligned > self.pool.page_size {
            let block = match self.large.try_reuse(aligned, used) {
                Some((block, _)) => block,
                None => {
                    let page = self.new_page(shim, aligned, may_add)?;
                    self.large.add(page, 0, aligned, used)
                }
            };
            (SliceKind::Large, block)
        } else {
            let carved = match self.pool.try_carve(size, aligned, used) {
                Some(c) => c,
                None => {
                    let page = self.new_page(shim, self.pool.page_size, may_add)?;
                    self.pool.add_page(page, 0, self.pool.page_size);
                    self.pool.try_carve(size, aligned, used)?
                }
            };
            (SliceKind::Carved, carved.block)
        };
        self.next_id += 1;
        self.pages_peak = self
            .pages_peak
            .max(self.pool.pages_live + self.large.pages_live);
        // The slice's first byte: the page's own pointer, plus the offset the pool carved at.
        let (page, offset) = match kind {
            SliceKind::Large => (&self.large.page(block)?.raw, 0),
            SliceKind::Carved => {
                let (_, page, offset) = self.pool.used(block, id)?;
                (&self.pool.page(page)?.raw, offset)
            }
        };
        let Ok(offset) = usize::try_from(offset) else {
            // Unreachable on a page the host addresses; the slice goes back.
            // Only a memory manager's queue is ever closed: this push always lands.
            let _ = self.returns.push(SliceRef { kind, block, id });
            return None;
        };
        // SAFETY: the pool carved `aligned` bytes at `offset` of a page whose `page_size` bytes
        // start at the page's pointer (a large page is the slice, at offset 0), so the result
        // stays inside that allocation.
        let ptr = unsafe { shim.host_page_ptr(page).add(offset) };
        // The slice at `ptr` spans `aligned >= len` bytes of a live pinned page, owned by the
        // token until it drops.
        Some(PinnedSlice {
            slice: SliceRef { kind, block, id },
            returns: Arc::clone(&self.returns),
            ptr,
            len,
        })
    }

    /// A new pinned page of `size` bytes, within the pool's limit, or `None`.
    fn new_page(&mut self, shim: &S, size: u64, may_add: bool) -> Option<S::HostPage> {
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
        let page = match alloc_host_page(shim, usize::try_from(size).ok()?) {
            Ok(p) => p,
            Err(e) => {
                debug!(
                    "pinned page refused (status {}): staging from the heap",
                    e.status
                );
                // A refused page stops asking for pages that large until a cleanup (unless it was
                // refused for now only, while another device of the process records: the next
                // request asks again); a refused large page says nothing about the carved size.
                if e.fault != Fault::Busy {
                    if large {
                        self.refused_large = Some(self.refused_large.map_or(size, |r| r.min(size)));
                    } else {
                        self.refused = true;
                    }
                }
                return None;
            }
        };
        Some(page)
    }

    /// Pinned bytes held, both kinds of pages.
    fn held(&self) -> u64 {
        self.pool.usage().reserved + self.large.usage().reserved
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
        let usage = self.pool.usage() + self.large.usage();
        PoolReport {
            kind: PoolKind::PinnedHost,
            // The size of the carved pages; large requests' own pages count in `pages`.
            page_size: self.pool.page_size,
            pages: self.pool.pages_live + self.large.pages_live,
            pages_peak: self.pages_peak,
            allocations: usage.allocations,
            in_use: usage.in_use,
            padding: usage.padding,
            reserved: usage.reserved,
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

/// A pinned host page of `size` bytes from the shim, zeroed. Its bytes reach the user before
/// anything wrote them (a pinned buffer from `reserve_host`, a zero-copy allocation read in
/// place), and the shim contract leaves a new page's contents unsaid (`cuMemHostAlloc` does not
/// clear them): zeroed here once, they are initialised bytes for good.
pub(crate) fn alloc_host_page<S: Shim>(
    shim: &S,
    size: usize,
) -> Result<S::HostPage, crate::DriverError> {
    let page = shim.host_alloc_pinned(size)?;
    // SAFETY: `host_page_ptr`'s contract: the page's `size` bytes are valid from its first
    // byte until it is freed; the page is new, so nothing else reads or writes them.
    unsafe { core::ptr::write_bytes(shim.host_page_ptr(&page).as_ptr(), 0, size) };
    Ok(page)
}

/// `size` bytes (at least one) rounded up to the slice alignment `alignment`, capped at
/// [`MAX_ALIGNMENT`] (a slice's padding is kept in 32 bits); `None` past `u64::MAX`.
fn aligned_len(size: u64, alignment: u64) -> Option<u64> {
    size.max(1)
        .checked_next_multiple_of(alignment.clamp(1, MAX_ALIGNMENT))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_shim::TestShim;

    #[test]
    fn an_alignment_past_two_gib_is_honoured_as_two_gib() {
        // Review of the smaller block record: an 8 GiB alignment with a pinned page of 8 GiB
        // made the first staged write panic (the padding no longer fit its 32 bits).
        assert_eq!(aligned_len(100, 8 << 30), Some(MAX_ALIGNMENT));
        assert_eq!(aligned_len(0, 0), Some(1));
        assert_eq!(aligned_len(100, 64), Some(128));
        assert_eq!(aligned_len(u64::MAX, 64), None);
    }

    #[test]
    fn huge_lengths_are_refused_never_a_panic() {
        // The test shim refuses pinned pages: only the pool's own checks are reached.
        let shim = TestShim::new(1 << 30, 64, 1 << 28);
        let mut pool: PinnedPool<TestShim> = PinnedPool::new(PinnedConfig::default());
        let huge = [
            usize::MAX,
            usize::MAX - 63,
            isize::MAX as usize + 1,
            1 << 40,
            (256 << 20) + 1,
        ];
        for len in huge {
            for may_add in [true, false] {
                assert!(pool.reserve(&shim, len, may_add).is_none(), "{len}");
            }
        }
        assert_eq!(pool.report().pages, 0);
        pool.cleanup(&shim);
    }
}
