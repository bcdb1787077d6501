//! The errors of the core and of the device calls it makes.
//!
//! Every variant says what was asked, what was found, and what to do about it; nothing here is a
//! string built at the call site. [`DriverError`] is what a shim returns; [`IoError`] is what the
//! memory and copy paths return to a caller.

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
}

impl ShimOp {
    /// Every device call, in declaration order (shims index per-call tables by it).
    pub const ALL: [ShimOp; 15] = [
        Self::StreamCreate,
        Self::StreamWaitEvent,
        Self::EventRecord,
        Self::EventQuery,
        Self::EventWait,
        Self::DeviceAlloc,
        Self::HostAlloc,
        Self::CopyHostToDevice,
        Self::CopyDeviceToHost,
        Self::CopyDeviceToDevice,
        Self::Launch,
        Self::GraphBegin,
        Self::GraphEnd,
        Self::GraphUpload,
        Self::GraphLaunch,
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
            Self::CopyHostToDevice => "host-to-device copy",
            Self::CopyDeviceToHost => "device-to-host copy",
            Self::CopyDeviceToDevice => "device-to-device copy",
            Self::Launch => "kernel launch",
            Self::GraphBegin => "graph capture begin",
            Self::GraphEnd => "graph capture end",
            Self::GraphUpload => "graph upload",
            Self::GraphLaunch => "graph launch",
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
}

/// A failed device call, as a shim reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
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
                "recreate the device",
            ),
            Fault::WorkFailed => (
                "work enqueued before this point failed while it ran",
                "recreate the device; the stream's data can no longer be trusted",
            ),
            Fault::Failed => ("the call failed", "check the shim's status code"),
        };
        write!(
            f,
            "{} failed with status {}: {what}; {todo}",
            self.op, self.status
        )
    }
}

/// Why a handle could not be resolved to memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum NotFoundReason {
    /// The handle was issued lazily and no memory was ever bound to it.
    NeverBound,
    /// The handle's memory was handed to another handle (a reservation after `bind`).
    HandedOver,
    /// The location the handle remembers is held by another allocation or no longer exists.
    Stale,
}

/// Errors of the memory, copy and I/O paths.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum IoError {
    /// No page this device can ever hold fits the request.
    BufferTooBig {
        /// Bytes asked for (alignment padding included).
        size: u64,
        /// The largest page the device can hold.
        max_page: u64,
    },
    /// The device or the memory budget cannot hold the request right now, even after reclaim.
    OutOfMemory {
        /// Bytes asked for.
        size: u64,
        /// Bytes of device pages held on this device when the request failed.
        held: u64,
        /// The device-wide budget, when one is set.
        budget: Option<u64>,
        /// The device call that refused, when the refusal came from the device, not the budget.
        source: Option<DriverError>,
    },
    /// No room was held and the page set may not change (the stream is recording a graph).
    PageUpdateForbidden {
        /// Bytes asked for.
        size: u64,
    },
    /// A new page size was needed but every page-size class of the arena is in use.
    PageSizesExhausted {
        /// Bytes asked for.
        size: u64,
        /// The number of classes, all live.
        classes: usize,
    },
    /// A layout that is not pitched row-major.
    UnsupportedStrides {
        /// Number of dimensions of the layout.
        rank: usize,
        /// The first dimension whose stride breaks the rule.
        dim: usize,
    },
    /// The handle does not resolve to memory.
    NotFound {
        /// The handle's id.
        handle: u64,
        /// Why it does not resolve.
        reason: NotFoundReason,
    },
    /// The handle routes to a page the manager no longer has.
    StorageHandleNotFound {
        /// The handle's id.
        handle: u64,
        /// The page index it routed to.
        page: u32,
    },
    /// The handle was issued by another device.
    ForeignHandle {
        /// The id of the device that issued the handle.
        issued_by: u32,
        /// The id of the device it was used on.
        used_on: u32,
    },
    /// The handle belongs to another stream's memory, and the operation must run on its owner.
    WrongStream {
        /// The handle's id.
        handle: u64,
        /// The stream whose memory it is.
        owner: u32,
        /// The stream the operation ran on.
        used_on: u32,
    },
    /// The handle's memory is still used by in-flight work (a binding is out), so it cannot be
    /// replaced now.
    InUse {
        /// The handle's id.
        handle: u64,
    },
    /// A byte range past the end of its allocation.
    OutOfRange {
        /// First byte asked for.
        offset: u64,
        /// Bytes asked for.
        len: u64,
        /// Size of the allocation.
        size: u64,
    },
    /// A device call failed (a lost device among them: see [`IoError::is_device_lost`]).
    Shim(DriverError),
    /// A reservation was bound to itself: the target of `bind` is the reserved handle, a clone
    /// or a view of it.
    SelfBind {
        /// The allocation's id.
        handle: u64,
    },
    /// Host memory could not be allocated (the length overflows what the heap can address, or
    /// the allocator refused it).
    HostAllocFailed {
        /// Bytes asked for.
        len: u64,
    },
}

impl IoError {
    /// Whether reclaiming memory (cleanup, relocation) and retrying might cure this error.
    ///
    /// False only for sizes nothing can ever hold and for reservations that may not add pages.
    pub const fn may_succeed_after_reclaim(&self) -> bool {
        !matches!(
            self,
            Self::BufferTooBig { .. } | Self::PageUpdateForbidden { .. }
        )
    }

    /// Whether this error means the device is lost.
    pub const fn is_device_lost(&self) -> bool {
        match self {
            Self::Shim(e) => e.loses_device(),
            Self::OutOfMemory {
                source: Some(e), ..
            } => e.loses_device(),
            _ => false,
        }
    }
}

impl From<DriverError> for IoError {
    fn from(e: DriverError) -> Self {
        Self::Shim(e)
    }
}

impl fmt::Display for IoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::BufferTooBig { size, max_page } => write!(
                f,
                "asked for {size} bytes but the largest page this device holds is {max_page} bytes; \
                 split the buffer"
            ),
            Self::OutOfMemory {
                size,
                held,
                budget,
                source,
            } => {
                write!(
                    f,
                    "asked for {size} bytes with {held} bytes of device pages held"
                )?;
                if let Some(b) = budget {
                    write!(f, " under a budget of {b} bytes")?;
                }
                if let Some(e) = source {
                    write!(f, " ({e})")?;
                }
                f.write_str(
                    " after reclaiming what could be reclaimed; free buffers or raise the budget",
                )
            }
            Self::PageUpdateForbidden { size } => write!(
                f,
                "asked for {size} bytes while the stream records a graph and no room is held; \
                 reserve the working set in the warm-up run"
            ),
            Self::PageSizesExhausted { size, classes } => write!(
                f,
                "asked for {size} bytes needing a new page size but all {classes} page-size \
                 classes hold live allocations; free long-lived buffers or run a cleanup"
            ),
            Self::UnsupportedStrides { rank, dim } => write!(
                f,
                "a layout of rank {rank} is not pitched row-major at dimension {dim}; \
                 make the data contiguous first"
            ),
            Self::NotFound { handle, reason } => {
                let why = match reason {
                    NotFoundReason::NeverBound => "was issued lazily and never bound to memory",
                    NotFoundReason::HandedOver => {
                        "was a reservation whose memory was bound to another handle"
                    }
                    NotFoundReason::Stale => "points to memory that was released or reused",
                };
                write!(
                    f,
                    "handle {handle} {why}; use the handle the memory was bound to"
                )
            }
            Self::StorageHandleNotFound { handle, page } => write!(
                f,
                "handle {handle} routes to page {page}, which the pool no longer holds; \
                 this is a bug in devcmd, please report it"
            ),
            Self::ForeignHandle { issued_by, used_on } => write!(
                f,
                "a handle issued by device {issued_by} was used on device {used_on}; \
                 copy the data through the host"
            ),
            Self::WrongStream {
                handle,
                owner,
                used_on,
            } => write!(
                f,
                "handle {handle} is memory of stream {owner} but was used on stream {used_on}; \
                 run this operation on stream {owner}"
            ),
            Self::InUse { handle } => write!(
                f,
                "handle {handle} is still used by in-flight work; wait for it (sync) or bind \
                 the new memory to a fresh handle"
            ),
            Self::OutOfRange { offset, len, size } => write!(
                f,
                "asked for bytes {offset}..{} of an allocation of {size} bytes; \
                 keep ranges inside the allocation",
                offset.saturating_add(*len)
            ),
            Self::Shim(e) => write!(f, "{e}"),
            Self::SelfBind { handle } => write!(
                f,
                "asked to bind the room reserved as handle {handle} to handle {handle} itself \
                 (the target is the reservation, a clone or a view of it); bind a reservation \
                 to another handle, such as a lazy one"
            ),
            Self::HostAllocFailed { len } => write!(
                f,
                "asked for {len} bytes of host memory but the heap could not provide them; \
                 ask for fewer bytes or free host memory"
            ),
        }
    }
}

impl IoError {
    /// The device call underneath, if the error came from one.
    pub const fn driver_error(&self) -> Option<&DriverError> {
        match self {
            Self::Shim(e)
            | Self::OutOfMemory {
                source: Some(e), ..
            } => Some(e),
            _ => None,
        }
    }
}

impl core::error::Error for IoError {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            Self::OutOfMemory {
                source: Some(e), ..
            } => Some(e),
            _ => None,
        }
    }
}

impl core::error::Error for DriverError {}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;

    #[test]
    fn only_impossible_sizes_and_forbidden_updates_are_final() {
        assert!(
            !IoError::BufferTooBig {
                size: 1,
                max_page: 0
            }
            .may_succeed_after_reclaim()
        );
        assert!(!IoError::PageUpdateForbidden { size: 1 }.may_succeed_after_reclaim());
        let oom = IoError::OutOfMemory {
            size: 1,
            held: 0,
            budget: None,
            source: None,
        };
        assert!(oom.may_succeed_after_reclaim());
        assert!(
            IoError::PageSizesExhausted {
                size: 1,
                classes: 64
            }
            .may_succeed_after_reclaim()
        );
    }

    #[test]
    fn a_lost_device_is_one_variant_of_the_callers_error() {
        let e = DriverError::new(ShimOp::Launch, 700, Fault::DeviceLost);
        let io: IoError = e.into();
        assert!(io.is_device_lost());
        assert!(matches!(ServerError::from(io), ServerError::DeviceLost { cause } if cause == e));
        assert!(matches!(
            ServerError::from(e),
            ServerError::DeviceLost { .. }
        ));
    }

    #[test]
    fn out_of_memory_names_the_budget_and_what_is_held() {
        let text = IoError::OutOfMemory {
            size: 10,
            held: 90,
            budget: Some(96),
            source: None,
        }
        .to_string();
        assert!(text.contains("10 bytes") && text.contains("90 bytes") && text.contains("96"));
    }
}

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
}

impl fmt::Display for Validation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::StreamOutOfRange { stream, max } => write!(
                f,
                "stream {stream} asked for but this device allows {max} streams; use 0..{max} \
                 or raise `DeviceConfig::max_streams`"
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
    /// A fence wait or query failed with an outcome the core cannot know (not a fault of work
    /// that ran, which is [`ServerError::StreamFaulted`], nor a lost device).
    Device(DriverError),
    /// Work on a stream failed while it ran ([`Fault::WorkFailed`]): nothing written on that
    /// stream, or ordered after it, can be trusted, so every operation on it or depending on it
    /// fails with this.
    StreamFaulted {
        /// The stream whose work failed.
        stream: u32,
        /// The fault its fence reported.
        cause: DriverError,
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
                write!(f, "the device is lost ({cause}); recreate it")
            }
            Self::Io(e) => write!(f, "{e}"),
            Self::Launch(e) => write!(f, "{e}"),
            Self::Device(e) => write!(f, "work on the stream failed: {e}"),
            Self::StreamFaulted { stream, cause } => write!(
                f,
                "work on stream {stream} failed while it ran ({cause}); its data, and work \
                 ordered after it, can no longer be trusted: recreate the device"
            ),
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
        }
    }
}

impl core::error::Error for LaunchError {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            Self::Refused { cause, .. } => Some(cause),
            Self::Buffer { cause, .. } => Some(cause),
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
            Self::Device(e) => defmt::write!(f, "Device({})", e),
            Self::StreamFaulted { stream, cause } => {
                defmt::write!(
                    f,
                    "StreamFaulted {{ stream: {=u32}, cause: {} }}",
                    stream,
                    cause
                )
            }
        }
    }
}
