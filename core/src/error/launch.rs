//! Why a launch or library work could not be enqueued: [`LaunchError`], with what a library
//! says ([`LibraryError`]).

use super::{DriverError, IoError};
use core::fmt;

/// Why a launch could not be enqueued.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum LaunchError {
    /// The device refused to enqueue it.
    Refused {
        /// The kernel's name.
        kernel: &'static str,
        /// The device's answer.
        cause: DriverError,
    },
    /// Library work ([`Command::library`](crate::Command::library)) returned an error when it
    /// was enqueued: the library's own code and message.
    Library {
        /// The work's name.
        work: &'static str,
        /// What the library said.
        error: LibraryError,
    },
    /// A buffer of the launch did not resolve.
    Buffer {
        /// The kernel's name.
        kernel: &'static str,
        /// Position of the buffer among the launch's buffers (inputs first).
        index: usize,
        /// Why it did not resolve.
        cause: IoError,
    },
}

impl fmt::Display for LaunchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Refused { kernel, cause } => {
                write!(f, "launch of `{kernel}` was refused: {cause}")
            }
            Self::Library { work, error } => write!(
                f,
                "library work `{work}` failed: {error}: its outputs carry this failure; fix the \
                 call's arguments or the library's state and run it again"
            ),
            Self::Buffer {
                kernel,
                index,
                cause,
            } => {
                write!(
                    f,
                    "buffer {index} of the launch of `{kernel}` is unusable: {cause}"
                )
            }
        }
    }
}

/// What library work returns when the library refuses it (a cuBLAS status, a TensorRT
/// `enqueueV3` that answered `false`, a vendor DSP library's error code): its own code and
/// message, kept in the failure the work's outputs carry.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct LibraryError {
    /// The library's status code.
    pub code: i64,
    /// The library's own words (its status name, its error string).
    pub message: alloc::string::String,
}

impl LibraryError {
    /// An error with the library's `code` and `message`.
    pub fn new(code: i64, message: impl Into<alloc::string::String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

impl fmt::Display for LibraryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (code {})", self.message, self.code)
    }
}

impl core::error::Error for LibraryError {}

impl core::error::Error for LaunchError {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        // Each variant prints its cause's text: the cause's own source comes next.
        match self {
            Self::Refused { cause, .. } => cause.source(),
            Self::Buffer { cause, .. } => cause.source(),
            Self::Library { error, .. } => error.source(),
        }
    }
}
