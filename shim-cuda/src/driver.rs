//! Finding the CUDA driver library and checking it before the first call into it.
//!
//! cudarc's `dynamic-loading` mode resolves every `sys::cu*` function on its first call and
//! **panics** when the library cannot be loaded or lacks the symbol. So before anything calls
//! into cudarc, [`load`]:
//!
//! 1. tries, with `libloading`, the library names cudarc itself tries, in its order
//!    ([`cudarc::get_lib_name_candidates`] of `cuda` then `nvcuda`), and stops at the first that
//!    loads: cudarc will load that same one. None loads: [`CudaInitError::NoDriver`], naming
//!    every name tried and what the system loader said;
//! 2. asks that library for every symbol the shim calls ([`SYMBOLS`]): one missing is
//!    [`CudaInitError::MissingSymbol`], never cudarc's panic;
//! 3. compares `cuDriverGetVersion` with the bindings' `CUDA_VERSION`: a driver older than the
//!    bindings is [`CudaInitError::DriverTooOld`], naming both versions and the binding feature
//!    that would fit.

use crate::faults::status_name;
use cudarc::driver::sys;
use std::fmt;

/// The CUDA version of the bindings this crate was built with (`13000` is CUDA 13.0).
pub const BINDING_VERSION: i32 = sys::CUDA_VERSION as i32;

/// The cargo feature of this crate that chose the bindings.
pub const BINDING_FEATURE: &str = if cfg!(feature = "cuda-11040") {
    "cuda-11040"
} else if cfg!(feature = "cuda-12020") {
    "cuda-12020"
} else if cfg!(feature = "cuda-12060") {
    "cuda-12060"
} else if cfg!(feature = "cuda-13000") {
    "cuda-13000"
} else {
    // Only when cudarc's version came from `CUDARC_CUDA_VERSION` with every feature of this
    // crate off.
    "CUDARC_CUDA_VERSION"
};

/// The binding features of this crate: version, feature, the JetPack releases it suits.
pub const BINDINGS: [(i32, &str, &str); 4] = [
    (11040, "cuda-11040", "JetPack 5"),
    (12020, "cuda-12020", "JetPack 6.0"),
    (12060, "cuda-12060", "JetPack 6.1 and 6.2"),
    (
        13000,
        "cuda-13000",
        "JetPack 7, and x86_64 hosts with a CUDA 13 driver",
    ),
];

/// Every driver function the shim calls, checked in the loaded library before the first call
/// (a test checks that the sources call no other `sys::cu*` function).
pub const SYMBOLS: &[&str] = &[
    "cuDriverGetVersion",
    "cuInit",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetName",
    "cuDeviceGetAttribute",
    "cuDeviceTotalMem_v2",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxGetCurrent",
    "cuCtxSetCurrent",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    // Borrowed streams: the context they belong to.
    "cuStreamGetCtx",
    "cuStreamWaitEvent",
    // Futures that sleep (notify.rs).
    "cuStreamAddCallback",
    "cuStreamSynchronize",
    "cuEventCreate",
    "cuEventDestroy_v2",
    "cuEventRecord",
    "cuEventQuery",
    "cuEventSynchronize",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuMemHostGetDevicePointer_v2",
    "cuMemHostRegister_v2",
    "cuMemHostUnregister",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyDtoDAsync_v2",
    "cuMemcpyPeerAsync",
    "cuDeviceCanAccessPeer",
    "cuCtxEnablePeerAccess",
    "cuMemcpy2DAsync_v2",
    // Poisoned frees (`CudaShim::with_poison`).
    "cuMemsetD8_v2",
    // Kernels (kernel.rs).
    "cuModuleLoadDataEx",
    "cuModuleGetFunction",
    "cuModuleUnload",
    "cuLaunchKernel",
    // Graphs (graph.rs).
    "cuStreamBeginCapture_v2",
    "cuStreamEndCapture",
    "cuStreamIsCapturing",
    "cuGraphInstantiateWithFlags",
    "cuGraphDestroy",
    "cuGraphExecDestroy",
    "cuGraphUpload",
    "cuGraphLaunch",
];

/// Driver functions the shim calls only where the driver has them, each looked up in the loaded
/// library before its first call: `cuFuncGetParamInfo` (CUDA 12.4), for the launch's
/// parameter check, and `cuGraphExecUpdate_v2` (CUDA 12.0), for updating a graph in place
/// (each with bindings that declare it; without, the check is skipped and a graph recorded
/// again is instantiated anew); and the eight calls of virtual memory management (CUDA 10.2,
/// every binding version: `cuMemGetAllocationGranularity`, `cuMemAddressReserve`,
/// `cuMemAddressFree`, `cuMemCreate`, `cuMemRelease`, `cuMemMap`, `cuMemUnmap`,
/// `cuMemSetAccess`), looked up at set-up: without one of them the device reports a
/// `vm_granule` of 0 and the shim calls none of them.
pub const OPTIONAL_SYMBOLS: &[&str] = &[
    "cuFuncGetParamInfo",
    "cuGraphExecUpdate_v2",
    "cuMemGetAllocationGranularity",
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemSetAccess",
];

/// Why [`CudaShim::new`](crate::CudaShim::new) could not set up the device.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CudaInitError {
    /// No CUDA driver library loads.
    NoDriver {
        /// Every library name tried, in order.
        tried: Vec<String>,
        /// What the system loader said for the names it reported on: `(name, message)`.
        reasons: Vec<(String, String)>,
    },
    /// The driver library lacks a function the shim calls.
    MissingSymbol {
        /// The library that loaded.
        library: String,
        /// The function it lacks.
        symbol: &'static str,
        /// The driver's CUDA version, when it could be asked.
        driver_version: Option<i32>,
    },
    /// The driver is older than the bindings the crate was built with.
    DriverTooOld {
        /// `cuDriverGetVersion` (`12020` is CUDA 12.2).
        driver: i32,
        /// The bindings' `CUDA_VERSION`.
        bindings: i32,
    },
    /// A driver call of the set-up failed.
    Call {
        /// The driver function.
        call: &'static str,
        /// Its `CUresult`.
        status: i32,
    },
    /// The driver sees no device of this ordinal.
    NoDevice {
        /// The ordinal asked for.
        ordinal: i32,
        /// How many devices the driver sees.
        count: i32,
    },
}

impl CudaInitError {
    /// Whether no CUDA driver is installed (the GPU tests skip then).
    pub fn is_no_driver(&self) -> bool {
        matches!(self, Self::NoDriver { .. })
    }

    /// Whether a driver is installed but sees no such device (or none at all).
    pub fn is_no_device(&self) -> bool {
        matches!(
            self,
            Self::NoDevice { .. }
                | Self::Call {
                    status: crate::status::NO_DEVICE,
                    ..
                }
        )
    }
}

/// `13000` as `13.0`.
pub(crate) struct Version(pub(crate) i32);

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.0 / 1000, self.0 % 1000 / 10)
    }
}

/// What to build instead for a driver of CUDA `driver`.
fn advice_for(driver: i32) -> String {
    match BINDINGS.iter().rev().find(|(v, _, _)| *v <= driver) {
        Some((v, feature, jetpack)) => format!(
            "update the NVIDIA driver to CUDA {} or newer, or build devcmd-cuda for this driver \
             with `--no-default-features --features {feature}` (CUDA {} bindings: {jetpack})",
            Version(BINDING_VERSION),
            Version(*v)
        ),
        None => format!(
            "update the NVIDIA driver: the oldest bindings devcmd-cuda offers are CUDA {}",
            Version(BINDINGS[0].0)
        ),
    }
}

impl fmt::Display for CudaInitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoDriver { tried, reasons } => {
                write!(f, "no CUDA driver found: none of these libraries loads: ")?;
                write!(f, "{}", tried.join(", "))?;
                for (name, why) in reasons {
                    write!(f, "; {name}: {why}")?;
                }
                write!(
                    f,
                    ". Install the NVIDIA driver (it provides libcuda.so.1; on Jetson, JetPack \
                     puts it in /usr/lib/aarch64-linux-gnu/tegra), or add the folder that holds \
                     libcuda.so.1 to LD_LIBRARY_PATH; without a GPU, use the std shim \
                     (devcmd-std)"
                )
            }
            Self::MissingSymbol {
                library,
                symbol,
                driver_version,
            } => {
                write!(f, "the CUDA driver library {library} lacks {symbol}, ")?;
                match driver_version {
                    Some(v) => write!(
                        f,
                        "which devcmd-cuda calls (driver: CUDA {}, bindings: CUDA {}); {}",
                        Version(*v),
                        Version(BINDING_VERSION),
                        advice_for(*v)
                    ),
                    None => write!(
                        f,
                        "so it is not a usable NVIDIA driver; install the NVIDIA driver or fix \
                         LD_LIBRARY_PATH so that its libcuda.so.1 is found first"
                    ),
                }
            }
            Self::DriverTooOld { driver, bindings } => write!(
                f,
                "the CUDA driver is older than the bindings: the driver supports CUDA {} \
                 (cuDriverGetVersion = {driver}) but devcmd-cuda was built with CUDA {} bindings \
                 (CUDA_VERSION = {bindings}, feature {BINDING_FEATURE}); {}",
                Version(*driver),
                Version(*bindings),
                advice_for(*driver)
            ),
            Self::Call { call, status } => {
                let name = status_name(*status).unwrap_or("an unnamed CUresult");
                write!(f, "CUDA set-up failed: {call} returned {name} ({status})")?;
                let hint = match *status {
                    crate::status::STUB_LIBRARY => {
                        "; the library loaded is the CUDA toolkit's stub, not the driver: \
                         remove the toolkit's lib64/stubs folder from LD_LIBRARY_PATH"
                    }
                    crate::status::NO_DEVICE => {
                        "; the driver sees no CUDA device: check nvidia-smi and \
                         CUDA_VISIBLE_DEVICES"
                    }
                    crate::status::DEVICE_UNAVAILABLE => {
                        "; the device is busy or in exclusive-process mode (nvidia-smi -c)"
                    }
                    s if crate::faults::is_sticky(s) => {
                        "; the device was lost earlier in this process (a sticky error, such as \
                         a kernel that trapped or touched a bad address): CUDA does not recover \
                         from it within a process, not even with every handle released, so \
                         restart the process"
                    }
                    crate::status::SYSTEM_DRIVER_MISMATCH => {
                        "; the driver's user-space library and kernel module differ in \
                         version: reboot or reinstall the driver"
                    }
                    _ => "",
                };
                f.write_str(hint)
            }
            Self::NoDevice { ordinal, count } => write!(
                f,
                "CUDA device {ordinal} does not exist: the driver sees {count} device(s) \
                 (check CUDA_VISIBLE_DEVICES)"
            ),
        }
    }
}

impl std::error::Error for CudaInitError {}

/// The library names cudarc tries, in its order.
/// (cudarc lists a few twice; they are tried once.)
pub(crate) fn candidates() -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for name in ["cuda", "nvcuda"]
        .iter()
        .flat_map(|l| cudarc::get_lib_name_candidates(l))
    {
        if !names.contains(&name) {
            names.push(name);
        }
    }
    names
}

/// What the system loader said: libloading's error and its source (the `dlerror` text).
pub(crate) fn loader_message(e: &libloading::Error) -> String {
    use std::error::Error as _;
    match e.source() {
        Some(source) => format!("{e}: {source}"),
        None => e.to_string(),
    }
}

/// The first of `names` that loads, or [`CudaInitError::NoDriver`] naming them all.
pub(crate) fn find_library(names: &[String]) -> Result<String, CudaInitError> {
    first_that_loads(names, &["libcuda.so", "libcuda.so.1"]).map_err(|reasons| {
        CudaInitError::NoDriver {
            tried: names.to_vec(),
            reasons,
        }
    })
}

/// The first of `names` (a library's candidate names, as cudarc loads them) that loads, closed
/// again at once (cudarc opens its own); otherwise what the loader said for the names in
/// `telling` (the development name and the soname a Linux install has), or for the first name
/// when none of those was tried.
pub(crate) fn first_that_loads(
    names: &[String],
    telling: &[&str],
) -> Result<String, Vec<(String, String)>> {
    let mut errors = Vec::new();
    for name in names {
        // SAFETY: loading a CUDA library runs its initialisers, as every program that links it
        // does; the names are the ones cudarc itself loads.
        match unsafe { libloading::Library::new(name.as_str()) } {
            Ok(_lib) => return Ok(name.clone()),
            Err(e) => errors.push((name.clone(), loader_message(&e))),
        }
    }
    let told: Vec<(String, String)> = errors
        .iter()
        .filter(|(n, _)| telling.contains(&n.as_str()))
        .cloned()
        .collect();
    if told.is_empty() {
        Err(errors.into_iter().take(1).collect())
    } else {
        Err(told)
    }
}

/// Whether a CUDA driver library loads on this machine (without calling into it).
pub fn driver_library() -> Option<String> {
    find_library(&candidates()).ok()
}

/// Whether the driver library has `symbol`. Only after [`load`] succeeded (a [`CudaShim`]
/// exists), which loaded the library.
///
/// [`CudaShim`]: crate::CudaShim
pub(crate) fn has_symbol(symbol: &str) -> bool {
    // SAFETY: `load` succeeded before (the caller's promise), so cudarc's library is loaded and
    // `culib` returns it without panicking.
    let lib = unsafe { sys::culib() };
    // SAFETY: the symbol is only looked up, never called through this type.
    unsafe { lib.get::<unsafe extern "C" fn()>(symbol) }.is_ok()
}

/// Checks the driver library as the [module](self) says; returns the driver's CUDA version.
/// After `Ok`, every function of [`SYMBOLS`] can be called through cudarc without a panic.
pub(crate) fn load() -> Result<i32, CudaInitError> {
    let library = find_library(&candidates())?;
    // SAFETY: `find_library` just loaded one of cudarc's candidates; cudarc tries the same names
    // in the same order, so it loads (and keeps) that library instead of panicking.
    let lib = unsafe { sys::culib() };
    let has = |symbol: &str| {
        // SAFETY: the symbol is only looked up, never called through this type.
        unsafe { lib.get::<unsafe extern "C" fn()>(symbol) }.is_ok()
    };
    let missing = |symbol, driver_version| CudaInitError::MissingSymbol {
        library: library.clone(),
        symbol,
        driver_version,
    };
    if !has("cuDriverGetVersion") {
        return Err(missing("cuDriverGetVersion", None));
    }
    let mut driver = 0;
    // SAFETY: the symbol exists (checked above); the pointer is valid for one write.
    let r = unsafe { sys::cuDriverGetVersion(&mut driver) };
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(CudaInitError::Call {
            call: "cuDriverGetVersion",
            status: crate::faults::code(r),
        });
    }
    if driver < BINDING_VERSION {
        return Err(CudaInitError::DriverTooOld {
            driver,
            bindings: BINDING_VERSION,
        });
    }
    if let Some(symbol) = SYMBOLS.iter().find(|s| !has(s)) {
        return Err(missing(symbol, Some(driver)));
    }
    Ok(driver)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_library_is_a_clear_error_naming_every_name_tried() {
        let names = vec![
            "libdevcmd-no-such-driver.so".to_owned(),
            "libdevcmd-no-such-driver.so.1".to_owned(),
        ];
        let e = find_library(&names).unwrap_err();
        assert!(e.is_no_driver());
        let msg = e.to_string();
        assert!(msg.starts_with("no CUDA driver found: "), "{msg}");
        for n in &names {
            assert!(msg.contains(n.as_str()), "{msg}");
        }
        assert!(msg.contains("Install the NVIDIA driver"), "{msg}");
        assert!(msg.contains("LD_LIBRARY_PATH"), "{msg}");
    }

    #[test]
    fn the_candidates_are_cudarcs_and_include_the_drivers_soname() {
        let c = candidates();
        assert!(c.iter().any(|n| n == "libcuda.so.1"), "{c:?}");
        assert_eq!(c[0], "libcuda.so");
    }

    #[test]
    fn an_old_driver_names_both_versions_and_the_feature_that_fits() {
        let e = CudaInitError::DriverTooOld {
            driver: 12020,
            bindings: 13000,
        };
        let msg = e.to_string();
        assert!(
            msg.contains("CUDA 12.2 (cuDriverGetVersion = 12020)"),
            "{msg}"
        );
        assert!(
            msg.contains("CUDA 13.0 bindings (CUDA_VERSION = 13000"),
            "{msg}"
        );
        assert!(msg.contains("--features cuda-12020"), "{msg}");
        let ancient = CudaInitError::DriverTooOld {
            driver: 10020,
            bindings: 13000,
        }
        .to_string();
        assert!(ancient.contains("oldest bindings devcmd-cuda offers are CUDA 11.4"));
        let jp5 = CudaInitError::DriverTooOld {
            driver: 11040,
            bindings: 12060,
        }
        .to_string();
        assert!(
            jp5.contains("cuda-11040") && jp5.contains("JetPack 5"),
            "{jp5}"
        );
    }

    #[test]
    fn a_stub_library_says_so() {
        let msg = CudaInitError::Call {
            call: "cuInit",
            status: crate::status::STUB_LIBRARY,
        }
        .to_string();
        assert!(msg.contains("CUDA_ERROR_STUB_LIBRARY (34)") && msg.contains("stubs"));
        let lost = CudaInitError::Call {
            call: "cuDevicePrimaryCtxRetain",
            status: crate::status::LAUNCH_FAILED,
        }
        .to_string();
        assert!(lost.contains("restart the process"), "{lost}");
        assert!(
            CudaInitError::Call {
                call: "cuInit",
                status: crate::status::NO_DEVICE
            }
            .is_no_device()
        );
    }

    #[test]
    fn versions_print_as_major_dot_minor() {
        assert_eq!(Version(13000).to_string(), "13.0");
        assert_eq!(Version(12060).to_string(), "12.6");
        assert_eq!(Version(11040).to_string(), "11.4");
        assert_eq!(Version(BINDING_VERSION).to_string().len(), 4);
    }

    #[test]
    fn the_binding_feature_matches_the_bindings() {
        let (v, _, _) = BINDINGS
            .iter()
            .find(|(_, f, _)| *f == BINDING_FEATURE)
            .expect("built with one of the crate's binding features");
        assert_eq!(*v, BINDING_VERSION);
    }

    /// Every `sys::cu*` function the sources call is checked before the first call: a call
    /// missing from [`SYMBOLS`] could reach cudarc's panic on an old driver.
    #[test]
    fn every_driver_function_called_is_checked_first() {
        let sources = [
            include_str!("device.rs"),
            include_str!("stream.rs"),
            include_str!("notify.rs"),
            include_str!("memory.rs"),
            include_str!("driver.rs"),
            include_str!("kernel.rs"),
            include_str!("graph.rs"),
            include_str!("vm.rs"),
            include_str!("peer.rs"),
            include_str!("recording.rs"),
        ];
        let mut called = Vec::new();
        for src in sources {
            for (i, _) in src.match_indices("sys::cu") {
                let name: String = src[i + 5..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if name != "culib" && src[i + 5 + name.len()..].starts_with('(') {
                    called.push(name);
                }
            }
        }
        assert!(called.len() > 20, "{called:?}");
        for name in &called {
            assert!(
                SYMBOLS.contains(&name.as_str()) || OPTIONAL_SYMBOLS.contains(&name.as_str()),
                "{name} is not in SYMBOLS"
            );
        }
        for s in SYMBOLS.iter().chain(OPTIONAL_SYMBOLS) {
            assert!(
                called.iter().any(|c| c == s),
                "{s} is checked but never called"
            );
        }
    }

    /// The virtual-memory calls are all optional (looked up at set-up, granule 0 without).
    #[test]
    fn the_virtual_memory_calls_are_optional_symbols() {
        for s in crate::vm::SYMBOLS {
            assert!(OPTIONAL_SYMBOLS.contains(&s), "{s}");
            assert!(!SYMBOLS.contains(&s), "{s}");
        }
    }

    /// The same for NVRTC: every `nv::nvrtc*` function `nvrtc.rs` calls (or passes on) is in
    /// `NVRTC_SYMBOLS`, checked before the first call.
    #[test]
    fn every_nvrtc_function_called_is_checked_first() {
        use crate::nvrtc::NVRTC_SYMBOLS;
        let src = include_str!("nvrtc.rs");
        let mut called = Vec::new();
        for (i, _) in src.match_indices("nv::nvrtc") {
            let name: String = src[i + 4..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !matches!(name.as_str(), "nvrtcResult" | "nvrtcProgram") {
                called.push(name);
            }
        }
        assert!(called.len() > 10, "{called:?}");
        for name in &called {
            assert!(
                NVRTC_SYMBOLS.contains(&name.as_str()),
                "{name} is not in NVRTC_SYMBOLS"
            );
        }
        for s in NVRTC_SYMBOLS {
            assert!(
                called.iter().any(|c| c == s),
                "{s} is checked but never called"
            );
        }
    }
}
