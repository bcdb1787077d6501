//! TI LM3S6965 (Cortex-M3, 256 KiB flash, 64 KiB SRAM) as QEMU's `lm3s6965evb`.
//!
//! cortex-m-rt owns the reset path (vector table, `.data`/`.bss` initialisation, `link.x` with
//! `memory.x`); cortex-m the single-core critical section the heap takes. Semihosting traps with
//! `bkpt 0xAB` (the M-profile convention). Interrupts are never enabled.

/// The board, as the log names it.
pub const NAME: &str = "lm3s6965evb (Cortex-M3, thumbv7m-none-eabi)";

/// Heap bytes. SRAM is 64 KiB: 16 KiB of device memory, the 1 KiB pinned window, this, and the
/// stack (about 9 KiB, of which the job uses about 7).
pub const HEAP_BYTES: usize = 37 * 1024;

#[cortex_m_rt::entry]
fn reset() -> ! {
    crate::start()
}

/// Makes semihosting call `op` with the parameter `arg` (a pointer to its parameter block, or a
/// value) and returns the host's answer.
///
/// # Safety
///
/// `arg` is what call `op` expects: a parameter block valid for the call's reads and writes.
pub unsafe fn semihost(op: usize, arg: usize) -> usize {
    let ret;
    // SAFETY: the semihosting trap reads r0 (the call) and r1 (its parameter) and writes r0; the
    // caller vouches for the parameter block. QEMU serves it (`-semihosting-config enable=on`).
    unsafe {
        core::arch::asm!("bkpt #0xab", inout("r0") op => ret, in("r1") arg, options(nostack));
    }
    ret
}

unsafe extern "C" {
    /// Lowest address of the stack (cortex-m-rt: the end of `.bss`/`.uninit`).
    static _stack_end: u32;
    /// Highest address of the stack (the end of RAM).
    static _stack_start: u32;
}

/// The stack's lowest and highest addresses.
pub fn stack_bounds() -> (usize, usize) {
    (
        (&raw const _stack_end) as usize,
        (&raw const _stack_start) as usize,
    )
}

/// The stack pointer now.
#[inline(always)]
pub fn sp() -> usize {
    cortex_m::register::msp::read() as usize
}
