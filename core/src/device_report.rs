//! The memory report of a whole device: every stream's pools, what waits in the drop queues for
//! a fence, and the device-wide totals.
//!
//! Owns the report's shape and how it prints. Does not gather the figures (the device does, in
//! `Device::memory_report`) nor the per-pool lines (`memory/report.rs`).

use crate::drop_queue::Awaiting;
use crate::memory::{MemoryReport, ReadableBytes};
use crate::stream::StreamId;
use alloc::vec::Vec;

/// The memory report of a whole device: one report per stream created. Device memory and
/// pinned host memory are kept apart, in the totals as in each stream's report.
///
/// The device figures add up: [`Self::held`] (what counts against the budget) is the memory in
/// the pools ([`Self::in_pools`]: each pool's `reserved`), plus the pages and granules the pools
/// let go that wait for a fence in a drop queue ([`Awaiting::pages`] of [`Self::awaiting_fence`]),
/// plus what was leaked on purpose after a fence of unknown outcome ([`Self::leaked`]). Address
/// space a granule pool reserved ([`Self::address_space`]) is not memory and is counted apart.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceReport {
    /// Per stream: its id and the figures of its pools (its device pools, then its pinned host
    /// pool; [`MemoryReport::device`] and [`MemoryReport::pinned_host`] total them apart).
    pub streams: Vec<(StreamId, MemoryReport)>,
    /// Per stream: what its drop queue holds until a fence passes (memory the host dropped or
    /// handed over that is not back yet). [`Self::awaiting_fence`] totals it.
    pub awaiting: Vec<(StreamId, Awaiting)>,
    /// Bytes of device memory held on the device (the budget's count): in the pools, let go and
    /// waiting for a fence in a drop queue, or leaked after an inconclusive fence. Host memory is
    /// never counted here.
    pub held: u64,
    /// The device's budget, if any (it bounds `held`, not pinned host memory).
    pub budget: Option<u64>,
    /// Bytes of pinned host pages held by every stream's pinned pool.
    pub pinned_host: u64,
}

impl DeviceReport {
    /// What every stream's drop queue holds until a fence passes, together.
    pub fn awaiting_fence(&self) -> Awaiting {
        self.awaiting
            .iter()
            .fold(Awaiting::default(), |t, (_, a)| Awaiting {
                pages: t.pages.saturating_add(a.pages),
                bindings: t.bindings.saturating_add(a.bindings),
                host: t.host.saturating_add(a.host),
            })
    }

    /// Bytes of device memory in every stream's pools (their `reserved`, pinned host pools left
    /// out).
    pub fn in_pools(&self) -> u64 {
        self.streams.iter().map(|(_, r)| r.device().reserved).sum()
    }

    /// Bytes of device address space reserved by granule pools: not memory, not in `held`.
    pub fn address_space(&self) -> u64 {
        self.streams.iter().map(|(_, r)| r.address_space).sum()
    }

    /// Bytes held that are neither in a pool nor waiting for a fence: pages leaked on purpose
    /// after a fence whose outcome is unknown (the device may still use them).
    pub fn leaked(&self) -> u64 {
        self.held
            .saturating_sub(self.in_pools())
            .saturating_sub(self.awaiting_fence().pages)
    }
}

impl core::fmt::Display for DeviceReport {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        for (id, report) in &self.streams {
            writeln!(f, "stream {}:", id.0)?;
            writeln!(f, "{report}")?;
        }
        let a = self.awaiting_fence();
        write!(f, "device memory held: {}", ReadableBytes(self.held))?;
        if let Some(b) = self.budget {
            write!(f, " of a {} budget", ReadableBytes(b))?;
        }
        write!(
            f,
            " = {} in the pools + {} let go, awaiting a fence",
            ReadableBytes(self.in_pools()),
            ReadableBytes(a.pages)
        )?;
        if self.leaked() > 0 {
            write!(
                f,
                " + {} leaked after an inconclusive fence",
                ReadableBytes(self.leaked())
            )?;
        }
        if self.address_space() > 0 {
            write!(
                f,
                "\ndevice address space reserved: {} (memory is mapped into it on demand)",
                ReadableBytes(self.address_space())
            )?;
        }
        write!(
            f,
            "\nalso awaiting a fence: {} of allocations kept for work in flight, {} of host buffers",
            ReadableBytes(a.bindings),
            ReadableBytes(a.host)
        )?;
        write!(
            f,
            "\npinned host pages held: {}",
            ReadableBytes(self.pinned_host)
        )
    }
}

#[cfg(feature = "defmt")]
impl defmt::Format for DeviceReport {
    /// As `Display`, through `defmt` (no float formatting in the image).
    fn format(&self, f: defmt::Formatter<'_>) {
        for (id, report) in &self.streams {
            defmt::write!(f, "stream {=u32}:\n{}\n", id.0, report);
        }
        let a = self.awaiting_fence();
        defmt::write!(f, "device memory held: {}", ReadableBytes(self.held));
        if let Some(b) = self.budget {
            defmt::write!(f, " of a {} budget", ReadableBytes(b));
        }
        defmt::write!(
            f,
            " = {} in the pools + {} let go, awaiting a fence",
            ReadableBytes(self.in_pools()),
            ReadableBytes(a.pages)
        );
        if self.leaked() > 0 {
            defmt::write!(
                f,
                " + {} leaked after an inconclusive fence",
                ReadableBytes(self.leaked())
            );
        }
        if self.address_space() > 0 {
            defmt::write!(
                f,
                "\ndevice address space reserved: {} (memory is mapped into it on demand)",
                ReadableBytes(self.address_space())
            );
        }
        defmt::write!(
            f,
            "\nalso awaiting a fence: {} of allocations kept for work in flight, {} of host buffers",
            ReadableBytes(a.bindings),
            ReadableBytes(a.host)
        );
        defmt::write!(
            f,
            "\npinned host pages held: {}",
            ReadableBytes(self.pinned_host)
        );
    }
}
