//! The errors of the memory, copy and I/O paths.

use super::DriverError;
use core::fmt;

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
    /// The handle was made by another memory manager of the same device and stream (one a
    /// user made with [`MemoryManager::new`](crate::memory::MemoryManager::new)), whose pools
    /// hold its memory.
    OtherManager,
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
        /// The device's memory budget, when it is what bounds the page
        /// ([`DeviceConfig::memory_budget`](crate::DeviceConfig::memory_budget), or the shim's
        /// own): raising it makes room for larger pages.
        budget: Option<u64>,
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
    /// No room was held for the request and no page may be allocated: a stream of the device
    /// records a graph (on the recording stream itself this discards the recording).
    PageUpdateForbidden {
        /// Bytes asked for.
        size: u64,
        /// The largest free room the pool the request routes to holds (0 when it holds none).
        room: u64,
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
        /// Whether the issuing device was dropped (its memory went with it).
        issuer_dropped: bool,
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
    /// Room whose raw device address was handed out
    /// ([`Command::managed_resource`](crate::Command::managed_resource)) cannot be given to
    /// another handle while a binding of it is out: the resource (or work not yet collected)
    /// keeps the old handle, not the room's new owner. Also the source of a copy to another
    /// device whose end could not be known (`Command::copy_from`): it is kept for good.
    Exposed {
        /// The handle whose room was to be given.
        handle: u64,
    },
    /// Room a graph (or the recording open on a stream) uses cannot be given to another handle.
    KeptByGraph {
        /// The handle whose room was to be given.
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
    /// Room bound to a handle larger than it ([`MemoryManager::bind`](crate::memory::MemoryManager::bind)).
    RoomTooSmall {
        /// Bytes of the reserved room.
        room: u64,
        /// Bytes the handle needs.
        needs: u64,
    },
    /// A device call failed (a lost device among them: see [`IoError::is_device_lost`]).
    Shim(DriverError),
    /// A reservation was bound to itself: the target of `bind` is the reserved handle, a clone
    /// or a view of it.
    SelfBind {
        /// The allocation's id.
        handle: u64,
    },
    /// The host could not hold a buffer of this size (a read's destination, a staging buffer):
    /// the length overflows what the heap can address, or the allocator refused it.
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

impl IoError {
    /// [`IoError::ForeignHandle`] for a handle of device `issued_by` used on device `used_on`,
    /// saying whether the issuing device is gone.
    pub(crate) fn foreign_handle(issued_by: u32, used_on: u32) -> Self {
        Self::ForeignHandle {
            issued_by,
            used_on,
            issuer_dropped: !crate::live::is_alive(issued_by),
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
            Self::BufferTooBig {
                size,
                max_page,
                budget: Some(b),
            } => write!(
                f,
                "asked for {size} bytes but the device's memory budget of {b} bytes allows no \
                 page larger than {max_page} bytes; raise `DeviceConfig::memory_budget` or split \
                 the buffer"
            ),
            Self::BufferTooBig {
                size,
                max_page,
                budget: None,
            } => write!(
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
                    write!(f, " under a memory budget of {b} bytes")?;
                }
                match source {
                    // The device's own answer is the error's source.
                    Some(_) => f.write_str(
                        ", and the device refused the page (a device's reservation reclaims \
                         first); free buffers or lower the load",
                    ),
                    None => f.write_str(
                        ", and the budget has no room left (a device's reservation reclaims \
                         first); free buffers or raise `DeviceConfig::memory_budget`",
                    ),
                }
            }
            Self::PageUpdateForbidden { size, room } => write!(
                f,
                "asked for {size} bytes while a stream of the device records a graph, and the \
                 largest room held for it is {room} bytes, but no page may be allocated or freed \
                 while a graph records (on the recording stream this discards the recording); \
                 hold room ahead with `Command::hold` or a warm-up run before `begin_capture`"
            ),
            Self::UnsupportedStrides { rank, dim } => write!(
                f,
                "a layout of rank {rank} is not pitched row-major at dimension {dim}; \
                 make the data contiguous first"
            ),
            Self::NotFound { handle, reason } => {
                let bound_one = "use the handle the memory was bound to";
                let (why, action) = match reason {
                    NotFoundReason::NeverBound => {
                        ("was issued lazily and never bound to memory", bound_one)
                    }
                    NotFoundReason::HandedOver => (
                        "was a reservation whose memory was bound to another handle",
                        bound_one,
                    ),
                    NotFoundReason::Stale => {
                        ("points to memory that was released or reused", bound_one)
                    }
                    NotFoundReason::OtherManager => (
                        "was made by another memory manager of this device and stream, which \
                         holds its memory",
                        "use the handle with the manager that made it",
                    ),
                };
                write!(f, "handle {handle} {why}; {action}")
            }
            Self::StorageHandleNotFound { handle, page } => write!(
                f,
                "handle {handle} routes to page {page}, which the pool no longer holds: a bug in \
                 devcmd; report it with the steps that led here"
            ),
            Self::ForeignHandle {
                issued_by,
                used_on,
                issuer_dropped: true,
            } => write!(
                f,
                "a handle issued by device {issued_by} was used on device {used_on}, and device \
                 {issued_by} was dropped: its memory went with it; upload the data again on \
                 device {used_on}"
            ),
            Self::ForeignHandle {
                issued_by,
                used_on,
                issuer_dropped: false,
            } => write!(
                f,
                "a handle issued by device {issued_by} was used on device {used_on}, but a handle \
                 belongs to the device that issued it; read the data back from device \
                 {issued_by} and upload it to device {used_on}"
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
            Self::KeptByGraph { handle } => write!(
                f,
                "the memory of handle {handle} is used by a graph (or by the recording open on \
                 its stream), whose replays must find it where it is; drop the graph (or end the \
                 recording) first, or bind fresh room from `reserve`"
            ),
            Self::Exposed { handle } => write!(
                f,
                "the room of handle {handle} had its raw device address handed out \
                 (managed_resource) and a binding of it is still out; drop the resource and let \
                 the streams that used the room collect their work (memory_cleanup) before you \
                 bind it, or bind fresh room from `reserve` (the source of a copy to another \
                 device whose end could not be known is kept for good: bind fresh room)"
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
            Self::RoomTooSmall { room, needs } => write!(
                f,
                "the reserved room holds {room} bytes but the handle bound to it needs {needs}; \
                 reserve at least {needs} bytes for it"
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
                "asked for {len} bytes of host memory but the heap cannot provide them; read or \
                 write in smaller pieces, or free host memory"
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
        // `Shim` prints its call's text itself; `OutOfMemory` leaves the device's answer to here.
        match self {
            Self::OutOfMemory {
                source: Some(e), ..
            } => Some(e),
            Self::Shim(e) => e.source(),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{Fault, ServerError, ShimOp};
    use alloc::string::ToString;

    #[test]
    fn only_impossible_sizes_and_forbidden_updates_are_final() {
        assert!(
            !IoError::BufferTooBig {
                size: 1,
                max_page: 0,
                budget: None,
            }
            .may_succeed_after_reclaim()
        );
        assert!(!IoError::PageUpdateForbidden { size: 1, room: 0 }.may_succeed_after_reclaim());
        let oom = IoError::OutOfMemory {
            size: 1,
            held: 0,
            budget: None,
            source: None,
        };
        assert!(oom.may_succeed_after_reclaim());
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
