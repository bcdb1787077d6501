//! The boards: everything that differs between the machines the job runs on, one file each.
//!
//! A board provides the reset path (it calls [`crate::start`] once, with a stack and zeroed
//! statics), the semihosting trap ([`semihost`]), where the stack lies ([`stack_bounds`], [`sp`])
//! and its name. The shim, the job, the heap, the logger and the semihosting calls are shared, so a
//! third board is one more file here (and its linker script in `build.rs`), not a fork.

#[cfg(target_arch = "arm")]
mod lm3s6965evb;
#[cfg(target_arch = "arm")]
pub use lm3s6965evb::*;

#[cfg(target_arch = "aarch64")]
mod virt_aarch64;
#[cfg(target_arch = "aarch64")]
pub use virt_aarch64::*;
