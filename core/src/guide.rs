//! The embedding guide: how to run devcmd in a host, what to do when the device fails, how to
//! write a shim and prove it with the conformance suite.
//!
//! This module holds no code, only this page. Every example on it is a doctest that runs against
//! `devcmd-std` (the CPU shim) or against the small shim written in [section 3](#3-writing-a-shim),
//! so `cargo test -p devcmd --doc` keeps the page honest.
//!
//! 1. [A host loop](#1-a-host-loop), and [when memory comes back](#when-memory-comes-back)
//! 2. [When the device fails](#2-when-the-device-fails)
//! 3. [Writing a shim](#3-writing-a-shim)
//! 4. [Features and targets](#4-features-and-targets)
//! 5. [The conformance suite](#5-the-conformance-suite)
//! 6. [Which shim calls the core makes today](#6-which-shim-calls-the-core-makes-today)
//!
//! The vocabulary: a [`Device`] owns a shim and the streams created on it; a [`Command`] is one
//! borrow of the device for one stream, and every operation goes through one; a [`Handle`] names
//! an allocation (or a view of one) and may be dropped from any thread; a [`HostBuffer`] holds the
//! host side of a copy until the device is done with it.
//!
//! # 1. A host loop
//!
//! An inference host usually runs two streams: a *copy* stream that uploads the next inputs while a
//! *compute* stream runs the model on the previous ones. The weights are uploaded once, in the
//! [`AllocationMode::Persistent`] window, so they sit in pages of their exact size and never share
//! a page with the per-batch churn. The host does not order the two streams itself: when the
//! compute stream launches a kernel over a handle the copy stream owns, the core makes the compute
//! stream wait for the copy stream *on the device* (no host synchronisation), and keeps the
//! memory alive until the compute stream's work on it passed a fence.
//!
//! The kernel below is registered on the CPU shim; on a GPU shim it would be a loaded module
//! function, and its arguments whatever the shim's [`Shim::Args`] is (raw scalar bytes here).
//!
//! ```
//! use devcmd::memory::AllocationMode;
//! use devcmd::{Device, DeviceConfig, Grid, Launch, ReadRequest, StreamId};
//! use devcmd_std::{KernelFault, StdShim, as_f32, as_f32_mut};
//!
//! const COMPUTE: StreamId = StreamId(0);
//! const COPY: StreamId = StreamId(1);
//! const N: usize = 1024;
//!
//! fn floats(v: &[f32]) -> Vec<u8> {
//!     v.iter().flat_map(|x| x.to_le_bytes()).collect()
//! }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let shim = StdShim::new();
//! // out[i] = w[i] * x[i] + bias, with `bias` passed as the argument bytes.
//! let scale = shim.register_kernel("scale_add", |ctx| {
//!     let bias = ctx.arg_f32(0)?;
//!     let mut bufs = ctx.buffers_mut()?;
//!     let [w, x, out] = bufs.as_mut_slice() else {
//!         return Err(KernelFault::Failed);
//!     };
//!     let (w, x, out) = (as_f32(w)?, as_f32(x)?, as_f32_mut(out)?);
//!     for ((o, w), x) in out.iter_mut().zip(w).zip(x) {
//!         *o = w * x + bias;
//!     }
//!     Ok(())
//! });
//! let mut device = Device::new(shim, DeviceConfig::default());
//!
//! // The weights: once, in the persistent window, on the compute stream.
//! let w_host: Vec<f32> = (0..N).map(|i| i as f32 / N as f32).collect();
//! let weights = {
//!     let mut cmd = device.command(COMPUTE)?;
//!     cmd.allocation_mode(AllocationMode::Persistent);
//!     let w = cmd.create(&floats(&w_host))?; // staged, uploaded; the bytes are ours again
//!     cmd.allocation_mode(AllocationMode::Auto); // closes the window
//!     w
//! };
//!
//! let bias = 0.5f32;
//! let mut in_flight = Vec::new();
//! for batch in 0..4 {
//!     let x_host: Vec<f32> = (0..N).map(|i| (i + batch) as f32).collect();
//!     // Upload on the copy stream, through a pinned staging buffer we fill in place.
//!     let x = {
//!         let mut cmd = device.command(COPY)?;
//!         let x = cmd.empty((N * 4) as u64)?;
//!         let mut staged = cmd.reserve_host(N * 4, true)?;
//!         staged.as_mut_slice().copy_from_slice(&floats(&x_host));
//!         cmd.write(&x, staged)?; // the drop queue keeps `staged` until a fence passes
//!         x
//!     };
//!     // Compute: ordered after the upload on the device, because `x` belongs to COPY.
//!     let mut cmd = device.command(COMPUTE)?;
//!     let out = cmd.empty((N * 4) as u64)?;
//!     cmd.launch(Launch {
//!         kernel: &scale,
//!         name: "scale_add", // named by a stream fault this launch may cause
//!         grid: Grid::linear(N as u32 / 256),
//!         inputs: &[&weights, &x],
//!         outputs: &[&out],
//!         args: &bias.to_ne_bytes(),
//!     })?;
//!     // Enqueue the read and move on; `x` and `out` may be dropped now (see below).
//!     let read = cmd.read_async(&[ReadRequest::whole(&out)])?;
//!     in_flight.push((x_host, read));
//!     // Between batches: release what passed fences already cover, without blocking.
//!     device.command(COPY)?.poll_drops()?;
//! }
//!
//! for (x_host, read) in in_flight {
//!     let bytes = read.wait()?; // blocks until the fence after the copies passed
//!     let got = bytes[0].as_slice();
//!     for (i, chunk) in got.chunks_exact(4).enumerate() {
//!         let y = f32::from_le_bytes(chunk.try_into()?);
//!         assert_eq!(y, w_host[i] * x_host[i] + bias, "element {i}");
//!     }
//! }
//!
//! // Two flushes release everything queued before the first: staging buffers, and the
//! // bindings by which COMPUTE kept COPY's inputs alive.
//! for _ in 0..2 {
//!     device.command(COMPUTE)?.flush_drops()?;
//!     device.command(COPY)?.flush_drops()?;
//! }
//! for (stream, stats) in device.drop_stats() {
//!     println!(
//!         "stream {}: {} items released",
//!         stream.0, stats.items_released
//!     );
//! }
//! // Give everything back: drop the weights, drain the queues, return the empty pages.
//! drop(weights);
//! device.command(COMPUTE)?.memory_cleanup()?;
//! device.command(COPY)?.memory_cleanup()?;
//! let report = device.memory_report();
//! println!("{report}");
//! assert_eq!(report.held, 0, "every device page went back");
//! # Ok(())
//! # }
//! ```
//!
//! [`ReadFuture`] is also a [`Future`]: a host with an executor awaits it, and a firmware main
//! loop polls it between other work (a poll never blocks; devices raise no wake-ups, so it asks
//! to be polled again):
//!
//! ```
//! use core::future::Future;
//! use core::pin::Pin;
//! use core::task::{Context, Poll, Waker};
//! # use devcmd::{Device, DeviceConfig, ReadRequest, StreamId};
//! # use devcmd_std::StdShim;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut device = Device::new(StdShim::new(), DeviceConfig::default());
//! let mut cmd = device.command(StreamId(0))?;
//! let h = cmd.create(b"sixteen bytes!!!")?;
//! let mut read = cmd.read_async(&[ReadRequest::whole(&h)])?;
//! let mut cx = Context::from_waker(Waker::noop());
//! let bytes = loop {
//!     match Pin::new(&mut read).poll(&mut cx) {
//!         Poll::Ready(result) => break result?,
//!         Poll::Pending => { /* run the rest of the main loop */ }
//!     }
//! };
//! assert_eq!(bytes[0].as_slice(), b"sixteen bytes!!!");
//! # Ok(())
//! # }
//! ```
//!
//! ## When memory comes back
//!
//! Dropping a [`Handle`] frees nothing on the spot: work enqueued before the drop may still read or
//! write the memory. The way back is one straight line:
//!
//! 1. **Handle dropped.** When the last handle, view and [`Binding`](crate::memory::Binding) of an
//!    allocation is gone (from any thread), the allocation goes on the *return queue* of the
//!    stream that owns it. In-flight work holds bindings: a [`ReadFuture`] holds the memory it
//!    reads until its fence passed, and a stream that used another stream's memory holds a binding
//!    in its own drop queue, so a dropped input of the copy stream comes back only once the
//!    compute stream is done with it.
//! 2. **Manager.** At the start of the device's next operation (reservations, copies, launches,
//!    reads, syncs and cleanups run the bookkeeping first) the owner's
//!    [`MemoryManager`](crate::memory::MemoryManager) takes the return queue: the slice is free
//!    in its pool and **the owning stream may reuse it at once**, since its own later work runs
//!    after its earlier work.
//! 3. **Retired page.** A page that emptied stays in its pool for reuse until a cleanup lets it go:
//!    the periodic one (on every reservation: freed dedicated pages, empty pages of outdated arena
//!    classes) or an explicit one ([`Command::memory_cleanup`], or the reclaim a failed
//!    reservation runs once before it retries: every empty page, and freed persistent pages). A
//!    page let go is *retired*, not freed; it still counts against the device's budget.
//! 4. **Drop queue.** Retired pages join the stream's [drop queue](crate::drop_queue), next to
//!    the host buffers of uploads and the bindings of other streams' memory.
//! 5. **Freed after a fence.** A flush records one fence for what was queued since the previous
//!    flush, and releases (here the page is finally [`Shim::device_free`]d) what the previous
//!    fence covered, waiting for it if needed. So an item goes at the second flush after it was
//!    queued, and the hot path mostly waits on fences that have long passed.
//!
//! Flushes happen by themselves when the queue passes its [`DropPolicy`] (64 items or 64 MiB by
//! default), after a file-backed upload or one larger than the staging policy's threshold, and in
//! the reclaim before a reservation is retried. A host steers them with:
//!
//! | call | blocks | what it releases |
//! |---|---|---|
//! | [`Command::flush_drops`] | on the fence of the previous flush (usually passed) | what that fence covered; records a fence for what is queued now |
//! | [`Command::poll_drops`] | never | what the pending fence covered, if it passed; `Ok(true)` once nothing is pending |
//! | [`Command::memory_cleanup`] | until the stream's queue is drained | everything queued, then every empty page of the stream and its idle pinned pages |
//!
//! The [`Device::memory_report`] ([`DeviceReport`]) shows, per stream, each pool (small, arena
//! classes, persistent, dedicated, and the pinned host pool) with its pages, peak, live
//! allocations, bytes in use, padding and bytes reserved; [`DeviceReport::held`] counts the device
//! pages held in all (in pools, retired, waiting in a drop queue, or leaked after an unknown fence
//! outcome) against the budget. [`Device::drop_stats`] counts flushes, fences waited and polled,
//! and items released or leaked per stream.
//!
//! # 2. When the device fails
//!
//! Device calls that fail while they are *made* (a refused copy, a launch the shim rejects) fail
//! that operation, and the bytes it would have written are marked so a later read reports why
//! (the [`failure`](crate::failure) rule: failures follow the data). Faults of work that was
//! enqueued fine but failed while it *ran* reach the core only at a fence, and one function
//! decides what each fence answer means ([`FenceOutcome::of`]); the [`fault`](crate::fault) module
//! keeps the ledger. What a host sees:
//!
//! | what happened | error | memory the fence covered | afterwards | what to do |
//! |---|---|---|---|---|
//! | the device is lost (CUDA's sticky errors) | [`ServerError::DeviceLost`] | released: nothing runs again | every operation on every stream fails fast with the same error | drop the [`Device`] and build a new one |
//! | work on a stream failed while it ran | [`ServerError::StreamFaulted`] with the stream and the last kernel launched before the fence | released: the fence completed | that stream, and every stream ordered after it, fails fast; other streams keep working | write the inputs again on another stream, or recreate the device to use that stream again |
//! | the wait or query failed without saying whether the work ran (an *unknown* outcome) | [`ServerError::Device`] | **leaked on purpose**: the device may still use it | nothing is tainted; the next operation may succeed | retry; each such fence leaks what it covered (the report's [`held`](crate::DeviceReport::held), [`DropStats::items_leaked`] for drop-queue batches), so if it repeats, recreate the device |
//!
//! A fence that passed cleanly is the fourth outcome ([`FenceOutcome::Passed`]). Faults the core
//! meets in its own bookkeeping (a flush after an upload, reclaim on another stream) are kept for
//! the stream's next operation, read or sync, never pinned on an unrelated call.
//!
//! All three, on the CPU shim: a kernel that fails while it runs, one that loses the device, and
//! an event wait made to fail by the shim's fault injection.
//!
//! ```
//! use devcmd::{
//!     Device, DeviceConfig, Grid, Launch, ReadRequest, ServerError, ShimOp, StreamId, SyncFuture,
//! };
//! use devcmd_std::{Injection, KernelFault, StdShim};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let shim = StdShim::new();
//! let broken = shim.register_kernel("broken", |_| Err(KernelFault::Failed));
//! let fatal = shim.register_kernel("fatal", |_| Err(KernelFault::DeviceLost));
//! let probe = shim.clone(); // clones share the device: for fault injection below
//! let mut device = Device::new(shim, DeviceConfig::default());
//!
//! // A stream fault: stream 1's kernel fails while it runs; the next fence reports it.
//! let mut cmd = device.command(StreamId(1))?;
//! let out = cmd.empty(64)?;
//! cmd.launch(Launch {
//!     kernel: &broken,
//!     name: "broken",
//!     grid: Grid::linear(1),
//!     inputs: &[],
//!     outputs: &[&out],
//!     args: &[],
//! })?;
//! match cmd.sync().and_then(SyncFuture::wait) {
//!     Err(ServerError::StreamFaulted {
//!         stream: 1,
//!         kernel: Some("broken"),
//!         ..
//!     }) => {}
//!     other => panic!("expected a stream fault, got {other:?}"),
//! }
//! // Stream 1 fails fast from now on; stream 0 keeps working.
//! assert!(matches!(
//!     cmd.empty(64),
//!     Err(ServerError::StreamFaulted { .. })
//! ));
//! let mut cmd = device.command(StreamId(0))?;
//! let h = cmd.create(&[1, 2, 3, 4])?;
//! assert_eq!(
//!     cmd.read_async(&[ReadRequest::whole(&h)])?.wait()?[0].as_slice(),
//!     [1, 2, 3, 4]
//! );
//!
//! // An unknown outcome: the shim fails the next event wait without saying why. The read's
//! // buffers are leaked (the device might still write them), the stream stays usable.
//! let read = cmd.read_async(&[ReadRequest::whole(&h)])?;
//! let waits = probe.stats().calls(ShimOp::EventWait);
//! probe.inject(Injection::nth(ShimOp::EventWait, waits + 1));
//! assert!(matches!(read.wait(), Err(ServerError::Device(_))));
//! probe.clear_injections();
//! assert_eq!(
//!     cmd.read_async(&[ReadRequest::whole(&h)])?.wait()?[0].as_slice(),
//!     [1, 2, 3, 4]
//! );
//!
//! // A lost device: nothing runs again, every operation of every stream fails fast.
//! let out = cmd.empty(64)?;
//! cmd.launch(Launch {
//!     kernel: &fatal,
//!     name: "fatal",
//!     grid: Grid::linear(1),
//!     inputs: &[],
//!     outputs: &[&out],
//!     args: &[],
//! })?;
//! // (The fence may fail to be recorded if the kernel already ran: same answer.)
//! let lost = cmd.sync().and_then(SyncFuture::wait);
//! assert!(matches!(lost, Err(ServerError::DeviceLost { .. })));
//! assert!(matches!(
//!     device.command(StreamId(2)),
//!     Err(ServerError::DeviceLost { .. })
//! ));
//! # Ok(())
//! # }
//! ```
//!
//! Whichever way the device failed, dropping the [`Device`] is safe: teardown syncs every stream
//! and frees the memory only when each fence completed (or the device is lost), and leaks it
//! otherwise.
//!
//! # 3. Writing a shim
//!
//! A shim implements [`Shim`]: the device's own objects as associated types (`Stream`, `Event`,
//! `DevicePage`, `HostPage`, `Kernel`, `Args`, `Graph`) and these calls, each a thin wrapper over
//! one driver call:
//!
//! | group | methods |
//! |---|---|
//! | facts and errors | [`facts`](crate::Shim::facts), [`classify`](crate::Shim::classify) |
//! | streams and events | [`create_stream`](crate::Shim::create_stream), [`stream_wait_event`](crate::Shim::stream_wait_event), [`record_event`](crate::Shim::record_event), [`event_query`](crate::Shim::event_query) (never blocks), [`event_wait`](crate::Shim::event_wait) |
//! | device pages | [`device_alloc`](crate::Shim::device_alloc), [`device_page_addr`](crate::Shim::device_page_addr), [`device_free`](crate::Shim::device_free) |
//! | pinned host pages | [`host_alloc_pinned`](crate::Shim::host_alloc_pinned), [`host_page_ptr`](crate::Shim::host_page_ptr), [`host_page_device_addr`](crate::Shim::host_page_device_addr), [`host_free_pinned`](crate::Shim::host_free_pinned) |
//! | copies (asynchronous) | [`copy_to_device`](crate::Shim::copy_to_device), [`copy_to_host`](crate::Shim::copy_to_host), [`copy_on_device`](crate::Shim::copy_on_device) |
//! | launch | [`launch`](crate::Shim::launch) |
//! | graphs | [`begin_capture`](crate::Shim::begin_capture), [`end_capture`](crate::Shim::end_capture), [`graph_upload`](crate::Shim::graph_upload), [`graph_launch`](crate::Shim::graph_launch) |
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
//! Below is a complete, if slow, shim: a *synchronous* device over host memory. Every call runs
//! to completion before it returns, so every event is complete as soon as it is recorded. It has
//! no pinned memory (the core falls back to the heap) and no graphs; its uninhabited
//! [`Infallible`](core::convert::Infallible) types make the compiler check that nothing can ask
//! for them after a refusal. A kernel is a Rust function over copies of its buffers; one that fails
//! marks its stream, and the fault travels with the stream's later events, as the contract asks.
//!
//! ```
//! use core::cell::Cell;
//! use core::convert::Infallible;
//! use core::ptr::NonNull;
//! use devcmd::{
//!     CopyLayout, DeviceAddr, DeviceFacts, DeviceSpan, DriverError, Fault, Grid, Shim, ShimOp,
//! };
//! use std::alloc::{Layout, alloc_zeroed, dealloc};
//!
//! /// The device's status codes, classified in one place.
//! mod status {
//!     pub const OUT_OF_MEMORY: i32 = 1;
//!     pub const TOO_BIG: i32 = 2;
//!     pub const UNSUPPORTED: i32 = 3;
//!     pub const KERNEL_FAILED: i32 = 4;
//! }
//!
//! const TOTAL: u64 = 256 << 20;
//! const ALIGN: u64 = 256;
//!
//! /// A kernel: a function over copies of its buffers (inputs, then outputs) and the arguments.
//! pub type HostKernel = fn(&mut [Vec<u8>], &[u8]) -> Result<(), ()>;
//!
//! #[derive(Debug, Default)]
//! pub struct HostShim {
//!     live: Cell<u64>,
//! }
//!
//! /// A stream remembers the first fault of its work (sticky).
//! #[derive(Debug, Default)]
//! pub struct HostStream {
//!     failed: Cell<Option<DriverError>>,
//! }
//!
//! /// An event is complete when recorded; it carries the fault its stream had by then.
//! #[derive(Debug)]
//! pub struct HostEvent {
//!     failed: Option<DriverError>,
//! }
//!
//! #[derive(Debug)]
//! pub struct Block {
//!     ptr: NonNull<u8>,
//!     layout: Layout,
//!     size: u64,
//! }
//!
//! fn host(addr: DeviceAddr) -> *mut u8 {
//!     std::ptr::with_exposed_provenance_mut(addr.0 as usize)
//! }
//!
//! impl Shim for HostShim {
//!     type Stream = HostStream;
//!     type Event = HostEvent;
//!     type DevicePage = Block;
//!     type HostPage = Infallible;
//!     type Kernel = HostKernel;
//!     type Args = [u8];
//!     type Graph = Infallible;
//!
//!     fn facts(&self) -> DeviceFacts {
//!         DeviceFacts {
//!             total_memory: TOTAL,
//!             memory_budget: None,
//!             page_alignment: ALIGN,
//!             max_page_size: TOTAL / 4,
//!             integrated: false,
//!             can_map_host: false,
//!         }
//!     }
//!
//!     fn classify(&self, op: ShimOp, status: i32) -> DriverError {
//!         let fault = match status {
//!             status::OUT_OF_MEMORY => Fault::OutOfMemory,
//!             status::TOO_BIG => Fault::TooBig,
//!             status::UNSUPPORTED => Fault::Unsupported,
//!             status::KERNEL_FAILED => Fault::WorkFailed,
//!             // A real device maps its sticky statuses to `Fault::DeviceLost` here.
//!             _ => Fault::Failed,
//!         };
//!         DriverError::new(op, status, fault)
//!     }
//!
//!     fn create_stream(&self) -> Result<HostStream, DriverError> {
//!         Ok(HostStream::default())
//!     }
//!
//!     fn stream_wait_event(
//!         &self,
//!         stream: &HostStream,
//!         event: &HostEvent,
//!     ) -> Result<(), DriverError> {
//!         // Nothing to wait for on a synchronous device, but a fault travels with the wait.
//!         if stream.failed.get().is_none() {
//!             stream.failed.set(event.failed);
//!         }
//!         Ok(())
//!     }
//!
//!     fn record_event(&self, stream: &HostStream) -> Result<HostEvent, DriverError> {
//!         Ok(HostEvent {
//!             failed: stream.failed.get(),
//!         })
//!     }
//!
//!     fn event_query(&self, event: &HostEvent) -> Result<bool, DriverError> {
//!         self.event_wait(event).map(|()| true)
//!     }
//!
//!     fn event_wait(&self, event: &HostEvent) -> Result<(), DriverError> {
//!         event.failed.map_or(Ok(()), Err)
//!     }
//!
//!     fn device_alloc(&self, size: u64) -> Result<Block, DriverError> {
//!         let refuse = |status| self.classify(ShimOp::DeviceAlloc, status);
//!         if size > self.facts().max_page_size {
//!             return Err(refuse(status::TOO_BIG));
//!         }
//!         if self.live.get() + size > TOTAL {
//!             return Err(refuse(status::OUT_OF_MEMORY));
//!         }
//!         let layout = Layout::from_size_align(size.max(1) as usize, ALIGN as usize)
//!             .map_err(|_| refuse(status::TOO_BIG))?;
//!         // SAFETY: the layout is at least one byte long.
//!         let ptr = NonNull::new(unsafe { alloc_zeroed(layout) })
//!             .ok_or_else(|| refuse(status::OUT_OF_MEMORY))?;
//!         self.live.set(self.live.get() + size);
//!         Ok(Block { ptr, layout, size })
//!     }
//!
//!     fn device_page_addr(&self, page: &Block) -> DeviceAddr {
//!         DeviceAddr(page.ptr.as_ptr().expose_provenance() as u64)
//!     }
//!
//!     unsafe fn device_free(&self, page: Block) {
//!         self.live.set(self.live.get() - page.size);
//!         // SAFETY: allocated by `device_alloc` with this layout; the core frees it once.
//!         unsafe { dealloc(page.ptr.as_ptr(), page.layout) };
//!     }
//!
//!     fn host_alloc_pinned(&self, _size: usize) -> Result<Infallible, DriverError> {
//!         Err(self.classify(ShimOp::HostAlloc, status::UNSUPPORTED)) // the core uses the heap
//!     }
//!
//!     fn host_page_ptr(&self, page: &Infallible) -> NonNull<u8> {
//!         match *page {}
//!     }
//!
//!     fn host_page_device_addr(&self, page: &Infallible) -> Option<DeviceAddr> {
//!         match *page {}
//!     }
//!
//!     unsafe fn host_free_pinned(&self, page: Infallible) {
//!         match page {}
//!     }
//!
//!     unsafe fn copy_to_device(
//!         &self,
//!         _stream: &HostStream,
//!         src: *const u8,
//!         dst: DeviceAddr,
//!         layout: CopyLayout,
//!     ) -> Result<(), DriverError> {
//!         for row in layout.rows() {
//!             // SAFETY: the caller keeps the packed source valid and the device rows in a live
//!             // page (`Shim::copy_to_device`'s contract); host and device memory are distinct.
//!             unsafe {
//!                 let to = host(dst.offset(row.device));
//!                 core::ptr::copy_nonoverlapping(
//!                     src.add(row.host as usize),
//!                     to,
//!                     row.len as usize,
//!                 );
//!             }
//!         }
//!         Ok(())
//!     }
//!
//!     unsafe fn copy_to_host(
//!         &self,
//!         _stream: &HostStream,
//!         src: DeviceAddr,
//!         dst: *mut u8,
//!         layout: CopyLayout,
//!     ) -> Result<(), DriverError> {
//!         for row in layout.rows() {
//!             // SAFETY: as in `copy_to_device`, the other way round.
//!             unsafe {
//!                 let from = host(src.offset(row.device));
//!                 core::ptr::copy_nonoverlapping(
//!                     from,
//!                     dst.add(row.host as usize),
//!                     row.len as usize,
//!                 );
//!             }
//!         }
//!         Ok(())
//!     }
//!
//!     unsafe fn copy_on_device(
//!         &self,
//!         _stream: &HostStream,
//!         src: DeviceAddr,
//!         dst: DeviceAddr,
//!         layout: CopyLayout,
//!     ) -> Result<(), DriverError> {
//!         for row in layout.rows() {
//!             // SAFETY: both spans lie in live pages and do not overlap (caller's contract).
//!             unsafe {
//!                 let (from, to) = (host(src.offset(row.device)), host(dst.offset(row.device)));
//!                 core::ptr::copy_nonoverlapping(from, to, row.len as usize);
//!             }
//!         }
//!         Ok(())
//!     }
//!
//!     unsafe fn launch(
//!         &self,
//!         stream: &HostStream,
//!         kernel: &HostKernel,
//!         _grid: Grid,
//!         buffers: &[DeviceSpan],
//!         args: &[u8],
//!     ) -> Result<(), DriverError> {
//!         // SAFETY (both blocks): every span lies in a live page (the caller's contract).
//!         let mut copies: Vec<Vec<u8>> = buffers
//!             .iter()
//!             .map(|s| {
//!                 unsafe { std::slice::from_raw_parts(host(s.addr), s.len as usize) }.to_vec()
//!             })
//!             .collect();
//!         if kernel(&mut copies, args).is_err() {
//!             // Enqueued fine, failed while it ran: the stream's later fences report it.
//!             if stream.failed.get().is_none() {
//!                 stream
//!                     .failed
//!                     .set(Some(self.classify(ShimOp::Launch, status::KERNEL_FAILED)));
//!             }
//!             return Ok(());
//!         }
//!         for (span, bytes) in buffers.iter().zip(&copies) {
//!             unsafe {
//!                 core::ptr::copy_nonoverlapping(bytes.as_ptr(), host(span.addr), bytes.len())
//!             };
//!         }
//!         Ok(())
//!     }
//!
//!     fn begin_capture(&self, _stream: &HostStream) -> Result<(), DriverError> {
//!         Err(self.classify(ShimOp::GraphBegin, status::UNSUPPORTED))
//!     }
//!
//!     fn end_capture(
//!         &self,
//!         _stream: &HostStream,
//!         _doomed: bool,
//!     ) -> Result<Infallible, DriverError> {
//!         Err(self.classify(ShimOp::GraphEnd, status::UNSUPPORTED))
//!     }
//!
//!     fn graph_upload(
//!         &self,
//!         graph: &Infallible,
//!         _stream: &HostStream,
//!     ) -> Result<(), DriverError> {
//!         match *graph {}
//!     }
//!
//!     unsafe fn graph_launch(
//!         &self,
//!         graph: &Infallible,
//!         _stream: &HostStream,
//!     ) -> Result<(), DriverError> {
//!         match *graph {}
//!     }
//! }
//!
//! // The core on top of it: every policy comes for free.
//! use devcmd::{Device, DeviceConfig, Launch, ReadRequest, ServerError, StreamId};
//!
//! fn add_one(bufs: &mut [Vec<u8>], _args: &[u8]) -> Result<(), ()> {
//!     let [input, output] = bufs else {
//!         return Err(());
//!     };
//!     for (o, i) in output.iter_mut().zip(input.iter()) {
//!         *o = i.wrapping_add(1);
//!     }
//!     Ok(())
//! }
//!
//! # fn main() -> Result<(), ServerError> {
//! let mut device = Device::new(HostShim::default(), DeviceConfig::default());
//! let a = device.command(StreamId(0))?.create(&[1, 2, 3])?;
//! let mut cmd = device.command(StreamId(1))?; // another stream reads `a`: ordered by the core
//! let b = cmd.empty(3)?;
//! let kernel: HostKernel = add_one;
//! cmd.launch(Launch {
//!     kernel: &kernel,
//!     name: "add_one",
//!     grid: Grid::linear(1),
//!     inputs: &[&a],
//!     outputs: &[&b],
//!     args: &[],
//! })?;
//! assert_eq!(
//!     cmd.read_async(&[ReadRequest::whole(&b)])?.wait()?[0].as_slice(),
//!     [2, 3, 4]
//! );
//! drop((a, b));
//! cmd.memory_cleanup()?;
//! device.command(StreamId(0))?.memory_cleanup()?;
//! assert_eq!(
//!     device.shim().live.get(),
//!     0,
//!     "every page went back to the shim"
//! );
//! # Ok(())
//! # }
//! ```
//!
//! # 4. Features and targets
//!
//! The core is `#![no_std]` with `alloc` in every configuration; the features only add
//! conveniences.
//!
//! | feature | default | what it adds | for |
//! |---|---|---|---|
//! | `std` | yes | links `std`; nothing in the core needs it today (the errors implement [`core::error::Error`] in every build) | hosts with an OS |
//! | `log` | no | the core's diagnostics (a leaked batch, a reclaim) through the `log` crate | std hosts |
//! | `defmt` | no | `defmt::Format` on the public types, diagnostics through `defmt` | firmware |
//!
//! `log` and `defmt` exclude each other: enabling both is a compile error. Without either, the
//! diagnostics compile to nothing. CI builds the core with `--no-default-features` for
//! `thumbv7em-none-eabihf`, `thumbv7m-none-eabi` and `aarch64-unknown-none`, and checks each of
//! `""`, `log`, `defmt` on the two Cortex-M targets and `""`, `log`, `defmt`, `std`, `std,log`,
//! `std,defmt` on the host. A bare-metal host depends on it like this (the firmware host in
//! `examples/firmware` does):
//!
//! ```toml
//! [dependencies]
//! devcmd = { version = "0.1", default-features = false, features = ["defmt"] }
//! ```
//!
//! # 5. The conformance suite
//!
//! `devcmd-tests` (in `tests/`) checks that a shim keeps its side of the contract, by running the
//! core on it: the drop queue (nothing released before its fence, polls that never block), copy
//! layouts and staging, round trips, memory reuse across streams, the failure rule as a seeded
//! property against a model, fault injection of every shim call under every operation, and bad
//! input. A shim author implements its `Harness` trait:
//!
//! - `type S`: the shim;
//! - `shim(mode)`: a fresh shim for a `Mode` (`lazy`: streams run only when a fence is queried or
//!   waited on, so a missing order shows every time; `poison`: freed memory is overwritten, so a
//!   late read shows garbage); `None` for a mode the shim cannot offer skips its groups;
//! - `kernel(shim, TestKernel)` and `args(kernel, value)`: three tiny kernels (`Fill`, `AddByte`,
//!   `SlowAdd`, which takes at least `SLOW_KERNEL_MS` milliseconds) and their one-byte argument;
//! - optionally `probe(shim)`: a `Probe` with call counters and fault injection (`FaultRule`).
//!   An injected failure must come from the shim's `classify` like a real one and change nothing
//!   else. Without a probe the fault-injection group is skipped and the counting checks use the
//!   core's own statistics.
//!
//! Then one line in an integration test of the shim's crate generates a `#[test]` per behaviour
//! group and mode (`normal::drop_queue`, `lazy_poison::failure_rule`, ...), so a failure names
//! what broke:
//!
//! ```text
//! // tests/conformance.rs of the shim's crate; devcmd-tests is a dev-dependency
//! devcmd_tests::conformance_tests!(my_shim::MyHarness);
//! ```
//!
//! or one call runs every group in every mode (`devcmd_tests::run_conformance(&harness)`).
//! `devcmd_tests::StdHarness` is the reference harness (`tests/src/std_harness.rs`), with a probe;
//! `tests/tests/conformance_std.rs` is the one line for `devcmd-std`. Here is the harness of the
//! synchronous shim of [section 3](#3-writing-a-shim) (hidden here; the same code), and the
//! whole suite run on it:
//!
//! ```
//! # use core::cell::Cell;
//! # use core::convert::Infallible;
//! # use core::ptr::NonNull;
//! # use devcmd::{
//! #     CopyLayout, DeviceAddr, DeviceFacts, DeviceSpan, DriverError, Fault, Grid, Shim, ShimOp,
//! # };
//! # use std::alloc::{Layout, alloc_zeroed, dealloc};
//! #
//! # /// The device's status codes, classified in one place.
//! # mod status {
//! #     pub const OUT_OF_MEMORY: i32 = 1;
//! #     pub const TOO_BIG: i32 = 2;
//! #     pub const UNSUPPORTED: i32 = 3;
//! #     pub const KERNEL_FAILED: i32 = 4;
//! # }
//! #
//! # const TOTAL: u64 = 256 << 20;
//! # const ALIGN: u64 = 256;
//! #
//! # /// A kernel: a function over copies of its buffers (inputs, then outputs) and the arguments.
//! # pub type HostKernel = fn(&mut [Vec<u8>], &[u8]) -> Result<(), ()>;
//! #
//! # #[derive(Debug, Default)]
//! # pub struct HostShim {
//! #     live: Cell<u64>,
//! # }
//! #
//! # /// A stream remembers the first fault of its work (sticky).
//! # #[derive(Debug, Default)]
//! # pub struct HostStream {
//! #     failed: Cell<Option<DriverError>>,
//! # }
//! #
//! # /// An event is complete when recorded; it carries the fault its stream had by then.
//! # #[derive(Debug)]
//! # pub struct HostEvent {
//! #     failed: Option<DriverError>,
//! # }
//! #
//! # #[derive(Debug)]
//! # pub struct Block {
//! #     ptr: NonNull<u8>,
//! #     layout: Layout,
//! #     size: u64,
//! # }
//! #
//! # fn host(addr: DeviceAddr) -> *mut u8 {
//! #     std::ptr::with_exposed_provenance_mut(addr.0 as usize)
//! # }
//! #
//! # impl Shim for HostShim {
//! #     type Stream = HostStream;
//! #     type Event = HostEvent;
//! #     type DevicePage = Block;
//! #     type HostPage = Infallible;
//! #     type Kernel = HostKernel;
//! #     type Args = [u8];
//! #     type Graph = Infallible;
//! #
//! #     fn facts(&self) -> DeviceFacts {
//! #         DeviceFacts {
//! #             total_memory: TOTAL,
//! #             memory_budget: None,
//! #             page_alignment: ALIGN,
//! #             max_page_size: TOTAL / 4,
//! #             integrated: false,
//! #             can_map_host: false,
//! #         }
//! #     }
//! #
//! #     fn classify(&self, op: ShimOp, status: i32) -> DriverError {
//! #         let fault = match status {
//! #             status::OUT_OF_MEMORY => Fault::OutOfMemory,
//! #             status::TOO_BIG => Fault::TooBig,
//! #             status::UNSUPPORTED => Fault::Unsupported,
//! #             status::KERNEL_FAILED => Fault::WorkFailed,
//! #             // A real device maps its sticky statuses to `Fault::DeviceLost` here.
//! #             _ => Fault::Failed,
//! #         };
//! #         DriverError::new(op, status, fault)
//! #     }
//! #
//! #     fn create_stream(&self) -> Result<HostStream, DriverError> {
//! #         Ok(HostStream::default())
//! #     }
//! #
//! #     fn stream_wait_event(
//! #         &self,
//! #         stream: &HostStream,
//! #         event: &HostEvent,
//! #     ) -> Result<(), DriverError> {
//! #         // Nothing to wait for on a synchronous device, but a fault travels with the wait.
//! #         if stream.failed.get().is_none() {
//! #             stream.failed.set(event.failed);
//! #         }
//! #         Ok(())
//! #     }
//! #
//! #     fn record_event(&self, stream: &HostStream) -> Result<HostEvent, DriverError> {
//! #         Ok(HostEvent {
//! #             failed: stream.failed.get(),
//! #         })
//! #     }
//! #
//! #     fn event_query(&self, event: &HostEvent) -> Result<bool, DriverError> {
//! #         self.event_wait(event).map(|()| true)
//! #     }
//! #
//! #     fn event_wait(&self, event: &HostEvent) -> Result<(), DriverError> {
//! #         event.failed.map_or(Ok(()), Err)
//! #     }
//! #
//! #     fn device_alloc(&self, size: u64) -> Result<Block, DriverError> {
//! #         let refuse = |status| self.classify(ShimOp::DeviceAlloc, status);
//! #         if size > self.facts().max_page_size {
//! #             return Err(refuse(status::TOO_BIG));
//! #         }
//! #         if self.live.get() + size > TOTAL {
//! #             return Err(refuse(status::OUT_OF_MEMORY));
//! #         }
//! #         let layout = Layout::from_size_align(size.max(1) as usize, ALIGN as usize)
//! #             .map_err(|_| refuse(status::TOO_BIG))?;
//! #         // SAFETY: the layout is at least one byte long.
//! #         let ptr = NonNull::new(unsafe { alloc_zeroed(layout) })
//! #             .ok_or_else(|| refuse(status::OUT_OF_MEMORY))?;
//! #         self.live.set(self.live.get() + size);
//! #         Ok(Block { ptr, layout, size })
//! #     }
//! #
//! #     fn device_page_addr(&self, page: &Block) -> DeviceAddr {
//! #         DeviceAddr(page.ptr.as_ptr().expose_provenance() as u64)
//! #     }
//! #
//! #     unsafe fn device_free(&self, page: Block) {
//! #         self.live.set(self.live.get() - page.size);
//! #         // SAFETY: allocated by `device_alloc` with this layout; the core frees it once.
//! #         unsafe { dealloc(page.ptr.as_ptr(), page.layout) };
//! #     }
//! #
//! #     fn host_alloc_pinned(&self, _size: usize) -> Result<Infallible, DriverError> {
//! #         Err(self.classify(ShimOp::HostAlloc, status::UNSUPPORTED)) // the core uses the heap
//! #     }
//! #
//! #     fn host_page_ptr(&self, page: &Infallible) -> NonNull<u8> {
//! #         match *page {}
//! #     }
//! #
//! #     fn host_page_device_addr(&self, page: &Infallible) -> Option<DeviceAddr> {
//! #         match *page {}
//! #     }
//! #
//! #     unsafe fn host_free_pinned(&self, page: Infallible) {
//! #         match page {}
//! #     }
//! #
//! #     unsafe fn copy_to_device(
//! #         &self,
//! #         _stream: &HostStream,
//! #         src: *const u8,
//! #         dst: DeviceAddr,
//! #         layout: CopyLayout,
//! #     ) -> Result<(), DriverError> {
//! #         for row in layout.rows() {
//! #             // SAFETY: the caller keeps the packed source valid and the device rows in a live
//! #             // page (`Shim::copy_to_device`'s contract); host and device memory are distinct.
//! #             unsafe {
//! #                 let to = host(dst.offset(row.device));
//! #                 core::ptr::copy_nonoverlapping(
//! #                     src.add(row.host as usize),
//! #                     to,
//! #                     row.len as usize,
//! #                 );
//! #             }
//! #         }
//! #         Ok(())
//! #     }
//! #
//! #     unsafe fn copy_to_host(
//! #         &self,
//! #         _stream: &HostStream,
//! #         src: DeviceAddr,
//! #         dst: *mut u8,
//! #         layout: CopyLayout,
//! #     ) -> Result<(), DriverError> {
//! #         for row in layout.rows() {
//! #             // SAFETY: as in `copy_to_device`, the other way round.
//! #             unsafe {
//! #                 let from = host(src.offset(row.device));
//! #                 core::ptr::copy_nonoverlapping(
//! #                     from,
//! #                     dst.add(row.host as usize),
//! #                     row.len as usize,
//! #                 );
//! #             }
//! #         }
//! #         Ok(())
//! #     }
//! #
//! #     unsafe fn copy_on_device(
//! #         &self,
//! #         _stream: &HostStream,
//! #         src: DeviceAddr,
//! #         dst: DeviceAddr,
//! #         layout: CopyLayout,
//! #     ) -> Result<(), DriverError> {
//! #         for row in layout.rows() {
//! #             // SAFETY: both spans lie in live pages and do not overlap (caller's contract).
//! #             unsafe {
//! #                 let (from, to) = (host(src.offset(row.device)), host(dst.offset(row.device)));
//! #                 core::ptr::copy_nonoverlapping(from, to, row.len as usize);
//! #             }
//! #         }
//! #         Ok(())
//! #     }
//! #
//! #     unsafe fn launch(
//! #         &self,
//! #         stream: &HostStream,
//! #         kernel: &HostKernel,
//! #         _grid: Grid,
//! #         buffers: &[DeviceSpan],
//! #         args: &[u8],
//! #     ) -> Result<(), DriverError> {
//! #         // SAFETY (both blocks): every span lies in a live page (the caller's contract).
//! #         let mut copies: Vec<Vec<u8>> = buffers
//! #             .iter()
//! #             .map(|s| {
//! #                 unsafe { std::slice::from_raw_parts(host(s.addr), s.len as usize) }.to_vec()
//! #             })
//! #             .collect();
//! #         if kernel(&mut copies, args).is_err() {
//! #             // Enqueued fine, failed while it ran: the stream's later fences report it.
//! #             if stream.failed.get().is_none() {
//! #                 stream
//! #                     .failed
//! #                     .set(Some(self.classify(ShimOp::Launch, status::KERNEL_FAILED)));
//! #             }
//! #             return Ok(());
//! #         }
//! #         for (span, bytes) in buffers.iter().zip(&copies) {
//! #             unsafe {
//! #                 core::ptr::copy_nonoverlapping(bytes.as_ptr(), host(span.addr), bytes.len())
//! #             };
//! #         }
//! #         Ok(())
//! #     }
//! #
//! #     fn begin_capture(&self, _stream: &HostStream) -> Result<(), DriverError> {
//! #         Err(self.classify(ShimOp::GraphBegin, status::UNSUPPORTED))
//! #     }
//! #
//! #     fn end_capture(
//! #         &self,
//! #         _stream: &HostStream,
//! #         _doomed: bool,
//! #     ) -> Result<Infallible, DriverError> {
//! #         Err(self.classify(ShimOp::GraphEnd, status::UNSUPPORTED))
//! #     }
//! #
//! #     fn graph_upload(
//! #         &self,
//! #         graph: &Infallible,
//! #         _stream: &HostStream,
//! #     ) -> Result<(), DriverError> {
//! #         match *graph {}
//! #     }
//! #
//! #     unsafe fn graph_launch(
//! #         &self,
//! #         graph: &Infallible,
//! #         _stream: &HostStream,
//! #     ) -> Result<(), DriverError> {
//! #         match *graph {}
//! #     }
//! # }
//! use devcmd_tests::{Harness, Mode, SLOW_KERNEL_MS, TestKernel};
//!
//! struct HostHarness;
//!
//! fn fill(bufs: &mut [Vec<u8>], args: &[u8]) -> Result<(), ()> {
//!     bufs.iter_mut().for_each(|b| b.fill(args[0]));
//!     Ok(())
//! }
//!
//! fn add(bufs: &mut [Vec<u8>], args: &[u8]) -> Result<(), ()> {
//!     let [input, output] = bufs else {
//!         return Err(());
//!     };
//!     for (o, i) in output.iter_mut().zip(input.iter()) {
//!         *o = i.wrapping_add(args[0]);
//!     }
//!     Ok(())
//! }
//!
//! fn slow_add(bufs: &mut [Vec<u8>], args: &[u8]) -> Result<(), ()> {
//!     std::thread::sleep(std::time::Duration::from_millis(SLOW_KERNEL_MS));
//!     add(bufs, args)
//! }
//!
//! fn write_then_fail(bufs: &mut [Vec<u8>], args: &[u8]) -> Result<(), ()> {
//!     fill(bufs, args)?;
//!     Err(()) // a fault of work that ran: the stream's later fences report it
//! }
//!
//! impl Harness for HostHarness {
//!     type S = HostShim;
//!
//!     fn shim(&self, mode: Mode) -> Option<HostShim> {
//!         // A synchronous device has no lazy streams and does not poison freed memory.
//!         (mode == Mode::NORMAL).then(HostShim::default)
//!     }
//!
//!     fn kernel(&self, _shim: &HostShim, kernel: TestKernel) -> HostKernel {
//!         match kernel {
//!             TestKernel::Fill => fill,
//!             TestKernel::AddByte => add,
//!             TestKernel::SlowAdd => slow_add,
//!             TestKernel::WriteThenFail => write_then_fail,
//!         }
//!     }
//!
//!     fn args(&self, _kernel: TestKernel, value: u8) -> Box<[u8]> {
//!         Box::new([value])
//!     }
//! }
//!
//! # fn main() {
//! // In the shim's crate: `devcmd_tests::conformance_tests!(HostHarness);` in an integration test.
//! devcmd_tests::run_conformance(&HostHarness);
//! # }
//! ```
//!
//! # 6. Which shim calls the core makes today
//!
//! Every method of [`Shim`] is part of the contract, but the core does not call all of them yet.
//! A shim must still implement the others (answering [`Fault::Unsupported`] is fine where the
//! device cannot), and the conformance suite only exercises what the core calls.
//!
//! | method | called by the core today | where |
//! |---|---|---|
//! | [`facts`](crate::Shim::facts) | yes, once | [`Device::new`] |
//! | [`classify`](crate::Shim::classify) | no: the shim calls it to build its own errors | — |
//! | [`create_stream`](crate::Shim::create_stream) | yes | a stream's first command |
//! | [`stream_wait_event`](crate::Shim::stream_wait_event) | yes | cross-stream order, before a stream uses memory another stream owns or used |
//! | [`record_event`](crate::Shim::record_event) | yes | drop-queue flushes, reads, syncs, cross-stream order |
//! | [`event_query`](crate::Shim::event_query) | yes | [`Command::poll_drops`], polled futures |
//! | [`event_wait`](crate::Shim::event_wait) | yes | flushes, drains, [`ReadFuture::wait`], [`SyncFuture::wait`], teardown |
//! | [`device_alloc`](crate::Shim::device_alloc), [`device_page_addr`](crate::Shim::device_page_addr) | yes | a pool that needs a page |
//! | [`device_free`](crate::Shim::device_free) | yes | a retired page whose fence passed; teardown |
//! | [`host_alloc_pinned`](crate::Shim::host_alloc_pinned), [`host_page_ptr`](crate::Shim::host_page_ptr), [`host_free_pinned`](crate::Shim::host_free_pinned) | yes | the pinned staging pool of each stream |
//! | [`host_page_device_addr`](crate::Shim::host_page_device_addr) | **not yet**: zero-copy on integrated devices is planned | — |
//! | [`copy_to_device`](crate::Shim::copy_to_device), [`copy_to_host`](crate::Shim::copy_to_host) | yes | uploads, reads |
//! | [`copy_on_device`](crate::Shim::copy_on_device) | **not yet**: relocation of live allocations is planned | — |
//! | [`launch`](crate::Shim::launch) | yes | [`Command::launch`] |
//! | [`begin_capture`](crate::Shim::begin_capture), [`end_capture`](crate::Shim::end_capture), [`graph_upload`](crate::Shim::graph_upload), [`graph_launch`](crate::Shim::graph_launch) | **not yet**: graphs are called once capture lands ([`capture`](crate::capture)) | — |
//!
//! [`Device`]: crate::Device
//! [`Device::new`]: crate::Device::new
//! [`Device::memory_report`]: crate::Device::memory_report
//! [`Device::drop_stats`]: crate::Device::drop_stats
//! [`DeviceReport`]: crate::DeviceReport
//! [`DeviceReport::held`]: crate::DeviceReport::held
//! [`Command`]: crate::Command
//! [`Command::flush_drops`]: crate::Command::flush_drops
//! [`Command::poll_drops`]: crate::Command::poll_drops
//! [`Command::memory_cleanup`]: crate::Command::memory_cleanup
//! [`Command::launch`]: crate::Command::launch
//! [`Handle`]: crate::Handle
//! [`HostBuffer`]: crate::HostBuffer
//! [`ReadFuture`]: crate::ReadFuture
//! [`ReadFuture::wait`]: crate::ReadFuture::wait
//! [`SyncFuture::wait`]: crate::SyncFuture::wait
//! [`AllocationMode::Persistent`]: crate::AllocationMode::Persistent
//! [`Shim`]: crate::Shim
//! [`Shim::Args`]: crate::Shim::Args
//! [`Shim::device_free`]: crate::Shim::device_free
//! [`DropPolicy`]: crate::DropPolicy
//! [`DropStats::items_leaked`]: crate::DropStats::items_leaked
//! [`FenceOutcome::of`]: crate::FenceOutcome::of
//! [`FenceOutcome::Passed`]: crate::FenceOutcome::Passed
//! [`ServerError::DeviceLost`]: crate::ServerError::DeviceLost
//! [`ServerError::StreamFaulted`]: crate::ServerError::StreamFaulted
//! [`ServerError::Device`]: crate::ServerError::Device
//! [`Fault::Unsupported`]: crate::Fault::Unsupported
