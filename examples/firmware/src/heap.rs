//! The heap: a linked-list allocator over a static block, counting what the job measures (bytes
//! in use, their high-water mark, and the calls that hand out memory: the figure the allocation-
//! free enqueue path is held to).

use crate::board::HEAP_BYTES;
use core::alloc::{GlobalAlloc, Layout};
use core::mem::MaybeUninit;
use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use embedded_alloc::LlffHeap;

/// The heap, with its high-water mark and allocation count.
pub struct Heap {
    inner: LlffHeap,
    peak: AtomicUsize,
    calls: AtomicUsize,
}

impl Heap {
    /// Bytes in use.
    pub fn used(&self) -> usize {
        self.inner.used()
    }

    /// The most bytes in use at once.
    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }

    /// Calls that handed out memory (`alloc`, `alloc_zeroed`, `realloc`) since boot.
    pub fn allocations(&self) -> usize {
        self.calls.load(Ordering::Relaxed)
    }

    /// Gives the heap its memory. Call once, first thing: a later call does nothing (giving the
    /// heap its memory again would hand out memory in use).
    pub fn init(&self) {
        static mut MEMORY: [MaybeUninit<u8>; HEAP_BYTES] = [MaybeUninit::uninit(); HEAP_BYTES];
        static DONE: AtomicBool = AtomicBool::new(false);
        if DONE.swap(true, Ordering::AcqRel) {
            return;
        }
        // SAFETY: runs once (the flag above), before any allocation; nothing else uses MEMORY.
        unsafe { self.inner.init(&raw mut MEMORY as usize, HEAP_BYTES) }
    }

    fn note(&self) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.peak.fetch_max(self.inner.used(), Ordering::Relaxed);
    }
}

// SAFETY: every call is forwarded unchanged to the linked-list heap, which upholds the contract;
// the wrapper only counts.
unsafe impl GlobalAlloc for Heap {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is passed on.
        let p = unsafe { self.inner.alloc(layout) };
        self.note();
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract is passed on.
        unsafe { self.inner.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract is passed on.
        let p = unsafe { self.inner.realloc(ptr, layout, new_size) };
        self.note();
        p
    }
}

#[global_allocator]
pub static HEAP: Heap = Heap {
    inner: LlffHeap::empty(),
    peak: AtomicUsize::new(0),
    calls: AtomicUsize::new(0),
};
