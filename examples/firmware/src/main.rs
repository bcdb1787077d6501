//! The bare-metal hosts: the same `Device`/`Command` job as the std host, without an OS, over the
//! DMA-engine shim of [`shim`], on two boards from one crate: a Cortex-M3 (QEMU lm3s6965evb,
//! `thumbv7m-none-eabi`) and an AArch64 Cortex-A53 (QEMU virt, `aarch64-unknown-none`).
//!
//! What is shared and what is the board's: [`board`] has the reset path, the semihosting trap and
//! the stack's place and the heap's size; everything else (the shim, the job, the heap, the logger, the semihosting
//! calls) is one source for every board. The job ([`job`]) exits 0 once verified, 1 on a failed
//! check, an error or a panic (`panic` makes one), and 2 when run with `fault` and a failing DMA
//! descriptor stopped it as the failure rules say. It logs through defmt by default (`--no-default-features --features
//! log` for text): `run.sh` decodes the log with `defmt-print` and compares it with `expected/`.
#![no_std]
#![no_main]

extern crate alloc;

#[macro_use]
mod out;
mod board;
mod heap;
mod job;
mod semihosting;
mod shim;
mod stack;

/// Where every board's reset path lands: with a stack and zeroed statics, once.
fn start() -> ! {
    stack::paint();
    heap::HEAP.init();
    out::init();
    let mut line = [0u8; 96];
    let mode = job::Mode::of(semihosting::cmdline(&mut line));
    semihosting::exit(job::run(mode))
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
    #[cfg(feature = "defmt")]
    defmt::println!("devcmd-firmware: PANIC: {}", defmt::Display2Format(info));
    #[cfg(feature = "log")]
    say!("devcmd-firmware: PANIC: {}", info);
    semihosting::exit(job::EXIT_FAILED)
}
