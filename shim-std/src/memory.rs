//! Device and pinned host pages: zeroed, aligned heap blocks, and the poison quarantine.
//!
//! A block is kept as its exposed address (`usize`), so pages are plain `Send + Sync` values and
//! a device address is the host address of the block. Pointers are rebuilt with
//! [`std::ptr::with_exposed_provenance_mut`].

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::collections::VecDeque;
use std::ptr::{self, NonNull};

/// The byte a new pinned host page holds ([`Shim::host_alloc_pinned`](devcmd::Shim::host_alloc_pinned)):
/// not zero, as `cuMemHostAlloc` does not clear its pages, so the suite sees a core that hands
/// out bytes nothing wrote.
pub const FRESH_HOST_BYTE: u8 = 0xA5;

/// The byte freed memory is filled with in poison mode.
pub const POISON_BYTE: u8 = 0xDB;

/// At most this many freed blocks stay in the quarantine (and as many unmapped ranges in the
/// virtual memory's own, `vm.rs`).
pub(crate) const QUARANTINE_BLOCKS: usize = 64;
/// At most this many bytes of freed blocks stay in the quarantine (the newest block always stays).
pub(crate) const QUARANTINE_BYTES: usize = 64 << 20;

/// A zeroed heap block owned by this crate. Not freed on drop: [`Block::free`] does it.
#[derive(Debug)]
pub(crate) struct Block {
    addr: usize,
    layout: Layout,
}

impl Block {
    /// Allocates `size` zeroed bytes (at least one, so every block has its own address) aligned
    /// to `align`. `None` when the layout is impossible or the heap refuses.
    pub(crate) fn alloc(size: usize, align: usize) -> Option<Self> {
        let layout = Layout::from_size_align(size.max(1), align).ok()?;
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { alloc_zeroed(layout) };
        (!p.is_null()).then(|| Self {
            addr: p.expose_provenance(),
            layout,
        })
    }

    /// The block's first byte, as an address.
    pub(crate) fn addr(&self) -> usize {
        self.addr
    }

    fn ptr(&self) -> *mut u8 {
        ptr::with_exposed_provenance_mut(self.addr)
    }

    fn len(&self) -> usize {
        self.layout.size()
    }

    /// Fills the block with `byte` (a fresh host page's [`FRESH_HOST_BYTE`]).
    ///
    /// # Safety
    ///
    /// Nothing reads or writes the block concurrently.
    pub(crate) unsafe fn fill(&self, byte: u8) {
        // SAFETY: the block is a live allocation of `len()` bytes (we own it and it is not freed);
        // the caller promises no concurrent access.
        unsafe { ptr::write_bytes(self.ptr(), byte, self.len()) };
    }

    /// Fills the block with [`POISON_BYTE`].
    ///
    /// # Safety
    ///
    /// Nothing reads or writes the block concurrently.
    pub(crate) unsafe fn poison(&self) {
        // SAFETY: the caller's promise.
        unsafe { self.fill(POISON_BYTE) }
    }

    /// Returns the block to the heap.
    ///
    /// # Safety
    ///
    /// Nothing uses the block any more.
    pub(crate) unsafe fn free(self) {
        // SAFETY: `addr` came from `alloc_zeroed(layout)` and is freed only here, once (by value).
        unsafe { dealloc(self.ptr(), self.layout) }
    }
}

/// A device page: a base address and a size. Return it with
/// [`Shim::device_free`](devcmd::Shim::device_free); dropping it instead leaks it (like losing a
/// `CUdeviceptr`) and leaves it counted in [`Stats::device_bytes_live`](crate::Stats).
#[derive(Debug)]
pub struct StdDevicePage {
    pub(crate) block: Block,
    pub(crate) size: u64,
}

impl StdDevicePage {
    /// The bytes asked for (zero-size pages hold a one-byte block of their own).
    pub fn size(&self) -> u64 {
        self.size
    }
}

/// A pinned host page. Return it with
/// [`Shim::host_free_pinned`](devcmd::Shim::host_free_pinned); dropping it instead leaks it.
#[derive(Debug)]
pub struct StdHostPage {
    pub(crate) block: Block,
    pub(crate) size: usize,
}

impl StdHostPage {
    /// The bytes asked for.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The first byte of the page.
    pub(crate) fn ptr(&self) -> NonNull<u8> {
        NonNull::new(self.block.ptr()).unwrap_or(NonNull::dangling())
    }
}

/// Freed blocks held back in poison mode, filled with [`POISON_BYTE`], so that work which reads a
/// page after it was freed reads poison instead of someone else's data or unmapped memory. Bounded
/// to the last [`QUARANTINE_BLOCKS`] blocks and [`QUARANTINE_BYTES`] bytes (the newest block
/// always stays); older blocks really go back to the heap.
#[derive(Debug, Default)]
pub(crate) struct Quarantine {
    blocks: VecDeque<Block>,
    bytes: usize,
}

impl Quarantine {
    /// Poisons `block` and holds it; frees the oldest blocks past the bounds.
    ///
    /// # Safety
    ///
    /// The block was freed by the core: nothing uses it any more.
    pub(crate) unsafe fn push(&mut self, block: Block) {
        // SAFETY: the caller promises nothing uses the block.
        unsafe { block.poison() };
        self.bytes += block.len();
        self.blocks.push_back(block);
        while self.blocks.len() > 1
            && (self.blocks.len() > QUARANTINE_BLOCKS || self.bytes > QUARANTINE_BYTES)
        {
            let Some(old) = self.blocks.pop_front() else {
                break;
            };
            self.bytes -= old.len();
            // SAFETY: the core freed it at least one free ago; the quarantine is a debugging net,
            // not part of the contract.
            unsafe { old.free() };
        }
    }

    /// Bytes held.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for Quarantine {
    fn drop(&mut self) {
        for block in self.blocks.drain(..) {
            // SAFETY: the quarantine belongs to the device state, dropped only once every stream
            // (which holds the device) has been joined: nothing runs that could use the block.
            unsafe { block.free() };
        }
    }
}
