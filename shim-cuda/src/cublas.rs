//! cuBLAS as library work: GEMMs (and any cuBLAS call) enqueued on a devcmd stream's CUDA stream
//! through [`Command::library`], so the core orders, guards, records and failure-rules them as it
//! does a launch.
//!
//! Owns: finding and checking the cuBLAS library ([`cublas_library`], [`CUBLAS_SYMBOLS`]), one
//! cuBLAS handle per devcmd stream with its workspace, and the mapping of a [`Gemm`] onto
//! `cublasSgemm` / `cublasGemmEx` (a product cut along k: `cublas_split.rs`). Does not own:
//! ordering, capture or the failure rule (the
//! core's `library` operation), streams (`stream.rs`).
//!
//! # Loading: no toolkit to build, a clear error without the library
//!
//! cuBLAS is loaded at run time through cudarc's `cublas` bindings (`dynamic-loading`), which
//! **panic** when the library or a symbol is missing. So [`Cublas::new`], before any call into
//! cudarc's cuBLAS layer, tries the names cudarc tries (`libcublas.so`, `libcublas.so.13`, ...:
//! [`cudarc::get_lib_name_candidates`]) with `libloading` and asks the first that loads for every
//! function this module calls ([`CUBLAS_SYMBOLS`]): a missing library is
//! [`CublasInitError::NotFound`] (every name tried, what the loader said, what to install), a
//! missing function [`CublasInitError::MissingSymbol`]; never cudarc's panic.
//!
//! # A handle per stream, a workspace per handle
//!
//! The first GEMM on a devcmd stream (or [`Cublas::prepare`]) creates a cuBLAS handle for it,
//! binds it to the stream's `CUstream` (`cublasSetStream`) and gives it a workspace
//! (`cublasSetWorkspace`): a devcmd allocation of [`Cublas::workspace_bytes`] reserved on that
//! stream (32 MiB on Hopper and newer, cuBLAS's recommendation, 4 MiB before). The workspace is
//! declared as a **write of every call**, so:
//!
//! - cuBLAS never allocates memory inside a call, which is what lets a call be recorded into a
//!   graph (a `cudaMalloc` while a stream records would invalidate the recording);
//! - the core's cross-stream order and its drop queue cover it like any buffer: a graph that
//!   recorded a GEMM keeps its workspace alive, and dropping the [`Cublas`] frees the workspace
//!   only once the work that used it is done.
//!
//! Calls on one stream share its workspace; calls on two streams never do. Creating a handle
//! allocates device memory (cuBLAS's own, and the workspace), so it is refused while any stream
//! of the device records ([`Validation::Recording`]): call [`Cublas::prepare`] on a stream
//! before recording it.
//!
//! # Costs and limits
//!
//! A call adds a mutex, a look-up among the handles (a few entries), the shape check, and the
//! core's library-work bookkeeping (four buffers: A, B, C and the workspace) to the cuBLAS call
//! itself (BENCHMARKS.md measures it).
//! Dropping a [`Cublas`] destroys its handles, and `cublasDestroy` synchronises the device
//! (cuBLAS's documentation): drop it when no stream records and a wait is acceptable. Dropped
//! while a stream of its context records, it leaks its handles instead (a synchronisation
//! would invalidate the recording).
//! F32 GEMMs run in cuBLAS's default math mode (full fp32, no TF32, unless the process sets
//! `NVIDIA_TF32_OVERRIDE=1`); F16 GEMMs take f16 inputs and outputs with fp32 accumulation
//! (`CUBLAS_COMPUTE_32F`).

use crate::device::CudaShim;
use cudarc::cublas::sys as cb;
use cudarc::driver::sys;
use devcmd::{
    CapturePhase, Command, DeviceSpan, Gemm, GemmType, Handle, LaunchError, LibraryError,
    LibraryWork, ServerError, ShimOp, Validation,
};
use std::ffi::c_void;
use std::fmt;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// Every cuBLAS function this module calls, checked in the loaded library before the first call
/// (a test checks that the sources call no other `cb::cublas*` function).
pub const CUBLAS_SYMBOLS: &[&str] = &[
    "cublasCreate_v2",
    "cublasDestroy_v2",
    "cublasGetVersion_v2",
    "cublasSetStream_v2",
    "cublasSetWorkspace_v2",
    "cublasSgemm_v2",
    "cublasGemmEx",
    "cublasGemmStridedBatchedEx",
];

/// Workspace of a handle on Hopper (compute capability 9.x) and newer: cuBLAS's recommendation.
pub const WORKSPACE_HOPPER: u64 = 32 << 20;
/// Workspace of a handle on older GPUs: cuBLAS's recommendation.
pub const WORKSPACE_DEFAULT: u64 = 4 << 20;

/// Why [`Cublas::new`] could not set cuBLAS up.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CublasInitError {
    /// No cuBLAS library loads.
    NotFound {
        /// Every library name tried, in order.
        tried: Vec<String>,
        /// What the system loader said for the names it reported on: `(name, message)`.
        reasons: Vec<(String, String)>,
    },
    /// The cuBLAS library lacks a function this crate calls.
    MissingSymbol {
        /// The library that loaded.
        library: String,
        /// The function it lacks.
        symbol: &'static str,
    },
    /// A cuBLAS or driver call of the set-up failed.
    Call {
        /// The call.
        call: &'static str,
        /// Its status, by name (`CUBLAS_STATUS_NOT_INITIALIZED`, or the driver's error).
        status: String,
    },
}

impl fmt::Display for CublasInitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotFound { tried, reasons } => {
                write!(f, "no cuBLAS library found: none of these loads: ")?;
                write!(f, "{}", tried.join(", "))?;
                for (name, why) in reasons {
                    write!(f, "; {name}: {why}")?;
                }
                write!(
                    f,
                    ". Install cuBLAS for the driver's CUDA version (the CUDA toolkit's \
                     libcublas.so.N, or the nvidia-cublas wheel's nvidia/cu13/lib) and add the \
                     folder that holds libcublas.so.N to LD_LIBRARY_PATH; devcmd-cuda needs no \
                     cuBLAS for anything else"
                )
            }
            Self::MissingSymbol { library, symbol } => write!(
                f,
                "the cuBLAS library {library} lacks {symbol}, which devcmd-cuda calls: install \
                 cuBLAS 11.4 or newer, or fix LD_LIBRARY_PATH so a current libcublas.so.N is \
                 found first"
            ),
            Self::Call { call, status } => {
                write!(f, "cuBLAS set-up failed: {call} returned {status}")?;
                if status == "CUBLAS_STATUS_NOT_INITIALIZED" {
                    write!(
                        f,
                        "; cuBLAS could not initialise the CUDA runtime it carries: a cuBLAS \
                         newer than the driver (check nvidia-smi's CUDA version against the \
                         library's) or no usable device"
                    )?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for CublasInitError {}

/// The library names cudarc tries for cuBLAS, in its order, each once.
fn candidates() -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for name in cudarc::get_lib_name_candidates("cublas") {
        if !names.contains(&name) {
            names.push(name);
        }
    }
    names
}

/// The first of `names` that loads, or [`CublasInitError::NotFound`] naming them all.
fn find_library(names: &[String]) -> Result<String, CublasInitError> {
    crate::driver::first_that_loads(names, &["libcublas.so", "libcublas.so.13"]).map_err(
        |reasons| CublasInitError::NotFound {
            tried: names.to_vec(),
            reasons,
        },
    )
}

/// The cuBLAS library that loads on this machine (without calling into it), if any.
pub fn cublas_library() -> Option<String> {
    find_library(&candidates()).ok()
}

/// Checks the library as the [module](self) says. After `Ok`, every function of
/// [`CUBLAS_SYMBOLS`] can be called through cudarc without a panic.
fn load() -> Result<String, CublasInitError> {
    let library = find_library(&candidates())?;
    // SAFETY: `find_library` just loaded one of cudarc's candidates; cudarc tries the same names
    // in the same order, so it loads (and keeps) that library instead of panicking.
    let lib = unsafe { cb::culib() };
    for symbol in CUBLAS_SYMBOLS {
        // SAFETY: the symbol is only looked up, never called through this type.
        if unsafe { lib.get::<unsafe extern "C" fn()>(*symbol) }.is_err() {
            return Err(CublasInitError::MissingSymbol {
                library: library.clone(),
                symbol,
            });
        }
    }
    Ok(library)
}

/// The status's name (`CUBLAS_STATUS_INVALID_VALUE`): the bindings' variant names are cuBLAS's.
pub(crate) fn status_name(status: cb::cublasStatus_t) -> String {
    format!("{status:?}")
}

/// `Ok` for `CUBLAS_STATUS_SUCCESS`, else the library error naming the status and the call.
pub(crate) fn library_result(call: &str, status: cb::cublasStatus_t) -> Result<(), LibraryError> {
    if status == cb::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        return Ok(());
    }
    let hint = match status {
        cb::cublasStatus_t::CUBLAS_STATUS_INVALID_VALUE => {
            ": an argument cuBLAS refuses (a size, a leading dimension, a transpose)"
        }
        cb::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED => {
            ": this combination of types, layout or compute type is not supported here"
        }
        cb::cublasStatus_t::CUBLAS_STATUS_ARCH_MISMATCH => {
            ": the GPU lacks a feature this call needs"
        }
        cb::cublasStatus_t::CUBLAS_STATUS_EXECUTION_FAILED => {
            ": the GPU program failed to launch (check the device's state)"
        }
        _ => "",
    };
    Err(LibraryError::new(
        status as i64,
        format!("{} ({call}{hint})", status_name(status)),
    ))
}

/// A cuBLAS handle, destroyed (its context bound) when dropped.
struct BlasHandle(cb::cublasHandle_t);

impl Drop for BlasHandle {
    fn drop(&mut self) {
        // SAFETY: the handle was created by `cublasCreate` and is destroyed once, here; the
        // owner bound the shim's context first (`Cublas`'s drop). Errors cannot be reported.
        let _ = unsafe { cb::cublasDestroy_v2(self.0) };
    }
}

/// The handle of one devcmd stream with its workspace, and what was last set on it.
pub(crate) struct Lane {
    /// `Issuer::device` of the device the stream belongs to.
    device: u32,
    /// The devcmd stream's index.
    stream: u32,
    handle: BlasHandle,
    /// A devcmd allocation on that stream, declared as a write of every call.
    pub(crate) workspace: Handle,
    /// The `CUstream` last given to `cublasSetStream` (`None`: none yet, so the first call sets
    /// it even to the null stream: a spare handle still points at the stream of the lane it
    /// came from, which its device destroyed).
    native: Option<sys::CUstream>,
    /// The workspace address last given to `cublasSetWorkspace` (0: none since the last
    /// `cublasSetStream`, which resets it).
    workspace_addr: u64,
}

/// cuBLAS on a [`CudaShim`]: one handle per devcmd stream, each with its workspace, calls
/// enqueued as library work ([`Command::library`]). See the [module](self) documentation.
///
/// ```no_run
/// use devcmd::{Device, DeviceConfig, Gemm, GemmType, StreamId};
/// use devcmd_cuda::{CudaShim, Cublas};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let shim = CudaShim::new(0)?;
/// let blas = Cublas::new(&shim)?; // "no cuBLAS library found: ..." without one
/// let mut device = Device::new(shim, DeviceConfig::default());
/// let mut cmd = device.command(StreamId(0))?;
/// // C (64 x 32) = A (64 x 16) B (16 x 32), f32, column-major.
/// let a = cmd.create(&[0u8; 64 * 16 * 4])?;
/// let b = cmd.create(&[0u8; 16 * 32 * 4])?;
/// let c = cmd.empty(64 * 32 * 4)?;
/// blas.gemm(&mut cmd, Gemm::packed(GemmType::F32, 64, 32, 16), &a, &b, &c)?;
/// # Ok(())
/// # }
/// ```
pub struct Cublas {
    pub(crate) shim: CudaShim,
    library: String,
    /// cuBLASLt's library name, or why it did not load ([`Cublas::lt`]).
    pub(crate) lt_library: Result<String, String>,
    version: i32,
    workspace_bytes: u64,
    /// One entry per devcmd stream that made a call; a handle made by `new` waits in `spares`.
    lanes: Mutex<Lanes>,
}

pub(crate) struct Lanes {
    lanes: Vec<Lane>,
    /// Handles without a lane (the one `new` made; those of lanes whose device was dropped),
    /// reused before a new one is created. Only `Drop` destroys a handle: `cublasDestroy`
    /// synchronises the device, which a GEMM call must not do.
    spares: Vec<BlasHandle>,
    /// cuBLASLt's handle and plans, made by [`Cublas::prepare`] or the first cuBLASLt call
    /// (`cublas_lt.rs`).
    pub(crate) lt: Option<crate::cublas_lt::Lt>,
}

// SAFETY: the cuBLAS handles are only used under the mutex, one call at a time, with the shim's
// context bound by the calling thread first (cuBLAS handles may move between threads; they may
// not be used by two at once). The workspace handles are devcmd `Handle`s, `Send + Sync`.
unsafe impl Send for Cublas {}
// SAFETY: as for `Send`: every use of a handle goes through the mutex.
unsafe impl Sync for Cublas {}

impl fmt::Debug for Cublas {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cublas")
            .field("library", &self.library)
            .field("version", &self.version)
            .field("workspace_bytes", &self.workspace_bytes)
            .finish_non_exhaustive()
    }
}

impl Drop for Cublas {
    fn drop(&mut self) {
        let _ = self.shim.context().bind(ShimOp::StreamCreate);
        let lanes = self.lanes.get_mut().unwrap_or_else(PoisonError::into_inner);
        if self.shim.is_any_stream_capturing() {
            // `cublasDestroy` synchronises the device, which would invalidate the open
            // recording (CUDA's global capture mode): the handles are leaked instead, and the
            // workspaces go back to their devices as usual.
            lanes.spares.drain(..).for_each(core::mem::forget);
            core::mem::forget(lanes.lt.take());
            for lane in lanes.lanes.drain(..) {
                core::mem::forget(lane.handle);
                drop(lane.workspace);
            }
            return;
        }
        // Handles first (each destroy synchronises the device), then the workspaces go back to
        // their devices' drop queues.
        lanes.spares.clear();
        lanes.lt = None;
        for lane in lanes.lanes.drain(..) {
            drop(lane.handle);
            drop(lane.workspace);
        }
    }
}

impl Cublas {
    /// Sets cuBLAS up on `shim`'s device: finds and checks the library (see the [module](self)
    /// docs), creates a first handle (kept for the first stream) and reads cuBLAS's version.
    /// The workspace is [`WORKSPACE_HOPPER`] on compute capability 9 and newer, else
    /// [`WORKSPACE_DEFAULT`]; [`Cublas::with_workspace`] changes it.
    ///
    /// # Errors
    ///
    /// [`CublasInitError::NotFound`] without the library, [`CublasInitError::MissingSymbol`]
    /// with one too old, [`CublasInitError::Call`] when `cublasCreate` fails.
    pub fn new(shim: &CudaShim) -> Result<Self, CublasInitError> {
        let library = load()?;
        shim.context()
            .bind(ShimOp::StreamCreate)
            .map_err(|e| CublasInitError::Call {
                call: "cuCtxSetCurrent",
                status: e.to_string(),
            })?;
        let handle = create_handle().map_err(|status| CublasInitError::Call {
            call: "cublasCreate",
            status: status_name(status),
        })?;
        let mut version = 0;
        // SAFETY: the handle is alive; the pointer is valid for one write.
        let status = unsafe { cb::cublasGetVersion_v2(handle.0, &mut version) };
        if status != cb::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return Err(CublasInitError::Call {
                call: "cublasGetVersion",
                status: status_name(status),
            });
        }
        let workspace_bytes = if shim.compute_capability().0 >= 9 {
            WORKSPACE_HOPPER
        } else {
            WORKSPACE_DEFAULT
        };
        Ok(Self {
            shim: shim.clone(),
            library,
            lt_library: crate::cublas_lt::load_lt(),
            version,
            workspace_bytes,
            lanes: Mutex::new(Lanes {
                lanes: Vec::new(),
                spares: vec![handle],
                lt: None,
            }),
        })
    }

    /// The same, with a workspace of `bytes` per stream for the streams set up from now on
    /// (cuBLAS rounds nothing: pass a multiple of 256; 0 gives cuBLAS no workspace, which some
    /// algorithms need).
    pub fn with_workspace(mut self, bytes: u64) -> Self {
        self.workspace_bytes = bytes;
        self
    }

    /// The library that was loaded (`libcublas.so.13`).
    pub fn library(&self) -> &str {
        &self.library
    }

    /// cuBLAS's version (`cublasGetVersion`: 130000 + minor * 100 + patch for 13.x).
    pub fn version(&self) -> i32 {
        self.version
    }

    /// Bytes of the workspace each stream's handle gets.
    pub fn workspace_bytes(&self) -> u64 {
        self.workspace_bytes
    }

    /// The cuBLAS handles (each with its workspace) this `Cublas` holds for streams: one per
    /// stream it served. Those of a dropped device go when the next stream is served (their
    /// handles kept as spares for the streams served next), or with the `Cublas`.
    pub fn streams_held(&self) -> usize {
        self.lock().lanes.len()
    }

    /// Creates the cuBLAS handle and workspace of `cmd`'s stream now, where the first call would
    /// otherwise: before a stream records (creating them is refused while any stream of the
    /// device records), and cuBLASLt's handle where cuBLASLt loaded. Does nothing on a stream
    /// already set up.
    ///
    /// # Errors
    ///
    /// [`Validation::Recording`] while a stream of the device records; the workspace's
    /// reservation errors; a failed `cublasCreate` as [`LaunchError::Library`] (work
    /// `"cuBLAS set-up"`, the status's name).
    pub fn prepare(&self, cmd: &mut Command<'_, CudaShim>) -> Result<(), ServerError> {
        let mut lanes = self.lock();
        self.lane(&mut lanes, cmd)?;
        // cuBLASLt's handle too, where it loaded (it may allocate on the device).
        if self.lt_library.is_ok() {
            self.ensure_lt(&mut lanes, cmd)?;
        }
        Ok(())
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Lanes> {
        self.lanes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The lane of `cmd`'s stream on `cmd`'s device, created if missing (operands of another
    /// device are refused by the core once the call reaches it, whatever the lane).
    pub(crate) fn lane<'l>(
        &self,
        lanes: &'l mut Lanes,
        cmd: &mut Command<'_, CudaShim>,
    ) -> Result<&'l mut Lane, ServerError> {
        let (device, stream) = (cmd.device_id(), cmd.stream_id().0);
        if let Some(i) = lanes
            .lanes
            .iter()
            .position(|l| l.device == device && l.stream == stream)
        {
            return Ok(&mut lanes.lanes[i]);
        }
        if cmd.capture_phase() == CapturePhase::Recording || self.shim.is_any_stream_capturing() {
            return Err(Validation::Recording {
                op: "the first cuBLAS call on a stream (cublasCreate and its workspace \
                     allocate device memory, which a recording of any device of the process \
                     would not survive; call Cublas::prepare on the stream before recording)",
            }
            .into());
        }
        // A handle of one GPU's context on another GPU's stream is undefined behaviour in
        // cuBLAS: refused before anything is made (lanes are per device, so once is enough).
        if cmd.shim().cu_context() != self.shim.cu_context() {
            return Err(library_setup_error(format!(
                "this Cublas was made for GPU {} ({}), but the command runs on GPU {} ({}); make \
                 a Cublas from that device's shim (Cublas::new) for its commands",
                self.shim.ordinal(),
                self.shim.name(),
                cmd.shim().ordinal(),
                cmd.shim().name()
            )));
        }
        // The lanes of devices dropped since (their ids never come back): their workspaces went
        // with the device; their handles wait as spares (one is taken below), never destroyed
        // here (`cublasDestroy` would synchronise the device inside this call).
        if lanes.lanes.iter().any(|l| l.workspace.is_orphaned()) {
            let (gone, kept): (Vec<Lane>, Vec<Lane>) = core::mem::take(&mut lanes.lanes)
                .into_iter()
                .partition(|l| l.workspace.is_orphaned());
            lanes.lanes = kept;
            lanes
                .spares
                .extend(gone.into_iter().map(|lane| lane.handle));
        }
        let workspace = cmd.empty(self.workspace_bytes)?;
        debug_assert_eq!(workspace.issuer().device, device);
        let handle = match lanes.spares.pop() {
            Some(h) => h,
            None => {
                self.shim
                    .context()
                    .bind(ShimOp::StreamCreate)
                    .map_err(|e| library_setup_error(e.to_string()))?;
                create_handle().map_err(|s| {
                    library_setup_error(format!("cublasCreate returned {}", status_name(s)))
                })?
            }
        };
        lanes.lanes.push(Lane {
            device,
            stream,
            handle,
            workspace,
            native: None,
            workspace_addr: 0,
        });
        let lane = lanes.lanes.last_mut().expect("just pushed");
        // Point the handle at the stream and the workspace now, outside any recording (a
        // recording then only replays what the calls enqueue).
        let handle = lane.handle.0;
        let workspace = [&lane.workspace];
        let work = LibraryWork::new("cuBLAS set-up", &[], &workspace);
        let (last_native, last_ws) = (&mut lane.native, &mut lane.workspace_addr);
        // SAFETY: the call only sets the handle's stream and workspace (host state), enqueuing
        // nothing.
        unsafe {
            cmd.library(work, |native, spans| {
                bind_for_call(handle, *native, &spans[0], last_native, last_ws)
            })
        }?;
        Ok(lane)
    }

    /// `C = alpha op(A) op(B) + beta C` ([`Gemm`], BLAS column-major convention) on `cmd`'s
    /// stream, as library work that reads `a` and `b` and writes `c` (and the stream's
    /// workspace): `cublasSgemm` for [`GemmType::F32`], `cublasGemmEx` with f16 A, B and C and
    /// fp32 compute for [`GemmType::F16`]. The shapes are checked against the handles first
    /// ([`Gemm::check_handles`]), so the GEMM touches nothing outside them.
    ///
    /// C is declared as [`Gemm::declared_c`] gives it: the bytes the product spans only, and an
    /// update (read and written in place) when `beta != 0` (cuBLAS reads it) or when `ldc > m`
    /// leaves rows between its columns unwritten, so a failure it carries there skips the GEMM
    /// and C keeps it.
    ///
    /// # Errors
    ///
    /// [`Validation::LibraryDimension`] (a size past cuBLAS's 32-bit `int`, at most 2³¹ − 1),
    /// [`Validation::LibraryOperand`], [`Validation::LibraryAlignment`] and
    /// [`Validation::LibraryLeadingDimension`] from [`Gemm::check_handles`], with nothing
    /// enqueued or marked;
    /// [`Validation::Recording`] for the first call on a stream while a stream of the device
    /// records (see [`Cublas::prepare`]);
    /// the core's library-work errors: [`ServerError::Skipped`] when `a` or `b` carries a
    /// failure, and [`LaunchError::Library`] naming the cuBLAS status
    /// (`CUBLAS_STATUS_INVALID_VALUE`) when cuBLAS refuses the call (`c` then carries it).
    pub fn gemm(
        &self,
        cmd: &mut Command<'_, CudaShim>,
        g: Gemm,
        a: &Handle,
        b: &Handle,
        c: &Handle,
    ) -> Result<(), ServerError> {
        let name = match g.dtype {
            GemmType::F32 => "cublasSgemm",
            GemmType::F16 => "cublasGemmEx (f16, fp32 compute)",
        };
        // Also refuses dimensions past cuBLAS's 32-bit int.
        g.check_handles(name, a, b, c)?;
        // C narrowed to the bytes the product spans. With `beta != 0` cuBLAS reads it too, and
        // with `ldc > m` rows between its columns stay unwritten: then it is an update, so a
        // failure it carries skips the GEMM and passes on.
        let (c, update) = g.declared_c(name, c, 1)?;
        let (c, none): ([&Handle; 1], [&Handle; 0]) = ([&*c], []);
        let (updates, writes): (&[&Handle], &[&Handle]) =
            if update { (&c, &none) } else { (&none, &c) };
        // SAFETY: `Gemm::check` showed that the matrices `g` describes (leading dimensions
        // included) lie inside `a`, `b` and `c`, and cuBLAS touches nothing else but its
        // workspace, which `call` declares; cuBLAS enqueues on the stream it is given and
        // returns without waiting.
        unsafe {
            self.call(cmd, name, &[a, b], updates, writes, |handle, spans| {
                gemm_raw(
                    handle,
                    &g,
                    spans[0].addr.0,
                    spans[1].addr.0,
                    spans[2].addr.0,
                )
            })
        }
    }

    /// Any cuBLAS call as library work on `cmd`'s stream: `call` gets the stream's cuBLAS handle
    /// (its stream and workspace set) and the device ranges of `reads`, then `updates` (read and
    /// written in place), then `writes` (the workspace is appended to `writes` and not passed), and returns cuBLAS's status; a status
    /// other than success fails the written ranges with its name. `name` names the work in
    /// failure reports.
    ///
    /// # Safety
    ///
    /// `call` enqueues only on the handle's stream, through the handle, touches only the ranges
    /// it is given (the workspace through the handle), and returns without waiting for the work.
    pub unsafe fn call<F>(
        &self,
        cmd: &mut Command<'_, CudaShim>,
        name: &'static str,
        reads: &[&Handle],
        updates: &[&Handle],
        writes: &[&Handle],
        call: F,
    ) -> Result<(), ServerError>
    where
        F: FnOnce(cb::cublasHandle_t, &[DeviceSpan]) -> cb::cublasStatus_t,
    {
        let mut lanes = self.lock();
        let lane = self.lane(&mut lanes, cmd)?;
        // Up to 8 writes on the stack; more are rare (a GEMM has one).
        let mut stack: [&Handle; 8] = [&lane.workspace; 8];
        let mut heap = Vec::new();
        let all: &[&Handle] = if writes.len() < stack.len() {
            stack[..writes.len()].copy_from_slice(writes);
            &stack[..=writes.len()]
        } else {
            heap.extend_from_slice(writes);
            heap.push(&lane.workspace);
            &heap
        };
        let handle = lane.handle.0;
        let state = (&mut lane.native, &mut lane.workspace_addr);
        let work = LibraryWork::new(name, reads, all).updating(updates);
        // SAFETY: the caller's promise for `call`; the workspace is declared among the writes,
        // and cuBLAS touches it only through the handle, inside the range given to
        // `cublasSetWorkspace` (the span the core resolved for it).
        unsafe {
            cmd.library(work, |native, spans| {
                let (ws, spans) = spans.split_last().expect("the workspace is declared");
                let (last_native, last_ws) = state;
                bind_for_call(handle, *native, ws, last_native, last_ws)?;
                library_result(name, call(handle, spans))
            })
        }
    }
}

/// Points `handle` at `native` and its workspace at `ws` where they changed since the last call.
/// The shim's context is current: the core asked the shim for `native` just before
/// (`Shim::native_stream` binds it).
fn bind_for_call(
    handle: cb::cublasHandle_t,
    native: sys::CUstream,
    ws: &DeviceSpan,
    last_native: &mut Option<sys::CUstream>,
    last_ws: &mut u64,
) -> Result<(), LibraryError> {
    if *last_native != Some(native) {
        // SAFETY: the handle is alive (owned by the lane); the stream is the devcmd stream's,
        // alive while the command is. `cudaStream_t` and `CUstream` are the same handle.
        let s = unsafe { cb::cublasSetStream_v2(handle, native.cast()) };
        library_result("cublasSetStream", s)?;
        *last_native = Some(native);
        // `cublasSetStream` resets the workspace to cuBLAS's own pool.
        *last_ws = 0;
    }
    if *last_ws != ws.addr.0 {
        let len = usize::try_from(ws.len).unwrap_or(usize::MAX);
        // SAFETY: the span is the workspace allocation the core resolved (alive while a call
        // may use it: it is a write of every call, so the drop queue and graphs keep it), 256-
        // byte aligned like every devcmd allocation.
        let s = unsafe { cb::cublasSetWorkspace_v2(handle, ws.addr.0 as *mut c_void, len) };
        library_result("cublasSetWorkspace", s)?;
        *last_ws = ws.addr.0;
    }
    Ok(())
}

/// A new cuBLAS handle (the shim's context current).
fn create_handle() -> Result<BlasHandle, cb::cublasStatus_t> {
    let mut handle = std::ptr::null_mut();
    // SAFETY: the library was checked (`load`); the pointer is valid for one write.
    let status = unsafe { cb::cublasCreate_v2(&mut handle) };
    if status == cb::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(BlasHandle(handle))
    } else {
        Err(status)
    }
}

/// A failure to set a stream's cuBLAS handle up, as the error a command returns.
fn library_setup_error(message: String) -> ServerError {
    LaunchError::Library {
        work: "cuBLAS set-up",
        error: LibraryError::new(-1, message),
    }
    .into()
}

/// The six sizes as cuBLAS's `int`, or `None` when one passes `i32::MAX`.
fn ints(v: [u32; 6]) -> Option<[i32; 6]> {
    let mut out = [0; 6];
    for (o, v) in out.iter_mut().zip(v) {
        *o = i32::try_from(v).ok()?;
    }
    Some(out)
}

fn op(transpose: bool) -> cb::cublasOperation_t {
    if transpose {
        cb::cublasOperation_t::CUBLAS_OP_T
    } else {
        cb::cublasOperation_t::CUBLAS_OP_N
    }
}

/// The cuBLAS call of `g` on `handle` with A, B and C at those device addresses.
fn gemm_raw(handle: cb::cublasHandle_t, g: &Gemm, a: u64, b: u64, c: u64) -> cb::cublasStatus_t {
    let Some([m, n, k, lda, ldb, ldc]) = ints([g.m, g.n, g.k, g.lda, g.ldb, g.ldc]) else {
        // `Cublas::gemm` refused it before; cuBLAS answers the same for a size it cannot take.
        return cb::cublasStatus_t::CUBLAS_STATUS_INVALID_VALUE;
    };
    let (ta, tb) = (op(g.trans_a), op(g.trans_b));
    let (alpha, beta) = (g.alpha, g.beta);
    match g.dtype {
        // SAFETY: the caller's contract (`Cublas::gemm`): the matrices lie in live device
        // memory the core resolved; alpha and beta are host values read during the call.
        GemmType::F32 => unsafe {
            cb::cublasSgemm_v2(
                handle,
                ta,
                tb,
                m,
                n,
                k,
                &alpha,
                a as *const f32,
                lda,
                b as *const f32,
                ldb,
                &beta,
                c as *mut f32,
                ldc,
            )
        },
        // SAFETY: as above; with `CUBLAS_COMPUTE_32F` alpha and beta are `float`.
        GemmType::F16 => unsafe {
            let f16 = cb::cudaDataType::CUDA_R_16F;
            cb::cublasGemmEx(
                handle,
                ta,
                tb,
                m,
                n,
                k,
                (&raw const alpha).cast(),
                a as *const c_void,
                f16,
                lda,
                b as *const c_void,
                f16,
                ldb,
                (&raw const beta).cast(),
                c as *mut c_void,
                f16,
                ldc,
                cb::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cb::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        },
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn no_library_is_a_clear_error_naming_every_name_tried() {
        let names = vec![
            "libdevcmd-no-such-cublas.so".to_owned(),
            "libdevcmd-no-such-cublas.so.13".to_owned(),
        ];
        let e = find_library(&names).unwrap_err();
        let msg = e.to_string();
        assert!(msg.starts_with("no cuBLAS library found: "), "{msg}");
        for n in &names {
            assert!(msg.contains(n.as_str()), "{msg}");
        }
        assert!(msg.contains("LD_LIBRARY_PATH"), "{msg}");
    }

    #[test]
    fn the_candidates_are_cudarcs_and_include_the_cuda_13_soname() {
        let c = candidates();
        assert_eq!(c[0], "libcublas.so");
        assert!(c.iter().any(|n| n == "libcublas.so.13"), "{c:?}");
    }

    #[test]
    fn a_status_becomes_a_library_error_with_its_name() {
        let e = library_result(
            "cublasSgemm",
            cb::cublasStatus_t::CUBLAS_STATUS_INVALID_VALUE,
        )
        .unwrap_err();
        assert_eq!(e.code, 7);
        assert!(
            e.message
                .starts_with("CUBLAS_STATUS_INVALID_VALUE (cublasSgemm"),
            "{}",
            e.message
        );
        assert!(library_result("x", cb::cublasStatus_t::CUBLAS_STATUS_SUCCESS).is_ok());
    }

    /// The functions `src` calls through `alias::` whose names start with `prefix` (`"cublas"`
    /// after `cb::`), each once per call site: `alias::name(`.
    pub(crate) fn called(src: &str, alias: &str, prefix: &str) -> Vec<String> {
        let mut called = Vec::new();
        for (i, _) in src.match_indices(&format!("{alias}::{prefix}")) {
            let at = i + alias.len() + 2;
            let name: String = src[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if src[at + name.len()..].starts_with('(') {
                called.push(name);
            }
        }
        called
    }

    /// Every name of `called` is in `symbols` (`list` names it) and every symbol is called.
    pub(crate) fn assert_checked(called: &[String], symbols: &[&str], list: &str) {
        for name in called {
            assert!(symbols.contains(&name.as_str()), "{name} is not in {list}");
        }
        for s in symbols {
            assert!(
                called.iter().any(|c| c == s),
                "{s} is checked but never called"
            );
        }
    }

    /// Every `cb::cublas*` function this file and `cublas_split.rs` call is checked before the
    /// first call.
    #[test]
    fn every_cublas_function_called_is_checked_first() {
        let mut called = called(include_str!("cublas.rs"), "cb", "cublas");
        called.extend(super::tests::called(
            include_str!("cublas_split.rs"),
            "cb",
            "cublas",
        ));
        assert!(called.len() >= 6, "{called:?}");
        assert_checked(&called, CUBLAS_SYMBOLS, "CUBLAS_SYMBOLS");
    }

    /// Without the library (CI), `Cublas::new` is the clear error, never a panic.
    #[test]
    fn without_cublas_new_is_the_clear_error_never_a_panic() {
        use std::io::Write;
        if cublas_library().is_some() {
            let _ = writeln!(
                std::io::stderr(),
                "skipped: a cuBLAS library loads here; tests/library.rs covers it"
            );
            return;
        }
        assert!(matches!(load(), Err(CublasInitError::NotFound { .. })));
    }
}
