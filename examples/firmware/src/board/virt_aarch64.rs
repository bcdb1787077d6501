//! QEMU `virt` with a Cortex-A53 (AArch64, `aarch64-unknown-none`): the CPU architecture of Jetson
//! boards, with no OS and no firmware underneath. QEMU loads the ELF and starts it at EL1.
//!
//! Owns the reset path: `_start` (below) sets the stack, zeroes `.bss` and the stack, maps the
//! first 2 GiB one to one (devices below 1 GiB as Device memory, RAM above as Normal cacheable
//! memory, so unaligned and exclusive accesses behave as the compiler expects), turns the MMU,
//! the caches and the FP/SIMD unit on, and calls [`crate::start`]. Semihosting traps with
//! `hlt #0xF000` (the A64 convention). One core runs; interrupts stay masked (DAIF is set at
//! reset and nothing clears it), which is what makes the critical section below sound.

/// The board, as the log names it.
pub const NAME: &str = "QEMU virt (Cortex-A53, aarch64-unknown-none)";

/// Heap bytes: the Cortex-M3's budget scaled for 64-bit pointers and sizes (the job is the same;
/// RAM is not short here).
pub const HEAP_BYTES: usize = 64 * 1024;

/// The level 1 translation table: 512 entries of 1 GiB each (39-bit addresses, 4 KiB granule).
#[repr(C, align(4096))]
struct PageTable([u64; 512]);

/// Written once by `_start`, before any Rust code runs; never touched by Rust.
static mut PAGE_TABLE: PageTable = PageTable([0; 512]);

core::arch::global_asm!(
    r#"
    .section .text._start, "ax"
    .global _start
_start:
    ldr     x0, =__stack_top
    mov     sp, x0

    // Zero .bss (the page table is in it) and the stack: 16-byte aligned, whole 16-byte steps.
    ldr     x0, =__bss_start
    ldr     x1, =__stack_top
0:  cmp     x0, x1
    b.hs    1f
    stp     xzr, xzr, [x0], #16
    b       0b
1:
    // Identity map: [0, 1 GiB) devices (attribute 0, Device-nGnRnE), [1 GiB, 2 GiB) RAM
    // (attribute 1, Normal write-back, inner shareable). Block descriptor: AF | SH | AttrIndx | 0b01.
    ldr     x0, ={page_table}
    mov     x1, #0x401              // AF | block
    str     x1, [x0]
    ldr     x1, =0x40000705         // 1 GiB | AF | SH inner | AttrIndx 1 | block
    str     x1, [x0, #8]
    dsb     ish

    ldr     x1, =0xff00             // MAIR: attribute 0 Device-nGnRnE, attribute 1 Normal WB
    msr     mair_el1, x1
    // TCR: T0SZ 25 (39-bit), IRGN0/ORGN0 write-back, SH0 inner, TG0 4 KiB, EPD1 (no TTBR1 walks),
    // IPS 40-bit.
    ldr     x1, =0x200803519
    msr     tcr_el1, x1
    msr     ttbr0_el1, x0
    isb
    tlbi    vmalle1
    dsb     ish
    isb

    // FP/SIMD on at EL1 (CPACR_EL1.FPEN = 0b11): the compiler uses the vector registers.
    mov     x1, #(3 << 20)
    msr     cpacr_el1, x1
    isb

    // MMU, data and instruction caches on; alignment checks off.
    mrs     x1, sctlr_el1
    orr     x1, x1, #(1 << 0)
    orr     x1, x1, #(1 << 2)
    orr     x1, x1, #(1 << 12)
    bic     x1, x1, #(1 << 1)
    msr     sctlr_el1, x1
    isb

    bl      {start}
2:  wfe
    b       2b
    "#,
    start = sym rust_start,
    page_table = sym PAGE_TABLE,
);

extern "C" fn rust_start() -> ! {
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
    // SAFETY: the semihosting trap reads x0 (the call) and x1 (its parameter) and writes x0; the
    // caller vouches for the parameter block. QEMU serves it (`-semihosting-config enable=on`).
    unsafe {
        core::arch::asm!("hlt #0xf000", inout("x0") op => ret, in("x1") arg, options(nostack));
    }
    ret
}

unsafe extern "C" {
    /// Lowest address of the stack (the linker script's `.stack`).
    static __stack_bottom: u8;
    /// Highest address of the stack.
    static __stack_top: u8;
}

/// The stack's lowest and highest addresses.
pub fn stack_bounds() -> (usize, usize) {
    (
        (&raw const __stack_bottom) as usize,
        (&raw const __stack_top) as usize,
    )
}

/// The stack pointer now.
#[inline(always)]
pub fn sp() -> usize {
    let sp: usize;
    // SAFETY: reads the stack pointer into a register; no memory is touched.
    unsafe { core::arch::asm!("mov {}, sp", out(reg) sp, options(nomem, nostack)) };
    sp
}

/// The critical section the heap takes: interrupts are never unmasked on this board and one core
/// runs, so nothing can preempt a section and there is nothing to mask.
struct SingleCoreMasked;

critical_section::set_impl!(SingleCoreMasked);

// SAFETY: one core runs and no interrupt or exception handler is ever enabled (DAIF stays set
// from reset), so code inside a section cannot be preempted by other code that enters one.
unsafe impl critical_section::Impl for SingleCoreMasked {
    unsafe fn acquire() -> critical_section::RawRestoreState {}

    unsafe fn release(_state: critical_section::RawRestoreState) {}
}
