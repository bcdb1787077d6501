//! The device: its primary context, its facts and the [`Shim`] implementation.
//!
//! Owns: the context and its per-call binding ([`Context::bind`]), the device's facts, and the
//! `impl Shim for CudaShim`, whose calls delegate to the modules that own each kind of object
//! (`stream.rs`, `memory.rs`, `kernel.rs`, `graph.rs`, `vm.rs`). Does not own: loading the driver
//! (`driver.rs`), the classification of failures (`faults.rs`).

use crate::driver::{self, CudaInitError};
use crate::faults::{self, check, classify, code};
use crate::graph::{self, CudaGraph};
use crate::kernel::{self, CudaKernel};
use crate::memory::{self, CudaDevicePage, CudaHostPage, CudaRegistration, Side};
use crate::recording::{self, Release};
use crate::stream::{self, CudaEvent, CudaStream};
use crate::vm;
use cudarc::driver::sys;
use devcmd::shim::unsupported;
use devcmd::workers::CopyWorkers;
use devcmd::{
    CopyLayout, DeviceAddr, DeviceFacts, DeviceSpan, DriverError, HostCopy, HostMemory,
    KernelParam, LaunchDims, Shim, ShimOp,
};
use std::ffi::CStr;
use std::fmt;
use std::ptr::{self, NonNull};
use std::sync::{Arc, Mutex};

/// Alignment of every device page (`cuMemAlloc` aligns to at least this) and of every slice the
/// core carves.
pub const PAGE_ALIGNMENT: u64 = 256;

/// The retained primary context of one device, shared by the shim and by every stream and event
/// made from it (so it outlives them), with the pool of idle events.
pub(crate) struct Context {
    raw: sys::CUcontext,
    device: sys::CUdevice,
    /// Idle events (created with `CU_EVENT_DISABLE_TIMING`), reused by later records.
    pub(crate) events: Mutex<Vec<sys::CUevent>>,
    /// The streams that wake waiting futures, by the stream their fences are recorded on
    /// (`notify.rs`), made on first use.
    pub(crate) notifiers: Mutex<Vec<(sys::CUstream, sys::CUstream)>>,
    /// Other contexts this one copies from (`peer.rs`), by their address: whether peer access
    /// is enabled (`false`: the driver refused, so copies from there are staged).
    pub(crate) peers: Mutex<Vec<(usize, bool)>>,
}

// SAFETY: a `CUcontext` is a handle the driver API accepts from any thread (the driver is
// thread-safe; a context may be current on several threads at once). The pooled `CUevent`s are
// handles too and are only touched under the mutex.
unsafe impl Send for Context {}
// SAFETY: as for `Send`: every use of the handles goes through the thread-safe driver API, and
// the only mutable state (the event pool) is behind a mutex.
unsafe impl Sync for Context {}

impl Context {
    /// The raw `CUcontext`.
    pub(crate) fn raw(&self) -> sys::CUcontext {
        self.raw
    }

    /// The context's `CUdevice`.
    pub(crate) fn device(&self) -> sys::CUdevice {
        self.device
    }

    /// Makes this context current on the calling thread, unless it already is. Every driver call
    /// of the shim is preceded by it (see [`CudaShim`]'s threading rule).
    pub(crate) fn bind(&self, op: ShimOp) -> Result<(), DriverError> {
        self.bind_changed(op).map(|_| ())
    }

    /// [`Self::bind`], saying whether the context had to be made current (`false`: it already
    /// was). The launches that skip the bind ask it after a refusal: only then is a second try
    /// worth making.
    pub(crate) fn bind_changed(&self, op: ShimOp) -> Result<bool, DriverError> {
        let mut current = ptr::null_mut();
        // SAFETY: the pointer is valid for one write; `cuCtxGetCurrent` was checked to exist by
        // `driver::load`, like every function called below.
        check(op, unsafe { sys::cuCtxGetCurrent(&mut current) })?;
        let changed = current != self.raw;
        if changed {
            // SAFETY: `raw` is the primary context retained by this `Context` until it drops.
            check(op, unsafe { sys::cuCtxSetCurrent(self.raw) })?;
        }
        LAST_BOUND.with(|b| b.set(self.raw as usize));
        Ok(changed)
    }

    /// Runs `call` (a launch on a stream of this context), binding the context first only when
    /// this thread's last bind by the shim was of another context (or none), and binding and
    /// running it again when it was refused while another context was current behind the
    /// shim's back. A launch on a stream created in a context runs in that context: the driver
    /// takes the context from the stream, not from the thread (`tests/kernels.rs` checks it
    /// with another context of the GPU current and with none). The check the bind makes costs a
    /// driver call (`cuCtxGetCurrent`), about 0.5 % of `cuLaunchKernel` on the H200's host; the
    /// thread's last bind keeps a host that drives two GPUs from one thread from paying a
    /// refused launch each time it switches, and the retry keeps a context made current
    /// behind the shim's back correct.
    pub(crate) fn launch_unbound(
        &self,
        op: ShimOp,
        stream: &crate::CudaStream,
        mut call: impl FnMut() -> Result<(), DriverError>,
    ) -> Result<(), DriverError> {
        // The special streams (null and `CU_STREAM_LEGACY`, which a borrowed stream may be;
        // `CU_STREAM_PER_THREAD`, refused when borrowed) are the current context's: bound
        // first, always. So is a launch on a thread whose last bind was another context's.
        let special = (stream.cu_stream() as usize) <= 2;
        if special || LAST_BOUND.with(|b| b.get()) != self.raw as usize {
            self.bind(op)?;
            return call();
        }
        match call() {
            Ok(()) => Ok(()),
            Err(refused) => {
                if self.bind_changed(op)? {
                    call()
                } else {
                    Err(refused)
                }
            }
        }
    }
}

std::thread_local! {
    /// The context the shim last made sure of on this thread (as an address; 0: none), by
    /// [`Context::bind_changed`]: a launch of that context's skips the check. Something else
    /// may have made another context current since; the launch's retry covers that.
    static LAST_BOUND: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

impl Drop for Context {
    fn drop(&mut self) {
        let events = std::mem::take(self.events.get_mut().unwrap_or_else(|e| e.into_inner()));
        // Errors are ignored: nothing can be done about them here, and a lost device answers
        // every call with its sticky error anyway.
        let _ = self.bind(ShimOp::StreamCreate);
        for event in events {
            // SAFETY: a pooled event is owned by the pool alone (no `CudaEvent` holds it).
            let _ = unsafe { sys::cuEventDestroy_v2(event) };
        }
        let notifiers = std::mem::take(self.notifiers.get_mut().unwrap_or_else(|e| e.into_inner()));
        for (_, notifier) in notifiers {
            // SAFETY: the notifiers are owned by the context and destroyed once, here (a callback
            // still queued on one runs or is dropped with it; it holds only its waker slot).
            let _ = unsafe { sys::cuStreamDestroy_v2(notifier) };
        }
        let mut current = ptr::null_mut();
        // SAFETY: the pointer is valid for one write.
        let r = unsafe { sys::cuCtxGetCurrent(&mut current) };
        if r == sys::CUresult::CUDA_SUCCESS && current == self.raw {
            // SAFETY: unbinding (a null context) is always allowed; the shim binds on every
            // call that needs it, so no later call relies on this binding.
            let _ = unsafe { sys::cuCtxSetCurrent(ptr::null_mut()) };
        }
        // A later context at the same address is not this one: its first launch binds.
        let _ = LAST_BOUND.try_with(|b| {
            if b.get() == self.raw as usize {
                b.set(0);
            }
        });
        // SAFETY: the retain of `CudaShim::new` is released once, here; no stream, event or shim
        // of this context is left (each holds the `Arc` this drop ends).
        let _ = unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.device) };
    }
}

/// An NVIDIA GPU through the CUDA driver API: the device's primary context, retained while the
/// shim (or any stream or event made from it) lives. Cheap to clone (clones share the context);
/// `Send + Sync`.
///
/// # Threads: the context is bound per call
///
/// The driver API acts on the context current on the calling thread. **Every call of this shim,
/// and every drop of a stream or an event, first makes the device's primary context current on
/// the calling thread** (`cuCtxGetCurrent`, then `cuCtxSetCurrent` only when another context is
/// current) and leaves it current. Two calls are the exception: a kernel launch and a graph's
/// launch on a stream the shim created or borrowed (not a special stream: null,
/// `CU_STREAM_LEGACY`) run in that stream's context whatever the thread's is, so they skip the
/// check (a driver call per launch) on a thread whose last bind by the shim was of this
/// context, and bind and launch again when the driver refused them because code outside the
/// shim made another context current since; after such a launch the other context may still
/// be current. So any thread may call the shim, one after another or at once
/// (the driver is thread-safe), and a stream or event dropped on another thread is released
/// correctly. Code that mixes its own contexts with the shim on one thread must expect the shim's
/// context to be current after any call but a launch, after which either may be.
///
/// # What is implemented
///
/// Facts, streams (`CU_STREAM_NON_BLOCKING`), events without timing (pooled), cross-stream waits,
/// device pages (`cuMemAlloc`), pinned host pages (`cuMemHostAlloc`, portable, mapped where the
/// device can map host memory, never write-combined), and copies (`cuMemcpy*Async`, pitched ones
/// with `cuMemcpy2DAsync`), host memory registered in place (`cuMemHostRegister`), kernels
/// compiled with NVRTC or loaded from PTX and cubins ([`CudaShim::compile`],
/// [`CudaShim::load_module`]) and launched with `cuLaunchKernel`, and graphs by stream capture
/// ([`CudaGraph`]).
#[derive(Clone)]
pub struct CudaShim {
    ctx: Arc<Context>,
    /// The GPUs that may read and write this one's virtual-memory mappings: this one, then every
    /// other GPU `cuDeviceCanAccessPeer` allows (a peer copy on another GPU's stream reads this
    /// one's memory; `cuCtxEnablePeerAccess` does not cover `cuMemMap`ped memory).
    readers: Vec<sys::CUdevice>,
    ordinal: u32,
    name: String,
    driver_version: i32,
    facts: DeviceFacts,
    /// `CU_DEVICE_ATTRIBUTE_MAX_PITCH`: the largest pitch `cuMemcpy2DAsync` accepts.
    max_pitch: u64,
    /// `CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR` and `_MINOR`.
    compute_capability: (u32, u32),
    /// `CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED`: whether `cuMemHostRegister` works here.
    host_register: bool,
    /// `CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED`: whether it takes read-only
    /// memory (a weights file mapped `PROT_READ`).
    read_only_register: bool,
    /// Whether freed pages are filled with [`POISON_BYTE`](crate::POISON_BYTE) first
    /// ([`CudaShim::with_poison`]).
    poison: bool,
    /// Host threads for staging copies ([`CudaShim::with_copy_threads`]); clones share them.
    copies: Arc<CopyWorkers>,
}

impl fmt::Debug for CudaShim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaShim")
            .field("ordinal", &self.ordinal)
            .field("name", &self.name)
            .field("driver_version", &self.driver_version)
            .field("binding_version", &driver::BINDING_VERSION)
            .field("compute_capability", &self.compute_capability)
            .field("facts", &self.facts)
            .field("poison", &self.poison)
            .finish_non_exhaustive()
    }
}

/// Maps a failed set-up call to [`CudaInitError::Call`].
fn setup(call: &'static str, r: sys::CUresult) -> Result<(), CudaInitError> {
    match code(r) {
        faults::status::SUCCESS => Ok(()),
        status => Err(CudaInitError::Call { call, status }),
    }
}

/// One integer attribute of `dev`.
fn attribute(dev: sys::CUdevice, attr: sys::CUdevice_attribute) -> Result<i32, CudaInitError> {
    let mut v = 0;
    // SAFETY: the pointer is valid for one write; `dev` came from `cuDeviceGet`.
    setup("cuDeviceGetAttribute", unsafe {
        sys::cuDeviceGetAttribute(&mut v, attr, dev)
    })?;
    Ok(v)
}

impl CudaShim {
    /// How many GPUs the driver lists (`cuDeviceGetCount`), after the checks of [`Self::new`]
    /// (the driver loads, has every function, is not older than the bindings) and `cuInit`.
    ///
    /// # Errors
    ///
    /// As [`Self::new`], before a device is set up.
    pub fn device_count() -> Result<u32, CudaInitError> {
        driver::load()?;
        // SAFETY: every function called below was checked to exist by `driver::load`; the
        // pointer passed is valid for the write the call makes.
        setup("cuInit", unsafe { sys::cuInit(0) })?;
        let mut count = 0;
        // SAFETY: as above.
        setup("cuDeviceGetCount", unsafe {
            sys::cuDeviceGetCount(&mut count)
        })?;
        Ok(u32::try_from(count).unwrap_or(0))
    }

    /// Sets up the CUDA device `ordinal` (0 is the first GPU the driver sees).
    ///
    /// On a machine with several GPUs, the device's virtual-memory mappings are opened to every
    /// GPU that can access its memory (`cuDeviceCanAccessPeer`), so copies between devices
    /// ([`devcmd::Command::copy_from`]) read them; one GPU changes nothing.
    ///
    /// First checks, without any call that could panic, that the driver library loads, has every
    /// function the shim calls and is not older than the bindings (see the `driver` module);
    /// then `cuInit`, the device, its facts, and retains its primary context.
    ///
    /// # Errors
    ///
    /// [`CudaInitError`]: on a machine without the NVIDIA driver, `NoDriver`, whose message starts
    /// with "no CUDA driver found: " and names the libraries tried and what to do.
    pub fn new(ordinal: u32) -> Result<Self, CudaInitError> {
        let driver_version = driver::load()?;
        // SAFETY: every function called below was checked to exist by `driver::load`; each
        // pointer passed is valid for the write the call makes.
        setup("cuInit", unsafe { sys::cuInit(0) })?;
        let mut count = 0;
        // SAFETY: as above.
        setup("cuDeviceGetCount", unsafe {
            sys::cuDeviceGetCount(&mut count)
        })?;
        let no_device = CudaInitError::NoDevice {
            ordinal: i32::try_from(ordinal).unwrap_or(i32::MAX),
            count,
        };
        let Ok(ord) = i32::try_from(ordinal) else {
            return Err(no_device);
        };
        if ord >= count {
            return Err(no_device);
        }
        let mut dev = 0;
        // SAFETY: as above; `ord` is a valid ordinal (below the count).
        setup("cuDeviceGet", unsafe { sys::cuDeviceGet(&mut dev, ord) })?;
        let mut name: [std::ffi::c_char; 256] = [0; 256];
        // SAFETY: the buffer holds 256 bytes, the length passed; the driver NUL-terminates.
        setup("cuDeviceGetName", unsafe {
            sys::cuDeviceGetName(name.as_mut_ptr(), name.len() as i32, dev)
        })?;
        // SAFETY: `name` is NUL-terminated (the driver writes at most len - 1 bytes and a NUL;
        // the buffer started zeroed, so a NUL exists even if it did not).
        let name = unsafe { CStr::from_ptr(name.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        let mut total = 0usize;
        // SAFETY: as above.
        setup("cuDeviceTotalMem_v2", unsafe {
            sys::cuDeviceTotalMem_v2(&mut total, dev)
        })?;
        use sys::CUdevice_attribute as A;
        let integrated = attribute(dev, A::CU_DEVICE_ATTRIBUTE_INTEGRATED)? == 1;
        let can_map_host = attribute(dev, A::CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY)? == 1;
        let max_pitch = attribute(dev, A::CU_DEVICE_ATTRIBUTE_MAX_PITCH)?;
        let cc_major = attribute(dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let cc_minor = attribute(dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        let host_register = attribute(dev, A::CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED)? == 1;
        let read_only_register = attribute(
            dev,
            A::CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED,
        )? == 1;
        // Optional: a device or driver that cannot answer has no virtual memory (granule 0).
        let vmm = attribute(
            dev,
            A::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
        )
        .is_ok_and(|v| v == 1);
        let mut raw = ptr::null_mut();
        // SAFETY: as above.
        setup("cuDevicePrimaryCtxRetain", unsafe {
            sys::cuDevicePrimaryCtxRetain(&mut raw, dev)
        })?;
        // From here the `Context` releases the retain when it drops, error or not.
        let ctx = Arc::new(Context {
            raw,
            device: dev,
            events: Mutex::new(Vec::new()),
            notifiers: Mutex::new(Vec::new()),
            peers: Mutex::new(Vec::new()),
        });
        ctx.bind(ShimOp::StreamCreate)
            .map_err(|e| CudaInitError::Call {
                call: "cuCtxSetCurrent",
                status: e.status,
            })?;
        let total_memory = total as u64;
        // With the context current: the granularity query needs an initialised driver.
        let vm_granule = vm::granule(dev, vmm);
        let readers = vm::readers(dev, count);
        Ok(Self {
            ctx,
            readers,
            ordinal,
            name,
            driver_version,
            facts: DeviceFacts::new(total_memory, PAGE_ALIGNMENT)
                .with_integrated(integrated)
                .with_can_map_host(can_map_host)
                .with_vm_granule(vm_granule),
            max_pitch: u64::try_from(max_pitch).unwrap_or(0),
            compute_capability: (
                u32::try_from(cc_major).unwrap_or(0),
                u32::try_from(cc_minor).unwrap_or(0),
            ),
            host_register,
            read_only_register,
            poison: false,
            copies: Arc::new(CopyWorkers::new(CopyWorkers::default_threads())),
        })
    }

    /// This shim, poisoning freed pages when `yes` (off by default; clones keep the setting):
    /// [`Shim::device_free`] fills the page with [`POISON_BYTE`](crate::POISON_BYTE)
    /// (`cuMemsetD8` on the legacy default stream, waited for with `cuStreamSynchronize`)
    /// before `cuMemFree`, and [`Shim::host_free_pinned`] fills the host page before
    /// `cuMemFreeHost`.
    ///
    /// Legal because the contract lets nothing use a page when it is freed. The fill runs at
    /// once, beside the shim's streams (they are non-blocking: they never wait for the legacy
    /// stream, nor it for them), so work that still reads or writes a page the core let go too
    /// early sees or leaves the poison instead of plausible old bytes: the conformance suite's
    /// poison mode (`devcmd-tests`' `CudaHarness`). Unlike the std shim, it keeps no quarantine
    /// of freed pages: the driver may hand the same memory out again at once. Costs a device
    /// round trip per free: for tests, not for serving.
    pub fn with_poison(mut self, yes: bool) -> Self {
        self.poison = yes;
        self
    }

    /// This shim with `n` host threads helping with staging copies ([`Shim::host_copy`]: the
    /// staging copy of a pipelined upload or read, which one thread cannot run at the DMA
    /// engine's speed); 0 copies on the caller's thread only. Default
    /// [`CopyWorkers::default_threads`]. Clones made after this share the new threads; the
    /// threads start with the first copy large enough to split.
    pub fn with_copy_threads(mut self, n: usize) -> Self {
        self.copies = Arc::new(CopyWorkers::new(n));
        self
    }

    /// This shim with `workers` for its staging copies (a pool set up beyond its thread count,
    /// [`CopyWorkers::streaming`]).
    pub fn with_copy_workers(mut self, workers: CopyWorkers) -> Self {
        self.copies = Arc::new(workers);
        self
    }

    /// Whether freed pages are poisoned ([`Self::with_poison`]).
    pub fn poisons(&self) -> bool {
        self.poison
    }

    /// The device's ordinal.
    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }

    /// The device's name (`cuDeviceGetName`), e.g. "NVIDIA H200".
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The driver's CUDA version (`cuDriverGetVersion`: `13000` is CUDA 13.0).
    pub fn driver_version(&self) -> i32 {
        self.driver_version
    }

    /// The CUDA version of the bindings the crate was built with (see the crate's features).
    pub fn binding_version(&self) -> i32 {
        driver::BINDING_VERSION
    }

    /// The device's primary context (`CUcontext`), for code that calls the driver itself.
    pub fn cu_context(&self) -> sys::CUcontext {
        self.ctx.raw
    }

    /// The device's compute capability, `(major, minor)`: `(9, 0)` for the H100 and H200,
    /// `(8, 7)` for Jetson Orin. [`Self::compile`] compiles for it.
    pub fn compute_capability(&self) -> (u32, u32) {
        self.compute_capability
    }

    /// Whether `stream` is recording into a graph (an active or an invalidated capture:
    /// `cuStreamIsCapturing`).
    pub fn is_capturing(&self, stream: &CudaStream) -> Result<bool, DriverError> {
        self.bound(ShimOp::GraphBegin)?;
        graph::is_capturing(stream)
    }

    /// Whether a stream of this process records into a graph now (begun through any
    /// `CudaShim`, of this device or another, and not yet ended): any call that allocates or
    /// frees device memory (`cuMemAlloc`, a library creating its handle) would then invalidate
    /// that recording, since captures run in global mode, which is process-wide.
    pub fn is_any_stream_capturing(&self) -> bool {
        crate::recording::any()
    }

    /// The context (not bound).
    pub(crate) fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// The context, checked current on this thread, for a call of `op`.
    pub(crate) fn bound(&self, op: ShimOp) -> Result<&Arc<Context>, DriverError> {
        self.ctx.bind(op)?;
        Ok(&self.ctx)
    }
}

impl Shim for CudaShim {
    type Stream = CudaStream;
    type Event = CudaEvent;
    type DevicePage = CudaDevicePage;
    type HostPage = CudaHostPage;
    /// A kernel of a module compiled with [`CudaShim::compile`] or loaded with
    /// [`CudaShim::load_module`].
    type Kernel = CudaKernel;
    type Registration = CudaRegistration;
    /// An instantiated graph, recorded by stream capture.
    type Graph = CudaGraph;
    /// The `CUstream` under a stream: cuBLAS, TensorRT and any CUDA library enqueue on it.
    type NativeStream = sys::CUstream;

    fn kernel_name(&self, kernel: &CudaKernel) -> &'static str {
        kernel.name()
    }

    /// The stream's `CUstream`, with the shim's context made current on the calling thread
    /// first (libraries built on the CUDA runtime, cuBLAS among them, act on the current
    /// context). A failed bind is not reported here: the library's call then fails and says so.
    fn native_stream<'a>(&self, stream: &'a CudaStream) -> &'a sys::CUstream {
        let _ = self.ctx.bind(ShimOp::Launch);
        stream.raw_ref()
    }

    /// A stream over `native`, a `CUstream` the caller's runtime created (TensorRT's, PyTorch's),
    /// after `cuStreamGetCtx` showed it belongs to the shim's context; never destroyed by the
    /// shim. The legacy default stream (null) is accepted (no graph can be recorded on it:
    /// CUDA refuses the capture); the per-thread default stream (`CU_STREAM_PER_THREAD`) is
    /// refused ([`status::BAD_ARGUMENT`](crate::status::BAD_ARGUMENT)), and a stream of another
    /// context is `CUDA_ERROR_INVALID_CONTEXT`.
    unsafe fn borrow_stream(&self, native: &sys::CUstream) -> Result<CudaStream, DriverError> {
        let ctx = self.bound(ShimOp::StreamCreate)?;
        // SAFETY: `borrow_stream`'s contract: a live stream that outlives the returned one.
        unsafe { stream::borrow(ctx, *native) }
    }

    fn facts(&self) -> DeviceFacts {
        self.facts
    }

    fn classify(&self, op: ShimOp, status: i32) -> DriverError {
        classify(op, status)
    }

    fn create_stream(&self) -> Result<CudaStream, DriverError> {
        stream::create(self.bound(ShimOp::StreamCreate)?)
    }

    fn stream_wait_event(&self, stream: &CudaStream, event: &CudaEvent) -> Result<(), DriverError> {
        self.bound(ShimOp::StreamWaitEvent)?;
        stream::wait_event(stream, event)
    }

    fn record_event(&self, stream: &CudaStream) -> Result<CudaEvent, DriverError> {
        stream::record(self.bound(ShimOp::EventRecord)?, stream)
    }

    /// `cuEventQuery`: `CUDA_ERROR_NOT_READY` is `Ok(false)`, not an error. `Ok(false)` without
    /// the driver while a stream of the process records (`recording.rs`): the query would spoil
    /// that recording; the caller polls again later.
    fn event_query(&self, event: &CudaEvent) -> Result<bool, DriverError> {
        if recording::any() {
            return Ok(false);
        }
        self.bound(ShimOp::EventQuery)?;
        stream::query(event)
    }

    /// `cuEventSynchronize`. Refused before the driver (status 900) while a stream of the process
    /// records (`recording.rs`).
    fn event_wait(&self, event: &CudaEvent) -> Result<(), DriverError> {
        recording::refuse_while_any(ShimOp::EventWait)?;
        self.bound(ShimOp::EventWait)?;
        stream::synchronize(event)
    }

    /// `cuStreamWaitEvent` on the notifier stream of the event's stream, then
    /// `cuStreamAddCallback` behind it, which wakes the latest waker once the event completed
    /// (`notify.rs`); `false` (the core polls) while a stream of the process records.
    fn event_notify(&self, event: &CudaEvent, waker: &std::task::Waker) -> bool {
        // While a stream of the process records (global capture mode), no call beside it.
        if self.is_any_stream_capturing() || self.bound(ShimOp::EventQuery).is_err() {
            return false;
        }
        crate::notify::notify(&self.ctx, event, waker)
    }

    /// `cuMemAlloc`. A zero size allocates one aligned unit (every page has its own address); a
    /// size past the device's total memory is [`devcmd::Fault::TooBig`] without a driver call.
    /// Refused before the driver (status 900) while a stream of the process records
    /// (`recording.rs`).
    fn device_alloc(&self, size: u64) -> Result<CudaDevicePage, DriverError> {
        recording::refuse_while_any(ShimOp::DeviceAlloc)?;
        self.bound(ShimOp::DeviceAlloc)?;
        memory::device_alloc(size, self.facts.total_memory)
    }

    fn device_page_addr(&self, page: &CudaDevicePage) -> DeviceAddr {
        page.addr()
    }

    /// `cuMemAddressReserve` of `size` bytes aligned to the granule. A size of no granules or
    /// not a multiple is refused before the driver
    /// ([`status::BAD_ARGUMENT`](crate::status::BAD_ARGUMENT)); without virtual memory (a
    /// granule of 0), [`unsupported`].
    fn vm_reserve(&self, size: u64) -> Result<DeviceAddr, DriverError> {
        const OP: ShimOp = ShimOp::VmReserve;
        if self.facts.vm_granule == 0 {
            return Err(unsupported(OP));
        }
        self.bound(OP)?;
        vm::reserve(size, self.facts.vm_granule)
    }

    /// `cuMemAddressFree`.
    unsafe fn vm_release(&self, addr: DeviceAddr, size: u64) {
        if self.facts.vm_granule == 0 {
            return; // Nothing was ever reserved.
        }
        // SAFETY: `vm_release`'s contract: a reservation of this shim with nothing mapped in it.
        unsafe { recording::release(&self.ctx, Release::Reservation { addr, size }) }
    }

    /// `cuMemCreate` of pinned memory on this device, `cuMemMap` at `addr`, `cuMemSetAccess`
    /// (read and write from this device); on a failure, what succeeded is undone, so nothing
    /// stays mapped. Returns the `CUmemGenericAllocationHandle`. A size past the device's memory
    /// is [`devcmd::Fault::TooBig`] without a driver call; `CUDA_ERROR_OUT_OF_MEMORY` is a
    /// shortage; without virtual memory, [`unsupported`].
    fn vm_map(&self, addr: DeviceAddr, size: u64) -> Result<u64, DriverError> {
        const OP: ShimOp = ShimOp::VmMap;
        if self.facts.vm_granule == 0 {
            return Err(unsupported(OP));
        }
        self.bound(OP)?;
        vm::map(
            addr,
            size,
            self.facts.vm_granule,
            &self.readers,
            self.facts.total_memory,
        )
    }

    /// `cuMemUnmap`, then `cuMemRelease` of the allocation `memory`; in poison mode the range is
    /// filled with [`POISON_BYTE`](crate::POISON_BYTE) first, as a freed page is.
    unsafe fn vm_unmap(&self, addr: DeviceAddr, size: u64, memory: u64) {
        if self.facts.vm_granule == 0 {
            return; // Nothing was ever mapped.
        }
        let mapping = Release::Mapping {
            addr,
            size,
            handle: memory,
            poison: self.poison,
        };
        // SAFETY: `vm_unmap`'s contract: one `vm_map` call's range and handle, unused.
        unsafe { recording::release(&self.ctx, mapping) }
    }

    unsafe fn device_free(&self, page: CudaDevicePage) {
        // SAFETY: `device_free`'s contract: no pending work uses the page, so the poison fill
        // races with nothing the core let run.
        unsafe { recording::release(&self.ctx, Release::DevicePage(page, self.poison)) }
    }

    /// `cuMemHostAlloc` with `CU_MEMHOSTALLOC_PORTABLE`, plus `CU_MEMHOSTALLOC_DEVICEMAP` where
    /// the device can map host memory. Never write-combined: the host reads the pages back.
    /// Refused before the driver (status 900) while a stream of the process records
    /// (`recording.rs`).
    fn host_alloc_pinned(&self, size: usize) -> Result<CudaHostPage, DriverError> {
        recording::refuse_while_any(ShimOp::HostAlloc)?;
        let context = self.bound(ShimOp::HostAlloc)?;
        memory::host_alloc(context, size, self.facts.can_map_host)
    }

    fn host_page_ptr(&self, page: &CudaHostPage) -> NonNull<u8> {
        page.ptr()
    }

    /// The page's device address (`cuMemHostGetDevicePointer`) where the device maps host
    /// memory (every pinned page is allocated `CU_MEMHOSTALLOC_DEVICEMAP` there). Whether device
    /// memory is then served from such pages (zero copy) is the core's decision
    /// (`DeviceConfig::zero_copy`), not the shim's.
    fn host_page_device_addr(&self, page: &CudaHostPage) -> Option<DeviceAddr> {
        page.mapped()
    }

    unsafe fn host_free_pinned(&self, page: CudaHostPage) {
        // SAFETY: `host_free_pinned`'s contract: no pending copy uses the page, and the core
        // holds no reference into it any more.
        unsafe { recording::release(&self.ctx, Release::HostPage(page, self.poison)) }
    }

    /// `cuMemHostRegister` (portable; read-only where the device supports it, so a weights file
    /// mapped `PROT_READ` registers too: the core registers only bytes the device reads) where
    /// the device supports it (`CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED`);
    /// [`devcmd::Fault::Unsupported`] elsewhere. Refused before the driver (status 900) while a
    /// stream of the process records (`recording.rs`).
    fn host_register(&self, ptr: NonNull<u8>, len: usize) -> Result<CudaRegistration, DriverError> {
        if !self.host_register {
            return Err(unsupported(ShimOp::HostRegister));
        }
        recording::refuse_while_any(ShimOp::HostRegister)?;
        self.bound(ShimOp::HostRegister)?;
        memory::host_register(ptr, len, self.read_only_register)
    }

    unsafe fn host_unregister(&self, registration: CudaRegistration) {
        // SAFETY: `host_unregister`'s contract: no pending copy uses the memory.
        unsafe { recording::release(&self.ctx, Release::Registration(registration)) }
    }

    /// Split among the shim's copy threads ([`CudaShim::with_copy_threads`]).
    unsafe fn host_copy(&self, dst: *mut u8, src: *const u8, len: usize, kind: HostCopy) {
        // SAFETY: `host_copy`'s contract is `CopyWorkers::copy`'s.
        unsafe { self.copies.copy(dst, src, len, kind) }
    }

    /// `cuMemcpyHtoDAsync` for a linear layout, `cuMemcpy2DAsync` for a pitched one (row by row
    /// where the pitch passes the device's `MAX_PITCH`). The driver itself tells pageable from
    /// page-locked memory: a pageable source is staged by the driver (slower, see BENCHMARKS.md).
    unsafe fn copy_to_device(
        &self,
        stream: &CudaStream,
        src: *const u8,
        _src_memory: HostMemory,
        dst: DeviceAddr,
        layout: CopyLayout,
    ) -> Result<(), DriverError> {
        const OP: ShimOp = ShimOp::CopyHostToDevice;
        if layout.packed_bytes() == 0 {
            return Ok(());
        }
        self.bound(OP)?;
        let src = Side::Host(src.cast_mut());
        // SAFETY: `copy_to_device`'s contract: the host bytes and the device span are valid
        // until an event recorded after this call completes.
        unsafe { memory::copy(OP, stream, src, Side::Device(dst.0), layout, self.max_pitch) }
    }

    /// `cuMemcpyDtoHAsync` for a linear layout, `cuMemcpy2DAsync` for a pitched one. The copy is
    /// asynchronous only when `dst` is pinned; CUDA makes it synchronous for pageable memory.
    unsafe fn copy_to_host(
        &self,
        stream: &CudaStream,
        src: DeviceAddr,
        dst: *mut u8,
        _dst_memory: HostMemory,
        layout: CopyLayout,
    ) -> Result<(), DriverError> {
        const OP: ShimOp = ShimOp::CopyDeviceToHost;
        if layout.packed_bytes() == 0 {
            return Ok(());
        }
        self.bound(OP)?;
        // SAFETY: `copy_to_host`'s contract: the host bytes and the device span are valid until
        // an event recorded after this call completes, and nothing else touches the host bytes.
        unsafe {
            memory::copy(
                OP,
                stream,
                Side::Device(src.0),
                Side::Host(dst),
                layout,
                self.max_pitch,
            )
        }
    }

    /// `cuMemcpyDtoDAsync` for a linear layout, `cuMemcpy2DAsync` for a pitched one.
    unsafe fn copy_on_device(
        &self,
        stream: &CudaStream,
        src: DeviceAddr,
        dst: DeviceAddr,
        layout: CopyLayout,
    ) -> Result<(), DriverError> {
        const OP: ShimOp = ShimOp::CopyDeviceToDevice;
        if layout.packed_bytes() == 0 {
            return Ok(());
        }
        self.bound(OP)?;
        // SAFETY: `copy_on_device`'s contract: both spans lie in live device pages.
        unsafe {
            memory::copy(
                OP,
                stream,
                Side::Device(src.0),
                Side::Device(dst.0),
                layout,
                self.max_pitch,
            )
        }
    }

    /// Another `CudaShim` of the same GPU (the same primary context) always; of another GPU
    /// where `cuDeviceCanAccessPeer` says yes, enabling peer access (`cuCtxEnablePeerAccess`)
    /// the first time, remembered per pair. Events of one context are waited by streams of the
    /// other with `cuStreamWaitEvent`, which works across contexts.
    fn peer_access(&self, src: &CudaShim) -> bool {
        crate::peer::access(&self.ctx, &src.ctx)
    }

    /// A plain device-to-device copy within one context (`cuMemcpyDtoDAsync`), else
    /// `cuMemcpyPeerAsync` on `stream`.
    unsafe fn copy_peer(
        &self,
        stream: &CudaStream,
        dst: DeviceAddr,
        src_device: &CudaShim,
        src: DeviceAddr,
        len: u64,
    ) -> Result<(), DriverError> {
        // SAFETY: `copy_peer`'s contract is `peer::copy`'s.
        unsafe { crate::peer::copy(self, stream, dst, src_device, src, len) }
    }

    /// `cuLaunchKernel` with the parameters in the kernel's order: a `Buffer(slot)` passes the
    /// 64-bit address of `buffers[slot]`, a `Scalar` its bytes. Refused before the driver with
    /// [`status::PARAM_MISMATCH`](crate::status::PARAM_MISMATCH) when the kernel's parameter
    /// sizes are known and differ ([`CudaKernel::check_params`] says how), and with
    /// [`status::BAD_ARGUMENT`](crate::status::BAD_ARGUMENT) for a kernel of another context.
    /// No heap allocation for up to [`STACK_PARAMS`](crate::STACK_PARAMS) parameters.
    unsafe fn launch(
        &self,
        stream: &CudaStream,
        kernel: &CudaKernel,
        dims: LaunchDims,
        buffers: &[DeviceSpan],
        params: &[KernelParam<'_>],
    ) -> Result<(), DriverError> {
        // Not bound first: a launch runs in its stream's context (see
        // `Context::launch_unbound`).
        let ctx = &*self.ctx;
        ctx.launch_unbound(ShimOp::Launch, stream, || {
            // SAFETY: `launch`'s contract: the spans lie in live pages and the kernel stays
            // inside them; the stream and the kernel are of the shim's context.
            unsafe { kernel::launch(ctx, stream, kernel, dims, buffers, params) }
        })
    }

    /// `cuStreamBeginCapture` in global mode: a call of any thread that is illegal while the
    /// stream records fails and invalidates the capture. End the capture on the same thread
    /// (see [`CudaGraph`]).
    fn begin_capture(&self, stream: &CudaStream) -> Result<(), DriverError> {
        self.bound(ShimOp::GraphBegin)?;
        graph::begin(stream)
    }

    /// `cuStreamEndCapture`, then `cuGraphInstantiateWithFlags` (the template graph is destroyed
    /// either way). `doomed` discards the recording
    /// ([`status::CAPTURE_DOOMED`](crate::status::CAPTURE_DOOMED)); an invalidated capture is
    /// `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`. The stream no longer records after any
    /// answer, `CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD` included (an end on another thread than
    /// the one that began the capture is refused and loses the recording).
    fn end_capture(&self, stream: &CudaStream, doomed: bool) -> Result<CudaGraph, DriverError> {
        let ctx = self
            .bound(ShimOp::GraphEnd)
            .inspect_err(|_| graph::discard(stream))?;
        graph::end(ctx, stream, doomed)
    }

    /// `cuStreamEndCapture`, then `cuGraphExecUpdate` of `graph` (the same topology: updated in
    /// place, `None`), or else `cuGraphInstantiateWithFlags` (`Some`). As
    /// [`Shim::end_capture`] otherwise.
    fn end_capture_update(
        &self,
        stream: &CudaStream,
        doomed: bool,
        graph: &CudaGraph,
    ) -> Result<Option<CudaGraph>, DriverError> {
        let ctx = self
            .bound(ShimOp::GraphEnd)
            .inspect_err(|_| graph::discard(stream))?;
        graph::end_update(ctx, stream, doomed, graph)
    }

    /// `cuGraphUpload`.
    fn graph_upload(&self, graph: &CudaGraph, stream: &CudaStream) -> Result<(), DriverError> {
        self.bound(ShimOp::GraphUpload)?;
        graph::upload(graph, stream)
    }

    /// `cuGraphLaunch`.
    unsafe fn graph_launch(
        &self,
        graph: &CudaGraph,
        stream: &CudaStream,
    ) -> Result<(), DriverError> {
        // Not bound first, as a kernel's launch (see `Context::launch_unbound`).
        self.ctx.launch_unbound(ShimOp::GraphLaunch, stream, || {
            // SAFETY: `graph_launch`'s contract: everything the recording touched is alive.
            unsafe { graph::launch(graph, stream) }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// On a machine without the driver (CI, this crate's build machines), `new` is the clear
    /// error, never a panic; where a driver loads, the GPU tests (`tests/gpu.rs`) cover `new`.
    #[test]
    fn without_a_driver_new_is_the_clear_error_never_a_panic() {
        if let Some(lib) = driver::driver_library() {
            let _ = writeln!(
                std::io::stderr(),
                "skipped: a CUDA driver library loads here ({lib}); tests/gpu.rs covers it"
            );
            return;
        }
        for ordinal in [0, 1, u32::MAX] {
            let e = CudaShim::new(ordinal).unwrap_err();
            assert!(e.is_no_driver(), "{e:?}");
            let msg = e.to_string();
            assert!(msg.starts_with("no CUDA driver found: "), "{msg}");
            assert!(msg.contains("libcuda.so.1"), "{msg}");
            assert!(msg.contains("Install the NVIDIA driver"), "{msg}");
        }
    }
}
