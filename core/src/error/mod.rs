//! The errors of the core and of the device calls it makes.
//!
//! Every variant says what was asked, what was found, and what to do about it; nothing here is a
//! string built at the call site. One file per layer: [`DriverError`] is what a shim returns
//! (`driver.rs`); [`IoError`] is what the memory and copy paths return (`io.rs`); [`ServerError`]
//! is what a command returns, with [`LaunchError`] and [`Validation`] (`server.rs`), and
//! [`CaptureError`] for recordings and replays (`capture.rs`). Every error
//! implements [`core::error::Error`], with `source()` leading down to the device call.

mod capture;
mod driver;
mod io;
mod server;

pub use capture::CaptureError;
pub use driver::{DriverError, Fault, ShimOp};
pub use io::{IoError, NotFoundReason};
pub use server::{LaunchError, LibraryError, ServerError, Validation};
