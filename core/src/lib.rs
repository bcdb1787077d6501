//! devcmd: the device command layer of an inference host that runs close to the metal.
//!
//! This crate is the policy core: it is `no_std` + `alloc` and holds every rule about device
//! memory (reservation, sub-allocation, guards, cleanup, the memory budget), and the contract a
//! device shim implements ([`Shim`]). It makes no device call itself: a shim does
//! (`devcmd-std` for a CPU device, `devcmd-cuda` for NVIDIA GPUs, or one of your own).
//!
//! Start with [`Shim`] (what a device must do) and [`memory::MemoryManager`] (what the core does
//! with the pages a device hands out).
#![no_std]
#![deny(missing_docs)]

#[cfg(any(test, feature = "std"))]
extern crate std;

extern crate alloc;

#[cfg(all(feature = "log", feature = "defmt"))]
compile_error!("the `log` and `defmt` features are mutually exclusive: enable one of them");

#[macro_use]
mod fmt;

pub mod copy;
pub mod drop_queue;
pub mod error;
pub mod host;
pub mod memory;
pub mod shim;
#[cfg(test)]
mod test_shim;

pub use copy::CopyLayout;
pub use error::{DriverError, Fault, IoError, ShimOp};
pub use shim::{DeviceAddr, DeviceFacts, DeviceSpan, Grid, Shim};
