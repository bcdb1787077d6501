//! devcmd-cuda: an NVIDIA GPU for [`devcmd`], on the CUDA driver API through
//! [cudarc](https://crates.io/crates/cudarc) (pinned `=0.19.10`, its thin `result`/`sys` layers
//! only).
//!
//! [`CudaShim`] implements the calls of [`devcmd::Shim`] on one device's primary context:
//!
//! | call | CUDA |
//! |---|---|
//! | [`Shim::facts`] | `cuDeviceTotalMem`; alignment 256; largest page = total memory; `integrated` and `can_map_host` from `CU_DEVICE_ATTRIBUTE_INTEGRATED` and `CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY`; `vm_granule` from `cuMemGetAllocationGranularity` (minimum, pinned memory on this device) where `CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`, else 0 |
//! | [`Shim::create_stream`] | `cuStreamCreate(CU_STREAM_NON_BLOCKING)` |
//! | [`Shim::native_stream`] | the stream's `CUstream` ([`Shim::NativeStream`] is `CUstream`), the context made current first (cuBLAS and other runtime-API libraries act on the current context) |
//! | [`Shim::borrow_stream`] | the caller's `CUstream`, checked to be of the shim's context with `cuStreamGetCtx`; never destroyed ([`CudaStream::is_borrowed`]); the per-thread default stream refused |
//! | [`Shim::record_event`] | `cuEventRecord` of a pooled `CU_EVENT_DISABLE_TIMING` event |
//! | [`Shim::stream_wait_event`] | `cuStreamWaitEvent` |
//! | [`Shim::event_query`] | `cuEventQuery` (`CUDA_ERROR_NOT_READY` is `Ok(false)`) |
//! | [`Shim::event_wait`] | `cuEventSynchronize` |
//! | [`Shim::event_notify`] | `cuStreamWaitEvent` on a notifier stream, then `cuStreamAddCallback`, which wakes the future's latest waker |
//! | [`Shim::device_alloc`], [`Shim::device_free`] | `cuMemAlloc`, `cuMemFree` |
//! | [`Shim::vm_reserve`], [`Shim::vm_release`] | `cuMemAddressReserve` (aligned to the granule), `cuMemAddressFree` |
//! | [`Shim::vm_map`], [`Shim::vm_unmap`] | `cuMemCreate` (pinned, on this device) + `cuMemMap` + `cuMemSetAccess` (read and write, this device), undoing what succeeded on a failure; the handle is the `CUmemGenericAllocationHandle`. `cuMemUnmap` + `cuMemRelease` |
//! | [`Shim::host_alloc_pinned`], [`Shim::host_free_pinned`] | `cuMemHostAlloc` (portable; device-mapped where the device maps host memory; never write-combined), `cuMemFreeHost` |
//! | poisoned frees ([`CudaShim::with_poison`], for tests) | `cuMemsetD8` + `cuStreamSynchronize` of the legacy stream before `cuMemFree` and before `cuMemUnmap`; a host fill before `cuMemFreeHost` |
//! | [`Shim::host_register`], [`Shim::host_unregister`] | `cuMemHostRegister` (portable) where `CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED`, `cuMemHostUnregister` |
//! | [`Shim::host_page_device_addr`] | `cuMemHostGetDevicePointer`, wherever the device maps host memory (the core decides whether to run zero copy on it: `DeviceConfig::zero_copy`) |
//! | [`Shim::copy_to_device`], [`Shim::copy_to_host`], [`Shim::copy_on_device`] | `cuMemcpy{HtoD,DtoH,DtoD}Async` for linear layouts, `cuMemcpy2DAsync` for pitched ones |
//! | [`Shim::launch`] | `cuLaunchKernel`, parameters in the kernel's order; their number and sizes checked against `cuFuncGetParamInfo` where the bindings (CUDA ≥ 12.4) and the driver have it ([`CudaKernel`]) |
//! | [`Shim::begin_capture`], [`Shim::end_capture`] | `cuStreamBeginCapture` (global mode), `cuStreamEndCapture`, `cuGraphInstantiateWithFlags` ([`CudaGraph`]) |
//! | [`Shim::end_capture_update`] | `cuStreamEndCapture`, then `cuGraphExecUpdate_v2` (the same topology) or a new instantiation |
//! | [`Shim::graph_upload`], [`Shim::graph_launch`] | `cuGraphUpload`, `cuGraphLaunch` |
//!
//! Captures run in global mode, which is the process's: while any stream of the process records
//! (through this shim or another `CudaShim`, of this device or another), a host wait, an
//! allocation or a free from any thread would be refused by the driver and spoil that recording
//! (`recording.rs` lists what was seen refused and taken). So while one records, the shim holds
//! the releases the driver refuses (`cuMemFree`, `cuMemFreeHost`, `cuMemHostUnregister`,
//! `cuModuleUnload`, `cuMemAddressFree`, a poisoned unmap) until the process's last recording
//! ends ([`releases_waiting`] counts them); an event query answers "not yet"; and a host wait or
//! an allocation (`cuEventSynchronize`, `cuMemAlloc`, `cuMemHostAlloc`, `cuMemHostRegister`,
//! `cuCtxEnablePeerAccess`) is refused before the driver with the driver's status (900), so the
//! recording stays valid. Virtual memory calls (granules mapped and unmapped) go on beside a
//! recording.
//!
//! Kernels are compiled or loaded once, at start-up: [`CudaShim::compile`] compiles CUDA C with
//! NVRTC (loaded at run time like the driver, and checked first: without it, a clear
//! "NVRTC not found" error, never a panic) for the device's own architecture;
//! [`CudaShim::load_ptx`] (safe) and [`CudaShim::load_module`] (unsafe: a cubin or fatbin must be
//! well formed, the driver trusts its headers) load code built ahead of time, with no NVRTC
//! (the way on Jetson). [`CudaModule::kernel`] finds a kernel by name.
//!
//! ```no_run
//! use devcmd::{KernelParam, LaunchDims, Shim};
//! use devcmd_cuda::CudaShim;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let gpu = CudaShim::new(0)?;
//! let module = gpu.compile(
//!     r#"extern "C" __global__ void scale(float* x, float k, unsigned long long n) {
//!         unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
//!         if (i < n) x[i] *= k;
//!     }"#,
//!     &[],
//! )?;
//! // Sizes read from the driver (CUDA >= 12.4 bindings), or declared where it cannot tell:
//! let scale = module.kernel("scale").or_else(|_| module.kernel_with_sizes("scale", &[8, 4, 8]))?;
//! assert_eq!(scale.param_sizes(), [8, 4, 8]);
//! # let (stream, page) = (gpu.create_stream()?, gpu.device_alloc(4096)?);
//! # let buffers = [devcmd::DeviceSpan { addr: gpu.device_page_addr(&page), len: 4096 }];
//! let (k, n) = (2.0f32.to_ne_bytes(), 1024u64.to_ne_bytes());
//! let params = [KernelParam::Buffer(0), KernelParam::Scalar(&k), KernelParam::Scalar(&n)];
//! // SAFETY: `buffers[0]` is a live page of 1024 floats.
//! unsafe { gpu.launch(&stream, &scale, LaunchDims::covering(1024, 256), &buffers, &params)? };
//! # Ok(())
//! # }
//! ```
//!
//! # Library work: cuBLAS, and any CUDA library
//!
//! [`Cublas`] runs cuBLAS GEMMs (f32, and f16 with fp32 accumulation; any other cuBLAS routine
//! through [`Cublas::call`]) as library work ([`devcmd::Command::library`]): ordered after other
//! streams' work on their operands, skipped when an input failed, recorded into graphs, a cuBLAS
//! status kept in the failure of what the call writes. cuBLAS is loaded at run time like the
//! driver (a clear [`CublasInitError::NotFound`] without it, never a panic), with one handle per
//! devcmd stream and a workspace that is a devcmd allocation declared as a write of each call
//! (see the [`cublas`] module). Any other CUDA library (TensorRT's `enqueueV3`, cuDNN) is
//! called the same way from [`devcmd::Command::library`], on the `CUstream` it hands over; and a
//! stream that library's runtime owns can become a devcmd stream
//! ([`devcmd::Device::borrow_stream`]).
//!
//! Every error is built by [`classify`] from the `CUresult` (the table is in [`faults`]):
//! CUDA's sticky errors lose the device, `CUDA_ERROR_OUT_OF_MEMORY` is a shortage, and so on.
//!
//! # Threads
//!
//! Every call binds the device's primary context to the calling thread where the call depends
//! on it (see [`CudaShim`]: a launch runs in its stream's context and binds only when needed),
//! so the shim, its streams and its events may be used and dropped on any thread.
//!
//! # Building: no CUDA needed
//!
//! The driver library (`libcuda.so.1`), NVRTC (`libnvrtc.so.N`) for [`CudaShim::compile`] and
//! cuBLAS (`libcublas.so.N`) for [`Cublas`] are loaded with `dlopen` at run time (cudarc's
//! `dynamic-loading`): building, linting, documenting and running the unit tests need no CUDA
//! toolkit and no driver, and the binaries link only libc. cudarc's build script reads no
//! toolkit either: the binding version comes from a feature.
//!
//! # After a device fault
//!
//! A kernel that traps or touches a bad address surfaces as
//! [`Fault::DeviceLost`](devcmd::Fault::DeviceLost) (`CUDA_ERROR_LAUNCH_FAILED`, 719, for a
//! trap) at the next fence; its launch itself succeeds. From then on every call of the shim
//! answers the same. **The process does not recover**: seen on the H200 (driver 580.159.04,
//! CUDA 13.0), a second [`CudaShim::new`] while the first lives succeeds but shares the lost
//! context (its work fails with 719); once every handle is dropped, `CudaShim::new` fails with
//! 719 in `cuDevicePrimaryCtxRetain`, and so do a context of its own (`cuCtxCreate`) and
//! `CudaShim::new` after `cuDevicePrimaryCtxReset` (which itself succeeds). A new process runs
//! normally. So a server keeps the device in a process it can restart (`tests/trap.rs`).
//!
//! # Binding versions: exactly one feature
//!
//! The CUDA version of the bindings (the struct layouts and entry points cudarc declares) is
//! chosen by **exactly one** of these features; the default is `cuda-13000`.
//!
//! | feature | bindings | for |
//! |---|---|---|
//! | `cuda-11040` | CUDA 11.4 | JetPack 5 (L4T r35: Xavier, Orin) |
//! | `cuda-12020` | CUDA 12.2 | JetPack 6.0 (L4T r36.3: Orin) |
//! | `cuda-12060` | CUDA 12.6 | JetPack 6.1 and 6.2 (L4T r36.4: Orin) |
//! | `cuda-13000` (default) | CUDA 13.0 | JetPack 7 (Thor), and x86_64 hosts with a CUDA 13 driver (the H200 host) |
//!
//! For another, turn the default off: `cargo build -p devcmd-cuda --no-default-features
//! --features cuda-11040`. Two at once make cudarc fail to compile (hundreds of conflicting
//! items), so do not build this crate with `--all-features`, and do not set cudarc's own
//! `CUDARC_CUDA_VERSION` variable (it adds a second version to the feature's). None at all
//! (`--no-default-features` alone) stops cudarc's build script with a list of its features.
//!
//! A driver runs bindings of its own CUDA version or older; [`CudaShim::new`] refuses a driver
//! older than the bindings ([`CudaInitError::DriverTooOld`], naming both versions and the
//! feature that fits), so pick the oldest version among the machines a binary must run on.
//!
//! For Jetson, the repository's `scripts/jetson-cross` cross-builds the `cuda-facts` example
//! (`examples/cuda-facts.rs`: prints what the shim sees of device 0) with `cuda-11040` for
//! `aarch64-unknown-linux-gnu`, linked for glibc 2.31 (JetPack 5), and runs it under
//! `qemu-aarch64`; the README's Jetson section explains the build.
//!
//! # Running without a driver
//!
//! On a machine without the NVIDIA driver, [`CudaShim::new`] returns
//! [`CudaInitError::NoDriver`] ("no CUDA driver found: …", naming the libraries tried and what to
//! do); it never panics, even though cudarc panics when its library or a symbol is missing: the
//! library and every function the shim calls are checked before the first call.
//!
//! ```
//! use devcmd::Shim;
//! use devcmd_cuda::CudaShim;
//!
//! match CudaShim::new(0) {
//!     Ok(gpu) => println!("{}: {:?}", gpu.name(), gpu.facts()),
//!     Err(e) => println!("{e}"), // "no CUDA driver found: ..." on a machine without one
//! }
//! ```
#![deny(missing_docs)]

pub mod cublas;
pub mod cublas_lt;
mod cublas_split;
mod device;
mod driver;
pub mod faults;
mod graph;
mod kernel;
mod memory;
mod notify;
mod nvrtc;
mod peer;
mod recording;
mod stream;
mod vm;

pub use cublas::{CUBLAS_SYMBOLS, Cublas, CublasInitError, cublas_library};
pub use cublas_lt::{LT_SETUP, LT_SYMBOLS};
pub use device::{CudaShim, PAGE_ALIGNMENT};
pub use driver::{
    BINDING_FEATURE, BINDING_VERSION, BINDINGS, CudaInitError, OPTIONAL_SYMBOLS, SYMBOLS,
    driver_library,
};
pub use faults::{classify, status};
pub use graph::CudaGraph;
pub use kernel::{
    CudaKernel, CudaKernelError, CudaModule, ImageFormat, PARAM_INFO_BINDINGS, STACK_PARAMS,
};
pub use memory::{CudaDevicePage, CudaHostPage, CudaRegistration, POISON_BYTE};
pub use nvrtc::NVRTC_SYMBOLS;
pub use recording::releases_waiting;
pub use stream::{CudaEvent, CudaStream};

#[cfg(doc)]
use devcmd::Shim;

/// The raw driver API (cudarc's `sys` bindings), for code that calls the driver next to the
/// shim: with the shim's context current ([`CudaShim::cu_context`]) and only functions the
/// driver has, since cudarc panics on a missing one.
pub use cudarc::driver::sys;

/// The raw cuBLAS API (cudarc's `cublas::sys` bindings), for code that calls cuBLAS next to
/// [`Cublas`] (a benchmark's direct call, a routine [`Cublas::call`] wraps): only after
/// [`Cublas::new`] succeeded (it loaded and checked the library) and only functions of
/// [`CUBLAS_SYMBOLS`], since cudarc panics on a missing one.
pub use cudarc::cublas::sys as cublas_sys;
