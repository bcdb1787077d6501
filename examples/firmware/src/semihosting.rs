//! Semihosting: the calls the hosts make to the machine running them (QEMU here, a debug probe on
//! a board): the console, the command line and the exit status. Shared by every board; only the
//! trap instruction is the board's ([`crate::board::semihost`]).
//!
//! QEMU sends console writes to the chardev named in `-semihosting-config chardev=` (a file:
//! defmt frames are binary), hands back the `arg=` values as the command line, and exits with the
//! status given to [`exit`].

use crate::board;
use core::sync::atomic::{AtomicUsize, Ordering};

const SYS_OPEN: usize = 0x01;
const SYS_WRITE: usize = 0x05;
const SYS_GET_CMDLINE: usize = 0x15;
const SYS_EXIT: usize = 0x18;
const SYS_EXIT_EXTENDED: usize = 0x20;
/// `ADP_Stopped_ApplicationExit`: the program exits, with a status.
const APPLICATION_EXIT: usize = 0x2_0026;
/// `SYS_OPEN` mode "w".
const MODE_WRITE: usize = 4;

/// The console's handle, opened on first use (0: not yet).
static CONSOLE: AtomicUsize = AtomicUsize::new(0);

fn console() -> usize {
    let handle = CONSOLE.load(Ordering::Relaxed);
    if handle != 0 {
        return handle;
    }
    let name = b":tt\0";
    let block = [name.as_ptr() as usize, MODE_WRITE, name.len() - 1];
    // SAFETY: SYS_OPEN reads a block of (name, mode, length); the name is NUL-terminated.
    let handle = unsafe { board::semihost(SYS_OPEN, block.as_ptr() as usize) };
    CONSOLE.store(handle, Ordering::Relaxed);
    handle
}

/// Writes `bytes` to the console.
pub fn write(bytes: &[u8]) {
    if bytes.is_empty() {
        return;
    }
    let block = [console(), bytes.as_ptr() as usize, bytes.len()];
    // SAFETY: SYS_WRITE reads a block of (handle, address, length) and the bytes it names.
    unsafe { board::semihost(SYS_WRITE, block.as_ptr() as usize) };
}

/// The command line (QEMU: the `-semihosting-config arg=` values, space separated) in `buf`.
pub fn cmdline(buf: &mut [u8]) -> &str {
    let mut block = [buf.as_mut_ptr() as usize, buf.len()];
    // SAFETY: SYS_GET_CMDLINE reads (buffer, length) and writes at most `length` bytes into the
    // buffer, then the length it wrote into the block.
    let failed = unsafe { board::semihost(SYS_GET_CMDLINE, block.as_mut_ptr() as usize) };
    let len = if failed == 0 {
        block[1].min(buf.len())
    } else {
        0
    };
    let line = &buf[..len];
    let line = line.split(|&b| b == 0).next().unwrap_or_default();
    core::str::from_utf8(line).unwrap_or_default()
}

/// Ends the program with `status` (QEMU exits with it).
pub fn exit(status: u32) -> ! {
    let block = [APPLICATION_EXIT, status as usize];
    // A64 takes the block with SYS_EXIT; A32 needs SYS_EXIT_EXTENDED to carry a status.
    let op = if cfg!(target_arch = "aarch64") {
        SYS_EXIT
    } else {
        SYS_EXIT_EXTENDED
    };
    // SAFETY: the exit call reads a block of (reason, status); it does not return under QEMU.
    unsafe { board::semihost(op, block.as_ptr() as usize) };
    loop {
        core::hint::spin_loop();
    }
}
