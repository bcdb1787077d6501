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
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceReport {
    /// Per stream: its id and the figures of its pools (its device pools, then its pinned host
    /// pool; [`MemoryReport::device`] and [`MemoryReport::pinned_host`] total them apart).
    pub streams: Vec<(StreamId, MemoryReport)>,
    /// Per stream: what its drop queue holds until a fence passes (memory the host dropped or
    /// handed over that is not back yet). [`Self::awaiting_fence`] totals it.
    pub awaiting: Vec<(StreamId, Awaiting)>,
    /// Bytes of device pages held on the device: in the pools, retired and waiting for a fence in
    /// a drop queue, or leaked after an inconclusive fence (the budget's count). Host memory is
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
}

impl core::fmt::Display for DeviceReport {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        for (id, report) in &self.streams {
            writeln!(f, "stream {}:", id.0)?;
            writeln!(f, "{report}")?;
        }
        let a = self.awaiting_fence();
        writeln!(
            f,
            "awaiting a fence: {} of pages let go, {} of allocations kept for work in flight, {} of host buffers",
            ReadableBytes(a.pages),
            ReadableBytes(a.bindings),
            ReadableBytes(a.host)
        )?;
        write!(f, "device pages held: {}", ReadableBytes(self.held))?;
        if let Some(b) = self.budget {
            write!(f, " of a {} budget", ReadableBytes(b))?;
        }
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
        defmt::write!(
            f,
            "awaiting a fence: {} of pages let go, {} of allocations kept for work in flight, {} of host buffers\n",
            ReadableBytes(a.pages),
            ReadableBytes(a.bindings),
            ReadableBytes(a.host)
        );
        defmt::write!(f, "device pages held: {}", ReadableBytes(self.held));
        if let Some(b) = self.budget {
            defmt::write!(f, " of a {} budget", ReadableBytes(b));
        }
        defmt::write!(
            f,
            "\npinned host pages held: {}",
            ReadableBytes(self.pinned_host)
        );
    }
}
