//! The smallest memory budget under which a trace replays with no failed reservation.
//!
//! Owns the search: bisection on `MemoryBudget::new(Some(limit))` between the live peak (below
//! it a replay must fail: at the live peak every allocation is held) and the held peak of the
//! unbounded replay (raised, doubling, up to the device's memory if even that fails), to within a
//! precision (default: the larger of 1 MiB and 1 % of the live peak). Each probe is a fresh
//! manager that stops at its first failure. The answer is a limit that was replayed without
//! failure; the bisection assumes that a larger budget never fails where a smaller one passed
//! (the manager fits page sizes to the budget, so this is not guaranteed: the answer is always
//! one that passed, but a smaller passing one could exist below a failing probe).

use crate::device::{Device, ReplayShim};
use crate::input::Trace;
use crate::progress::Progress;
use crate::replay::replays_within;
use crate::units::{MIB, bytes};
use devcmd::memory::MemoryConfig;

/// What the search found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Search {
    /// The smallest limit found that replays without failure (`None`: none does).
    pub min_budget: Option<u64>,
    /// The largest limit found to fail (the answer is within `precision` above it; 0 when not
    /// searched).
    pub fails_at: u64,
    /// The precision asked for.
    pub precision: u64,
    /// Replays run.
    pub probes: u32,
    /// Why there is no answer, when there is none.
    pub why_none: Option<String>,
}

/// The default precision for a trace whose live peak is `live_peak`: 1 MiB or 1 %, whichever is
/// larger.
pub fn default_precision(live_peak: u64) -> u64 {
    MIB.max(live_peak / 100)
}

/// Searches the smallest budget for `trace` with `config` (see the module documentation).
/// `held_peak` is the held peak of the unbounded replay.
pub fn min_budget<S: ReplayShim>(
    trace: &Trace,
    device: Device,
    config: MemoryConfig,
    held_peak: u64,
    precision: u64,
    progress: &mut Progress,
    label: &str,
) -> Search {
    let precision = precision.max(1);
    let mut probes = 0u32;
    let mut probe = |limit: u64, progress: &mut Progress| {
        probes += 1;
        progress.phase(format!(
            "{label}: min budget, probe {probes} ({})",
            bytes(limit)
        ));
        replays_within::<S>(trace, device, config, limit, progress)
    };
    // Below the live peak a replay fails: at that point every allocation is held.
    let mut lo = trace.live_peak.saturating_sub(1);
    let mut hi = held_peak.max(trace.live_peak);
    let none = |lo, probes, why: String| Search {
        min_budget: None,
        fails_at: lo,
        precision,
        probes,
        why_none: Some(why),
    };
    if trace.live_peak == 0 {
        return Search {
            min_budget: Some(0),
            fails_at: 0,
            precision,
            probes: 0,
            why_none: None,
        };
    }
    loop {
        if probe(hi, progress) {
            break;
        }
        lo = hi;
        if hi >= device.total_memory {
            return none(
                lo,
                probes,
                format!(
                    "the trace fails even under a budget of the device's whole memory ({})",
                    bytes(device.total_memory)
                ),
            );
        }
        hi = hi.saturating_mul(2).min(device.total_memory);
    }
    while hi - lo > precision {
        let mid = lo + (hi - lo) / 2;
        if probe(mid, progress) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Search {
        min_budget: Some(hi),
        fails_at: lo,
        precision,
        probes,
        why_none: None,
    }
}
