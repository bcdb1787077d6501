//! The classification of CUDA's status codes, written once: every error the shim returns is
//! built by [`classify`] from a `CUresult` (or one of the shim's own codes, below zero).
//!
//! | status | name | fault | why |
//! |---|---|---|---|
//! | 700 | `CUDA_ERROR_ILLEGAL_ADDRESS` | `DeviceLost` | sticky: the context is unusable, every later call returns it |
//! | 702 | `CUDA_ERROR_LAUNCH_TIMEOUT` | `DeviceLost` | sticky (watchdog killed a kernel) |
//! | 709 | `CUDA_ERROR_CONTEXT_IS_DESTROYED` | `DeviceLost` | the context is gone: nothing of it runs any more |
//! | 710 | `CUDA_ERROR_ASSERT` | `DeviceLost` | sticky (a device-side `assert` failed) |
//! | 714 | `CUDA_ERROR_HARDWARE_STACK_ERROR` | `DeviceLost` | sticky |
//! | 715 | `CUDA_ERROR_ILLEGAL_INSTRUCTION` | `DeviceLost` | sticky |
//! | 716 | `CUDA_ERROR_MISALIGNED_ADDRESS` | `DeviceLost` | sticky |
//! | 717 | `CUDA_ERROR_INVALID_ADDRESS_SPACE` | `DeviceLost` | sticky |
//! | 718 | `CUDA_ERROR_INVALID_PC` | `DeviceLost` | sticky |
//! | 719 | `CUDA_ERROR_LAUNCH_FAILED` | `DeviceLost` | sticky (also what a kernel's `trap` gives) |
//! | 214 | `CUDA_ERROR_ECC_UNCORRECTABLE` | `DeviceLost` | an uncorrectable memory error: the context's data is gone |
//! | 226 | `CUDA_ERROR_CONTAINED` | `DeviceLost` | sticky (an error the GPU contained; CUDA ≥ 12.8) |
//! | 2 | `CUDA_ERROR_OUT_OF_MEMORY` | `OutOfMemory` | freeing memory may cure it (from any call: `cuMemAlloc`, `cuMemCreate` of [`ShimOp::VmMap`], `cuMemAddressReserve` of [`ShimOp::VmReserve`] out of address space, ...) |
//! | 1 | `CUDA_ERROR_INVALID_VALUE` | `TooBig` for [`ShimOp::DeviceAlloc`] and [`ShimOp::HostAlloc`], `Failed` otherwise | the shim never passes a zero size nor odd flags to an allocation, so the size is what the driver refused |
//! | 801 | `CUDA_ERROR_NOT_SUPPORTED` | `Unsupported` | the device or the platform lacks the feature |
//! | 900 | `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` | `Busy` | the call is forbidden while a stream of the process records a graph, and did nothing: the shim refuses host waits and allocations with it before the driver while any stream records (`recording.rs`), and the core keeps what a refused fence covers for a later wait |
//! | 600 | `CUDA_ERROR_NOT_READY` | `Failed` | **not an error**: [`Shim::event_query`] answers `Ok(false)` for it and never classifies it; classified only if some other call returned it |
//! | -1 | [`status::UNSUPPORTED`] | `Unsupported` | a call this shim does not implement yet (the status of [`devcmd::shim::unsupported`]) |
//! | -2 | [`status::TOO_BIG`] | `TooBig` | a size past the device's total memory or past the host's address space (an allocation, a [`ShimOp::VmMap`]), refused before any driver call |
//! | -3 | [`status::BAD_ARGUMENT`] | `Failed` | a null host pointer or a size past the host's address space in a copy, a launch's buffer slot past its buffers, a kernel of another context, or a [`ShimOp::VmReserve`] / [`ShimOp::VmMap`] size of no granules or not a multiple of the granule (or a map address that is not), refused before any driver call |
//! | -4 | [`status::PARAM_MISMATCH`] | `Failed` | a launch's parameters differ from the kernel's in number or size, refused before any driver call |
//! | -5 | [`status::CAPTURE_DOOMED`] | `Failed` | [`Shim::end_capture`] with `doomed`: the recording was discarded |
//! | any other | | `Failed` | the call failed and the device stays usable, as far as the shim knows |
//!
//! No status is [`Fault::WorkFailed`]: every fault CUDA reports for work that ran is sticky, so
//! it loses the device, and for the whole process: after a trap, neither a new shim, nor a
//! context of its own, nor a reset primary context works again in that process (seen on the
//! H200; see the crate docs).
//!
//! **Only the codes CUDA documents as sticky lose the device.** Calling a live device lost would
//! let the core free memory that work still running may use; calling a lost device `Failed` only
//! makes the core leak what the failed fence covered. So codes whose stickiness CUDA does not
//! promise (`CUDA_ERROR_UNKNOWN`, `CUDA_ERROR_NVLINK_UNCORRECTABLE`,
//! `CUDA_ERROR_EXTERNAL_DEVICE`, `CUDA_ERROR_TENSOR_MEMORY_LEAK`, ...) are `Failed`.
//!
//! The codes are CUDA's ABI numbers, the same in every binding version; a test checks them
//! against the `CUresult` of the bindings the crate is built with.

#[cfg(doc)]
use devcmd::Shim;
use devcmd::{DriverError, Fault, ShimOp};

/// Status codes: CUDA's `CUresult` values the classification names, and the shim's own (below
/// zero, so they never collide with CUDA's).
pub mod status {
    /// `CUDA_SUCCESS`.
    pub const SUCCESS: i32 = 0;
    /// `CUDA_ERROR_INVALID_VALUE`.
    pub const INVALID_VALUE: i32 = 1;
    /// `CUDA_ERROR_OUT_OF_MEMORY`.
    pub const OUT_OF_MEMORY: i32 = 2;
    /// `CUDA_ERROR_NOT_INITIALIZED`.
    pub const NOT_INITIALIZED: i32 = 3;
    /// `CUDA_ERROR_DEINITIALIZED` (the driver is shutting down).
    pub const DEINITIALIZED: i32 = 4;
    /// `CUDA_ERROR_STUB_LIBRARY` (the toolkit's stub `libcuda.so` was loaded, not the driver).
    pub const STUB_LIBRARY: i32 = 34;
    /// `CUDA_ERROR_DEVICE_UNAVAILABLE` (busy: exclusive-process mode).
    pub const DEVICE_UNAVAILABLE: i32 = 46;
    /// `CUDA_ERROR_NO_DEVICE`.
    pub const NO_DEVICE: i32 = 100;
    /// `CUDA_ERROR_INVALID_DEVICE`.
    pub const INVALID_DEVICE: i32 = 101;
    /// `CUDA_ERROR_INVALID_IMAGE` (a module image the driver cannot read).
    pub const INVALID_IMAGE: i32 = 200;
    /// `CUDA_ERROR_INVALID_CONTEXT`.
    pub const INVALID_CONTEXT: i32 = 201;
    /// `CUDA_ERROR_NO_BINARY_FOR_GPU` (a module with no code for this architecture).
    pub const NO_BINARY_FOR_GPU: i32 = 209;
    /// `CUDA_ERROR_ECC_UNCORRECTABLE`.
    pub const ECC_UNCORRECTABLE: i32 = 214;
    /// `CUDA_ERROR_INVALID_PTX` (PTX that does not assemble).
    pub const INVALID_PTX: i32 = 218;
    /// `CUDA_ERROR_NVLINK_UNCORRECTABLE`.
    pub const NVLINK_UNCORRECTABLE: i32 = 220;
    /// `CUDA_ERROR_JIT_COMPILER_NOT_FOUND` (the driver's PTX compiler is missing).
    pub const JIT_COMPILER_NOT_FOUND: i32 = 221;
    /// `CUDA_ERROR_UNSUPPORTED_PTX_VERSION` (PTX newer than the driver).
    pub const UNSUPPORTED_PTX_VERSION: i32 = 222;
    /// `CUDA_ERROR_CONTAINED` (CUDA ≥ 12.8).
    pub const CONTAINED: i32 = 226;
    /// `CUDA_ERROR_INVALID_HANDLE`.
    pub const INVALID_HANDLE: i32 = 400;
    /// `CUDA_ERROR_ILLEGAL_STATE` (e.g. ending a capture on a stream that is not recording).
    pub const ILLEGAL_STATE: i32 = 401;
    /// `CUDA_ERROR_NOT_FOUND` (e.g. a kernel name a module does not have).
    pub const NOT_FOUND: i32 = 500;
    /// `CUDA_ERROR_NOT_READY`.
    pub const NOT_READY: i32 = 600;
    /// `CUDA_ERROR_ILLEGAL_ADDRESS`.
    pub const ILLEGAL_ADDRESS: i32 = 700;
    /// `CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES`.
    pub const LAUNCH_OUT_OF_RESOURCES: i32 = 701;
    /// `CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED` (no error for `cuCtxEnablePeerAccess`).
    pub const PEER_ACCESS_ALREADY_ENABLED: i32 = 704;
    /// `CUDA_ERROR_TOO_MANY_PEERS`: the device has as many peers enabled as it can.
    pub const TOO_MANY_PEERS: i32 = 711;
    /// `CUDA_ERROR_PEER_ACCESS_UNSUPPORTED`: the two devices cannot access each other.
    pub const PEER_ACCESS_UNSUPPORTED: i32 = 217;
    /// `CUDA_ERROR_LAUNCH_TIMEOUT`.
    pub const LAUNCH_TIMEOUT: i32 = 702;
    /// `CUDA_ERROR_CONTEXT_IS_DESTROYED`.
    pub const CONTEXT_IS_DESTROYED: i32 = 709;
    /// `CUDA_ERROR_ASSERT`.
    pub const ASSERT: i32 = 710;
    /// `CUDA_ERROR_HARDWARE_STACK_ERROR`.
    pub const HARDWARE_STACK_ERROR: i32 = 714;
    /// `CUDA_ERROR_ILLEGAL_INSTRUCTION`.
    pub const ILLEGAL_INSTRUCTION: i32 = 715;
    /// `CUDA_ERROR_MISALIGNED_ADDRESS`.
    pub const MISALIGNED_ADDRESS: i32 = 716;
    /// `CUDA_ERROR_INVALID_ADDRESS_SPACE`.
    pub const INVALID_ADDRESS_SPACE: i32 = 717;
    /// `CUDA_ERROR_INVALID_PC`.
    pub const INVALID_PC: i32 = 718;
    /// `CUDA_ERROR_LAUNCH_FAILED`.
    pub const LAUNCH_FAILED: i32 = 719;
    /// `CUDA_ERROR_TENSOR_MEMORY_LEAK` (CUDA ≥ 12.8).
    pub const TENSOR_MEMORY_LEAK: i32 = 721;
    /// `CUDA_ERROR_NOT_PERMITTED`.
    pub const NOT_PERMITTED: i32 = 800;
    /// `CUDA_ERROR_NOT_SUPPORTED`.
    pub const NOT_SUPPORTED: i32 = 801;
    /// `CUDA_ERROR_SYSTEM_DRIVER_MISMATCH`.
    pub const SYSTEM_DRIVER_MISMATCH: i32 = 803;
    /// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` (a call illegal while the stream records; it
    /// invalidates the capture).
    pub const STREAM_CAPTURE_UNSUPPORTED: i32 = 900;
    /// `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED` (the capture was invalidated by an illegal call).
    pub const STREAM_CAPTURE_INVALIDATED: i32 = 901;
    /// `CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD` (a capture ended on another
    /// thread).
    pub const STREAM_CAPTURE_WRONG_THREAD: i32 = 908;
    /// `CUDA_ERROR_EXTERNAL_DEVICE`.
    pub const EXTERNAL_DEVICE: i32 = 911;
    /// `CUDA_ERROR_UNKNOWN`.
    pub const UNKNOWN: i32 = 999;

    /// Shim: a call this shim does not implement (yet). Equal to the status of
    /// [`devcmd::shim::unsupported`].
    pub const UNSUPPORTED: i32 = -1;
    /// Shim: a size the device can never hold, refused before any driver call.
    pub const TOO_BIG: i32 = -2;
    /// Shim: a null host pointer or a size past the host's address space, a launch's buffer
    /// slot past its buffers, a kernel of another context, or a virtual-memory size or address
    /// that is not a multiple of the granule, refused before any driver call.
    pub const BAD_ARGUMENT: i32 = -3;
    /// Shim: a launch's parameters differ from the kernel's in number or size (or a scalar is
    /// empty), refused before any driver call; `CudaKernel::check_params` says what differs.
    pub const PARAM_MISMATCH: i32 = -4;
    /// Shim: a capture ended as doomed; the recording was discarded.
    pub const CAPTURE_DOOMED: i32 = -5;
}

/// Every named status with its name, for messages.
const NAMES: &[(i32, &str)] = &[
    (status::SUCCESS, "CUDA_SUCCESS"),
    (status::INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE"),
    (status::OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY"),
    (status::NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED"),
    (status::DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED"),
    (status::STUB_LIBRARY, "CUDA_ERROR_STUB_LIBRARY"),
    (status::DEVICE_UNAVAILABLE, "CUDA_ERROR_DEVICE_UNAVAILABLE"),
    (status::NO_DEVICE, "CUDA_ERROR_NO_DEVICE"),
    (status::INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE"),
    (status::INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE"),
    (status::INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT"),
    (status::NO_BINARY_FOR_GPU, "CUDA_ERROR_NO_BINARY_FOR_GPU"),
    (status::ECC_UNCORRECTABLE, "CUDA_ERROR_ECC_UNCORRECTABLE"),
    (status::INVALID_PTX, "CUDA_ERROR_INVALID_PTX"),
    (
        status::NVLINK_UNCORRECTABLE,
        "CUDA_ERROR_NVLINK_UNCORRECTABLE",
    ),
    (
        status::JIT_COMPILER_NOT_FOUND,
        "CUDA_ERROR_JIT_COMPILER_NOT_FOUND",
    ),
    (
        status::UNSUPPORTED_PTX_VERSION,
        "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
    ),
    (status::CONTAINED, "CUDA_ERROR_CONTAINED"),
    (status::INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE"),
    (status::ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE"),
    (status::NOT_FOUND, "CUDA_ERROR_NOT_FOUND"),
    (status::NOT_READY, "CUDA_ERROR_NOT_READY"),
    (status::ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS"),
    (
        status::LAUNCH_OUT_OF_RESOURCES,
        "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
    ),
    (status::LAUNCH_TIMEOUT, "CUDA_ERROR_LAUNCH_TIMEOUT"),
    (
        status::CONTEXT_IS_DESTROYED,
        "CUDA_ERROR_CONTEXT_IS_DESTROYED",
    ),
    (status::ASSERT, "CUDA_ERROR_ASSERT"),
    (
        status::HARDWARE_STACK_ERROR,
        "CUDA_ERROR_HARDWARE_STACK_ERROR",
    ),
    (
        status::ILLEGAL_INSTRUCTION,
        "CUDA_ERROR_ILLEGAL_INSTRUCTION",
    ),
    (status::MISALIGNED_ADDRESS, "CUDA_ERROR_MISALIGNED_ADDRESS"),
    (
        status::INVALID_ADDRESS_SPACE,
        "CUDA_ERROR_INVALID_ADDRESS_SPACE",
    ),
    (status::INVALID_PC, "CUDA_ERROR_INVALID_PC"),
    (status::LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED"),
    (status::TENSOR_MEMORY_LEAK, "CUDA_ERROR_TENSOR_MEMORY_LEAK"),
    (status::NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED"),
    (status::NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED"),
    (
        status::SYSTEM_DRIVER_MISMATCH,
        "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
    ),
    (
        status::STREAM_CAPTURE_UNSUPPORTED,
        "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
    ),
    (
        status::STREAM_CAPTURE_INVALIDATED,
        "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
    ),
    (
        status::STREAM_CAPTURE_WRONG_THREAD,
        "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD",
    ),
    (status::EXTERNAL_DEVICE, "CUDA_ERROR_EXTERNAL_DEVICE"),
    (status::UNKNOWN, "CUDA_ERROR_UNKNOWN"),
    (status::UNSUPPORTED, "devcmd-cuda: unsupported"),
    (status::TOO_BIG, "devcmd-cuda: too big"),
    (status::BAD_ARGUMENT, "devcmd-cuda: bad argument"),
    (
        status::PARAM_MISMATCH,
        "devcmd-cuda: kernel parameters do not match the kernel's",
    ),
    (
        status::CAPTURE_DOOMED,
        "devcmd-cuda: doomed capture discarded",
    ),
];

/// The name of `status` when the classification names it (`CUDA_ERROR_...`), else `None`.
pub fn status_name(status: i32) -> Option<&'static str> {
    NAMES.iter().find(|(c, _)| *c == status).map(|(_, n)| *n)
}

/// Whether `status` is one of CUDA's sticky errors: the context can run nothing again.
pub fn is_sticky(status: i32) -> bool {
    matches!(
        status,
        status::ILLEGAL_ADDRESS
            | status::LAUNCH_TIMEOUT
            | status::CONTEXT_IS_DESTROYED
            | status::ASSERT
            | status::HARDWARE_STACK_ERROR
            | status::ILLEGAL_INSTRUCTION
            | status::MISALIGNED_ADDRESS
            | status::INVALID_ADDRESS_SPACE
            | status::INVALID_PC
            | status::LAUNCH_FAILED
            | status::ECC_UNCORRECTABLE
            | status::CONTAINED
    )
}

/// Builds the error of a failed call of `op` with `status`, classified by the table of the
/// [module](self).
pub fn classify(op: ShimOp, status: i32) -> DriverError {
    let fault = match status {
        s if is_sticky(s) => Fault::DeviceLost,
        status::OUT_OF_MEMORY => Fault::OutOfMemory,
        status::INVALID_VALUE if matches!(op, ShimOp::DeviceAlloc | ShimOp::HostAlloc) => {
            Fault::TooBig
        }
        status::TOO_BIG => Fault::TooBig,
        status::NOT_SUPPORTED | status::UNSUPPORTED => Fault::Unsupported,
        status::STREAM_CAPTURE_UNSUPPORTED => Fault::Busy,
        _ => Fault::Failed,
    };
    DriverError::new(op, status, fault)
}

/// The status of a driver call as the shim's `i32`.
pub(crate) fn code(r: cudarc::driver::sys::CUresult) -> i32 {
    // `CUresult` is a `#[repr(u32)]` enum whose values are all below `i32::MAX`.
    r as i32
}

/// `Ok` for `CUDA_SUCCESS`, else the classified error of `op`.
pub(crate) fn check(op: ShimOp, r: cudarc::driver::sys::CUresult) -> Result<(), DriverError> {
    match code(r) {
        status::SUCCESS => Ok(()),
        s => Err(classify(op, s)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cudarc::driver::sys::CUresult as R;

    #[test]
    fn the_codes_are_the_bindings_codes() {
        let pairs = [
            (status::SUCCESS, R::CUDA_SUCCESS),
            (status::TOO_MANY_PEERS, R::CUDA_ERROR_TOO_MANY_PEERS),
            (
                status::PEER_ACCESS_UNSUPPORTED,
                R::CUDA_ERROR_PEER_ACCESS_UNSUPPORTED,
            ),
            (status::INVALID_VALUE, R::CUDA_ERROR_INVALID_VALUE),
            (status::OUT_OF_MEMORY, R::CUDA_ERROR_OUT_OF_MEMORY),
            (status::NOT_INITIALIZED, R::CUDA_ERROR_NOT_INITIALIZED),
            (status::DEINITIALIZED, R::CUDA_ERROR_DEINITIALIZED),
            (status::STUB_LIBRARY, R::CUDA_ERROR_STUB_LIBRARY),
            (status::NO_DEVICE, R::CUDA_ERROR_NO_DEVICE),
            (status::INVALID_DEVICE, R::CUDA_ERROR_INVALID_DEVICE),
            (status::INVALID_CONTEXT, R::CUDA_ERROR_INVALID_CONTEXT),
            (status::INVALID_IMAGE, R::CUDA_ERROR_INVALID_IMAGE),
            (status::NO_BINARY_FOR_GPU, R::CUDA_ERROR_NO_BINARY_FOR_GPU),
            (status::INVALID_PTX, R::CUDA_ERROR_INVALID_PTX),
            (
                status::JIT_COMPILER_NOT_FOUND,
                R::CUDA_ERROR_JIT_COMPILER_NOT_FOUND,
            ),
            (
                status::UNSUPPORTED_PTX_VERSION,
                R::CUDA_ERROR_UNSUPPORTED_PTX_VERSION,
            ),
            (status::ILLEGAL_STATE, R::CUDA_ERROR_ILLEGAL_STATE),
            (status::NOT_FOUND, R::CUDA_ERROR_NOT_FOUND),
            (
                status::STREAM_CAPTURE_UNSUPPORTED,
                R::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
            ),
            (
                status::STREAM_CAPTURE_INVALIDATED,
                R::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
            ),
            (
                status::STREAM_CAPTURE_WRONG_THREAD,
                R::CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD,
            ),
            (status::ECC_UNCORRECTABLE, R::CUDA_ERROR_ECC_UNCORRECTABLE),
            (
                status::NVLINK_UNCORRECTABLE,
                R::CUDA_ERROR_NVLINK_UNCORRECTABLE,
            ),
            (status::INVALID_HANDLE, R::CUDA_ERROR_INVALID_HANDLE),
            (status::NOT_READY, R::CUDA_ERROR_NOT_READY),
            (status::ILLEGAL_ADDRESS, R::CUDA_ERROR_ILLEGAL_ADDRESS),
            (
                status::LAUNCH_OUT_OF_RESOURCES,
                R::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
            ),
            (status::LAUNCH_TIMEOUT, R::CUDA_ERROR_LAUNCH_TIMEOUT),
            (
                status::CONTEXT_IS_DESTROYED,
                R::CUDA_ERROR_CONTEXT_IS_DESTROYED,
            ),
            (status::ASSERT, R::CUDA_ERROR_ASSERT),
            (
                status::HARDWARE_STACK_ERROR,
                R::CUDA_ERROR_HARDWARE_STACK_ERROR,
            ),
            (
                status::ILLEGAL_INSTRUCTION,
                R::CUDA_ERROR_ILLEGAL_INSTRUCTION,
            ),
            (status::MISALIGNED_ADDRESS, R::CUDA_ERROR_MISALIGNED_ADDRESS),
            (
                status::INVALID_ADDRESS_SPACE,
                R::CUDA_ERROR_INVALID_ADDRESS_SPACE,
            ),
            (status::INVALID_PC, R::CUDA_ERROR_INVALID_PC),
            (status::LAUNCH_FAILED, R::CUDA_ERROR_LAUNCH_FAILED),
            (status::NOT_PERMITTED, R::CUDA_ERROR_NOT_PERMITTED),
            (status::NOT_SUPPORTED, R::CUDA_ERROR_NOT_SUPPORTED),
            (
                status::SYSTEM_DRIVER_MISMATCH,
                R::CUDA_ERROR_SYSTEM_DRIVER_MISMATCH,
            ),
            (status::EXTERNAL_DEVICE, R::CUDA_ERROR_EXTERNAL_DEVICE),
            (status::UNKNOWN, R::CUDA_ERROR_UNKNOWN),
        ];
        for (ours, theirs) in pairs {
            assert_eq!(ours, code(theirs), "{theirs:?}");
        }
    }

    /// Codes that exist only in newer bindings.
    #[cfg(not(feature = "cuda-11040"))]
    #[test]
    fn the_newer_codes_are_the_bindings_codes() {
        assert_eq!(
            status::DEVICE_UNAVAILABLE,
            code(R::CUDA_ERROR_DEVICE_UNAVAILABLE)
        );
    }

    #[cfg(feature = "cuda-13000")]
    #[test]
    fn the_cuda_13_codes_are_the_bindings_codes() {
        assert_eq!(status::CONTAINED, code(R::CUDA_ERROR_CONTAINED));
        assert_eq!(
            status::TENSOR_MEMORY_LEAK,
            code(R::CUDA_ERROR_TENSOR_MEMORY_LEAK)
        );
    }

    fn fault(op: ShimOp, s: i32) -> Fault {
        classify(op, s).fault
    }

    #[test]
    fn sticky_errors_lose_the_device_from_any_call() {
        let sticky = [
            status::ILLEGAL_ADDRESS,
            status::LAUNCH_TIMEOUT,
            status::CONTEXT_IS_DESTROYED,
            status::ASSERT,
            status::HARDWARE_STACK_ERROR,
            status::ILLEGAL_INSTRUCTION,
            status::MISALIGNED_ADDRESS,
            status::INVALID_ADDRESS_SPACE,
            status::INVALID_PC,
            status::LAUNCH_FAILED,
            status::ECC_UNCORRECTABLE,
            status::CONTAINED,
        ];
        for op in ShimOp::ALL {
            for s in sticky {
                let e = classify(op, s);
                assert_eq!(e, DriverError::new(op, s, Fault::DeviceLost));
                assert!(e.loses_device());
            }
        }
    }

    #[test]
    fn codes_not_documented_sticky_do_not_lose_the_device() {
        for s in [
            status::UNKNOWN,
            status::NVLINK_UNCORRECTABLE,
            status::EXTERNAL_DEVICE,
            status::TENSOR_MEMORY_LEAK,
            status::LAUNCH_OUT_OF_RESOURCES,
            status::INVALID_HANDLE,
            status::INVALID_CONTEXT,
            status::DEINITIALIZED,
            12345,
            i32::MIN,
        ] {
            for op in ShimOp::ALL {
                assert_eq!(fault(op, s), Fault::Failed, "{s} of {op}");
            }
        }
    }

    #[test]
    fn out_of_memory_is_a_shortage() {
        for op in ShimOp::ALL {
            assert_eq!(fault(op, status::OUT_OF_MEMORY), Fault::OutOfMemory);
        }
    }

    /// A map the device has no memory for is a shortage the core can cure by giving memory
    /// back; a bad range (`CUDA_ERROR_INVALID_VALUE`) is a plain failure, never a loss.
    #[test]
    fn virtual_memory_failures_are_classified_once() {
        assert_eq!(
            classify(ShimOp::VmMap, status::OUT_OF_MEMORY),
            DriverError::new(ShimOp::VmMap, status::OUT_OF_MEMORY, Fault::OutOfMemory)
        );
        assert_eq!(
            fault(ShimOp::VmReserve, status::OUT_OF_MEMORY),
            Fault::OutOfMemory
        );
        assert_eq!(fault(ShimOp::VmMap, status::INVALID_VALUE), Fault::Failed);
        assert_eq!(
            fault(ShimOp::VmReserve, status::INVALID_VALUE),
            Fault::Failed
        );
        assert_eq!(fault(ShimOp::VmMap, status::TOO_BIG), Fault::TooBig);
        assert_eq!(
            fault(ShimOp::VmMap, status::NOT_SUPPORTED),
            Fault::Unsupported
        );
        assert_eq!(
            fault(ShimOp::VmMap, status::ILLEGAL_ADDRESS),
            Fault::DeviceLost
        );
    }

    #[test]
    fn an_invalid_value_is_too_big_only_for_allocations() {
        for op in ShimOp::ALL {
            let want = match op {
                ShimOp::DeviceAlloc | ShimOp::HostAlloc => Fault::TooBig,
                _ => Fault::Failed,
            };
            assert_eq!(fault(op, status::INVALID_VALUE), want, "{op}");
            assert_eq!(fault(op, status::TOO_BIG), Fault::TooBig);
            assert_eq!(fault(op, status::BAD_ARGUMENT), Fault::Failed);
            assert_eq!(fault(op, status::PARAM_MISMATCH), Fault::Failed);
            assert_eq!(fault(op, status::CAPTURE_DOOMED), Fault::Failed);
        }
    }

    #[test]
    fn not_supported_is_unsupported_like_the_cores_default() {
        for op in ShimOp::ALL {
            assert_eq!(fault(op, status::NOT_SUPPORTED), Fault::Unsupported);
            assert_eq!(
                classify(op, status::UNSUPPORTED),
                devcmd::shim::unsupported(op)
            );
        }
    }

    #[test]
    fn a_call_forbidden_while_a_stream_records_is_refused_for_now() {
        // What the shim answers for a host wait or an allocation while any stream of the
        // process records (`recording.rs`): the core keeps what a refused fence covers.
        for op in ShimOp::ALL {
            assert_eq!(
                fault(op, status::STREAM_CAPTURE_UNSUPPORTED),
                Fault::Busy,
                "{op}"
            );
        }
        assert!(!is_sticky(status::STREAM_CAPTURE_UNSUPPORTED));
    }

    #[test]
    fn not_ready_is_not_classified_as_a_fault_of_the_device() {
        // The event query answers `Ok(false)` for it (see `stream.rs`); if some other call
        // returned it, it is a plain failure, never a loss or a shortage.
        assert_eq!(fault(ShimOp::EventQuery, status::NOT_READY), Fault::Failed);
        assert!(!is_sticky(status::NOT_READY));
    }

    #[test]
    fn check_passes_success_and_classifies_the_rest() {
        assert_eq!(check(ShimOp::EventRecord, R::CUDA_SUCCESS), Ok(()));
        assert_eq!(
            check(ShimOp::EventWait, R::CUDA_ERROR_ILLEGAL_ADDRESS),
            Err(DriverError::new(
                ShimOp::EventWait,
                status::ILLEGAL_ADDRESS,
                Fault::DeviceLost
            ))
        );
    }

    #[test]
    fn every_named_code_has_one_name() {
        for (i, (c, n)) in NAMES.iter().enumerate() {
            assert_eq!(status_name(*c), Some(*n));
            assert!(NAMES[i + 1..].iter().all(|(d, _)| d != c), "{n} twice");
        }
        assert_eq!(status_name(4242), None);
    }
}
