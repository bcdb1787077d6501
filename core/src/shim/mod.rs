#![doc = include_str!("contract.md")]

mod types;

pub use types::{
    DeviceAddr, DeviceFacts, DeviceSpan, Dim3, HostCopy, HostMemory, KernelParam, LaunchDims,
};

use crate::copy::CopyLayout;
use crate::error::{DriverError, Fault, ShimOp};
use core::ptr::NonNull;

/// The device calls the core makes. See the module documentation for the promises on each side.
///
/// Every associated type is `Debug` so the core's own types can be.
/// Associated types are the device's own objects; dropping one releases it on the device
/// (destroying a stream, an event or a graph). Pages are the exception: they are returned through
/// [`Shim::device_free`] and [`Shim::host_free_pinned`] because freeing them has a precondition
/// only the core can check.
pub trait Shim {
    /// An in-order queue of device work.
    type Stream: core::fmt::Debug;
    /// A fence: a point in a stream's queue that completes once everything before it has.
    type Event: core::fmt::Debug;
    /// A device allocation the core sub-allocates: a base address and a size.
    type DevicePage: core::fmt::Debug;
    /// A pinned (page-locked) host allocation, usable as the host side of asynchronous copies.
    type HostPage: core::fmt::Debug;
    /// A kernel already loaded on the device.
    type Kernel: core::fmt::Debug;
    /// Host memory page-locked in place ([`Shim::host_register`]); given back through
    /// [`Shim::host_unregister`].
    type Registration: core::fmt::Debug + Send;
    /// An instantiated recording of a stream; dropping it destroys it.
    type Graph: core::fmt::Debug;
    /// The stream handle of the device's own API, which library work enqueues on
    /// ([`Command::library`](crate::Command::library)): CUDA's `CUstream`, shim-std's
    /// `StdStream`. A shim whose device has no library to call names `()`.
    type NativeStream: core::fmt::Debug;

    // ---- device facts ----

    /// The device's facts. Called once when the core is set up; must not change afterwards.
    fn facts(&self) -> DeviceFacts;

    /// Builds the error of a failed call of `op` with the device's `status`, classifying it.
    ///
    /// Every error a shim returns comes from here, so the classification is written once: a
    /// status after which nothing will run again (CUDA's sticky errors) must be
    /// [`Fault::DeviceLost`]; a transient shortage [`Fault::OutOfMemory`]; a size the device can
    /// never hold [`Fault::TooBig`].
    fn classify(&self, op: ShimOp, status: i32) -> DriverError;

    // ---- streams and events ----

    /// Creates a stream that runs asynchronously from the host and from the other streams.
    fn create_stream(&self) -> Result<Self::Stream, DriverError>;

    /// The native handle under `stream`, for library work to enqueue on.
    ///
    /// What every shim promises about it: work a library enqueues on the handle runs in the
    /// stream's order (after everything the core enqueued before, before everything after), is
    /// covered by the stream's later events, takes part in the stream's recording while it
    /// records (CUDA's stream capture; shim-std records it into the graph), and a fault while it
    /// runs is a fault of the stream's work (the contract's three rules). Where the device API
    /// keeps per-thread state (CUDA's current context), this call makes it current on the
    /// calling thread, as every other call does: the core calls it just before it hands the
    /// handle to a library.
    fn native_stream<'a>(&self, stream: &'a Self::Stream) -> &'a Self::NativeStream;

    /// A stream over `native`, a stream the caller's runtime created and owns (the stream a
    /// TensorRT context or PyTorch enqueues on): the shim uses it like its own and never destroys
    /// it; dropping the returned stream leaves `native` as it was.
    ///
    /// Default: [`unsupported`].
    ///
    /// # Safety
    ///
    /// `native` is a live stream of this device (CUDA: of the shim's context) and stays alive
    /// until the returned stream is dropped; its owner does not record it into a graph of its
    /// own meanwhile (a shim that can tell refuses one being recorded).
    unsafe fn borrow_stream(
        &self,
        native: &Self::NativeStream,
    ) -> Result<Self::Stream, DriverError> {
        let _ = native;
        Err(unsupported(ShimOp::StreamCreate))
    }

    /// Makes `stream` wait, on the device, until `event` (recorded on another stream) completes.
    /// Must not block the host.
    fn stream_wait_event(
        &self,
        stream: &Self::Stream,
        event: &Self::Event,
    ) -> Result<(), DriverError>;

    /// Records an event at the current tail of `stream`. An event recorded while nothing is
    /// pending may complete at once.
    fn record_event(&self, stream: &Self::Stream) -> Result<Self::Event, DriverError>;

    /// Whether `event` has completed, **without blocking**. A device fault that surfaced since the
    /// work was enqueued is returned as an error.
    fn event_query(&self, event: &Self::Event) -> Result<bool, DriverError>;

    /// Blocks the host until `event` completes. A device fault is returned as an error.
    ///
    /// A shim that may not wait now for a reason that passes (CUDA: a stream of the process
    /// records a graph) refuses with [`Fault::Busy`] and must have done
    /// nothing: the core keeps what the fence covers and waits for the same event later.
    fn event_wait(&self, event: &Self::Event) -> Result<(), DriverError>;

    /// Arranges for `waker` to be woken once `event` completes, and returns `true`; wakes it at
    /// once when the event has already completed (or the device is lost), so no completion
    /// between a query and this call is missed. A shim that can notify lets a pending future
    /// sleep: a [`ReadFuture`](crate::ReadFuture) awaited under an executor costs no CPU until
    /// the device is done.
    ///
    /// The core calls it again at each poll of a pending future, with that poll's waker and the
    /// future's own event value: only the latest waker of an event value needs waking, so a shim
    /// keeps one per value and replaces it (an executor may make a new waker every poll; keying
    /// on [`Waker::will_wake`](core::task::Waker::will_wake) alone would keep them all).
    ///
    /// The default returns `false`: the shim cannot notify, and a pending future asks to be
    /// polled again at once (it spins on [`Self::event_query`] under an executor; a firmware
    /// main loop polls it between other work anyway). Never blocks.
    fn event_notify(&self, event: &Self::Event, waker: &core::task::Waker) -> bool {
        let _ = (event, waker);
        false
    }

    // ---- device pages ----

    /// Allocates a device page of `size` bytes aligned to [`DeviceFacts::page_alignment`].
    ///
    /// A transient shortage is [`Fault::OutOfMemory`]; a size the device can never hold is
    /// [`Fault::TooBig`]. A zero size succeeds.
    fn device_alloc(&self, size: u64) -> Result<Self::DevicePage, DriverError>;

    /// The first device address of `page`.
    fn device_page_addr(&self, page: &Self::DevicePage) -> DeviceAddr;

    /// Returns `page` to the device.
    ///
    /// # Safety
    ///
    /// No work that uses the page may be pending on any stream: every event recorded after its
    /// last use has completed (or the device is lost and nothing will run again).
    unsafe fn device_free(&self, page: Self::DevicePage);

    // ---- virtual memory (optional: where `DeviceFacts::vm_granule` is not 0) ----

    /// Whether the virtual-memory calls below may ever succeed on this shim. `false` (a shim that
    /// never implements them, a firmware's) compiles the core's granule pools out of its build:
    /// the manager keeps whole pages whatever [`DeviceFacts::vm_granule`] says.
    ///
    /// Default: `true` (the facts decide, at run time).
    const VIRTUAL_MEMORY: bool = true;

    /// Reserves `size` bytes of device address space with no memory behind it (CUDA's
    /// `cuMemAddressReserve`), aligned to [`DeviceFacts::vm_granule`]. `size` is a multiple of
    /// the granule. Called only where the granule is not 0.
    ///
    /// Default: [`unsupported`].
    fn vm_reserve(&self, size: u64) -> Result<DeviceAddr, DriverError> {
        let _ = size;
        Err(unsupported(ShimOp::VmReserve))
    }

    /// Gives back a range [`Shim::vm_reserve`] returned, with its `size`.
    ///
    /// # Safety
    ///
    /// Nothing is mapped in the range: every [`Shim::vm_map`] in it was undone by
    /// [`Shim::vm_unmap`].
    ///
    /// Default: nothing (a shim without virtual memory never reserved a range).
    unsafe fn vm_release(&self, addr: DeviceAddr, size: u64) {
        let _ = (addr, size);
    }

    /// Backs the `size` bytes at `addr` with new device memory the device can read and write
    /// (CUDA's `cuMemCreate`, `cuMemMap`, `cuMemSetAccess`), and returns the device's handle of
    /// that memory, to be given back to [`Shim::vm_unmap`]. `addr` and `size` are multiples of
    /// [`DeviceFacts::vm_granule`], inside one reserved range, and not mapped: one granule, or
    /// under [`MemoryConfig::map_spans`](crate::memory::MemoryConfig::map_spans) several, given
    /// back by one [`Shim::vm_unmap`] of the same range. The contents are undefined. A shortage
    /// is [`Fault::OutOfMemory`]; on any failure nothing stays mapped.
    ///
    /// Default: [`unsupported`].
    fn vm_map(&self, addr: DeviceAddr, size: u64) -> Result<u64, DriverError> {
        let _ = (addr, size);
        Err(unsupported(ShimOp::VmMap))
    }

    /// Unmaps the `size` bytes at `addr` that one [`Shim::vm_map`] call mapped and returns
    /// their memory (`memory`, the handle it returned) to the device. The range stays reserved.
    ///
    /// # Safety
    ///
    /// As [`Shim::device_free`]: no work that uses the range may be pending on any stream.
    ///
    /// Default: nothing (a shim without virtual memory never mapped anything).
    unsafe fn vm_unmap(&self, addr: DeviceAddr, size: u64, memory: u64) {
        let _ = (addr, size, memory);
    }

    // ---- pinned host pages ----

    /// Allocates `size` bytes of pinned host memory. May fail with any fault: the core then
    /// falls back to ordinary heap memory.
    ///
    /// Default: [`unsupported`] (every copy is staged through the heap).
    fn host_alloc_pinned(&self, size: usize) -> Result<Self::HostPage, DriverError> {
        let _ = size;
        Err(unsupported(ShimOp::HostAlloc))
    }

    /// The first host byte of `page`, valid for the page's size until it is freed.
    fn host_page_ptr(&self, page: &Self::HostPage) -> NonNull<u8>;

    /// Where the device maps host memory (integrated devices, and discrete GPUs over PCIe), the
    /// device address of `page`; the device can then read and write it in place, with no
    /// staging copy. `None` otherwise. Whether device memory is served from such pages (zero
    /// copy) is the core's decision (`DeviceConfig::zero_copy`).
    ///
    /// Default: `None` (no host page is mapped into the device).
    fn host_page_device_addr(&self, page: &Self::HostPage) -> Option<DeviceAddr> {
        let _ = page;
        None
    }

    /// Returns `page` to the host.
    ///
    /// # Safety
    ///
    /// No copy that reads or writes the page may be pending on any stream.
    unsafe fn host_free_pinned(&self, page: Self::HostPage);

    /// Page-locks the caller's `len` bytes at `ptr` in place (CUDA's `cuMemHostRegister`), so
    /// copies from them run by DMA with no staging copy: memory-mapped weights need not be
    /// copied into pinned memory first. The core registers only bytes the device reads (upload
    /// sources, which may be mapped read-only), so a shim may register them read-only. A zero
    /// length is refused.
    ///
    /// Default: [`unsupported`] (the core stages such bytes as any other).
    fn host_register(
        &self,
        ptr: NonNull<u8>,
        len: usize,
    ) -> Result<Self::Registration, DriverError> {
        let _ = (ptr, len);
        Err(unsupported(ShimOp::HostRegister))
    }

    /// Undoes [`Shim::host_register`]; the bytes stay the caller's.
    ///
    /// Default: drops `registration` (a shim that keeps [`Shim::host_register`]'s default never
    /// has one; a shim that registers overrides both).
    ///
    /// # Safety
    ///
    /// No copy that reads or writes the registered bytes may be pending on any stream.
    unsafe fn host_unregister(&self, registration: Self::Registration) {
        drop(registration);
    }

    /// Copies `len` bytes from `src` to `dst`, both host memory, and returns once they are
    /// copied: the staging copy of a pipelined upload or read (ordinary memory into a pinned
    /// staging buffer, `kind` [`HostCopy::Stage`], and back out, [`HostCopy::Unstage`]). A shim
    /// with host worker threads may split the copy among them (shim-std and shim-cuda use
    /// `devcmd::workers::CopyWorkers`, with the `std` feature); the core overlaps it with the
    /// device's copy of the previous piece either way.
    ///
    /// Default: one `memcpy` on the caller's thread (a firmware shim, any shim without threads).
    ///
    /// # Safety
    ///
    /// `src` is valid for reads and `dst` for writes of `len` bytes, the two do not overlap, and
    /// nothing else touches either until the call returns.
    unsafe fn host_copy(&self, dst: *mut u8, src: *const u8, len: usize, kind: HostCopy) {
        let _ = kind;
        // SAFETY: the caller's contract is `copy_nonoverlapping`'s.
        unsafe { core::ptr::copy_nonoverlapping(src, dst, len) }
    }

    // ---- copies (all asynchronous on `stream`) ----

    /// Enqueues a copy of `layout.packed_bytes()` host bytes at `src` (of the kind
    /// `src_memory`) to the device rows at `dst` described by `layout`.
    ///
    /// # Safety
    ///
    /// `src` is valid for reads of `layout.packed_bytes()` bytes and stays valid and unchanged
    /// until an event recorded after this call completes. `dst .. dst + layout.device_span()`
    /// lies in one live device page.
    unsafe fn copy_to_device(
        &self,
        stream: &Self::Stream,
        src: *const u8,
        src_memory: HostMemory,
        dst: DeviceAddr,
        layout: CopyLayout,
    ) -> Result<(), DriverError>;

    /// Enqueues a copy of the device rows at `src` described by `layout` into
    /// `layout.packed_bytes()` packed host bytes at `dst` (of the kind `dst_memory`). Into
    /// [`HostMemory::Pageable`] memory a shim may finish the copy before it returns (CUDA does);
    /// the core reads back into pinned memory wherever its pool can serve it.
    ///
    /// # Safety
    ///
    /// `dst` is valid for writes of `layout.packed_bytes()` bytes, nothing else touches it, and it
    /// stays valid until an event recorded after this call completes. The device span lies in one
    /// live device page.
    unsafe fn copy_to_host(
        &self,
        stream: &Self::Stream,
        src: DeviceAddr,
        dst: *mut u8,
        dst_memory: HostMemory,
        layout: CopyLayout,
    ) -> Result<(), DriverError>;

    /// Enqueues a copy between two device ranges with the same `layout` on both sides.
    ///
    /// Default: [`unsupported`]. The core makes no device-to-device copy today; relocation will,
    /// and must leave a page where it is when this answers [`Fault::Unsupported`].
    ///
    /// # Safety
    ///
    /// Both spans lie in live device pages and do not overlap.
    unsafe fn copy_on_device(
        &self,
        stream: &Self::Stream,
        src: DeviceAddr,
        dst: DeviceAddr,
        layout: CopyLayout,
    ) -> Result<(), DriverError> {
        let _ = (stream, src, dst, layout);
        Err(unsupported(ShimOp::CopyDeviceToDevice))
    }

    // ---- several devices (optional: a shim with one device keeps the defaults) ----

    /// Whether this device can copy from `src`'s memory with [`Shim::copy_peer`] (`src` is
    /// another device of the same shim type in this process; CUDA: another context, on this GPU
    /// or on one `cuDeviceCanAccessPeer` allows, with peer access enabled by this call).
    ///
    /// Answering `true` promises three things the core relies on for a copy between the two:
    ///
    /// - [`Shim::stream_wait_event`] on a stream of this device accepts an event `src` recorded
    ///   (on CUDA `cuStreamWaitEvent` works across contexts): the core orders the copy after the
    ///   source stream's work, and the source stream after the copy, with such waits;
    /// - [`Shim::copy_peer`] from `src`'s pages to this device's works;
    /// - the two rules of faults of work that ran still hold across the wait: a fault travels
    ///   with it, and a device lost on one side completes the other side's waits on its events
    ///   (without a fault) once no work of the lost device runs, so the other device goes on.
    ///
    /// The core asks before every copy between two devices, so a shim caches what is costly to
    /// find out. Default: `false` (the core stages the copy through host memory).
    fn peer_access(&self, src: &Self) -> bool {
        let _ = src;
        false
    }

    /// Enqueues on `stream` (of this device) a copy of `len` bytes at `src` in a page of
    /// `src_device` to `dst` in a page of this device (CUDA's `cuMemcpyPeerAsync`, or a plain
    /// device-to-device copy for two contexts of one GPU). Called only where
    /// [`Shim::peer_access`] answered `true` for `src_device`; the core orders it (see there).
    ///
    /// A copy that runs when `src_device` is lost fails as work that ran (a fault of `stream`'s
    /// work, [`Fault::WorkFailed`]), never copies what is there: the source's work up to the
    /// copy may not have run, and the destination's bytes must carry a failure, not a silent
    /// mix (the waits before it complete without a fault, see [`Shim::peer_access`]).
    ///
    /// Default: [`unsupported`].
    ///
    /// # Safety
    ///
    /// `src .. src + len` lies in live memory of `src_device` (one page, or adjacent mappings of
    /// its virtual memory), `dst .. dst + len` in live memory of this device, and neither is
    /// freed before an event recorded on `stream` after this call completes (or, where a device
    /// is lost, before it runs no work of this copy).
    unsafe fn copy_peer(
        &self,
        stream: &Self::Stream,
        dst: DeviceAddr,
        src_device: &Self,
        src: DeviceAddr,
        len: u64,
    ) -> Result<(), DriverError> {
        let _ = (stream, dst, src_device, src, len);
        Err(unsupported(ShimOp::CopyDeviceToDevice))
    }

    // ---- launch ----

    /// The name `kernel` was loaded or registered under, carried in failure chains and named by
    /// a stream fault its launch may have caused ([`Launch`](crate::Launch) takes no name of its
    /// own: a kernel is named once, where the shim makes it).
    ///
    /// The default names the kernel type (`core::any::type_name`): a shim whose kernels carry a
    /// name overrides it, so reports tell its kernels apart.
    fn kernel_name(&self, kernel: &Self::Kernel) -> &'static str {
        let _ = kernel;
        core::any::type_name::<Self::Kernel>()
    }

    /// Enqueues `kernel` with the geometry `dims` and the parameters `params` in the kernel's own
    /// order; a [`KernelParam::Buffer`] names a slot of `buffers` (the launch's inputs, then its
    /// outputs).
    ///
    /// The core checks before the call that every buffer slot exists and that no extent of
    /// `dims` is zero. Whether the parameters fit the kernel (their number and sizes) and the
    /// geometry fits the device is the shim's to check where it can.
    ///
    /// # Safety
    ///
    /// Every span lies in a live device page, and the kernel accesses nothing outside them. The
    /// spans the kernel writes (the launch's outputs, after its inputs) overlap no other span of
    /// the launch: the core refuses such a launch ([`crate::Validation::AliasedLaunch`]), so a
    /// shim may hand each output to the kernel as an exclusive buffer without checking.
    unsafe fn launch(
        &self,
        stream: &Self::Stream,
        kernel: &Self::Kernel,
        dims: LaunchDims,
        buffers: &[DeviceSpan],
        params: &[KernelParam<'_>],
    ) -> Result<(), DriverError>;

    // ---- graphs (optional: a shim without graphs keeps the defaults) ----

    /// Starts recording `stream`: work enqueued on it from now on is recorded, not run.
    ///
    /// Default: [`unsupported`] (the stream never records, so the other graph calls are never
    /// reached).
    fn begin_capture(&self, stream: &Self::Stream) -> Result<(), DriverError> {
        let _ = stream;
        Err(unsupported(ShimOp::GraphBegin))
    }

    /// Ends the recording of `stream` and instantiates it. With `doomed`, or when the recording
    /// allocated memory, the recording is discarded and an error returned; the stream is no
    /// longer recording either way.
    ///
    /// Default: [`unsupported`].
    fn end_capture(&self, stream: &Self::Stream, doomed: bool) -> Result<Self::Graph, DriverError> {
        let _ = (stream, doomed);
        Err(unsupported(ShimOp::GraphEnd))
    }

    /// Ends the recording of `stream` as [`Shim::end_capture`] does, but first tries to update
    /// `graph` in place with it (CUDA's `cuGraphExecUpdate`: the same topology, new parameters):
    /// `Ok(None)` when `graph` now replays the new recording, `Ok(Some(new))` when it could not
    /// be updated and the recording was instantiated anew (`graph` is then unchanged). Replays of
    /// `graph` enqueued before the update run what they were enqueued with.
    ///
    /// Default: [`Shim::end_capture`], always a new graph.
    fn end_capture_update(
        &self,
        stream: &Self::Stream,
        doomed: bool,
        graph: &Self::Graph,
    ) -> Result<Option<Self::Graph>, DriverError> {
        let _ = graph;
        self.end_capture(stream, doomed).map(Some)
    }

    /// Uploads `graph` to the device ahead of its first launch on `stream`.
    ///
    /// Default: [`unsupported`].
    fn graph_upload(&self, graph: &Self::Graph, stream: &Self::Stream) -> Result<(), DriverError> {
        let _ = (graph, stream);
        Err(unsupported(ShimOp::GraphUpload))
    }

    /// Enqueues one replay of `graph` on `stream`.
    ///
    /// Default: [`unsupported`].
    ///
    /// # Safety
    ///
    /// Every page and host buffer the recording touched is still alive and unmoved.
    unsafe fn graph_launch(
        &self,
        graph: &Self::Graph,
        stream: &Self::Stream,
    ) -> Result<(), DriverError> {
        let _ = (graph, stream);
        Err(unsupported(ShimOp::GraphLaunch))
    }
}

/// The error of a call a shim does not support: for shims that implement part of the contract
/// (the defaults of the optional calls of [`Shim`] answer it).
pub const fn unsupported(op: ShimOp) -> DriverError {
    DriverError::new(op, -1, Fault::Unsupported)
}
