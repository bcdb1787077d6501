//! What a command returns: [`ServerError`], with the refusals of a launch ([`LaunchError`]) and
//! of a malformed call ([`Validation`]).

use super::{CaptureError, DriverError, IoError};
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
                "library work `{work}` failed: {error}; its outputs carry this failure, \
                 fix the call's arguments or the library's state and run it again"
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

/// A call the layer refuses because of how it was made, not because of the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Validation {
    /// A stream index past the device's limit.
    StreamOutOfRange {
        /// The index asked for.
        stream: u32,
        /// How many streams the device allows.
        max: u32,
    },
    /// A stream borrowed ([`Device::borrow_stream`](crate::Device::borrow_stream)) under an id
    /// the device already uses.
    StreamInUse {
        /// The id asked for.
        stream: u32,
    },
    /// Host data whose length does not match the copy's layout.
    LengthMismatch {
        /// Bytes the layout needs.
        expected: u64,
        /// Bytes given.
        found: u64,
    },
    /// A copy whose device side passes the end of the handle's view.
    LayoutPastView {
        /// Bytes the layout spans on the device.
        span: u64,
        /// Bytes of the view.
        view: u64,
    },
    /// A host buffer that cannot be written (external, read-only bytes) given as a destination.
    ReadOnlyDestination,
    /// The operation is refused while a stream records a graph.
    Recording {
        /// The operation.
        op: &'static str,
    },
    /// A launch output overlaps another buffer of the same launch: kernels may run their blocks
    /// in any order, so a buffer both read and written (or written twice) gives no defined
    /// result.
    AliasedLaunch {
        /// The kernel.
        kernel: &'static str,
        /// Position of the output among the launch's buffers (inputs first).
        output: usize,
        /// Position of the buffer it overlaps.
        other: usize,
    },
    /// A kernel parameter names a buffer slot the launch does not have.
    LaunchParam {
        /// The kernel.
        kernel: &'static str,
        /// Position of the parameter.
        param: usize,
        /// The slot it names.
        slot: usize,
        /// Buffers the launch has (inputs and outputs).
        buffers: usize,
    },
    /// An operand of library work is shorter than the work needs (checked by a library wrapper
    /// such as a GEMM's, before the library sees it).
    LibraryOperand {
        /// The work.
        work: &'static str,
        /// The operand (`"A"`, `"B"`, `"C"` of a GEMM).
        operand: &'static str,
        /// Bytes the work reads or writes through it.
        needs: u64,
        /// Bytes the handle views.
        found: u64,
    },
    /// A launch extent (a grid or block dimension) is zero.
    LaunchDims {
        /// The kernel.
        kernel: &'static str,
        /// The geometry asked for.
        dims: crate::shim::LaunchDims,
    },
}

impl fmt::Display for Validation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::StreamOutOfRange { stream, max } => write!(
                f,
                "stream {stream} asked for but this device allows {max} streams; use 0..{max} \
                 or raise `DeviceConfig::max_streams`"
            ),
            Self::StreamInUse { stream } => write!(
                f,
                "stream {stream} already exists on this device, so it cannot be borrowed; borrow \
                 a native stream under an id no command has used yet"
            ),
            Self::LengthMismatch { expected, found } => write!(
                f,
                "the copy's layout needs {expected} host bytes but {found} were given; \
                 pass data of the layout's packed size"
            ),
            Self::LayoutPastView { span, view } => write!(
                f,
                "the copy spans {span} device bytes but the handle views {view}; \
                 use a larger handle or a smaller layout"
            ),
            Self::ReadOnlyDestination => f.write_str(
                "a read-only (external) host buffer was given as a copy destination; \
                 reserve a host buffer with `reserve_host`",
            ),
            Self::Recording { op } => write!(
                f,
                "`{op}` is refused while a stream records a graph; call it after the capture ends"
            ),
            Self::AliasedLaunch {
                kernel,
                output,
                other,
            } => write!(
                f,
                "buffer {output} of the launch of `{kernel}` is an output that overlaps buffer \
                 {other} of the same launch; give the kernel a separate output buffer"
            ),
            Self::LaunchParam {
                kernel,
                param,
                slot,
                buffers,
            } => write!(
                f,
                "parameter {param} of the launch of `{kernel}` names buffer slot {slot}, but the \
                 launch has {buffers} buffers (inputs first, then outputs); name a slot below \
                 {buffers}"
            ),
            Self::LibraryOperand {
                work,
                operand,
                needs,
                found,
            } => write!(
                f,
                "operand {operand} of `{work}` views {found} bytes but the work touches {needs}; \
                 pass a larger handle or smaller dimensions (leading dimensions included)"
            ),
            Self::LaunchDims { kernel, dims } => write!(
                f,
                "the launch of `{kernel}` asks for grid {}x{}x{} and block {}x{}x{}: every extent \
                 must be at least 1 (use LaunchDims::covering for a grid over n elements)",
                dims.grid.x, dims.grid.y, dims.grid.z, dims.block.x, dims.block.y, dims.block.z
            ),
        }
    }
}

/// Errors of device operations: what a command returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerError {
    /// The call was malformed.
    Validation(Validation),
    /// A read of bytes that work which failed should have written.
    Unwritten {
        /// The failure's id on the device.
        failure: u64,
        /// The handle whose bytes were asked for.
        handle: u64,
        /// The launches skipped because of the failure, oldest first (the newest 16).
        chain: alloc::vec::Vec<&'static str>,
        /// Launches skipped in all (the chain may hold fewer).
        skipped_total: u64,
        /// The failure at the root.
        root: alloc::boxed::Box<ServerError>,
    },
    /// The launch did not run because an input carries a failure, which its outputs now carry.
    Skipped {
        /// The kernel that was skipped.
        kernel: &'static str,
        /// The failure's id.
        failure: u64,
    },
    /// The device is lost: every operation fails fast. The one variant for a lost device,
    /// whichever call found out.
    DeviceLost {
        /// The call that found the device lost.
        cause: DriverError,
    },
    /// A memory or copy error.
    Io(IoError),
    /// A launch error.
    Launch(LaunchError),
    /// A recording or a replay was refused, or met a recording (see [`CaptureError`]).
    Capture(CaptureError),
    /// A fence wait or query failed with an outcome the core cannot know (not a fault of work
    /// that ran, which is [`ServerError::StreamFaulted`], nor a lost device).
    Device(DriverError),
    /// Work on a stream failed while it ran ([`Fault::WorkFailed`](super::Fault::WorkFailed)): nothing written on that
    /// stream, or by work ordered after it, can be trusted, so every operation on it or depending
    /// on it fails with this. Other streams keep working.
    StreamFaulted {
        /// The stream whose work failed.
        stream: u32,
        /// The fault its fence reported.
        cause: DriverError,
        /// The last kernel launched on the stream before the fence that reported the fault (the
        /// shim cannot say which work failed; this is the likeliest suspect).
        kernel: Option<&'static str>,
    },
}

impl ServerError {
    /// Whether the error means the device is lost, looking through to the roots.
    pub fn is_device_lost(&self) -> bool {
        match self {
            Self::DeviceLost { .. } => true,
            Self::Io(e) => e.is_device_lost(),
            Self::Device(e) => e.loses_device(),
            Self::Unwritten { root, .. } => root.is_device_lost(),
            Self::Launch(LaunchError::Refused { cause, .. }) => cause.loses_device(),
            Self::Launch(LaunchError::Buffer { cause, .. }) => cause.is_device_lost(),
            Self::Capture(CaptureError::Refused { cause, .. }) => cause.loses_device(),
            Self::Capture(CaptureError::Discarded { reason, .. }) => reason.is_device_lost(),
            _ => false,
        }
    }
}

impl From<IoError> for ServerError {
    fn from(e: IoError) -> Self {
        match e.driver_error() {
            Some(cause) if cause.loses_device() => Self::DeviceLost { cause: *cause },
            _ => Self::Io(e),
        }
    }
}

impl From<LaunchError> for ServerError {
    fn from(e: LaunchError) -> Self {
        Self::Launch(e)
    }
}

impl From<CaptureError> for ServerError {
    fn from(e: CaptureError) -> Self {
        Self::Capture(e)
    }
}

impl From<Validation> for ServerError {
    fn from(e: Validation) -> Self {
        Self::Validation(e)
    }
}

impl From<DriverError> for ServerError {
    fn from(e: DriverError) -> Self {
        if e.loses_device() {
            Self::DeviceLost { cause: e }
        } else {
            Self::Device(e)
        }
    }
}

impl fmt::Display for ServerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Validation(v) => write!(f, "{v}"),
            Self::Unwritten {
                failure,
                handle,
                chain,
                skipped_total,
                root,
            } => {
                write!(
                    f,
                    "handle {handle} holds bytes that failed work left unwritten (failure {failure}"
                )?;
                if *skipped_total > 0 {
                    write!(f, ", carried through {skipped_total} skipped launches:")?;
                    for k in chain {
                        write!(f, " {k}")?;
                    }
                }
                write!(
                    f,
                    "); root cause: {root}; rewrite the buffer or rerun the work"
                )
            }
            Self::Skipped { kernel, failure } => write!(
                f,
                "`{kernel}` was skipped because an input carries failure {failure}; \
                 its outputs now carry it too"
            ),
            Self::DeviceLost { cause } => {
                write!(
                    f,
                    "the device is lost ({cause}); recreate it (on CUDA, a sticky error needs a \
                     new process)"
                )
            }
            Self::Io(e) => write!(f, "{e}"),
            Self::Launch(e) => write!(f, "{e}"),
            Self::Capture(e) => write!(f, "{e}"),
            Self::Device(e) => write!(f, "work on the stream failed: {e}"),
            Self::StreamFaulted {
                stream,
                cause,
                kernel,
            } => {
                write!(f, "work on stream {stream} failed while it ran")?;
                if let Some(k) = kernel {
                    write!(f, " (the last kernel launched before the fence was `{k}`)")?;
                }
                write!(
                    f,
                    ": the {} reported status {}; what the stream wrote, and work ordered after it, \
                     can no longer be trusted while other streams keep working: write the inputs \
                     again on another stream, or recreate the device to use stream {stream} again",
                    cause.op, cause.status
                )
            }
        }
    }
}

impl core::error::Error for ServerError {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            Self::Validation(_) | Self::Skipped { .. } => None,
            Self::Unwritten { root, .. } => Some(&**root),
            Self::DeviceLost { cause } | Self::Device(cause) => Some(cause),
            Self::StreamFaulted { cause, .. } => Some(cause),
            Self::Io(e) => Some(e),
            Self::Launch(e) => Some(e),
            Self::Capture(e) => Some(e),
        }
    }
}

impl core::error::Error for LaunchError {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            Self::Refused { cause, .. } => Some(cause),
            Self::Buffer { cause, .. } => Some(cause),
            Self::Library { error, .. } => Some(error),
        }
    }
}

impl core::error::Error for Validation {}

// Written by hand: `derive(defmt::Format)` bounds every field type, and the recursive fields
// (`Box<ServerError>`, `Vec<ServerError>`) make that bound overflow (E0275).
#[cfg(feature = "defmt")]
impl defmt::Format for ServerError {
    fn format(&self, f: defmt::Formatter<'_>) {
        match self {
            Self::Validation(v) => defmt::write!(f, "Validation({})", v),
            Self::Unwritten {
                failure,
                handle,
                chain,
                skipped_total,
                root,
            } => defmt::write!(
                f,
                "Unwritten {{ failure: {=u64}, handle: {=u64}, chain: {=[?]}, skipped_total: {=u64}, root: {} }}",
                failure,
                handle,
                chain.as_slice(),
                skipped_total,
                &**root
            ),
            Self::Skipped { kernel, failure } => {
                defmt::write!(
                    f,
                    "Skipped {{ kernel: {=str}, failure: {=u64} }}",
                    kernel,
                    failure
                )
            }
            Self::DeviceLost { cause } => {
                defmt::write!(f, "DeviceLost {{ cause: {} }}", cause)
            }
            Self::Io(e) => defmt::write!(f, "Io({})", e),
            Self::Launch(e) => defmt::write!(f, "Launch({})", e),
            Self::Capture(e) => defmt::write!(f, "Capture({})", e),
            Self::Device(e) => defmt::write!(f, "Device({})", e),
            Self::StreamFaulted {
                stream,
                cause,
                kernel,
            } => {
                defmt::write!(
                    f,
                    "StreamFaulted {{ stream: {=u32}, cause: {}, kernel: {} }}",
                    stream,
                    cause,
                    kernel
                )
            }
        }
    }
}
