//! The errors of recording and replaying graphs ([`CaptureError`]).

use super::{DriverError, ServerError};
use alloc::boxed::Box;
use core::fmt;

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
            Self::Discarded { stream, reason } => write!(
                f,
                "the recording on stream {stream} was discarded because a step of it failed \
                 ({reason}); nothing of it is kept and the buffers it would have written carry \
                 this failure; end it with `end_capture`, then record again with room held"
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
                "the device refused the recording on stream {stream} ({cause}); the stream runs \
                 its work eagerly as before"
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
            Self::Refused { cause, .. } => Some(cause),
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
