//! Kernels: modules compiled with NVRTC or loaded from PTX, cubins and fatbins, the kernels in
//! them, and their launch.
//!
//! Owns: [`CudaModule`] (a `CUmodule`, unloaded with its context bound when its last user
//! drops), [`CudaKernel`] (a `CUfunction` that keeps its module loaded), their errors
//! ([`CudaKernelError`]), the launch (`cuLaunchKernel`) and its parameter check. Does **not**
//! own: the compile itself and the NVRTC library (`nvrtc.rs`), the context and its binding
//! (`device.rs`), streams (`stream.rs`).
//!
//! # Kernels are loaded once, at start-up
//!
//! [`CudaShim::compile`] compiles CUDA C with NVRTC for the device's own architecture (a cubin
//! for `sm_XY`; PTX for the newest older `compute_XY` when NVRTC does not know the device) and
//! loads it; [`CudaShim::load_module`] loads PTX, a cubin or a fatbin built ahead of time (the
//! way on Jetson, where JIT compilation at start-up is slow and discouraged). Both are meant for
//! start-up: a compile takes tens of milliseconds or more (12 to 17 ms for a small kernel on the
//! H200 host), a load a fraction of that. A launch then costs one `cuLaunchKernel`: about
//! 3.4 µs to enqueue on the H200 host through [`Shim::launch`](devcmd::Shim::launch), the same
//! as `cuLaunchKernel` called directly.
//!
//! # Parameters
//!
//! A launch passes the kernel's parameters in its order ([`KernelParam`]): a `Buffer(slot)` as the
//! 64-bit device address of `buffers[slot]`, a `Scalar` as its bytes, exactly the parameter's
//! size. With bindings of CUDA 12.4 or newer (the features `cuda-12060` and `cuda-13000`) and a
//! driver that has `cuFuncGetParamInfo`, the shim reads each kernel's parameter sizes once, when
//! the kernel is looked up, and refuses a launch whose count or sizes differ
//! ([`status::PARAM_MISMATCH`](crate::status::PARAM_MISMATCH); [`CudaKernel::check_params`]
//! says what differs) instead of letting the driver read past a scalar. With older bindings
//! (`cuda-11040`, `cuda-12020`: JetPack 5 and 6.0) the sizes are **the caller's
//! responsibility**: [`CudaKernel::param_sizes`] is `None` and only empty scalars are refused.

use crate::device::{Context, CudaShim};
use crate::faults::{classify, code, is_sticky, status, status_name};
use crate::nvrtc;
use crate::stream::CudaStream;
use cudarc::driver::sys;
use devcmd::{DeviceSpan, DriverError, KernelParam, LaunchDims, ShimOp};
use std::ffi::{CString, c_void};
use std::fmt;
use std::ptr;
use std::sync::Arc;

/// Launches with at most this many parameters build their parameter array on the stack (no heap
/// allocation); longer ones allocate two small vectors.
pub const STACK_PARAMS: usize = 16;

/// Bytes of the driver's error log kept when a module fails to load.
const LOG_BYTES: usize = 16 << 10;

/// Whether this build reads kernels' parameter sizes (bindings of CUDA 12.4 or newer declare
/// `cuFuncGetParamInfo`); the driver must have the function too.
pub const PARAM_INFO_BINDINGS: bool = cfg!(any(feature = "cuda-12060", feature = "cuda-13000"));

/// What kind of image a module was loaded from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageFormat {
    /// An ELF cubin: machine code for one architecture.
    Cubin,
    /// A fatbin: cubins and PTX for several architectures; the driver picks.
    Fatbin,
    /// PTX text: the driver compiles it for the device when loading it.
    Ptx,
}

impl ImageFormat {
    /// The format of `image`, by its first bytes: ELF is a cubin, `0xBA55ED50` a fatbin, the rest
    /// PTX text.
    pub fn of(image: &[u8]) -> Self {
        if image.starts_with(b"\x7fELF") {
            Self::Cubin
        } else if image.starts_with(&0xBA55_ED50u32.to_le_bytes()) {
            Self::Fatbin
        } else {
            Self::Ptx
        }
    }
}

impl fmt::Display for ImageFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Cubin => "cubin",
            Self::Fatbin => "fatbin",
            Self::Ptx => "PTX",
        })
    }
}

/// Why a module could not be compiled or loaded, a kernel found, or a launch's parameters
/// checked. Each message says what was asked, what was found and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CudaKernelError {
    /// No NVRTC library loads (only [`CudaShim::compile`] needs one).
    NvrtcNotFound {
        /// Every library name and path tried, in order.
        tried: Vec<String>,
        /// What the system loader said for the names it reported on: `(name, message)`.
        reasons: Vec<(String, String)>,
    },
    /// The NVRTC library lacks a function the shim calls.
    NvrtcMissingSymbol {
        /// The library that loaded.
        library: String,
        /// The function it lacks.
        symbol: &'static str,
    },
    /// NVRTC knows neither the device's architecture nor any older one.
    UnsupportedArch {
        /// The device's compute capability.
        device: (u32, u32),
        /// NVRTC's version.
        nvrtc: (i32, i32),
        /// The architectures NVRTC compiles for (`90` is sm_90).
        supported: Vec<i32>,
    },
    /// The source does not compile.
    Compile {
        /// NVRTC's log: the compiler's errors and warnings.
        log: String,
        /// Every option passed, the architecture included.
        options: Vec<String>,
    },
    /// An NVRTC call failed for another reason than the source (an unknown option, say).
    Nvrtc {
        /// The NVRTC function.
        call: &'static str,
        /// Its `nvrtcResult`.
        status: i32,
        /// NVRTC's words for the status.
        message: String,
        /// NVRTC's log, if it wrote one.
        log: String,
    },
    /// The source, an option or a kernel name holds a NUL byte.
    Nul {
        /// Which.
        what: &'static str,
    },
    /// The image to load is empty.
    EmptyImage,
    /// The driver refused the image (`cuModuleLoadDataEx`).
    Load {
        /// What the image looked like.
        format: ImageFormat,
        /// The `CUresult`.
        status: i32,
        /// The driver's error log (the PTX assembler's errors, for PTX).
        log: String,
        /// The driver's CUDA version.
        driver: i32,
    },
    /// The module has no kernel of this name (`cuModuleGetFunction`: `CUDA_ERROR_NOT_FOUND`).
    NoSuchKernel {
        /// The name asked for.
        name: String,
    },
    /// The kernel's parameter sizes cannot be read here (bindings older than CUDA 12.4, or a
    /// driver that cannot tell): declare them with [`CudaModule::kernel_with_sizes`].
    ParamSizesUnknown {
        /// The kernel.
        kernel: String,
    },
    /// A launch's parameters (or a declared signature) differ from the kernel's in number or
    /// size.
    ParamMismatch {
        /// The kernel.
        kernel: String,
        /// The kernel's parameter sizes, in bytes.
        expected: Vec<usize>,
        /// The sizes the launch passed (a buffer is 8 bytes).
        given: Vec<usize>,
    },
    /// A driver call failed.
    Driver {
        /// The driver function.
        call: &'static str,
        /// Its `CUresult`.
        status: i32,
    },
}

impl CudaKernelError {
    /// Whether no NVRTC library loads on this machine.
    pub fn is_nvrtc_not_found(&self) -> bool {
        matches!(self, Self::NvrtcNotFound { .. })
    }

    /// Whether the device is lost (a sticky `CUresult`): nothing of this context runs again.
    pub fn loses_device(&self) -> bool {
        match self {
            Self::Load { status, .. } | Self::Driver { status, .. } => is_sticky(*status),
            _ => false,
        }
    }

    fn driver(call: &'static str, status: i32) -> Self {
        Self::Driver { call, status }
    }
}

/// `NAME (n)` of a `CUresult`.
struct Status(i32);

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match status_name(self.0) {
            Some(name) => write!(f, "{name} ({})", self.0),
            None => write!(f, "CUresult {}", self.0),
        }
    }
}

impl fmt::Display for CudaKernelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NvrtcNotFound { tried, reasons } => {
                write!(f, "NVRTC not found: tried {}", tried.join(", "))?;
                for (name, why) in reasons {
                    write!(f, "; {name}: {why}")?;
                }
                write!(
                    f,
                    ". Install the CUDA toolkit's libnvrtc (the cuda-nvrtc package of the \
                     driver's CUDA version) or add the folder holding libnvrtc.so.{} to \
                     LD_LIBRARY_PATH (or set CUDA_PATH); or compile ahead of time (nvcc -cubin or \
                     -ptx) and load the PTX or cubin with CudaShim::load_module, which needs no \
                     NVRTC (the way on Jetson, where JIT compilation is discouraged)",
                    crate::BINDING_VERSION / 1000
                )
            }
            Self::NvrtcMissingSymbol { library, symbol } => write!(
                f,
                "the NVRTC library {library} lacks {symbol}, which devcmd-cuda calls: it is not \
                 an NVRTC of CUDA 11.2 or newer; install the toolkit's libnvrtc matching the \
                 driver, or load PTX or a cubin with CudaShim::load_module"
            ),
            Self::UnsupportedArch {
                device,
                nvrtc,
                supported,
            } => write!(
                f,
                "NVRTC {}.{} cannot compile for this device (compute capability {}.{}): it \
                 supports {:?} only; use the NVRTC of an older CUDA toolkit, or load PTX or a \
                 cubin built for sm_{}{} with CudaShim::load_module",
                nvrtc.0, nvrtc.1, device.0, device.1, supported, device.0, device.1
            ),
            Self::Compile { log, options } => write!(
                f,
                "the CUDA C source does not compile (NVRTC, options {options:?}); fix the \
                 source. NVRTC's log:\n{log}"
            ),
            Self::Nvrtc {
                call,
                status,
                message,
                log,
            } => {
                write!(f, "{call} failed: {message} (nvrtcResult {status})")?;
                if *status == 5 {
                    write!(
                        f,
                        "; an option is not one NVRTC knows: check the options passed"
                    )?;
                }
                if !log.is_empty() {
                    write!(f, ". NVRTC's log:\n{log}")?;
                }
                Ok(())
            }
            Self::Nul { what } => write!(
                f,
                "{what} holds a NUL byte, which the CUDA APIs cannot take; remove it"
            ),
            Self::EmptyImage => write!(
                f,
                "the module image is empty: pass the bytes of PTX text, a cubin or a fatbin"
            ),
            Self::Load {
                format,
                status: s,
                log,
                driver,
            } => {
                write!(
                    f,
                    "the driver could not load the {format} image: cuModuleLoadDataEx returned \
                     {}",
                    Status(*s)
                )?;
                let hint = match *s {
                    status::NO_BINARY_FOR_GPU => {
                        "; the image holds no code for this device's architecture: build it for \
                         the device's sm_XY (see CudaShim::compute_capability) or include PTX"
                    }
                    status::UNSUPPORTED_PTX_VERSION => {
                        "; the PTX is newer than the driver understands: build it with a toolkit \
                         no newer than the driver, or update the driver"
                    }
                    status::INVALID_PTX => "; the PTX does not assemble (see the log)",
                    status::INVALID_IMAGE => {
                        "; the bytes are not a cubin, fatbin or PTX text this driver reads"
                    }
                    status::JIT_COMPILER_NOT_FOUND => {
                        "; the driver's PTX compiler (libnvidia-ptxjitcompiler) is missing: \
                         load a cubin instead"
                    }
                    _ => "",
                };
                write!(
                    f,
                    "{hint} (driver CUDA {}.{})",
                    driver / 1000,
                    driver % 1000 / 10
                )?;
                if !log.is_empty() {
                    write!(f, ". The driver's log:\n{log}")?;
                }
                Ok(())
            }
            Self::NoSuchKernel { name } => write!(
                f,
                "the module has no kernel named `{name}`: a kernel must be `__global__` and, in \
                 CUDA C++, declared `extern \"C\"` (otherwise its name is mangled); check the \
                 spelling"
            ),
            Self::ParamMismatch {
                kernel,
                expected,
                given,
            } => {
                write!(
                    f,
                    "kernel `{kernel}` takes {} parameter(s) of {expected:?} bytes, the launch \
                     passed {} of {given:?} bytes",
                    expected.len(),
                    given.len()
                )?;
                if let Some(i) = expected.iter().zip(given).position(|(e, g)| e != g) {
                    write!(
                        f,
                        " (parameter {i} is {} bytes in the kernel, {} passed)",
                        expected[i], given[i]
                    )?;
                }
                write!(
                    f,
                    "; pass every parameter in the kernel's order with its exact size: a Buffer \
                     is an 8-byte pointer, a Scalar the bytes of the C type (4 for int and float, \
                     8 for long long and double)"
                )
            }
            Self::ParamSizesUnknown { kernel } => write!(
                f,
                "the parameter sizes of kernel `{kernel}` cannot be read with these bindings or \
                 this driver (cuFuncGetParamInfo needs CUDA 12.4 bindings: the cuda-12060 or \
                 cuda-13000 feature), and a launch with wrong sizes would make the driver read \
                 past a parameter; declare them with CudaModule::kernel_with_sizes(name, sizes) \
                 (8 for a pointer, the C type's size for a scalar)"
            ),
            Self::Driver { call, status: s } => {
                write!(f, "{call} failed: {}", Status(*s))?;
                if is_sticky(*s) {
                    write!(
                        f,
                        "; the device is lost for this process: CUDA recovers from it only in \
                         a new process"
                    )?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for CudaKernelError {}

/// A loaded module: unloaded (with its context bound) when the last [`CudaModule`] or
/// [`CudaKernel`] holding it drops.
struct Module {
    raw: sys::CUmodule,
    ctx: Arc<Context>,
    format: ImageFormat,
    /// The NVRTC options of a compiled module (empty for a loaded one).
    options: Vec<String>,
    /// NVRTC's log of a compiled module (its warnings; empty for a loaded one).
    log: String,
}

// SAFETY: a `CUmodule` is a driver handle usable from any thread with its context current; the
// context is bound before every use and in `Drop`.
unsafe impl Send for Module {}
// SAFETY: the driver API is thread-safe; `&Module` only passes the handle to it.
unsafe impl Sync for Module {}

impl Drop for Module {
    fn drop(&mut self) {
        // Not inside a recording of the process: `cuModuleUnload` waits for the whole device,
        // which global-mode capture refuses (the module would stay loaded and the recording be
        // spoiled); it then waits for the last recording to end.
        // SAFETY: the module was loaded by `load` and is unloaded once (this drop); no kernel of
        // it is left (each holds the `Arc` this drop ends). Work already enqueued keeps what it
        // needs.
        unsafe { crate::recording::release(&self.ctx, crate::recording::Release::Module(self.raw)) }
    }
}

/// A module loaded on the device: the kernels of one compile or one image. Cheap to clone; the
/// module stays loaded while any clone, any [`CudaKernel`] of it or any
/// [`CudaGraph`](crate::CudaGraph) that recorded one of its kernels lives. `Send + Sync`.
///
/// Unloading (when the last of those drops) calls `cuModuleUnload`, which **waits until the
/// whole device is idle**, not only this module's work (measured on the H200): drop modules at
/// shutdown, not while streams are busy.
#[derive(Clone)]
pub struct CudaModule {
    inner: Arc<Module>,
}

impl fmt::Debug for CudaModule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaModule")
            .field("raw", &self.inner.raw)
            .field("format", &self.inner.format)
            .field("options", &self.inner.options)
            .finish_non_exhaustive()
    }
}

impl CudaModule {
    /// The kernel `name` (`cuModuleGetFunction`), with its parameter sizes read from the driver
    /// (see [`CudaKernel`]).
    ///
    /// # Errors
    ///
    /// [`CudaKernelError::NoSuchKernel`] when the module has none of that name;
    /// [`CudaKernelError::ParamSizesUnknown`] where the bindings or the driver cannot tell the
    /// sizes (then declare them: [`Self::kernel_with_sizes`]).
    pub fn kernel(&self, name: &str) -> Result<CudaKernel, CudaKernelError> {
        let raw = self.function(name)?;
        let Some(params) = param_sizes(raw)? else {
            return Err(CudaKernelError::ParamSizesUnknown {
                kernel: name.to_owned(),
            });
        };
        Ok(self.kernel_of(raw, name, params))
    }

    /// The kernel `name` with its parameter sizes declared (in bytes, in order: 8 for a pointer,
    /// the C type's size for a scalar), for bindings or drivers that cannot read them; where they
    /// can, the declaration must match what the driver says.
    ///
    /// # Errors
    ///
    /// [`CudaKernelError::NoSuchKernel`]; [`CudaKernelError::ParamMismatch`] when the driver
    /// knows other sizes.
    pub fn kernel_with_sizes(
        &self,
        name: &str,
        sizes: &[usize],
    ) -> Result<CudaKernel, CudaKernelError> {
        let raw = self.function(name)?;
        if let Some(known) = param_sizes(raw)?
            && *known != *sizes
        {
            return Err(CudaKernelError::ParamMismatch {
                kernel: name.to_owned(),
                expected: known.to_vec(),
                given: sizes.to_vec(),
            });
        }
        Ok(self.kernel_of(raw, name, sizes.into()))
    }

    fn kernel_of(&self, raw: sys::CUfunction, name: &str, params: Arc<[usize]>) -> CudaKernel {
        CudaKernel {
            raw,
            ctx: self.inner.ctx.raw(),
            signature: Signature::of(&params),
            name: intern(name),
            params,
            module: Arc::clone(&self.inner),
        }
    }

    /// `cuModuleGetFunction` of `name`.
    fn function(&self, name: &str) -> Result<sys::CUfunction, CudaKernelError> {
        let c_name = CString::new(name).map_err(|_| CudaKernelError::Nul {
            what: "the kernel name",
        })?;
        bind(&self.inner.ctx)?;
        let mut raw = ptr::null_mut();
        // SAFETY: the module is alive (held by `self`), the name NUL-terminated, the pointer
        // valid for one write; the context is current.
        let r =
            code(unsafe { sys::cuModuleGetFunction(&mut raw, self.inner.raw, c_name.as_ptr()) });
        match r {
            status::SUCCESS => Ok(raw),
            status::NOT_FOUND => Err(CudaKernelError::NoSuchKernel {
                name: name.to_owned(),
            }),
            s => Err(CudaKernelError::driver("cuModuleGetFunction", s)),
        }
    }

    /// What the module was loaded from.
    pub fn format(&self) -> ImageFormat {
        self.inner.format
    }

    /// The options NVRTC compiled it with, the architecture included (empty for a module loaded
    /// with [`CudaShim::load_module`]).
    pub fn compile_options(&self) -> &[String] {
        &self.inner.options
    }

    /// NVRTC's log of the compile: its warnings (empty when it wrote none, and for a loaded
    /// module).
    pub fn compile_log(&self) -> &str {
        &self.inner.log
    }

    /// The raw `CUmodule`, for code that calls the driver itself. Valid while `self` lives.
    pub fn cu_module(&self) -> sys::CUmodule {
        self.inner.raw
    }
}

/// A kernel of a loaded module, ready to launch; it keeps its module loaded. Cheap to clone;
/// `Send + Sync`.
///
/// # Parameters
///
/// [`Shim::launch`](devcmd::Shim::launch) passes the kernel's parameters in its order
/// ([`KernelParam`]): a `Buffer(slot)` as the 64-bit device address of `buffers[slot]`, a
/// `Scalar` as its bytes, exactly the parameter's size. With bindings of CUDA 12.4 or newer (the
/// features `cuda-12060` and `cuda-13000`, [`PARAM_INFO_BINDINGS`]) and a driver that has
/// `cuFuncGetParamInfo`, the sizes are read once, when the kernel is looked up
/// ([`Self::param_sizes`]). With older bindings (`cuda-11040`, `cuda-12020`: JetPack 5 and 6.0),
/// or a driver that cannot tell, [`CudaModule::kernel`] refuses to hand the kernel out and the
/// sizes are declared instead ([`CudaModule::kernel_with_sizes`]). Either way every kernel has
/// its sizes, and a launch whose count or sizes differ is refused with
/// [`status::PARAM_MISMATCH`](crate::status::PARAM_MISMATCH) ([`Self::check_params`] says what
/// differs): the driver never reads past a scalar.
#[derive(Clone)]
pub struct CudaKernel {
    raw: sys::CUfunction,
    /// The module's context (a copy of its handle: a launch compares it without reading the
    /// module, which `module` keeps alive).
    ctx: sys::CUcontext,
    /// The parameter sizes a launch checks, kept here (see [`Signature`]).
    signature: Signature,
    /// Interned ([`intern`]): failure reports carry it as `&'static str`.
    name: &'static str,
    /// The parameter sizes in bytes: read from the driver, or declared.
    params: Arc<[usize]>,
    module: Arc<Module>,
}

/// Parameters whose sizes a kernel keeps inline.
const INLINE_PARAMS: usize = 12;

/// The parameter sizes a launch checks, in the kernel itself: a launch beside a driver call
/// finds the core's and the shim's lines out of the caches, and each line it reads costs, so the
/// check reads no line but the kernel's. Kernels of more parameters (or of a parameter past
/// 64 KiB, more than the driver takes) are checked against the shared list instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Signature {
    /// The sizes, kept here.
    Inline {
        len: u8,
        sizes: [u16; INLINE_PARAMS],
    },
    /// Checked against the kernel's shared list.
    Shared,
}

impl Signature {
    fn of(params: &[usize]) -> Self {
        let mut sizes = [0u16; INLINE_PARAMS];
        let fits = params.len() <= INLINE_PARAMS
            && params
                .iter()
                .zip(&mut sizes)
                .all(|(&p, s)| u16::try_from(p).map(|p| *s = p).is_ok());
        match u8::try_from(params.len()) {
            Ok(len) if fits => Self::Inline { len, sizes },
            _ => Self::Shared,
        }
    }

    /// Whether `given` match the kernel's parameters in number and size; `all` is the kernel's
    /// whole list, which this signature was made of (read only when it is not kept inline).
    #[inline]
    fn matches(&self, all: &[usize], given: &[KernelParam<'_>]) -> bool {
        match self {
            Self::Inline { len, sizes } => {
                usize::from(*len) == given.len()
                    && sizes
                        .iter()
                        .zip(given)
                        .all(|(&s, p)| usize::from(s) == size_of_param(p))
            }
            Self::Shared => {
                all.len() == given.len()
                    && all.iter().zip(given).all(|(s, p)| *s == size_of_param(p))
            }
        }
    }
}

// SAFETY: a `CUfunction` and a `CUcontext` are driver handles usable from any thread (the
// context's only compared here); a launch runs in its stream's context (see
// `Context::launch_unbound`).
unsafe impl Send for CudaKernel {}
// SAFETY: the driver API is thread-safe; `&CudaKernel` only passes the handle to it.
unsafe impl Sync for CudaKernel {}

impl fmt::Debug for CudaKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaKernel")
            .field("name", &self.name)
            .field("param_sizes", &self.params)
            .field("format", &self.module.format)
            .finish_non_exhaustive()
    }
}

impl CudaKernel {
    /// The kernel's name, as asked for: the name of its launches in every failure report
    /// ([`devcmd::Shim::kernel_name`]).
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The sizes in bytes of the kernel's parameters, in order: read by `cuFuncGetParamInfo`,
    /// or declared ([`CudaModule::kernel_with_sizes`]).
    pub fn param_sizes(&self) -> &[usize] {
        &self.params
    }

    /// Whether `params` match the kernel's parameters in number and size (a buffer is 8
    /// bytes); the check [`Shim::launch`](devcmd::Shim::launch) makes, with the reason.
    ///
    /// # Errors
    ///
    /// [`CudaKernelError::ParamMismatch`], naming both lists of sizes.
    pub fn check_params(&self, params: &[KernelParam<'_>]) -> Result<(), CudaKernelError> {
        if self.params_match(params) {
            return Ok(());
        }
        Err(CudaKernelError::ParamMismatch {
            kernel: self.name.to_string(),
            expected: self.params.to_vec(),
            given: params.iter().map(size_of_param).collect(),
        })
    }

    /// The launch's check: counts and sizes equal.
    #[inline]
    fn params_match(&self, params: &[KernelParam<'_>]) -> bool {
        self.signature.matches(&self.params, params)
    }

    /// The raw `CUfunction`, for code that calls the driver itself. Valid while `self` lives.
    pub fn cu_function(&self) -> sys::CUfunction {
        self.raw
    }

    /// The module the kernel belongs to.
    pub fn module(&self) -> CudaModule {
        CudaModule {
            inner: Arc::clone(&self.module),
        }
    }
}

/// The size a parameter passes: 8 for a buffer's address, the bytes of a scalar.
fn size_of_param(p: &KernelParam<'_>) -> usize {
    match p {
        KernelParam::Buffer(_) => 8,
        KernelParam::Scalar(bytes) => bytes.len(),
    }
}

/// Binds `ctx`, as a kernel error.
fn bind(ctx: &Context) -> Result<(), CudaKernelError> {
    ctx.bind(ShimOp::Launch)
        .map_err(|e| CudaKernelError::driver("cuCtxSetCurrent", e.status))
}

/// The parameter sizes of `f` (`cuFuncGetParamInfo`, index by index until the driver answers
/// `CUDA_ERROR_INVALID_VALUE` past the last), or `None` where the driver lacks the function or
/// cannot tell for this kernel.
#[cfg(any(feature = "cuda-12060", feature = "cuda-13000"))]
fn param_sizes(f: sys::CUfunction) -> Result<Option<Arc<[usize]>>, CudaKernelError> {
    use std::sync::OnceLock;
    /// A kernel's parameters fill at most 32 764 bytes, so no kernel has more.
    const MAX_PARAMS: usize = 32_768;
    static DRIVER_HAS_IT: OnceLock<bool> = OnceLock::new();
    if !*DRIVER_HAS_IT.get_or_init(|| crate::driver::has_symbol("cuFuncGetParamInfo")) {
        return Ok(None);
    }
    let mut sizes = Vec::new();
    for index in 0..MAX_PARAMS {
        let (mut offset, mut size) = (0usize, 0usize);
        // SAFETY: the symbol exists (checked above); `f` is a live function of the current
        // context; both pointers are valid for one write.
        let r = code(unsafe { sys::cuFuncGetParamInfo(f, index, &mut offset, &mut size) });
        match r {
            status::SUCCESS => sizes.push(size),
            status::INVALID_VALUE => return Ok(Some(sizes.into())),
            s if is_sticky(s) => return Err(CudaKernelError::driver("cuFuncGetParamInfo", s)),
            // The driver cannot tell for this kernel: unchecked, as with older bindings.
            _ => return Ok(None),
        }
    }
    Ok(None)
}

/// Older bindings do not declare `cuFuncGetParamInfo`: sizes are the caller's responsibility.
#[cfg(not(any(feature = "cuda-12060", feature = "cuda-13000")))]
fn param_sizes(_f: sys::CUfunction) -> Result<Option<Arc<[usize]>>, CudaKernelError> {
    Ok(None)
}

/// The bytes the header of a cubin (ELF64: section and program header tables) or a fatbin
/// (16-byte header + its stated size) says the image spans; `None` for PTX. A header too short
/// to read claims one byte more than the image.
fn header_extent(image: &[u8]) -> Option<u64> {
    let u16_at = |o: usize| {
        image
            .get(o..o + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    let u64_at = |o: usize| {
        image
            .get(o..o + 8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
    };
    let short = image.len() as u64 + 1;
    match ImageFormat::of(image) {
        ImageFormat::Ptx => None,
        ImageFormat::Fatbin => Some(u64_at(8).map_or(short, |size| size.saturating_add(16))),
        ImageFormat::Cubin => {
            let table = |off: usize, count: usize, entry: usize| -> Option<u64> {
                let (o, n, e) = (u64_at(off)?, u16_at(count)?, u16_at(entry)?);
                Some(o.saturating_add(u64::from(n) * u64::from(e)))
            };
            // ELF64: e_phoff 0x20, e_shoff 0x28, e_phentsize 0x36, e_phnum 0x38,
            // e_shentsize 0x3A, e_shnum 0x3C; the header itself is 64 bytes.
            let extent = table(0x20, 0x38, 0x36)
                .zip(table(0x28, 0x3C, 0x3A))
                .map(|(p, s)| p.max(s).max(64));
            Some(extent.unwrap_or(short))
        }
    }
}

/// Loads `image` in `ctx` (`cuModuleLoadDataEx`, keeping the driver's error log).
fn load(
    ctx: &Arc<Context>,
    image: &[u8],
    options: Vec<String>,
    log: String,
    driver: i32,
) -> Result<CudaModule, CudaKernelError> {
    if image.is_empty() {
        return Err(CudaKernelError::EmptyImage);
    }
    let format = ImageFormat::of(image);
    // PTX must end with a NUL; binary images are read as 8-byte words, so they get an aligned
    // copy when they are not aligned.
    let mut words: Vec<u64> = Vec::new();
    let mut text: Vec<u8> = Vec::new();
    let data: *const c_void = match format {
        ImageFormat::Ptx if image.last() != Some(&0) => {
            text.reserve_exact(image.len() + 1);
            text.extend_from_slice(image);
            text.push(0);
            text.as_ptr().cast()
        }
        ImageFormat::Cubin | ImageFormat::Fatbin if image.as_ptr().align_offset(8) != 0 => {
            words.resize(image.len().div_ceil(8), 0);
            // SAFETY: `words` holds at least `image.len()` bytes; the two do not overlap.
            unsafe {
                ptr::copy_nonoverlapping(image.as_ptr(), words.as_mut_ptr().cast(), image.len())
            };
            words.as_ptr().cast()
        }
        _ => image.as_ptr().cast(),
    };
    bind(ctx)?;
    let mut error_log = vec![0u8; LOG_BYTES];
    let mut keys = [
        sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER,
        sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
    ];
    let mut values: [*mut c_void; 2] = [
        error_log.as_mut_ptr().cast(),
        ptr::without_provenance_mut(LOG_BYTES),
    ];
    let mut raw = ptr::null_mut();
    // SAFETY: `data` points to the whole image (NUL-terminated for PTX, aligned for binaries),
    // alive across the call; the options pair the log buffer with its size; the pointer is
    // valid for one write; the context is current.
    let r = code(unsafe {
        sys::cuModuleLoadDataEx(
            &mut raw,
            data,
            keys.len() as u32,
            keys.as_mut_ptr(),
            values.as_mut_ptr(),
        )
    });
    if r != status::SUCCESS {
        let end = error_log
            .iter()
            .position(|b| *b == 0)
            .unwrap_or(error_log.len());
        return Err(CudaKernelError::Load {
            format,
            status: r,
            log: String::from_utf8_lossy(&error_log[..end])
                .trim_end()
                .to_owned(),
            driver,
        });
    }
    Ok(CudaModule {
        inner: Arc::new(Module {
            raw,
            ctx: Arc::clone(ctx),
            format,
            options,
            log,
        }),
    })
}

impl CudaShim {
    /// Compiles CUDA C `source` with NVRTC and loads it: once, at start-up.
    ///
    /// The target is the device's own architecture ([`Self::compute_capability`]): a cubin for
    /// `sm_XY` where NVRTC knows it, else PTX for the newest older `compute_XY`, which the
    /// driver compiles for the device. An architecture among `options`
    /// (`--gpu-architecture=...` or `-arch=...`, e.g. `sm_90a` for Hopper's own instructions) is
    /// used as given. Kernels must be `extern "C"` to be found by their plain names.
    ///
    /// # Errors
    ///
    /// [`CudaKernelError::NvrtcNotFound`] without NVRTC ("NVRTC not found: tried ...", never a
    /// panic); [`CudaKernelError::Compile`] with NVRTC's log when the source does not compile;
    /// [`CudaKernelError::Load`] when the driver refuses the result.
    pub fn compile(&self, source: &str, options: &[&str]) -> Result<CudaModule, CudaKernelError> {
        let compiled = nvrtc::compile(source, options, self.compute_capability())?;
        load(
            self.context(),
            &compiled.image,
            compiled.options,
            compiled.log,
            self.driver_version(),
        )
    }

    /// Compiles CUDA C `source` as [`Self::compile`] does, without loading it: the cubin (or the
    /// PTX, with its NUL) for [`Self::load_module`], e.g. to keep on disk so that later start-ups
    /// skip NVRTC.
    ///
    /// # Errors
    ///
    /// As [`Self::compile`], less the load.
    pub fn compile_image(
        &self,
        source: &str,
        options: &[&str],
    ) -> Result<Vec<u8>, CudaKernelError> {
        Ok(nvrtc::compile(source, options, self.compute_capability())?.image)
    }

    /// Loads PTX text built ahead of time (`nvcc -ptx`, or [`Self::compile_image`] for an older
    /// architecture); needs no NVRTC. The driver compiles it for the device while loading it
    /// (kept in its cache, `~/.nv/ComputeCache`). Safe: the text is NUL-terminated here, so the
    /// driver reads nothing past it.
    ///
    /// # Errors
    ///
    /// [`CudaKernelError::Load`] with the PTX assembler's log; [`CudaKernelError::EmptyImage`].
    pub fn load_ptx(&self, ptx: &str) -> Result<CudaModule, CudaKernelError> {
        if ImageFormat::of(ptx.as_bytes()) != ImageFormat::Ptx {
            return Err(CudaKernelError::Load {
                format: ImageFormat::of(ptx.as_bytes()),
                status: status::INVALID_VALUE,
                log: "a binary image given as PTX text; load it with CudaShim::load_module"
                    .to_owned(),
                driver: self.driver_version(),
            });
        }
        load(
            self.context(),
            ptx.as_bytes(),
            Vec::new(),
            String::new(),
            self.driver_version(),
        )
    }

    /// Loads a module built ahead of time: PTX text (with or without its final NUL), a cubin
    /// (ELF) or a fatbin, as `cuModuleLoadDataEx` takes them; needs no NVRTC. The sizes an ELF
    /// or fatbin header states are checked against `image.len()` first, so a truncated file is
    /// an error, not a read past the end; PTX is NUL-terminated here.
    ///
    /// # Errors
    ///
    /// [`CudaKernelError::Load`] with the driver's log (the PTX assembler's errors for PTX), and
    /// a hint for the common statuses (no code for this architecture, PTX newer than the
    /// driver); a header whose sizes pass the end of `image`.
    ///
    /// # Safety
    ///
    /// A cubin or fatbin must be well formed past its header (as the CUDA toolchain or
    /// [`Self::compile_image`] writes it): `cuModuleLoadDataEx` takes no length and trusts the
    /// offsets inside the image, which this cannot check in full. Use [`Self::load_ptx`] for
    /// text from an untrusted source.
    pub unsafe fn load_module(&self, image: &[u8]) -> Result<CudaModule, CudaKernelError> {
        if let Some(claimed) = header_extent(image)
            && claimed > image.len() as u64
        {
            return Err(CudaKernelError::Load {
                format: ImageFormat::of(image),
                status: status::INVALID_VALUE,
                log: format!(
                    "the image's header describes {claimed} bytes but only {} were given: a \
                     truncated file? rebuild or re-copy it",
                    image.len()
                ),
                driver: self.driver_version(),
            });
        }
        load(
            self.context(),
            image,
            Vec::new(),
            String::new(),
            self.driver_version(),
        )
    }

    /// The NVRTC this process compiles with: its library and version (`(13, 0)`), or why none
    /// loads.
    ///
    /// # Errors
    ///
    /// As [`Self::compile`] without NVRTC.
    pub fn nvrtc() -> Result<(String, (i32, i32)), CudaKernelError> {
        nvrtc::load().map(|n| (n.library.clone(), n.version))
    }
}

/// Enqueues `kernel` on `stream` (`cuLaunchKernel`), its parameters in the kernel's order.
///
/// # Safety
///
/// [`Shim::launch`](devcmd::Shim::launch)'s contract: every span lies in a live device page and
/// the kernel accesses nothing outside them. `ctx` is the shim's context, the stream's (current
/// on this thread or not: the launch runs in the stream's context).
pub(crate) unsafe fn launch(
    ctx: &Context,
    stream: &CudaStream,
    kernel: &CudaKernel,
    dims: LaunchDims,
    buffers: &[DeviceSpan],
    params: &[KernelParam<'_>],
) -> Result<(), DriverError> {
    const OP: ShimOp = ShimOp::Launch;
    if kernel.ctx != ctx.raw() {
        return Err(classify(OP, status::BAD_ARGUMENT));
    }
    // No stream of the process records (the usual case): no lock taken. If this stream
    // records, the count went up when its recording's list was made and goes down when it goes
    // (`graph.rs`), both by the core's command on this stream, never beside a launch on it.
    if crate::recording::any()
        && let Some(kept) = stream
            .recorded
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_mut()
    {
        // Recorded, not run: a replay of the graph will run the module's code.
        crate::graph::keep_once(kept, Arc::clone(&kernel.module) as Arc<dyn Send + Sync>);
    }
    if !kernel.params_match(params) {
        return Err(classify(OP, status::PARAM_MISMATCH));
    }
    let n = params.len();
    if n <= STACK_PARAMS {
        let mut addrs = [0u64; STACK_PARAMS];
        let mut ptrs = [ptr::null_mut::<c_void>(); STACK_PARAMS];
        // SAFETY: the caller's promise; the arrays hold `n` entries each.
        unsafe {
            enqueue(
                stream,
                kernel,
                dims,
                buffers,
                params,
                &mut addrs[..n],
                &mut ptrs[..n],
            )
        }
    } else {
        let mut addrs = vec![0u64; n];
        let mut ptrs = vec![ptr::null_mut::<c_void>(); n];
        // SAFETY: as above.
        unsafe { enqueue(stream, kernel, dims, buffers, params, &mut addrs, &mut ptrs) }
    }
}

/// The launch proper, with room for the parameter array: `addrs` and `ptrs` hold one entry per
/// parameter.
///
/// # Safety
///
/// As [`launch`].
unsafe fn enqueue(
    stream: &CudaStream,
    kernel: &CudaKernel,
    dims: LaunchDims,
    buffers: &[DeviceSpan],
    params: &[KernelParam<'_>],
    addrs: &mut [u64],
    ptrs: &mut [*mut c_void],
) -> Result<(), DriverError> {
    const OP: ShimOp = ShimOp::Launch;
    for (addr, p) in addrs.iter_mut().zip(params) {
        if let KernelParam::Buffer(slot) = *p {
            // The core guarantees the slot is in range; a bad one is refused, not read.
            let span = buffers
                .get(slot)
                .ok_or(classify(OP, status::BAD_ARGUMENT))?;
            *addr = span.addr.0;
        }
    }
    // Every pointer into `addrs` comes from this one base, taken after the last write.
    let base = addrs.as_mut_ptr();
    for (i, (slot, p)) in ptrs.iter_mut().zip(params).enumerate() {
        *slot = match *p {
            // SAFETY: `i` is below `addrs.len()` (one entry per parameter).
            KernelParam::Buffer(_) => unsafe { base.add(i) }.cast(),
            KernelParam::Scalar(bytes) => bytes.as_ptr().cast_mut().cast(),
        };
    }
    let kernel_params = if ptrs.is_empty() {
        ptr::null_mut()
    } else {
        ptrs.as_mut_ptr()
    };
    let LaunchDims {
        grid,
        block,
        shared_bytes,
    } = dims;
    // SAFETY: the function is alive (held by `kernel`) and of the stream's context (checked by
    // `launch`); `kernel_params` holds one pointer per parameter, each to as many bytes as the
    // kernel reads for it (checked against the kernel's sizes where the driver tells them, the
    // caller's promise otherwise), alive across the call (the driver copies them at once); the
    // buffers are valid by the caller's promise.
    let r = unsafe {
        sys::cuLaunchKernel(
            kernel.raw,
            grid.x,
            grid.y,
            grid.z,
            block.x,
            block.y,
            block.z,
            shared_bytes,
            stream.cu_stream(),
            kernel_params,
            ptr::null_mut(),
        )
    };
    crate::faults::check(OP, r)
}

/// `name` as a `&'static str`: each distinct kernel name is leaked once for the process (a
/// failure report outlives the kernel it names), so the memory is bounded by the names a host
/// loads, however often it loads them.
fn intern(name: &str) -> &'static str {
    static NAMES: std::sync::Mutex<std::collections::BTreeSet<&'static str>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let mut names = NAMES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(known) = names.get(name) {
        return known;
    }
    let leaked: &'static str = Box::leak(name.into());
    names.insert(leaked);
    leaked
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_checks_counts_and_sizes_inline_and_past_it() {
        let (b, four, big) = (
            KernelParam::Buffer(0),
            KernelParam::Scalar(&[0; 4]),
            KernelParam::Scalar(&[0; 70_000]),
        );
        let sizes = [8, 8, 4];
        let sig = Signature::of(&sizes);
        assert!(matches!(sig, Signature::Inline { len: 3, .. }));
        assert!(sig.matches(&sizes, &[b, b, four]));
        assert!(!sig.matches(&sizes, &[b, four, four]), "a size differs");
        assert!(!sig.matches(&sizes, &[b, b]), "one too few");
        assert!(!sig.matches(&sizes, &[b, b, four, four]), "one too many");
        assert!(Signature::of(&[]).matches(&[], &[]));
        // Past the inline list: thirteen parameters, or one larger than a u16.
        let many = [8; INLINE_PARAMS + 1];
        let sig = Signature::of(&many);
        assert_eq!(sig, Signature::Shared);
        assert!(sig.matches(&many, &[b; INLINE_PARAMS + 1]));
        assert!(!sig.matches(&many, &[b; INLINE_PARAMS]));
        let mut wrong = [b; INLINE_PARAMS + 1];
        wrong[INLINE_PARAMS] = four;
        assert!(!sig.matches(&many, &wrong), "the last size differs");
        // Twelve, the most kept inline; a size of 65 535 is kept, 65 536 is not.
        let twelve = [8; INLINE_PARAMS];
        let sig = Signature::of(&twelve);
        assert!(matches!(sig, Signature::Inline { len, .. } if usize::from(len) == INLINE_PARAMS));
        assert!(sig.matches(&twelve, &[b; INLINE_PARAMS]));
        assert!(!sig.matches(&twelve, &[b; INLINE_PARAMS + 1]));
        let (max, past) = (
            KernelParam::Scalar(&[0; 65_535]),
            KernelParam::Scalar(&[0; 65_536]),
        );
        let sig = Signature::of(&[65_535]);
        assert!(matches!(sig, Signature::Inline { len: 1, .. }));
        assert!(sig.matches(&[65_535], &[max]));
        assert!(!sig.matches(&[65_535], &[past]));
        let sig = Signature::of(&[65_536]);
        assert_eq!(sig, Signature::Shared);
        assert!(sig.matches(&[65_536], &[past]));
        assert!(!sig.matches(&[65_536], &[max]));
        let large = [8, 70_000];
        let sig = Signature::of(&large);
        assert_eq!(sig, Signature::Shared);
        assert!(sig.matches(&large, &[b, big]));
        assert!(!sig.matches(&large, &[b, four]));
    }

    #[test]
    fn image_formats_by_their_first_bytes() {
        assert_eq!(ImageFormat::of(b"\x7fELF\x02\x01"), ImageFormat::Cubin);
        assert_eq!(
            ImageFormat::of(&[0x50, 0xED, 0x55, 0xBA, 1, 0]),
            ImageFormat::Fatbin
        );
        assert_eq!(ImageFormat::of(b"//\n.version 7.4\n"), ImageFormat::Ptx);
    }

    #[test]
    fn a_param_mismatch_names_both_lists_and_the_first_difference() {
        let e = CudaKernelError::ParamMismatch {
            kernel: "k".into(),
            expected: vec![8, 4],
            given: vec![8, 8],
        };
        let msg = e.to_string();
        assert!(
            msg.contains("takes 2 parameter(s) of [8, 4] bytes"),
            "{msg}"
        );
        assert!(
            msg.contains("parameter 1 is 4 bytes in the kernel, 8 passed"),
            "{msg}"
        );
    }

    #[test]
    fn a_load_error_names_the_status_and_what_to_do() {
        let e = CudaKernelError::Load {
            format: ImageFormat::Ptx,
            status: status::UNSUPPORTED_PTX_VERSION,
            log: String::new(),
            driver: 12020,
        };
        let msg = e.to_string();
        assert!(
            msg.contains("CUDA_ERROR_UNSUPPORTED_PTX_VERSION (222)"),
            "{msg}"
        );
        assert!(msg.contains("driver CUDA 12.2"), "{msg}");
        assert!(!e.loses_device());
        let lost = CudaKernelError::Driver {
            call: "cuModuleGetFunction",
            status: status::LAUNCH_FAILED,
        };
        assert!(lost.loses_device());
        assert!(lost.to_string().contains("the device is lost"));
    }
}
