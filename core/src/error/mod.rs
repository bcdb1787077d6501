//! The errors of the core and of the device calls it makes.
//!
//! A command returns [`ServerError`]. Its variants wrap the errors of each layer: [`Validation`]
//! (a call made wrongly), [`IoError`] (memory and copies), [`LaunchError`] and [`LibraryError`]
//! (kernels and library work), [`CaptureError`] (recordings and replays), and [`DriverError`]
//! (what the device answered, classified as a [`Fault`], naming the [`ShimOp`] that failed).
//!
//! Every message says what was asked, what was found and what to do, and is printed once: an
//! error either shows its cause's text in its own or hands the cause on as its
//! [`source`](core::error::Error::source), never both. Print the whole chain:
//!
//! ```
//! use devcmd::{DriverError, Fault, ServerError, ShimOp};
//!
//! let e = ServerError::from(DriverError::new(ShimOp::EventWait, 700, Fault::DeviceLost));
//! let mut text = e.to_string();
//! let mut cause = core::error::Error::source(&e);
//! while let Some(c) = cause {
//!     text.push_str("\n  caused by: ");
//!     text.push_str(&c.to_string());
//!     cause = c.source();
//! }
//! assert!(text.starts_with("every operation on this device fails from now on"));
//! assert!(text.contains("caused by: event wait failed with status 700"));
//! ```
//!
//! Branch on the variants, not on the text: [`ServerError::is_device_lost`] and
//! [`IoError::may_succeed_after_reclaim`] answer the usual questions.

// For contributors: one file per layer: `driver.rs` ([`DriverError`], what a shim returns),
// `io.rs`, `server.rs` (`ServerError` and `CaptureError`, which name each other), `launch.rs`,
// `validation.rs`; `chain_tests.rs` walks every chain. No message is built at the call site.

mod driver;
mod io;
mod launch;
mod server;
mod validation;

#[cfg(test)]
mod chain_tests;

pub use driver::{DriverError, Fault, ShimOp};
pub use io::{IoError, NotFoundReason};
pub use launch::{LaunchError, LibraryError};
pub use server::{CaptureError, ServerError};
pub use validation::Validation;
