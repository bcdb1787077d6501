//! Kernels: none yet.

/// A kernel loaded on the device. **None can exist yet** (the type has no values): loading
/// kernels once at start-up (NVRTC from CUDA C, or PTX and cubins loaded by the driver) and
/// launching them with `cuLaunchKernel` come with issue 8's launch contract, which carries what
/// the hardware needs (grid and block dimensions, dynamic shared memory, parameters in the
/// kernel's order). Until then [`Shim::launch`](devcmd::Shim::launch) answers
/// [`Fault::Unsupported`](devcmd::Fault::Unsupported).
#[derive(Debug)]
pub enum CudaKernel {}
