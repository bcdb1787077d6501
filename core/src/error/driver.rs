//! What a shim returns: the failed call ([`ShimOp`]), the device's status, and its
//! classification ([`Fault`]), written once by the shim's `classify`.

use core::fmt;

/// The device call that failed: lets an error name the operation without a string.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum ShimOp {
    /// Creating a stream.
    StreamCreate,
    /// Making a stream wait for an event of another stream.
    StreamWaitEvent,
    /// Recording an event.
    EventRecord,
    /// Querying an event without blocking.
    EventQuery,
    /// Blocking on an event.
    EventWait,
    /// Allocating a device page.
    DeviceAlloc,
    /// Allocating a pinned host page.
    HostAlloc,
    /// Page-locking the caller's host memory in place.
    HostRegister,
    /// Host to device copy.
    CopyHostToDevice,
    /// Device to host copy.
    CopyDeviceToHost,
    /// Device to device copy.
    CopyDeviceToDevice,
    /// Launching a kernel.
    Launch,
    /// Starting to record a stream into a graph.
    GraphBegin,
    /// Ending a recording and instantiating the graph.
    GraphEnd,
    /// Uploading a graph to the device.
    GraphUpload,
    /// Launching a graph.
    GraphLaunch,
    /// Reserving device address space.
    VmReserve,
    /// Backing reserved address space with device memory.
    VmMap,
}

impl ShimOp {
    /// Every device call, in declaration order (shims index per-call tables by it).
    pub const ALL: [ShimOp; 18] = [
        Self::StreamCreate,
        Self::StreamWaitEvent,
        Self::EventRecord,
        Self::EventQuery,
        Self::EventWait,
        Self::DeviceAlloc,
        Self::HostAlloc,
        Self::HostRegister,
        Self::CopyHostToDevice,
        Self::CopyDeviceToHost,
        Self::CopyDeviceToDevice,
        Self::Launch,
        Self::GraphBegin,
        Self::GraphEnd,
        Self::GraphUpload,
        Self::GraphLaunch,
        Self::VmReserve,
        Self::VmMap,
    ];
}

impl fmt::Display for ShimOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Self::StreamCreate => "stream create",
            Self::StreamWaitEvent => "stream wait on event",
            Self::EventRecord => "event record",
            Self::EventQuery => "event query",
            Self::EventWait => "event wait",
            Self::DeviceAlloc => "device page allocation",
            Self::HostAlloc => "pinned host page allocation",
            Self::HostRegister => "host memory registration",
            Self::CopyHostToDevice => "host-to-device copy",
            Self::CopyDeviceToHost => "device-to-host copy",
            Self::CopyDeviceToDevice => "device-to-device copy",
            Self::Launch => "kernel launch",
            Self::GraphBegin => "graph capture begin",
            Self::GraphEnd => "graph capture end",
            Self::GraphUpload => "graph upload",
            Self::GraphLaunch => "graph launch",
            Self::VmReserve => "address space reservation",
            Self::VmMap => "memory mapping into reserved address space",
        };
        f.write_str(name)
    }
}

/// How a shim classifies a failed device call. The core's reaction depends only on this.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Fault {
    /// The device is short of memory right now; freeing memory may cure it.
    OutOfMemory,
    /// The request can never succeed on this device (a size past what it can ever hold).
    TooBig,
    /// The shim does not implement this call.
    Unsupported,
    /// The device is lost: nothing will run on it again (CUDA's sticky errors such as an illegal
    /// address, a launch failure or an uncorrectable ECC error).
    DeviceLost,
    /// Reported by a fence: work enqueued before it failed while it ran, and the fence itself
    /// completed. The shim cannot say which work; the core stops trusting the stream.
    WorkFailed,
    /// Any other failure of this one call; the device stays usable.
    Failed,
    /// The call was refused before it did anything, for a state that passes: nothing changed,
    /// and the same call may succeed later. CUDA's global capture mode is the case: while any
    /// stream of the process records a graph, the driver forbids host waits and allocations from
    /// every thread and context, so the CUDA shim refuses them first (with the driver's status,
    /// 900). A fence whose wait is refused this way still stands: the core keeps what it covers
    /// for a later wait and never frees it early (see
    /// [`FenceOutcome::Refused`](crate::FenceOutcome::Refused)). An operation made of several
    /// calls (a pipelined upload) may have enqueued some before one was refused: it fails as
    /// any refused call makes it fail.
    Busy,
}

/// A failed device call, as a shim reports it (built with [`DriverError::new`]: the struct is
/// `#[non_exhaustive]`, so a field added later breaks no shim).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub struct DriverError {
    /// The call that failed.
    pub op: ShimOp,
    /// The device's own status code (CUDA's `CUresult`, a shim-defined number elsewhere).
    pub status: i32,
    /// What the failure means for the core.
    pub fault: Fault,
}

impl DriverError {
    /// A failure of `op` with the device status `status`, classified as `fault`.
    pub const fn new(op: ShimOp, status: i32, fault: Fault) -> Self {
        Self { op, status, fault }
    }

    /// Whether the device is lost after this failure.
    pub const fn loses_device(&self) -> bool {
        matches!(self.fault, Fault::DeviceLost)
    }
}

impl fmt::Display for DriverError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (what, todo) = match self.fault {
            Fault::OutOfMemory => (
                "the device is out of memory",
                "free memory or lower the load",
            ),
            Fault::TooBig => ("the size can never fit on this device", "split the request"),
            Fault::Unsupported => (
                "the shim does not support this call",
                "use a shim that does",
            ),
            Fault::DeviceLost => (
                "the device is lost and will run nothing again",
                "recreate the device (on CUDA, a sticky error needs a new process)",
            ),
            Fault::WorkFailed => {
                // The call was accepted; its work failed later, reported by a fence.
                let work = match self.op {
                    ShimOp::Launch => "a kernel",
                    _ => "the work of a call",
                };
                return write!(
                    f,
                    "{work} failed while it ran ({} accepted, then status {} reported by a \
                     fence): what the stream wrote since can no longer be trusted; write the \
                     inputs again on another stream, or recreate the device",
                    self.op, self.status
                );
            }
            Fault::Failed => ("the call failed", "check the shim's status code"),
            Fault::Busy => (
                "refused for now, nothing was done (on CUDA: a stream of the process records a \
                 graph, and the driver forbids this call until the recording ends)",
                "make the call again once the recording ended; nothing waiting for it was lost",
            ),
        };
        write!(
            f,
            "{} failed with status {}: {what}; {todo}",
            self.op, self.status
        )
    }
}

impl core::error::Error for DriverError {}
