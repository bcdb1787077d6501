//! The manager's public types: what a user of [`MemoryManager`](super::MemoryManager) names in
//! its calls and reads in its answers.
//!
//! Owns who issued a handle ([`Issuer`]), the modes and cleanup kinds a caller picks
//! ([`AllocationMode`], [`PageUpdate`], [`Cleanup`]), what a lookup answers ([`Resolved`],
//! [`PageRef`], [`PageGuard`]), the diagnostics of checks ([`AllocationInfo`], [`PageInfo`]), the
//! pages it holds ([`RawPage`]) and what it lets go before the device is done with it
//! ([`RetiredPage`]; what that holds is `retire.rs`'s). Does not own the rules that make or
//! consume them: those are the manager's (`manager.rs` and the files under `manager/`). Fields the
//! manager fills in are visible to the `memory` module only.

use super::budget::MemoryBudget;
use super::pool::Pool;
use super::report::PoolKind;
use crate::shim::{DeviceAddr, DeviceSpan, Shim};
use alloc::sync::Arc;
use core::sync::atomic::{AtomicU32, Ordering};

/// Who issued a handle: the device and the stream whose manager holds its memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Issuer {
    /// The device's id (unique in the process).
    pub device: u32,
    /// The stream's index on that device.
    pub stream: u32,
}

/// How new reservations are served. Modes nest: see [`MemoryManager::set_mode`].
///
/// [`MemoryManager::set_mode`]: super::MemoryManager::set_mode
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum AllocationMode {
    /// The pools chosen by size (small pool, adaptive arena). Closes the innermost window.
    Auto,
    /// Exact-size reuse, kept until an explicit cleanup (weights). Opens a window.
    Persistent,
    /// One page per reservation, released at the next cleanup once freed. Opens a window.
    Dedicated,
}

/// What a reservation may do to the set of pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum PageUpdate {
    /// Run the periodic cleanup and add pages as needed.
    Allow,
    /// Add pages, never release or renumber any (another stream records a graph).
    AddOnly,
    /// Only room already held (this stream records a graph).
    Forbidden,
}

/// Explicit or periodic cleanup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Cleanup {
    /// On every `Allow` reservation: freed dedicated pages and empty outdated pages go back.
    Periodic,
    /// Every empty, unguarded page of every pool goes back, and freed persistent pages.
    Explicit,
}

/// A device address range a handle resolved to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Resolved {
    /// First byte of the handle's view.
    pub addr: DeviceAddr,
    /// Bytes of the view.
    pub len: u64,
    /// The page it lies on.
    pub page: PageRef,
}

impl Resolved {
    /// The range, without its page.
    pub(crate) fn span(&self) -> DeviceSpan {
        DeviceSpan {
            addr: self.addr,
            len: self.len,
        }
    }
}

/// A page of a manager, as named in guards and checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct PageRef {
    pub(super) pool: Pool,
    pub(super) page: u32,
}

/// Keeps one page exactly as it is while alive: it is never released and what lives on it keeps
/// its address; on a page of the sliced and whole-page pools nothing new is carved from it either.
/// In a granule pool the guard keeps one granule mapped, and new allocations may still share its
/// free bytes (they move nothing). May be dropped from any thread; the manager notices at its next
/// cleanup.
#[derive(Debug, Clone)]
pub struct PageGuard {
    pub(super) token: Arc<PageRef>,
}

impl PageGuard {
    /// The guarded page.
    pub fn page(&self) -> PageRef {
        *self.token
    }
}

/// A live allocation, for checks and diagnostics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocationInfo {
    /// The handle id it is bound to.
    pub owner: u64,
    /// First device address.
    pub addr: u64,
    /// Bytes asked for.
    pub size: u64,
    /// Bytes it spans (size + padding).
    pub span: u64,
    /// The page it lies on.
    pub page: PageInfo,
}

/// A page held, for checks and diagnostics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageInfo {
    /// The pool it belongs to.
    pub kind: PoolKind,
    /// Which page.
    pub page: PageRef,
    /// First device address.
    pub addr: u64,
    /// Bytes.
    pub size: u64,
    /// Whether a guard holds it.
    pub guarded: bool,
}

/// A page a manager holds: device memory, or (zero copy, see
/// [`DeviceConfig::zero_copy`](crate::DeviceConfig::zero_copy)) a pinned host page the device
/// addresses in place, which the host reads and writes directly.
pub enum RawPage<S: Shim> {
    /// From [`Shim::device_alloc`].
    Device(S::DevicePage),
    /// From [`Shim::host_alloc_pinned`], with a device address from
    /// [`Shim::host_page_device_addr`], and how many host buffers lent out of it are alive
    /// ([`Command::read_owned`](crate::Command::read_owned)): a page with lent buffers is never
    /// freed, even at teardown or after a loss (it is leaked instead).
    Mapped(S::HostPage, Arc<AtomicU32>),
}

impl<S: Shim> core::fmt::Debug for RawPage<S> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Device(p) => f.debug_tuple("Device").field(p).finish(),
            Self::Mapped(p, lent) => f
                .debug_tuple("Mapped")
                .field(p)
                .field(&lent.load(Ordering::Relaxed))
                .finish(),
        }
    }
}

impl<S: Shim> RawPage<S> {
    /// The host address of the page's first byte, when the host can reach it.
    pub(crate) fn host_ptr(&self, shim: &S) -> Option<core::ptr::NonNull<u8>> {
        match self {
            Self::Mapped(p, _) => Some(shim.host_page_ptr(p)),
            Self::Device(_) => None,
        }
    }

    /// The count of host buffers lent out of a mapped page.
    pub(crate) fn lent(&self) -> Option<&Arc<AtomicU32>> {
        match self {
            Self::Mapped(_, lent) => Some(lent),
            Self::Device(_) => None,
        }
    }
}

/// What the manager let go that must wait for the device before it goes back: a page, or a
/// granule's memory ([`Released`](super::Released)). The device takes them from its streams'
/// managers into their drop queues (hence public: a drop-queue item).
#[derive(Debug)]
pub struct RetiredPage<P> {
    pub(super) raw: P,
    pub(super) size: u64,
    pub(super) budget: MemoryBudget,
}

impl<P> RetiredPage<P> {
    /// Bytes it holds against the budget.
    pub fn size(&self) -> u64 {
        self.size
    }
}

impl<S: Shim> RawPage<S> {
    /// Frees the page on the device, or on the host for a mapped page (leaked instead while
    /// host buffers lent out of it live).
    ///
    /// # Safety
    ///
    /// No work that may use the page is pending on any stream of the device (or the device is
    /// poisoned).
    pub(super) unsafe fn free(self, shim: &S) {
        match self {
            // SAFETY: the caller guarantees no pending work uses the page.
            Self::Device(p) => unsafe { shim.device_free(p) },
            Self::Mapped(p, lent) => {
                if lent.load(Ordering::Acquire) > 0 {
                    // The host still reads buffers lent out of it: leaked, never freed under them.
                    warn!(
                        "a mapped page is freed while host buffers lent from it live: leaking it"
                    );
                    core::mem::forget(p);
                } else {
                    // SAFETY: as above; a mapped page is only used by the device through its
                    // address, and no host buffer lent from it lives.
                    unsafe { shim.host_free_pinned(p) }
                }
            }
        }
    }
}
