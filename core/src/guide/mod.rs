//! The embedding guide: how to run devcmd in a host, what to do when the device fails, how to
//! write a shim and prove it with the conformance suite.
//!
//! This module holds no code, only this page. Every example on it is a doctest that runs against
//! `devcmd-std` (the CPU shim) or against the small shim shown in [section 3](#3-writing-a-shim),
//! so `cargo test -p devcmd --doc` keeps the page honest. That shim's own source, shown in full,
//! is compiled, linted and run through the conformance suite in `devcmd-tests`.
//!
//! 1. [A host loop](#1-a-host-loop), and [when memory comes back](#when-memory-comes-back)
//! 2. [When the device fails](#2-when-the-device-fails)
//! 3. [Writing a shim](#3-writing-a-shim)
//! 4. [Features and targets](#4-features-and-targets)
//! 5. [The conformance suite](#5-the-conformance-suite)
//! 6. [Which shim calls the core makes today](#6-which-shim-calls-the-core-makes-today)
//! 7. [Bringing your own library](#7-bringing-your-own-library): cuBLAS, TensorRT, a C library
//!
//! The vocabulary: a [`Device`] owns a shim and the streams created on it; a [`Command`] is one
//! borrow of the device for one stream, and every operation goes through one; a [`Handle`] names
//! an allocation (or a view of one) and may be dropped from any thread; a [`HostBuffer`] holds the
//! host side of a copy until the device is done with it.
//!
#![cfg_attr(not(doctest), doc = include_str!("host_loop.md"))]
//!
#![cfg_attr(not(doctest), doc = include_str!("failures.md"))]
//!
#![cfg_attr(not(doctest), doc = include_str!("writing_a_shim.md"))]
//!
// The listing is `core/src/guide/example_shim.rs`, a byte-for-byte copy of
// `tests/src/example_shim.rs` (each packaged crate must hold the files it includes);
// `tests/tests/example_shim_copy.rs` fails when the two differ.
// Four backticks: the included source may hold a fence of its own in its documentation.
#![cfg_attr(
    not(doctest),
    doc = concat!("````rust,ignore\n", include_str!("example_shim.rs"), "````")
)]
//!
#![cfg_attr(not(doctest), doc = include_str!("on_the_example_shim.md"))]
//!
#![cfg_attr(not(doctest), doc = include_str!("features.md"))]
//!
#![cfg_attr(not(doctest), doc = include_str!("conformance.md"))]
//!
#![cfg_attr(not(doctest), doc = include_str!("shim_calls.md"))]
//!
#![cfg_attr(not(doctest), doc = include_str!("library.md"))]
//!
//! [`Device`]: crate::Device
//! [`Device::new`]: crate::Device::new
//! [`Device::memory_report`]: crate::Device::memory_report
//! [`Device::drop_stats`]: crate::Device::drop_stats
//! [`DeviceReport`]: crate::DeviceReport
//! [`DeviceReport::held`]: crate::DeviceReport::held
//! [`DeviceReport::awaiting_fence`]: crate::DeviceReport::awaiting_fence
//! [`DeviceReport::in_pools`]: crate::DeviceReport::in_pools
//! [`DeviceReport::leaked`]: crate::DeviceReport::leaked
//! [`DeviceReport::address_space`]: crate::DeviceReport::address_space
//! [`Command`]: crate::Command
//! [`Command::flush_drops`]: crate::Command::flush_drops
//! [`Command::poll_drops`]: crate::Command::poll_drops
//! [`Command::memory_cleanup`]: crate::Command::memory_cleanup
//! [`Command::launch`]: crate::Command::launch
//! [`Command::create`]: crate::Command::create
//! [`Command::persistent`]: crate::Command::persistent
//! [`Command::write`]: crate::Command::write
//! [`Command::create_typed`]: crate::Command::create_typed
//! [`Command::write_typed`]: crate::Command::write_typed
//! [`Command::read_typed`]: crate::Command::read_typed
//! [`HostBuffer::copy_from`]: crate::HostBuffer::copy_from
//! [`HostBuffer::to_vec_of`]: crate::HostBuffer::to_vec_of
//! [`bytemuck::Pod`]: crate::Pod
//! [`Handle`]: crate::Handle
//! [`HostBuffer`]: crate::HostBuffer
//! [`ReadFuture`]: crate::ReadFuture
//! [`ReadFuture::wait`]: crate::ReadFuture::wait
//! [`SyncFuture::wait`]: crate::SyncFuture::wait
//! [`AllocationMode::Persistent`]: crate::AllocationMode::Persistent
//! [`Shim`]: crate::Shim
//! [`Shim::device_free`]: crate::Shim::device_free
//! [`Shim::event_notify`]: crate::Shim::event_notify
//! [`DropPolicy`]: crate::DropPolicy
//! [`DropStats::items_leaked`]: crate::DropStats::items_leaked
//! [`FenceOutcome::of`]: crate::FenceOutcome::of
//! [`FenceOutcome::Passed`]: crate::FenceOutcome::Passed
//! [`ServerError::DeviceLost`]: crate::ServerError::DeviceLost
//! [`ServerError::StreamFaulted`]: crate::ServerError::StreamFaulted
//! [`ServerError::Device`]: crate::ServerError::Device
//! [`Fault::Unsupported`]: crate::Fault::Unsupported

#[cfg(doctest)]
pub mod doctests;
