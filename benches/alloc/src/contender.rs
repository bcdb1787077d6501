//! What every contender offers, the replay loop, and the system-allocator anchor.

use crate::trace::Op;
use std::alloc::{Layout, alloc, dealloc};
use std::hint::black_box;
use std::ptr::NonNull;
use std::time::{Duration, Instant};

/// Memory figures a contender reports for one replay.
#[derive(Debug, Clone, Copy, Default)]
pub struct HeldStats {
    /// Peak bytes of pages held from the storage during the replay.
    pub peak_held: Option<u64>,
    /// Bytes still held when the replay ended (everything freed by then).
    pub held_after: Option<u64>,
    /// Pages taken from the storage during the replay.
    pub page_allocs: Option<u64>,
    /// Pages given back to the storage during the replay.
    pub page_frees: Option<u64>,
}

pub trait Contender {
    type Handle;
    fn name(&self) -> &'static str;
    /// Allocate `size` bytes; `None` when the allocator refused.
    fn alloc(&mut self, size: u64) -> Option<Self::Handle>;
    fn free(&mut self, handle: Self::Handle);
    /// The figures since the last call (the peak restarts from what is held now).
    fn take_stats(&mut self) -> HeldStats;
}

/// One replay's result.
#[derive(Debug, Clone, Copy)]
pub struct Replay {
    pub elapsed: Duration,
    pub ops: usize,
    pub failed: usize,
    pub stats: HeldStats,
}

impl Replay {
    pub fn ns_per_op(&self) -> f64 {
        self.elapsed.as_nanos() as f64 / self.ops as f64
    }
}

/// Replay `ops` through `c`, timing the whole list. An allocation that fails leaves a `None` on
/// the live list so the later indices still line up; its free is then a no-op.
#[inline(never)]
pub fn replay<C: Contender>(c: &mut C, ops: &[Op], live_capacity: usize) -> Replay {
    let mut live: Vec<Option<C::Handle>> = Vec::with_capacity(live_capacity);
    let mut failed = 0usize;
    let start = Instant::now();
    for op in ops {
        match *op {
            Op::Alloc(size) => {
                let h = c.alloc(size);
                failed += h.is_none() as usize;
                live.push(h);
            }
            Op::Free(index) => {
                if let Some(h) = live.swap_remove(index as usize) {
                    c.free(h);
                }
            }
        }
    }
    let elapsed = start.elapsed();
    debug_assert!(live.is_empty());
    black_box(&live);
    Replay {
        elapsed,
        ops: ops.len(),
        failed,
        stats: c.take_stats(),
    }
}

/// The system allocator (`std::alloc::alloc`/`dealloc`, glibc malloc here) with 64-byte
/// alignment: the ns/op anchor. It reports no held figures (it holds what is live, from the
/// trace's point of view; its own overhead is not visible from here).
#[derive(Debug, Default)]
pub struct System;

pub struct SysBlock {
    ptr: NonNull<u8>,
    layout: Layout,
}

impl Contender for System {
    type Handle = SysBlock;

    fn name(&self) -> &'static str {
        "system"
    }

    #[inline]
    fn alloc(&mut self, size: u64) -> Option<SysBlock> {
        let layout = Layout::from_size_align(size as usize, 64).ok()?;
        // SAFETY: the layout's size is at least 1 (the trace never asks for 0 bytes).
        let ptr = NonNull::new(unsafe { alloc(layout) })?;
        Some(SysBlock { ptr, layout })
    }

    #[inline]
    fn free(&mut self, block: SysBlock) {
        // SAFETY: `ptr` came from `alloc` with this very layout and is freed once.
        unsafe { dealloc(block.ptr.as_ptr(), block.layout) }
    }

    fn take_stats(&mut self) -> HeldStats {
        HeldStats::default()
    }
}
