//! NVRTC, CUDA's runtime compiler: finding its library, checking it before the first call into
//! it, and compiling CUDA C to a cubin (or PTX) for one device.
//!
//! Owns: the NVRTC library (found once per process), the choice of the target architecture, the
//! compile and its log. Does **not** own: loading the compiled image on the device, the modules
//! and kernels (`kernel.rs`), nor anything of the driver library (`driver.rs`).
//!
//! cudarc's `dynamic-loading` mode **panics** when NVRTC or one of its functions is missing, so,
//! as `driver.rs` does for the driver, [`load`] checks first, once per process:
//!
//! 1. tries the library names cudarc tries ([`cudarc::get_lib_name_candidates`] of `nvrtc`), in
//!    its order, and stops at the first that loads: cudarc will load that same one;
//! 2. where none loads from the loader's search path, tries the toolkit's own folders
//!    (`$CUDA_PATH`, `$CUDA_HOME`, `$CUDA_ROOT`, `/usr/local/cuda`, each `lib64`, `lib` and
//!    `targets/*/lib`) for the versioned names among cudarc's (`libnvrtc.so.13`, ...). One that
//!    loads by its full path is kept loaded (with the `libnvrtc-builtins` beside it), and the
//!    system loader then answers cudarc's own `dlopen` of that name with it (a loaded library
//!    answers to its soname);
//! 3. asks the library for every function compiled code calls ([`NVRTC_SYMBOLS`]).
//!
//! None found: [`CudaKernelError::NvrtcNotFound`] ("NVRTC not found: tried ..."), never a panic.
//! Users who ship PTX or cubins need no NVRTC at all
//! ([`CudaShim::load_ptx`](crate::CudaShim::load_ptx), [`CudaShim::load_module`](crate::CudaShim::load_module)).

use crate::kernel::CudaKernelError;
use cudarc::nvrtc::sys as nv;
use std::ffi::{CStr, CString, c_char};
use std::path::PathBuf;
use std::ptr;
use std::sync::{Mutex, OnceLock};

/// Every NVRTC function the shim calls, checked in the loaded library before the first call (a
/// test checks that `nvrtc.rs` calls no other).
pub const NVRTC_SYMBOLS: &[&str] = &[
    "nvrtcVersion",
    "nvrtcGetNumSupportedArchs",
    "nvrtcGetSupportedArchs",
    "nvrtcCreateProgram",
    "nvrtcCompileProgram",
    "nvrtcDestroyProgram",
    "nvrtcGetErrorString",
    "nvrtcGetProgramLogSize",
    "nvrtcGetProgramLog",
    "nvrtcGetCUBINSize",
    "nvrtcGetCUBIN",
    "nvrtcGetPTXSize",
    "nvrtcGetPTX",
];

/// The NVRTC found and checked in this process.
#[derive(Debug, Clone)]
pub(crate) struct Nvrtc {
    /// The library name (or path) that loaded.
    pub(crate) library: String,
    /// `nvrtcVersion`: (major, minor).
    pub(crate) version: (i32, i32),
    /// `nvrtcGetSupportedArchs`: the architectures it compiles for (`90` is sm_90), ascending.
    pub(crate) archs: Vec<i32>,
}

/// Libraries loaded by full path from a toolkit folder: kept loaded for the whole process, so
/// that cudarc's `dlopen` by name finds them.
static KEPT: Mutex<Vec<libloading::Library>> = Mutex::new(Vec::new());

/// The library names cudarc tries, in its order, each once.
pub(crate) fn candidates() -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for name in cudarc::get_lib_name_candidates("nvrtc") {
        if !names.contains(&name) {
            names.push(name);
        }
    }
    names
}

/// The folders of a CUDA toolkit where NVRTC lives, tried after the loader's search path.
fn toolkit_folders() -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = ["CUDA_PATH", "CUDA_HOME", "CUDA_ROOT"]
        .iter()
        .filter_map(std::env::var_os)
        .map(PathBuf::from)
        .collect();
    roots.push(PathBuf::from("/usr/local/cuda"));
    let mut folders = Vec::new();
    for root in roots {
        folders.push(root.join("lib64"));
        folders.push(root.join("lib"));
        if let Ok(targets) = std::fs::read_dir(root.join("targets")) {
            let mut t: Vec<PathBuf> = targets.flatten().map(|e| e.path().join("lib")).collect();
            t.sort();
            folders.extend(t);
        }
    }
    folders.dedup();
    folders
}

/// The first of cudarc's `names` that loads by name.
fn first_by_name(names: &[String], errors: &mut Vec<(String, String)>) -> Option<String> {
    for name in names {
        // SAFETY: loading NVRTC runs its initialisers, as every program using NVRTC does; the
        // names are the ones cudarc itself loads. The handle is closed at once (cudarc opens its
        // own; a library kept in `KEPT` stays loaded).
        match unsafe { libloading::Library::new(name.as_str()) } {
            Ok(_lib) => return Some(name.clone()),
            Err(e) => errors.push((name.clone(), crate::driver::loader_message(&e))),
        }
    }
    None
}

/// Finds the library cudarc will load, as the [module](self) says.
fn find_library() -> Result<String, CudaKernelError> {
    let names = candidates();
    let mut errors = Vec::new();
    if let Some(name) = first_by_name(&names, &mut errors) {
        return Ok(name);
    }
    // Not on the search path: a toolkit folder, by the versioned names only (the soname a
    // library answers to once loaded).
    let versioned: Vec<&String> = names
        .iter()
        .filter(|n| n.starts_with("libnvrtc.so.") || n.starts_with("nvrtc64_"))
        .collect();
    let mut tried_paths = Vec::new();
    for folder in toolkit_folders() {
        for name in &versioned {
            let path = folder.join(name.as_str());
            if !path.exists() {
                continue;
            }
            tried_paths.push(path.display().to_string());
            // SAFETY: as in `first_by_name`, for the same library at a full path.
            match unsafe { libloading::Library::new(&path) } {
                Ok(lib) => {
                    let mut kept = KEPT.lock().unwrap_or_else(|e| e.into_inner());
                    kept.push(lib);
                    keep_builtins(&folder, &mut kept);
                    drop(kept);
                    let mut again = Vec::new();
                    if first_by_name(&names, &mut again).is_some() {
                        return Ok(path.display().to_string());
                    }
                }
                Err(e) => errors.push((
                    path.display().to_string(),
                    crate::driver::loader_message(&e),
                )),
            }
        }
    }
    let mut tried = names;
    tried.extend(tried_paths);
    // The loader's own words for the soname of the bindings' version (the name a toolkit
    // installs), or for the first name, plus every path that existed but failed.
    let soname = format!("libnvrtc.so.{}", crate::BINDING_VERSION / 1000);
    let mut reasons: Vec<(String, String)> = errors
        .iter()
        .filter(|(n, _)| *n == soname || n.contains('/'))
        .cloned()
        .collect();
    if reasons.is_empty() {
        reasons.extend(errors.into_iter().take(1));
    }
    Err(CudaKernelError::NvrtcNotFound { tried, reasons })
}

/// Loads and keeps the `libnvrtc-builtins` of `folder` (NVRTC `dlopen`s it by name at its first
/// compile; loaded here, it answers to that name).
fn keep_builtins(folder: &std::path::Path, kept: &mut Vec<libloading::Library>) {
    let Ok(entries) = std::fs::read_dir(folder) else {
        return;
    };
    let mut builtins: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libnvrtc-builtins.so."))
        })
        .collect();
    builtins.sort();
    for path in builtins {
        // SAFETY: NVRTC's own helper library from the same toolkit folder; NVRTC loads it
        // itself at its first compile.
        if let Ok(lib) = unsafe { libloading::Library::new(&path) } {
            kept.push(lib);
        }
    }
}

/// Checks NVRTC as the [module](self) says, once per process; later calls answer the same.
/// After `Ok`, every function of [`NVRTC_SYMBOLS`] can be called through cudarc without a panic.
pub(crate) fn load() -> Result<&'static Nvrtc, CudaKernelError> {
    static NVRTC: OnceLock<Result<Nvrtc, CudaKernelError>> = OnceLock::new();
    NVRTC.get_or_init(check).as_ref().map_err(Clone::clone)
}

fn check() -> Result<Nvrtc, CudaKernelError> {
    let library = find_library()?;
    // SAFETY: `find_library` just loaded one of cudarc's candidates by name (itself, or the
    // library kept loaded under that soname); cudarc tries the same names in the same order, so
    // it loads that library instead of panicking.
    let lib = unsafe { nv::culib() };
    if let Some(symbol) = NVRTC_SYMBOLS.iter().find(|s| {
        // SAFETY: the symbol is only looked up, never called through this type.
        unsafe { lib.get::<unsafe extern "C" fn()>(s.as_bytes()) }.is_err()
    }) {
        return Err(CudaKernelError::NvrtcMissingSymbol { library, symbol });
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the symbol exists (checked above); both pointers are valid for one write.
    nvrtc_check("nvrtcVersion", unsafe {
        nv::nvrtcVersion(&mut major, &mut minor)
    })?;
    let mut count = 0;
    // SAFETY: as above.
    nvrtc_check("nvrtcGetNumSupportedArchs", unsafe {
        nv::nvrtcGetNumSupportedArchs(&mut count)
    })?;
    let mut archs = vec![0; usize::try_from(count).unwrap_or(0)];
    if !archs.is_empty() {
        // SAFETY: the buffer holds `count` ints, the number NVRTC said it writes.
        nvrtc_check("nvrtcGetSupportedArchs", unsafe {
            nv::nvrtcGetSupportedArchs(archs.as_mut_ptr())
        })?;
    }
    archs.sort_unstable();
    Ok(Nvrtc {
        library,
        version: (major, minor),
        archs,
    })
}

/// The status of an NVRTC call as an `i32`.
fn nvrtc_code(r: nv::nvrtcResult) -> i32 {
    // `nvrtcResult` is a `#[repr(u32)]` enum of small values.
    r as i32
}

/// NVRTC's own words for `r`.
fn nvrtc_message(r: nv::nvrtcResult) -> String {
    // SAFETY: `nvrtcGetErrorString` was checked to exist (callers run after `load`); it returns
    // a static NUL-terminated string (or null).
    let p = unsafe { nv::nvrtcGetErrorString(r) };
    if p.is_null() {
        return format!("NVRTC status {}", nvrtc_code(r));
    }
    // SAFETY: non-null, NUL-terminated and static (NVRTC's documentation).
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

fn nvrtc_check(call: &'static str, r: nv::nvrtcResult) -> Result<(), CudaKernelError> {
    if r == nv::nvrtcResult::NVRTC_SUCCESS {
        return Ok(());
    }
    Err(CudaKernelError::Nvrtc {
        call,
        status: nvrtc_code(r),
        message: nvrtc_message(r),
        log: String::new(),
    })
}

/// Whether the caller named the target architecture among `options`.
fn names_arch(options: &[&str]) -> bool {
    options
        .iter()
        .any(|o| o.starts_with("-arch") || o.starts_with("--gpu-architecture"))
}

/// The `--gpu-architecture` option for a device of compute capability `cc`: its own `sm_XY`
/// (a cubin) where NVRTC knows it, else the newest `compute_XY` older than the device (PTX the
/// driver compiles for the device), else an error.
pub(crate) fn arch_option(nvrtc: &Nvrtc, cc: (u32, u32)) -> Result<String, CudaKernelError> {
    let want = i32::try_from(cc.0 * 10 + cc.1).unwrap_or(i32::MAX);
    if nvrtc.archs.contains(&want) {
        return Ok(format!("--gpu-architecture=sm_{want}"));
    }
    match nvrtc.archs.iter().rev().find(|a| **a < want) {
        Some(older) => Ok(format!("--gpu-architecture=compute_{older}")),
        None => Err(CudaKernelError::UnsupportedArch {
            device: cc,
            nvrtc: nvrtc.version,
            supported: nvrtc.archs.clone(),
        }),
    }
}

/// What a compile produced.
#[derive(Debug)]
pub(crate) struct Compiled {
    /// The cubin, or the PTX text with its NUL.
    pub(crate) image: Vec<u8>,
    /// Every option passed to NVRTC, the architecture included.
    pub(crate) options: Vec<String>,
    /// NVRTC's log (warnings), possibly empty.
    pub(crate) log: String,
}

/// Destroys an NVRTC program when dropped, error or not.
struct Program(nv::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: the program was created by `nvrtcCreateProgram` and is destroyed once, here.
        let _ = unsafe { nv::nvrtcDestroyProgram(&mut self.0) };
    }
}

impl Program {
    /// NVRTC's log of the last compile (empty when it wrote none).
    fn log(&self) -> String {
        let mut size = 0usize;
        // SAFETY: the program is alive; the pointer is valid for one write.
        let r = unsafe { nv::nvrtcGetProgramLogSize(self.0, &mut size) };
        if r != nv::nvrtcResult::NVRTC_SUCCESS || size <= 1 {
            return String::new();
        }
        let mut buf = vec![0u8; size];
        // SAFETY: the buffer holds `size` bytes, the size NVRTC gave (with the NUL).
        let r = unsafe { nv::nvrtcGetProgramLog(self.0, buf.as_mut_ptr().cast::<c_char>()) };
        if r != nv::nvrtcResult::NVRTC_SUCCESS {
            return String::new();
        }
        let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
        String::from_utf8_lossy(&buf[..end]).trim_end().to_owned()
    }

    /// One of the outputs: `size` then `get` into a buffer of that size.
    fn output(
        &self,
        calls: (&'static str, &'static str),
        size: unsafe fn(nv::nvrtcProgram, *mut usize) -> nv::nvrtcResult,
        get: unsafe fn(nv::nvrtcProgram, *mut c_char) -> nv::nvrtcResult,
    ) -> Result<Vec<u8>, CudaKernelError> {
        let mut n = 0usize;
        // SAFETY: the program is alive and compiled; the pointer is valid for one write; `size`
        // is one of NVRTC's size functions, checked to exist.
        nvrtc_check(calls.0, unsafe { size(self.0, &mut n) })?;
        let mut buf = vec![0u8; n];
        if n > 0 {
            // SAFETY: the buffer holds `n` bytes, the size NVRTC gave for this output.
            nvrtc_check(calls.1, unsafe { get(self.0, buf.as_mut_ptr().cast()) })?;
        }
        Ok(buf)
    }
}

/// Compiles `source` with `options` for a device of compute capability `cc`: a cubin for the
/// device's own architecture where NVRTC knows it, PTX otherwise (see [`arch_option`]); an
/// architecture among `options` is used as given.
pub(crate) fn compile(
    source: &str,
    options: &[&str],
    cc: (u32, u32),
) -> Result<Compiled, CudaKernelError> {
    let nvrtc = load()?;
    let src = CString::new(source).map_err(|_| CudaKernelError::Nul {
        what: "the CUDA C source",
    })?;
    let mut all: Vec<String> = options.iter().map(|o| (*o).to_owned()).collect();
    if !names_arch(options) {
        all.push(arch_option(nvrtc, cc)?);
    }
    let c_options = all
        .iter()
        .map(|o| CString::new(o.as_str()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| CudaKernelError::Nul {
            what: "an NVRTC option",
        })?;
    let option_ptrs: Vec<*const c_char> = c_options.iter().map(|o| o.as_ptr()).collect();
    let mut raw = ptr::null_mut();
    // SAFETY: `load` checked the symbols; the source and name are NUL-terminated and outlive the
    // call; no headers (count 0, null arrays).
    nvrtc_check("nvrtcCreateProgram", unsafe {
        nv::nvrtcCreateProgram(
            &mut raw,
            src.as_ptr(),
            c"devcmd.cu".as_ptr(),
            0,
            ptr::null(),
            ptr::null(),
        )
    })?;
    let program = Program(raw);
    let count = i32::try_from(option_ptrs.len()).unwrap_or(i32::MAX);
    // SAFETY: the program is alive; `option_ptrs` holds `count` NUL-terminated strings that
    // outlive the call.
    let r = unsafe { nv::nvrtcCompileProgram(program.0, count, option_ptrs.as_ptr()) };
    let log = program.log();
    match r {
        nv::nvrtcResult::NVRTC_SUCCESS => {}
        nv::nvrtcResult::NVRTC_ERROR_COMPILATION => {
            return Err(CudaKernelError::Compile { log, options: all });
        }
        other => {
            return Err(CudaKernelError::Nvrtc {
                call: "nvrtcCompileProgram",
                status: nvrtc_code(other),
                message: nvrtc_message(other),
                log,
            });
        }
    }
    let cubin = program.output(
        ("nvrtcGetCUBINSize", "nvrtcGetCUBIN"),
        nv::nvrtcGetCUBINSize,
        nv::nvrtcGetCUBIN,
    )?;
    // NVRTC makes no cubin for a virtual architecture (`compute_XY`): its size is 0 then.
    let image = if cubin.is_empty() {
        program.output(
            ("nvrtcGetPTXSize", "nvrtcGetPTX"),
            nv::nvrtcGetPTXSize,
            nv::nvrtcGetPTX,
        )?
    } else {
        cubin
    };
    Ok(Compiled {
        image,
        options: all,
        log,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake(archs: &[i32]) -> Nvrtc {
        Nvrtc {
            library: "libnvrtc.so.13".into(),
            version: (13, 0),
            archs: archs.to_vec(),
        }
    }

    #[test]
    fn the_device_arch_is_a_cubin_an_unknown_newer_one_is_ptx_of_the_newest_older() {
        let n = fake(&[75, 80, 86, 87, 89, 90, 100, 120]);
        assert_eq!(arch_option(&n, (9, 0)).unwrap(), "--gpu-architecture=sm_90");
        assert_eq!(arch_option(&n, (8, 7)).unwrap(), "--gpu-architecture=sm_87");
        assert_eq!(
            arch_option(&n, (13, 0)).unwrap(),
            "--gpu-architecture=compute_120"
        );
        assert_eq!(
            arch_option(&n, (9, 5)).unwrap(),
            "--gpu-architecture=compute_90"
        );
        let e = arch_option(&n, (7, 2)).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("7.2") && msg.contains("13.0"), "{msg}");
    }

    #[test]
    fn an_arch_among_the_options_is_the_callers() {
        assert!(names_arch(&["-arch=sm_90a"]));
        assert!(names_arch(&["--gpu-architecture=compute_90"]));
        assert!(names_arch(&["-arch", "sm_90"]));
        assert!(!names_arch(&["-O3", "--use_fast_math"]));
    }

    #[test]
    fn the_candidates_are_cudarcs_and_include_the_bindings_soname() {
        let c = candidates();
        let soname = format!("libnvrtc.so.{}", crate::BINDING_VERSION / 1000);
        assert!(c.contains(&soname), "{c:?}");
        assert_eq!(c[0], "libnvrtc.so");
    }

    /// Without NVRTC (this crate's build machines), `load` is the clear error, never a panic;
    /// where it loads, the GPU tests compile with it.
    #[test]
    fn without_nvrtc_load_is_the_clear_error_never_a_panic() {
        match load() {
            Ok(n) => {
                use std::io::Write;
                let _ = writeln!(
                    std::io::stderr(),
                    "skipped: NVRTC {}.{} loads here ({}); tests/kernels.rs covers it",
                    n.version.0,
                    n.version.1,
                    n.library
                );
            }
            Err(e) => {
                let msg = e.to_string();
                assert!(msg.starts_with("NVRTC not found: tried "), "{msg}");
                assert!(msg.contains("libnvrtc.so"), "{msg}");
                assert!(msg.contains("load_module"), "{msg}");
                assert!(e.is_nvrtc_not_found());
            }
        }
    }
}
