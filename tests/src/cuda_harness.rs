//! The harness of `devcmd-cuda`: the suite on an NVIDIA GPU ([`CudaHarness`]).
//!
//! Owns the four [`TestKernel`]s in CUDA C ([`CUDA_TEST_KERNELS`]), compiled once with NVRTC
//! when the harness is made, and the fresh [`CudaShim`] each device of the suite gets. Does not
//! own counters nor fault injection: run it as [`CountedHarness`]`(CudaHarness)` (why, below).
//!
//! # Modes
//!
//! - **normal**: a plain [`CudaShim`].
//! - **poison**: [`CudaShim::with_poison`]: every page given back is filled with
//!   [`devcmd_cuda::POISON_BYTE`] before it is freed (`cuMemsetD8` for device pages, a host fill
//!   for pinned ones), so work the core let go of too early reads or leaves the poison.
//! - **lazy** and **lazy + poison**: not offered ([`Harness::shim`] answers `None`): the
//!   hardware starts work as soon as it is enqueued, and no shim call can hold a CUDA stream back
//!   until one of its fences is asked about. The groups that need it are skipped, saying so.
//!
//! # Probe: the suite's [`Counted`](crate::Counted) wrapper
//!
//! [`CudaHarness::probe`](Harness::probe) is `None`; [`CountedHarness`] gives the counters and
//! every [`FaultRule`](crate::FaultRule) at the shim boundary, exactly as the harness contract
//! asks, without a line of fault injection in the production shim. The driver could not produce
//! most of those faults on demand anyway (nothing makes `cuEventRecord` or `cuMemAlloc` fail at
//! the n-th call), while the one fault of work that ran ([`FaultRule::WorkFails`]) is a real
//! one: `Counted` launches this harness's [`TestKernel::WriteThenFail`] after the call, and its
//! trap is a real `CUDA_ERROR_LAUNCH_FAILED` (719), reported as
//! [`Fault::DeviceLost`](devcmd::Fault::DeviceLost) at the later fences.
//!
//! # One trap per process
//!
//! After a kernel traps, CUDA's sticky error poisons the whole process: no new shim, context or
//! reset recovers (see `devcmd-cuda`'s crate docs). So each check that makes work fail (the
//! `work_faults` group, one [`Check`](crate::groups::work_faults::Check) and
//! [`Source`](crate::groups::work_faults::Source) at a time) needs a process of its own;
//! `tests/tests/conformance_cuda.rs` is laid out for that.
//!
//! [`FaultRule::WorkFails`]: crate::FaultRule::WorkFails

#[cfg(doc)]
use crate::CountedHarness;
use crate::harness::{Harness, Mode, SLOW_KERNEL_MS, TestKernel};
use crate::util::kernel_slot;
use devcmd::{DeviceSpan, LibraryError};
use devcmd_cuda::{CudaInitError, CudaKernel, CudaKernelError, CudaShim, sys};
use std::fmt;

/// How long [`TestKernel::WriteThenFail`] runs between its writes and its trap, in
/// milliseconds.
///
/// Once the driver has seen a trap it answers **every** call with the sticky error, not just the
/// fences. The suite enqueues a few calls after the failing work before it asks a fence (a
/// read, a write, a launch ordered after it); a kernel that trapped at once would race those
/// calls and make them fail at random. Trapping a while later keeps to what
/// [`TestKernel::WriteThenFail`] asks: the launch succeeds, the work fails while it runs, and the
/// failure surfaces at the fences after it.
pub const TRAP_DELAY_MS: u64 = 100;

/// The CUDA C of the four [`TestKernel`]s, with their signatures as [`TestKernel`] documents them.
/// Compiled with `-DDEVCMD_SLOW_NS=` ([`SLOW_KERNEL_MS`]) and `-DDEVCMD_TRAP_DELAY_NS=`
/// ([`TRAP_DELAY_MS`]), both in nanoseconds.
///
/// Every kernel covers its bytes with a grid-stride loop over whatever geometry it is launched
/// with (the suite launches [`TestArgs::dims`](crate::TestArgs::dims)). `slow_add` spins on
/// `%globaltimer` for [`SLOW_KERNEL_MS`] before it reads its input; `write_then_fail` writes,
/// spins for [`TRAP_DELAY_MS`], then traps (`__trap()`).
pub const CUDA_TEST_KERNELS: &str = r#"
typedef unsigned long long u64;

/* This thread's first byte and the grid's stride, over any grid and block shape. */
__device__ __forceinline__ u64 first_index() {
    u64 block = ((u64)blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
    u64 threads = (u64)blockDim.x * blockDim.y * blockDim.z;
    u64 thread = ((u64)threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
    return block * threads + thread;
}

__device__ __forceinline__ u64 grid_stride() {
    return (u64)gridDim.x * gridDim.y * gridDim.z * blockDim.x * blockDim.y * blockDim.z;
}

__device__ __forceinline__ u64 now_ns() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* Spins for at least `ns` nanoseconds of the GPU's global timer. */
__device__ void spin_ns(u64 ns) {
    u64 start = now_ns();
    while (now_ns() - start < ns) {
    }
}

__device__ void fill_bytes(unsigned char *out, u64 n, unsigned int value) {
    for (u64 i = first_index(); i < n; i += grid_stride()) {
        out[i] = (unsigned char)value;
    }
}

__device__ void add_bytes(const unsigned char *in, u64 n_in, unsigned char *out, u64 n_out,
                          unsigned int value) {
    u64 n = n_in < n_out ? n_in : n_out;
    for (u64 i = first_index(); i < n; i += grid_stride()) {
        out[i] = (unsigned char)(in[i] + value);
    }
}

extern "C" __global__ void fill(unsigned char *out, u64 n, unsigned int value) {
    fill_bytes(out, n, value);
}

extern "C" __global__ void add(const unsigned char *in, u64 n_in, unsigned char *out, u64 n_out,
                               unsigned int value) {
    add_bytes(in, n_in, out, n_out, value);
}

extern "C" __global__ void slow_add(const unsigned char *in, u64 n_in, unsigned char *out,
                                    u64 n_out, unsigned int value) {
    spin_ns(DEVCMD_SLOW_NS);
    add_bytes(in, n_in, out, n_out, value);
}

extern "C" __global__ void write_then_fail(unsigned char *out, u64 n, unsigned int value) {
    fill_bytes(out, n, value);
    __threadfence_system();
    spin_ns(DEVCMD_TRAP_DELAY_NS);
    __trap();
}
"#;

/// Why a [`CudaHarness`] could not be made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CudaHarnessError {
    /// The device could not be set up ([`CudaShim::new`]).
    Init(CudaInitError),
    /// The test kernels could not be compiled or found (no NVRTC, a compile error).
    Kernels(CudaKernelError),
}

impl CudaHarnessError {
    /// Whether no CUDA driver is installed.
    pub fn is_no_driver(&self) -> bool {
        matches!(self, Self::Init(e) if e.is_no_driver())
    }

    /// Whether a driver is installed but sees no such device.
    pub fn is_no_device(&self) -> bool {
        matches!(self, Self::Init(e) if e.is_no_device())
    }

    /// Whether no NVRTC library loads (the kernels are compiled with it).
    pub fn is_nvrtc_not_found(&self) -> bool {
        matches!(self, Self::Kernels(e) if e.is_nvrtc_not_found())
    }
}

impl fmt::Display for CudaHarnessError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Init(e) => write!(f, "CudaHarness: the device could not be set up: {e}"),
            Self::Kernels(e) => write!(f, "CudaHarness: the test kernels: {e}"),
        }
    }
}

impl std::error::Error for CudaHarnessError {}

/// Runs the suite against [`CudaShim`] on one GPU: the normal and poison modes (not the lazy
/// ones), the four test kernels compiled once with NVRTC, no probe of its own (wrap it in
/// [`CountedHarness`]). See the [module documentation](self).
///
/// The harness holds a shim of its own for as long as it lives, so the device's primary context
/// (which every [`CudaShim`] of the device shares) and the module of the test kernels stay
/// loaded across the fresh shims it hands out.
pub struct CudaHarness {
    ordinal: u32,
    /// Keeps the primary context, and so the module, alive.
    base: CudaShim,
    /// The kernels, in [`TestKernel::ALL`] order.
    kernels: Vec<CudaKernel>,
}

impl fmt::Debug for CudaHarness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaHarness")
            .field("ordinal", &self.ordinal)
            .field("device", &self.base.name())
            .finish_non_exhaustive()
    }
}

impl CudaHarness {
    /// Sets up GPU `ordinal` and compiles [`CUDA_TEST_KERNELS`] for it with NVRTC.
    ///
    /// # Errors
    ///
    /// [`CudaHarnessError::Init`] without a driver or a device ([`CudaHarnessError::is_no_driver`]
    /// tells a machine without one); [`CudaHarnessError::Kernels`] without NVRTC or when a kernel
    /// does not compile.
    pub fn new(ordinal: u32) -> Result<Self, CudaHarnessError> {
        let base = CudaShim::new(ordinal).map_err(CudaHarnessError::Init)?;
        let slow = format!("-DDEVCMD_SLOW_NS={}ull", SLOW_KERNEL_MS * 1_000_000);
        let trap = format!("-DDEVCMD_TRAP_DELAY_NS={}ull", TRAP_DELAY_MS * 1_000_000);
        let module = base
            .compile(CUDA_TEST_KERNELS, &[&slow, &trap])
            .map_err(CudaHarnessError::Kernels)?;
        // The signatures of `TestKernel`, declared so every launch is checked whatever the
        // bindings: fill/write_then_fail(out, n, value), add/slow_add(in, n, out, n, value).
        let kernels = TestKernel::ALL
            .iter()
            .map(|k| {
                let sizes: &[usize] = match k {
                    TestKernel::Fill | TestKernel::WriteThenFail => &[8, 8, 4],
                    TestKernel::AddByte | TestKernel::SlowAdd => &[8, 8, 8, 8, 4],
                };
                module.kernel_with_sizes(k.name(), sizes)
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(CudaHarnessError::Kernels)?;
        Ok(Self {
            ordinal,
            base,
            kernels,
        })
    }

    /// The harness's own shim (normal mode): the device the suite runs on.
    pub fn device(&self) -> &CudaShim {
        &self.base
    }
}

impl Harness for CudaHarness {
    type S = CudaShim;

    /// A new [`CudaShim`] of the device (its primary context, fresh streams and events),
    /// poisoning in a poison mode; `None` in a lazy mode.
    ///
    /// # Panics
    ///
    /// When the device the harness set up cannot be set up again: in this process, that is after
    /// a kernel trapped (CUDA's sticky error outlives every shim), so the message says to run
    /// each trapping check in a process of its own.
    fn shim(&self, mode: Mode) -> Option<CudaShim> {
        if mode.lazy {
            return None;
        }
        let shim = CudaShim::new(self.ordinal).unwrap_or_else(|e| {
            panic!(
                "CudaHarness: CudaShim::new({}) failed, though the harness set the device up \
                 before: {e}. After a kernel traps, CUDA's sticky error poisons the whole \
                 process: run each check that makes work fail in a process of its own",
                self.ordinal
            )
        });
        Some(shim.with_poison(mode.poison))
    }

    /// The kernel of the module compiled when the harness was made (every shim of the device
    /// shares its primary context, where the module is loaded).
    fn kernel(&self, shim: &CudaShim, kernel: TestKernel) -> CudaKernel {
        assert_eq!(
            shim.cu_context(),
            self.base.cu_context(),
            "CudaHarness::kernel: a shim of another device or context than the harness's"
        );
        self.kernels[kernel_slot(kernel)].clone()
    }

    /// `cuMemcpyDtoDAsync` of `src` into `dst` on `native`: what a vendor library does, one
    /// driver call on the stream it was handed, nothing waited for. The driver's refusal is the
    /// library's error (its `CUresult` and name); lengths that differ are refused before it.
    unsafe fn library_copy(
        &self,
        native: &sys::CUstream,
        src: DeviceSpan,
        dst: DeviceSpan,
    ) -> Option<Result<(), LibraryError>> {
        if src.len != dst.len {
            return Some(Err(LibraryError::new(
                i64::from(devcmd_cuda::status::INVALID_VALUE),
                format!(
                    "library_copy of {} bytes into {}: the lengths differ",
                    src.len, dst.len
                ),
            )));
        }
        let Ok(len) = usize::try_from(src.len) else {
            return Some(Err(LibraryError::new(
                i64::from(devcmd_cuda::status::INVALID_VALUE),
                format!("library_copy of {} bytes: past the host's usize", src.len),
            )));
        };
        // SAFETY: the caller's contract: both spans are live device memory of this shim that
        // stays alive until the stream passed the copy; the core made the shim's context
        // current when it handed out `native` (`Shim::native_stream`).
        let r = unsafe { sys::cuMemcpyDtoDAsync_v2(dst.addr.0, src.addr.0, len, *native) };
        Some(if r == sys::CUresult::CUDA_SUCCESS {
            Ok(())
        } else {
            Err(LibraryError::new(
                i64::from(r as i32),
                format!("cuMemcpyDtoDAsync returned {r:?}"),
            ))
        })
    }
}
