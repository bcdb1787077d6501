//! The exit codes of every program in devcmd-examples, and which error gets which.
//!
//! Owns the codes ([`OK`], [`MISMATCH`], [`BAD_INPUT`], [`NO_DEVICE`], [`FAILED`]), the
//! `EXIT STATUS` section each program's `--help` prints ([`HELP`]), the [`BadInput`] wrapper a
//! program puts around an error that is the user's input, and [`code`], which sorts an error (and
//! the errors it wraps) into a code. `devcmd-trace` (tools/trace) and devcmd-cuda's `cuda-facts`
//! use the same numbers; a script can tell "the results are wrong" from "you gave me a bad file"
//! from "there is no GPU here" by the code alone.

use std::error::Error;
use std::fmt;
use std::process::ExitCode;

/// Done; every result that was checked matched.
pub const OK: u8 = 0;
/// The run finished but its results are wrong: outputs that differ from the reference.
pub const MISMATCH: u8 = 1;
/// Bad input: a flag, a file (weights, model, fixture, prompt), or a reference nothing can be
/// checked against. Nothing ran, or what ran was refused before its results meant anything.
pub const BAD_INPUT: u8 = 2;
/// No device: no CUDA driver, a driver too old or lacking a function, no GPU of that ordinal, no
/// NVRTC to compile the kernels.
pub const NO_DEVICE: u8 = 3;
/// The run failed on the way: a device or I/O error while it ran.
pub const FAILED: u8 = 4;

/// The `EXIT STATUS` section of every program's `--help`.
pub const HELP: &str = "\
EXIT STATUS:
    0  done (every result checked matched)
    1  results wrong: outputs differ from the reference
    2  bad input: a flag, a file or a reference nothing can be checked against
    3  no device: no CUDA driver, a driver too old, no GPU of that ordinal, or no NVRTC
    4  failed while running: a device or I/O error";

/// An error that is the user's input (a bad file, prompt or value): exit [`BAD_INPUT`].
#[derive(Debug)]
pub struct BadInput(pub Box<dyn Error>);

impl BadInput {
    /// `e` as bad input, boxed for `?`.
    pub fn boxed(e: impl Into<Box<dyn Error>>) -> Box<dyn Error> {
        Box::new(Self(e.into()))
    }
}

impl fmt::Display for BadInput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl Error for BadInput {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&*self.0)
    }
}

/// The code of a run that stopped with `e`: the first error in its chain (`e`, then its
/// sources) that says what it is decides; an error nobody sorted is [`FAILED`].
pub fn code(e: &(dyn Error + 'static)) -> u8 {
    let mut at = Some(e);
    while let Some(e) = at {
        if let Some(code) = sort(e) {
            return code;
        }
        at = e.source();
    }
    FAILED
}

/// The code `e` itself says, if any.
fn sort(e: &(dyn Error + 'static)) -> Option<u8> {
    use devcmd_cuda::{CudaInitError, CudaKernelError};
    let bad_input = e.is::<BadInput>()
        || e.is::<crate::cli::UsageError>()
        || e.is::<crate::weights::WeightsError>()
        || e.is::<crate::verify::ReferenceNotFinite>()
        || e.is::<crate::gpt2::config::ConfigError>()
        || e.is::<crate::gpt2::weights::WeightsError>()
        || e.is::<crate::gpt2::check::FixtureError>();
    if bad_input {
        return Some(BAD_INPUT);
    }
    let no_nvrtc = matches!(
        e.downcast_ref::<CudaKernelError>(),
        Some(CudaKernelError::NvrtcNotFound { .. } | CudaKernelError::NvrtcMissingSymbol { .. })
    );
    if e.is::<CudaInitError>() || no_nvrtc {
        return Some(NO_DEVICE);
    }
    None
}

/// Lets a closed output end the program quietly, as it ends `cat` or `grep`: `gpt2 ... | head`
/// stops the program once `head` has its lines, with no panic (Rust ignores `SIGPIPE`, so a
/// `println!` into a closed pipe would panic). Every program calls it first. A no-op off Unix.
pub fn quiet_on_closed_output() {
    #[cfg(unix)]
    // SAFETY: restoring the default disposition of one signal, before any thread is started;
    // nothing in the program relies on `SIGPIPE` being ignored (every other write goes to files
    // or the device).
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// When the command line asks for help (`-h` or `--help`): prints `usage`, then [`HELP`], and
/// says so (the program then exits [`OK`]).
pub fn help_asked(usage: &str) -> bool {
    let asked = std::env::args().skip(1).any(|a| a == "-h" || a == "--help");
    if asked {
        println!("{usage}\n\n{HELP}");
    }
    asked
}

/// Prints `program: e` and its chain of causes (`error_chain`) on stderr and returns `e`'s code.
pub fn report(program: &str, e: &(dyn Error + 'static)) -> ExitCode {
    eprintln!("{program}: {}", crate::error_chain(e));
    ExitCode::from(code(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_sorts_into_its_code() {
        let plain: Box<dyn Error> = "a device call failed".into();
        assert_eq!(code(&*plain), FAILED);
        let wrapped = BadInput::boxed("prompt row 1 has 2 tokens");
        assert_eq!(code(&*wrapped), BAD_INPUT);
        let reference = crate::verify::ReferenceNotFinite {
            index: 0,
            value: f32::NAN,
        };
        assert_eq!(code(&reference), BAD_INPUT);
        let no_driver = devcmd_cuda::CudaInitError::NoDevice {
            ordinal: 1,
            count: 0,
        };
        assert_eq!(code(&no_driver), NO_DEVICE);
        let codes = [OK, MISMATCH, BAD_INPUT, NO_DEVICE, FAILED];
        for (i, c) in codes.iter().enumerate() {
            assert!(
                HELP.contains(&format!("\n    {c}  ")),
                "{c} missing from HELP"
            );
            assert!(!codes[..i].contains(c), "{c} used twice");
        }
    }
}
