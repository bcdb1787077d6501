//! The stack's high-water mark: the free stack is painted at boot, and the deepest byte the
//! program overwrote is found at the end. Interrupts are not enabled, so nothing else uses it.
//! Where the stack lies is the board's ([`crate::board::stack_bounds`]).

use crate::board;

/// The paint.
const PAINT: u32 = 0xCCCC_CCCC;
/// Bytes below the stack pointer left unpainted: the frames of `paint` itself.
const MARGIN: usize = 512;

/// Bytes of stack available in all.
pub fn size() -> usize {
    let (lo, hi) = board::stack_bounds();
    hi - lo
}

/// Paints the stack below the current frame. Call it once, first thing.
#[inline(never)]
pub fn paint() {
    let (lo, _) = board::stack_bounds();
    let sp = board::sp();
    let mut p = lo.next_multiple_of(4);
    while p + MARGIN < sp {
        // SAFETY: `p` lies between the bottom of the stack and `MARGIN` bytes below the current
        // stack pointer: stack memory no live frame uses (no interrupt is enabled), aligned to 4.
        unsafe { (p as *mut u32).write_volatile(PAINT) };
        p += 4;
    }
}

/// The most stack used since [`paint`], in bytes.
pub fn high_water() -> usize {
    let (lo, hi) = board::stack_bounds();
    let mut p = lo.next_multiple_of(4);
    // SAFETY: as in `paint`: aligned stack memory between the bottom and the stack pointer
    // (reads only; the bytes above the first unpainted word are not read).
    while p < hi && unsafe { (p as *const u32).read_volatile() } == PAINT {
        p += 4;
    }
    hi - p
}
