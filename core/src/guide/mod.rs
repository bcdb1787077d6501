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
#![doc = include_str!("host_loop.md")]
//!
#![doc = include_str!("failures.md")]
//!
//! # 3. Writing a shim
//!
//! A shim implements [`Shim`]: the device's own objects as associated types (`Stream`, `Event`,
//! `DevicePage`, `HostPage`, `Kernel`, `Registration`, `Graph`, `NativeStream`) and these calls,
//! each a thin wrapper over one driver call:
//!
//! | group | methods |
//! |---|---|
//! | facts and errors | [`facts`](crate::Shim::facts), [`classify`](crate::Shim::classify) |
//! | streams and events | [`create_stream`](crate::Shim::create_stream), [`native_stream`](crate::Shim::native_stream), [`borrow_stream`](crate::Shim::borrow_stream), [`stream_wait_event`](crate::Shim::stream_wait_event), [`record_event`](crate::Shim::record_event), [`event_query`](crate::Shim::event_query) (never blocks), [`event_wait`](crate::Shim::event_wait) |
//! | device pages | [`device_alloc`](crate::Shim::device_alloc), [`device_page_addr`](crate::Shim::device_page_addr), [`device_free`](crate::Shim::device_free) |
//! | virtual memory | [`vm_reserve`](crate::Shim::vm_reserve), [`vm_map`](crate::Shim::vm_map), [`vm_unmap`](crate::Shim::vm_unmap), [`vm_release`](crate::Shim::vm_release) |
//! | pinned host pages | [`host_alloc_pinned`](crate::Shim::host_alloc_pinned), [`host_page_ptr`](crate::Shim::host_page_ptr), [`host_page_device_addr`](crate::Shim::host_page_device_addr), [`host_free_pinned`](crate::Shim::host_free_pinned) |
//! | registered host memory | [`host_register`](crate::Shim::host_register), [`host_unregister`](crate::Shim::host_unregister) |
//! | copies (asynchronous) | [`copy_to_device`](crate::Shim::copy_to_device), [`copy_to_host`](crate::Shim::copy_to_host), [`copy_on_device`](crate::Shim::copy_on_device) |
//! | launch | [`launch`](crate::Shim::launch) |
//! | graphs | [`begin_capture`](crate::Shim::begin_capture), [`end_capture`](crate::Shim::end_capture), [`end_capture_update`](crate::Shim::end_capture_update), [`graph_upload`](crate::Shim::graph_upload), [`graph_launch`](crate::Shim::graph_launch) |
//!
//! [`facts`](crate::Shim::facts) returns a [`DeviceFacts`](crate::DeviceFacts) built with
//! [`DeviceFacts::new`](crate::DeviceFacts::new) and its `with_*` methods (the struct is
//! `#[non_exhaustive]`: a fact added later comes with a default and breaks no shim). Every call
//! a device may lack has a default, listed in the [`shim`](crate::shim) module's "What a shim
//! may leave out"; a shim without pinned memory or graphs names an uninhabited `HostPage` or
//! `Graph`.
//!
//! The [`shim`](crate::shim) module states what each side promises: the core drives the shim from
//! one thread at a time, frees nothing before a fence after its last use completed, and passes
//! only addresses inside pages it got from this shim; the shim runs each stream in order,
//! completes an event only after everything before it, and reports a fault of work that ran at
//! completed fences only, stickily, and through
//! [`stream_wait_event`](crate::Shim::stream_wait_event) too.
//!
//! **The rule of thumb: a shim is thin.** One device call per method; every error built by
//! [`classify`](crate::Shim::classify) from the device's status, so the classification (lost
//! device, out of memory, too big, work that failed, anything else) is written once; and no
//! policy: no pooling, no caching of pages, no ordering between streams, no staging, no retry.
//! The core owns all of that and is tested for it; a shim that adds its own hides it from the
//! core. A call the device cannot make answers [`Fault::Unsupported`] (from `classify`, or with
//! the [`shim::unsupported`](crate::shim::unsupported) helper);
//! [section 6](#6-which-shim-calls-the-core-makes-today) says which calls the core makes today.
//!
//! The smallest complete shim is `devcmd_tests::example_shim`: a *synchronous* device over host
//! memory, with no pinned memory and no graphs. Its source file (`tests/src/example_shim.rs`)
//! follows in full, head comment first, which says what it does and leaves out, and ends with
//! the harness that runs the conformance suite on it ([section 5](#5-the-conformance-suite)). The
//! block is marked `ignore` only because this very file is a module of `devcmd-tests`, where rustc
//! and clippy check it and `tests/tests/conformance_example_shim.rs` runs the whole suite on it.
//!
// The listing is `core/src/guide/example_shim.rs`, a byte-for-byte copy of
// `tests/src/example_shim.rs` (each packaged crate must hold the files it includes);
// `tests/tests/example_shim_copy.rs` fails when the two differ.
// Four backticks: the included source may hold a fence of its own in its documentation.
#![doc = concat!("````rust,ignore\n", include_str!("example_shim.rs"), "````")]
//!
//! The core on top of it: every policy comes for free. Two streams, one reading what the other
//! wrote, ordered by the core:
//!
//! ```
//! use devcmd::{
//!     Device, DeviceConfig, KernelParam, Launch, LaunchDims, ReadRequest, ServerError, StreamId,
//! };
//! use devcmd_tests::example_shim::{self, HostKernel, HostShim};
//!
//! # fn main() -> Result<(), ServerError> {
//! let mut device = Device::new(HostShim::default(), DeviceConfig::default());
//! let a = device.command(StreamId(0))?.create(&[1, 2, 3])?;
//! let mut cmd = device.command(StreamId(1))?; // another stream reads `a`: ordered by the core
//! let b = cmd.empty(3)?;
//! let add: HostKernel = example_shim::add; // out[i] = in[i] + value, `value` last
//! cmd.launch(Launch {
//!     kernel: &add,
//!     name: "add",
//!     dims: LaunchDims::SINGLE,
//!     inputs: &[&a],
//!     outputs: &[&b],
//!     params: &[KernelParam::Scalar(&1u32.to_ne_bytes())],
//! })?;
//! assert_eq!(
//!     cmd.read_async(&[ReadRequest::whole(&b)])?.wait()?[0].as_slice(),
//!     [2, 3, 4]
//! );
//! drop((a, b));
//! cmd.memory_cleanup()?;
//! device.command(StreamId(0))?.memory_cleanup()?;
//! assert_eq!(
//!     device.shim().live_bytes(),
//!     0,
//!     "every page went back to the shim"
//! );
//! # Ok(())
//! # }
//! ```
//!
#![doc = include_str!("features.md")]
//!
#![doc = include_str!("conformance.md")]
//!
#![doc = include_str!("shim_calls.md")]
//!
#![doc = include_str!("library.md")]
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
