//! devcmd: the device command layer of an inference host that runs close to the metal.
//!
//! This crate is the policy core: it is `no_std` + `alloc` and holds every rule about device
//! memory (reservation, sub-allocation, guards, cleanup, the memory budget), and the contract a
//! device shim implements ([`Shim`]). It makes no device call itself: a shim does
//! (`devcmd-std` for a CPU device, `devcmd-cuda` for NVIDIA GPUs and Jetson, the firmware host's
//! own, or yours).
//!
//! **New here? Read the [`guide`]**: a host loop on two streams, what to do when the device fails,
//! a complete small shim, the features, the conformance suite, and which shim calls the core makes
//! today, every example a doctest that runs.
//!
//! Then the reference: [`Shim`] (what a device must do), [`Device`] (streams and cross-stream
//! order), [`Command`] (every operation), [`capture`] (recording a stream into a [`Graph`] and
//! replaying it), [`fault`] (what a failed fence means) and [`memory::MemoryManager`] (what the
//! core does with the pages a device hands out).
#![no_std]
#![deny(missing_docs)]

#[cfg(any(test, feature = "std"))]
extern crate std;

extern crate alloc;

#[cfg(all(feature = "log", feature = "defmt"))]
compile_error!("the `log` and `defmt` features are mutually exclusive: enable one of them");

#[macro_use]
mod fmt;

#[cfg(any(test, feature = "address-shim"))]
pub mod address_shim;
mod attention;
pub mod capture;
pub mod command;
pub mod copy;
pub mod device;
mod device_report;
pub mod drop_queue;
#[cfg(test)]
mod drop_queue_model;
pub mod error;
pub mod failure;
pub mod fault;
pub mod guide;
pub mod host;
mod host_report;
mod id;
mod live;
pub mod memory;
mod order;
mod peer;
pub mod pinned;
pub mod shim;
pub mod staging;
pub mod stream;
mod sync;
#[cfg(test)]
mod test_shim;
#[cfg(feature = "std")]
pub mod workers;

// The README's Rust snippet, compiled and run as a doctest so it stays true. Its whole
// documentation is the include (no `///` line), so a failure is reported at README.md's line.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

/// The plain-data bound of typed host I/O ([`Command::create_typed`], [`HostBuffer::copy_from`],
/// ...), re-exported so a host names it without depending on `bytemuck` itself.
pub use bytemuck::Pod;
pub use capture::{CapturePhase, Graph, Recording};
pub use command::{
    Command, CopyPath, Gemm, GemmType, Launch, LibraryWork, ManagedResource, ModeWindow,
    ReadFuture, ReadRequest, ReadToFuture, SyncFuture,
};
pub use copy::{CopyLayout, CopyPiece, CopyRow};
pub use device::{Device, DeviceConfig, DeviceReport};
pub use drop_queue::{Awaiting, DropPolicy, DropStats};
pub use error::{
    CaptureError, DriverError, Fault, IoError, LaunchError, LibraryError, ServerError, ShimOp,
    Validation,
};
pub use fault::FenceOutcome;
pub use host::{ExternalBytes, HostBuffer, HostOrigin};
pub use host_report::HostReport;
pub use memory::{AllocationMode, Handle};
pub use shim::{
    DeviceAddr, DeviceFacts, DeviceSpan, Dim3, HostCopy, HostMemory, KernelParam, LaunchDims, Shim,
};
pub use stream::StreamId;
