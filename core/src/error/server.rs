//! What a command returns: [`ServerError`], and [`CaptureError`] for recordings and replays (the
//! two name each other: a discarded recording keeps the error that discarded it).

use super::{DriverError, IoError, LaunchError, Validation};
use alloc::boxed::Box;
use core::fmt;

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
                root: _,
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
                // The root cause is the error's source, printed once, below this line.
                write!(
                    f,
                    "); rewrite the buffer, or rerun the work once its root cause is dealt with"
                )
            }
            Self::Skipped { kernel, failure } => write!(
                f,
                "`{kernel}` was skipped because an input carries failure {failure}, and its \
                 outputs now carry it too; rewrite the inputs (the failure's first error says \
                 why they are unwritten) and launch again"
            ),
            // The call that found out is the source.
            Self::DeviceLost { .. } => f.write_str(
                "every operation on this device fails from now on; recreate the device (on \
                 CUDA, a sticky error needs a new process)",
            ),
            Self::Io(e) => write!(f, "{e}"),
            Self::Launch(e) => write!(f, "{e}"),
            Self::Capture(e) => write!(f, "{e}"),
            // The call is the source.
            Self::Device(_) => f.write_str(
                "a device call on the stream failed, so devcmd cannot tell whether the work \
                 before it ran: what the stream's fences covered is kept, not freed; retry the \
                 operation, and recreate the device if it fails again",
            ),
            // The fence's report is the source.
            Self::StreamFaulted { stream, kernel, .. } => {
                write!(f, "stream {stream} is faulted")?;
                if let Some(k) = kernel {
                    write!(f, " (the last kernel launched before the fence was `{k}`)")?;
                }
                write!(
                    f,
                    ": what it wrote, and work ordered after it, can no longer be trusted, while \
                     other streams keep working; write the inputs again on another stream, or \
                     recreate the device to use stream {stream} again"
                )
            }
        }
    }
}

impl core::error::Error for ServerError {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        // A variant that prints its inner error's text passes on that error's source instead
        // of the error itself: every message of a chain is printed once.
        match self {
            Self::Skipped { .. } => None,
            Self::Validation(e) => e.source(),
            Self::Unwritten { root, .. } => Some(&**root),
            Self::DeviceLost { cause } | Self::Device(cause) => Some(cause),
            Self::StreamFaulted { cause, .. } => Some(cause),
            Self::Io(e) => e.source(),
            Self::Launch(e) => e.source(),
            Self::Capture(e) => e.source(),
        }
    }
}

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

/// Why a capture call (begin, end, replay) or an operation that meets a recording was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CaptureError {
    /// `begin_capture` while a recording of the device is still open (recording, or discarded
    /// and not yet ended): one stream records at a time.
    AnotherRecords {
        /// The stream that asked.
        stream: u32,
        /// The stream whose recording is open.
        recording: u32,
    },
    /// `end_capture` was given a recording this stream does not hold (of another stream or
    /// device, or one that already ended).
    NotRecording {
        /// The stream the end was asked on.
        stream: u32,
    },
    /// The recording was discarded because one of its steps failed (`reason`): nothing of it is
    /// kept, and the buffers it would have written carry this failure. Every operation on the
    /// stream answers this until `end_capture` reports it and the stream is idle again.
    Discarded {
        /// The stream that recorded.
        stream: u32,
        /// The step that failed.
        reason: Box<ServerError>,
    },
    /// Work on `stream` uses memory the recording on `recording` uses: that work would be ordered
    /// after recorded work, which has not run (and cannot be waited for until a replay).
    RecordedElsewhere {
        /// The stream of the refused work.
        stream: u32,
        /// The recording stream.
        recording: u32,
        /// The allocation both use.
        handle: u64,
    },
    /// The device refused to begin a recording, or to end and instantiate it
    /// ([`Fault::Unsupported`](super::Fault::Unsupported) on a shim without graphs).
    Refused {
        /// The stream.
        stream: u32,
        /// The device's answer.
        cause: DriverError,
    },
    /// A graph recorded on another device.
    ForeignGraph {
        /// The device that recorded it.
        recorded_on: u32,
        /// The device it was given to.
        used_on: u32,
    },
}

impl fmt::Display for CaptureError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::AnotherRecords { stream, recording } => write!(
                f,
                "stream {stream} cannot begin a recording while the recording on stream \
                 {recording} is open (one stream records at a time); end that one first"
            ),
            Self::NotRecording { stream } => write!(
                f,
                "stream {stream} holds no open recording for this `end_capture`; end a recording \
                 on the stream that began it (a recording given to another stream is abandoned)"
            ),
            // The failed step is the source.
            Self::Discarded { stream, .. } => write!(
                f,
                "the recording on stream {stream} was discarded because a step of it failed: \
                 nothing of it is kept and the buffers it would have written carry the failure; \
                 end it with `end_capture`, then record again once the step succeeds"
            ),
            Self::RecordedElsewhere {
                stream,
                recording,
                handle,
            } => write!(
                f,
                "stream {stream} used handle {handle}, which the recording on stream {recording} \
                 uses: that work would be ordered after recorded work that has not run; use it \
                 before `begin_capture` or after `end_capture`"
            ),
            Self::Refused { stream, cause } => write!(
                f,
                "the device refused the recording on stream {stream}, which runs its work \
                 eagerly as before: {cause}"
            ),
            Self::ForeignGraph {
                recorded_on,
                used_on,
            } => write!(
                f,
                "a graph recorded on device {recorded_on} was given to device {used_on}; replay \
                 it on the device that recorded it"
            ),
        }
    }
}

impl core::error::Error for CaptureError {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            Self::Discarded { reason, .. } => Some(&**reason),
            // Printed in the text.
            Self::Refused { cause, .. } => cause.source(),
            _ => None,
        }
    }
}

// Written by hand: the boxed `ServerError` makes a derived bound recursive (see `ServerError`).
#[cfg(feature = "defmt")]
impl defmt::Format for CaptureError {
    fn format(&self, f: defmt::Formatter<'_>) {
        match self {
            Self::AnotherRecords { stream, recording } => defmt::write!(
                f,
                "AnotherRecords {{ stream: {=u32}, recording: {=u32} }}",
                stream,
                recording
            ),
            Self::NotRecording { stream } => {
                defmt::write!(f, "NotRecording {{ stream: {=u32} }}", stream)
            }
            Self::Discarded { stream, reason } => defmt::write!(
                f,
                "Discarded {{ stream: {=u32}, reason: {} }}",
                stream,
                &**reason
            ),
            Self::RecordedElsewhere {
                stream,
                recording,
                handle,
            } => defmt::write!(
                f,
                "RecordedElsewhere {{ stream: {=u32}, recording: {=u32}, handle: {=u64} }}",
                stream,
                recording,
                handle
            ),
            Self::Refused { stream, cause } => {
                defmt::write!(f, "Refused {{ stream: {=u32}, cause: {} }}", stream, cause)
            }
            Self::ForeignGraph {
                recorded_on,
                used_on,
            } => defmt::write!(
                f,
                "ForeignGraph {{ recorded_on: {=u32}, used_on: {=u32} }}",
                recorded_on,
                used_on
            ),
        }
    }
}
