//! The errors of the core and of the device calls it makes.
//!
//! Every variant says what was asked, what was found, and what to do about it; nothing here is a
//! string built at the call site. One file per layer: [`DriverError`] is what a shim returns
//! (`driver.rs`); [`IoError`] is what the memory and copy paths return (`io.rs`); [`ServerError`]
//! is what a command returns, with [`CaptureError`] for recordings and replays (`server.rs`: the
//! two name each other), [`LaunchError`] and [`LibraryError`] (`launch.rs`) and [`Validation`]
//! (`validation.rs`). Every error
//! implements [`core::error::Error`], with `source()` leading down to the device call.

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
