//! The device a replay runs on: its facts, and where its pages come from.
//!
//! Owns [`Device`] (the facts the manager is fitted to), [`Pages`] (which device: `std` or
//! `address`), and the [`ReplayShim`] trait both implement (building one from the facts, the
//! counters of its pages that the figures and `--verify` read, and leaving out the checks a
//! timed replay should not pay for: the address-only device's record of every mapping). The
//! address-only device is the core's ([`devcmd::address_shim`]), shared with the core's tests
//! and engine-bench.
//!
//! - `std`: devcmd-std's [`StdShim`], the CPU device. Its pages are zeroed heap blocks of the
//!   page alignment; Rust's `alloc_zeroed` zeroes any block aligned past 16 bytes by writing it,
//!   so a replay touches every page it holds: it needs RAM for the held peak, and a cold replay's
//!   time is mostly that zeroing.
//! - `address`: [`AddressShim`], address ranges and nothing behind them (no memory; copies and
//!   kernels do nothing, and a replay makes none): the manager sees the same facts and the same
//!   failures past the device's memory, so its figures are the same, in no RAM and with nothing
//!   but the manager in the time.

pub use devcmd::address_shim::AddressShim;
use devcmd::{DeviceFacts, Shim, ShimOp};
use devcmd_std::StdShim;

/// The device facts the replay runs with, and where its pages come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Device {
    /// Bytes of device memory.
    pub total_memory: u64,
    /// Page alignment (every slice is aligned to it).
    pub alignment: u64,
    /// The largest page (`None`: the total memory, as the CUDA shim says).
    pub max_page: Option<u64>,
    /// Which device makes the pages.
    pub pages: Pages,
    /// Memory the manager lets go waits for a fence, as on a device (`--fenced`: see
    /// `replay::Fences`); otherwise it goes back at once.
    pub fenced: bool,
}

impl Default for Device {
    /// 140 GiB (about an H200's, the GPU the stored traces were captured on), CUDA's 256-byte
    /// alignment, no page limit below the total, pages of address ranges only (the figures are
    /// the same as devcmd-std's, with no RAM behind them and only the manager in the times).
    fn default() -> Self {
        Self {
            total_memory: 140 << 30,
            alignment: 256,
            max_page: None,
            pages: Pages::Address,
            fenced: false,
        }
    }
}

impl Device {
    /// The facts a device with these settings reports: devcmd-std's, for either device (so both
    /// round the alignment and clamp the largest page alike, and a field added to the facts
    /// later needs no change here).
    pub fn facts(&self) -> DeviceFacts {
        std_shim(*self).facts()
    }
}

fn std_shim(device: Device) -> StdShim {
    StdShim::builder()
        .total_memory(device.total_memory)
        .page_alignment(device.alignment)
        .max_page_size(device.max_page.unwrap_or(device.total_memory))
        .build()
}

/// Which device makes the pages (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pages {
    /// devcmd-std's CPU device: real, zeroed heap pages.
    Std,
    /// Address ranges only.
    Address,
}

impl Pages {
    /// Its name on the command line and in the report.
    pub fn name(self) -> &'static str {
        match self {
            Self::Std => "std",
            Self::Address => "address",
        }
    }
}

/// What a replay reads of its device's pages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Pages allocated (successfully).
    pub allocated: u64,
    /// Pages freed.
    pub freed: u64,
    /// Bytes of live pages.
    pub bytes_live: u64,
    /// Calls that may have changed the device's memory (every counted call and every free): a
    /// check reads the manager's pages again when this moves.
    pub calls: u64,
    /// Granules mapped (`vm_map` calls that succeeded).
    pub maps: u64,
    /// Granules unmapped (`vm_unmap` calls).
    pub unmaps: u64,
}

impl Counters {
    /// Pages live.
    pub fn live(&self) -> u64 {
        self.allocated - self.freed
    }

    /// Calls that put memory behind an address or took it away: pages allocated and freed,
    /// map and unmap calls (one granule each, or several under `map_spans`; each costs about a
    /// `cuMemAlloc` on a GPU).
    pub fn map_calls(&self) -> u64 {
        self.allocated + self.freed + self.maps + self.unmaps
    }
}

/// A device a replay can build from [`Device`] and read page counters from.
pub trait ReplayShim: Shim + Sized {
    /// A device with `device`'s facts.
    fn build(device: Device) -> Self;
    /// Its page counters now.
    fn counters(&self) -> Counters;
    /// Leaves out, on a device not yet used, the checks that cost it time a real device would
    /// not spend, so a timed replay measures the core: called before every timed replay's
    /// manager is built (the measured replay keeps them).
    fn for_timing(&self) {}
}

impl ReplayShim for StdShim {
    fn build(device: Device) -> Self {
        std_shim(device)
    }

    fn counters(&self) -> Counters {
        let st = self.stats();
        Counters {
            allocated: st.device_frees + st.device_pages_live,
            freed: st.device_frees,
            bytes_live: st.device_bytes_live,
            calls: ShimOp::ALL.iter().map(|op| st.calls(*op)).sum::<u64>() + st.device_frees,
            maps: st.vm_maps,
            unmaps: st.vm_unmaps,
        }
    }
}

impl ReplayShim for AddressShim {
    fn build(device: Device) -> Self {
        AddressShim::from_facts(device.facts())
    }

    /// The record of every mapping kept for the contract checks is a tree whose updates cost
    /// more than the core's own bookkeeping of a map call.
    fn for_timing(&self) {
        self.check_mappings(false);
    }

    fn counters(&self) -> Counters {
        Counters {
            allocated: self.pages_made.get(),
            freed: self.pages_freed.get(),
            bytes_live: self.live_bytes.get(),
            calls: self.memory_calls.get(),
            maps: self.maps.get(),
            unmaps: self.unmaps.get(),
        }
    }
}
