//! What every fuzz target checks on the bytes it is given: reading them as a trace ends in a trace
//! or a message, never a panic or an abort, within memory in proportion to the input, and a trace
//! that reads is consistent (its live-byte peak is what its operations add up to, with no
//! overflow).
//!
//! Owns the counting allocator the targets run under (the peak of live bytes while a trace is
//! read) and [`check`]. The `commands` target's model is [`commands`].

pub mod commands;

use devcmd_trace::input::{Action, ReadOptions, read_bytes};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Most bytes of memory a read may hold per byte of (uncompressed) input.
pub const PER_INPUT_BYTE: usize = 10;
/// What any read may hold whatever its size: the readers' buffers, gzip's window, the message.
pub const SLACK: usize = 4 << 20;

/// The system allocator, counting live bytes and their peak.
pub struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call forwards to `System` with the caller's layout and pointer; the counters are
// only bookkeeping.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let now = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        PEAK.fetch_max(now, Ordering::Relaxed);
        // SAFETY: the caller's layout, as `GlobalAlloc::alloc` requires.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Reads `bytes` as a trace and checks it (see the crate documentation). `uncompressed` is the
/// size the memory bound is taken against, when known (a gzip stream the target made); `None`
/// for a stream whose inflated size is unknown (libFuzzer's own RSS limit bounds it then).
pub fn check(bytes: &[u8], uncompressed: Option<usize>) {
    let before = LIVE.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let result = read_bytes("fuzz", bytes, ReadOptions::default());
    let peak = PEAK.load(Ordering::Relaxed) - before;
    if let Some(n) = uncompressed {
        assert!(
            peak <= PER_INPUT_BYTE * n + SLACK,
            "reading {n} bytes held {peak} bytes at its peak (more than {PER_INPUT_BYTE} per byte)"
        );
    }
    match result {
        Err(e) => assert!(!e.to_string().is_empty(), "a refusal without a message"),
        Ok(trace) => {
            let (mut live, mut peak_seen) = (0u64, 0u64);
            for op in &trace.ops {
                match op.action {
                    Action::Alloc => {
                        live = live
                            .checked_add(op.size)
                            .expect("a read trace never overflows");
                        peak_seen = peak_seen.max(live);
                    }
                    Action::Free => live -= op.size,
                }
            }
            assert_eq!(
                peak_seen, trace.live_peak,
                "the live peak is what the operations add to"
            );
        }
    }
}
