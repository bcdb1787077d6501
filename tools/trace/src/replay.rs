//! Replaying a trace through a `MemoryManager<StdShim>`: the measured replay, the timed ones and
//! the probes of the budget search.
//!
//! Owns the device the replay runs on ([`Device`]: a `StdShim`, whose pages are zeroed heap
//! blocks the host never touches, so untouched memory costs no RAM), a manager built from it
//! ([`Bench`]: one stream, pages freed at once, since no device work ever runs), and three kinds
//! of replay:
//! - [`measure`]: with the figures (held peak, pages, failures), the timeline sampled evenly
//!   across the trace from the manager's report, and `--verify`'s checks after every operation;
//! - [`time`]: uninstrumented, on a fresh manager (cold: page allocations included), then once
//!   more over the same manager's warm pools;
//! - [`replays_within`]: under a budget, stopping at the first failed reservation.
//!
//! An operation is an allocation (`reserve(.., PageUpdate::Allow)`) or a free (dropping the
//! handle). A reservation that fails is counted and its later free skipped.

use crate::input::{Action, Trace};
use crate::progress::Progress;
use crate::verify::Verifier;
use devcmd::Shim;
use devcmd::memory::{Handle, Issuer, MemoryBudget, MemoryConfig, MemoryManager, PageUpdate};
use devcmd_std::StdShim;
use std::time::Instant;

/// The device facts the replay runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Device {
    /// Bytes of device memory.
    pub total_memory: u64,
    /// Page alignment (every slice is aligned to it).
    pub alignment: u64,
    /// The largest page (`None`: the total memory, as the CUDA shim says).
    pub max_page: Option<u64>,
}

impl Default for Device {
    /// 1 TiB (only pages the trace needs are allocated, and never touched), CUDA's 256-byte
    /// alignment, no page limit below the total.
    fn default() -> Self {
        Self {
            total_memory: 1 << 40,
            alignment: 256,
            max_page: None,
        }
    }
}

/// A manager over its own CPU device.
#[derive(Debug)]
pub struct Bench {
    // Declared before the shim: the manager's pages go back before the shim does.
    /// The manager.
    pub mm: MemoryManager<StdShim>,
    /// Its device.
    pub shim: StdShim,
}

impl Bench {
    /// A fresh device and manager with `config`, under `limit` bytes (`None`: no budget).
    pub fn new(device: Device, config: MemoryConfig, limit: Option<u64>) -> Self {
        let shim = StdShim::builder()
            .total_memory(device.total_memory)
            .page_alignment(device.alignment)
            .max_page_size(device.max_page.unwrap_or(device.total_memory))
            .build();
        let mut mm = MemoryManager::new(
            &shim.facts(),
            config,
            Issuer {
                device: 0,
                stream: 0,
            },
            MemoryBudget::new(limit),
        );
        // SAFETY: no device work is ever enqueued on this shim: a page may go back as soon as
        // the manager lets it go.
        unsafe { mm.release_pages_immediately() };
        Self { mm, shim }
    }

    /// Pages the device handed out so far, and pages it took back.
    pub fn page_counts(&self) -> (u64, u64) {
        let st = self.shim.stats();
        (st.device_frees + st.device_pages_live, st.device_frees)
    }
}

impl Drop for Bench {
    fn drop(&mut self) {
        // SAFETY: the std shim runs no work here: nothing is pending on any stream.
        unsafe { self.mm.release_all(&self.shim) };
    }
}

/// Live and held bytes over the trace, per pool and in total, at evenly spaced operations.
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    /// The operation index after which each sample was taken (1-based: after op `x`).
    pub x: Vec<u64>,
    /// Most bytes live (asked for) since the previous sample.
    pub live: Vec<u64>,
    /// Most bytes held (pages) since the previous sample.
    pub held: Vec<u64>,
    /// Per pool, by the report's pool name.
    pub pools: Vec<PoolSeries>,
}

/// One pool's figures in a [`Timeline`] (all report lines of that pool kind added up).
#[derive(Debug, Clone)]
pub struct PoolSeries {
    /// The pool's name in the manager's report (`small`, `arena`, ...).
    pub name: String,
    /// Bytes of pages it held at each sample.
    pub held: Vec<u64>,
    /// Bytes asked for by its live allocations at each sample.
    pub used: Vec<u64>,
}

impl Timeline {
    fn sample(&mut self, at: u64, live: u64, held: u64, mm: &mut MemoryManager<StdShim>) {
        let n = self.x.len();
        self.x.push(at);
        self.live.push(live);
        self.held.push(held);
        for p in &mut self.pools {
            p.held.push(0);
            p.used.push(0);
        }
        for line in mm.report().pools.iter().filter(|p| !p.is_host()) {
            let name = line.kind.name();
            let series = match self.pools.iter().position(|p| p.name == name) {
                Some(i) => &mut self.pools[i],
                None => {
                    self.pools.push(PoolSeries {
                        name: name.to_owned(),
                        held: vec![0; n + 1],
                        used: vec![0; n + 1],
                    });
                    self.pools.last_mut().expect("just pushed")
                }
            };
            series.held[n] += line.reserved;
            series.used[n] += line.in_use;
        }
    }
}

/// What a measured replay found.
#[derive(Debug, Clone)]
pub struct Measured {
    /// The configuration in effect (fitted to the device and the budget).
    pub config: MemoryConfig,
    /// Most bytes live at once (allocations that succeeded).
    pub live_peak: u64,
    /// Most bytes of pages held at once.
    pub held_peak: u64,
    /// Pages held when the held peak was first reached.
    pub pages_at_peak: u64,
    /// Pages allocated during the replay.
    pub pages_allocated: u64,
    /// Pages freed during the replay (before the final teardown).
    pub pages_freed: u64,
    /// Reservations that failed.
    pub failed: u64,
    /// The first failure: where, and the manager's error.
    pub first_failure: Option<String>,
    /// The timeline.
    pub timeline: Timeline,
    /// Operations checked by `--verify` (0 when off).
    pub verified_ops: u64,
}

/// How to measure.
#[derive(Debug, Clone, Copy)]
pub struct MeasureOptions {
    /// The budget's limit (`None`: no budget).
    pub limit: Option<u64>,
    /// Most timeline samples.
    pub samples: usize,
    /// Check every operation against an independent model.
    pub verify: bool,
}

/// Replays `trace` with `config`, measuring (see the module documentation).
pub fn measure(
    trace: &Trace,
    device: Device,
    config: MemoryConfig,
    options: MeasureOptions,
    progress: &mut Progress,
) -> Result<Measured, String> {
    let mut bench = Bench::new(device, config, options.limit);
    let mut handles: Vec<Option<Handle>> = (0..trace.slots).map(|_| None).collect();
    let mut verifier = options
        .verify
        .then(|| Verifier::new(trace, bench.mm.alignment()));
    let ops = &trace.ops;
    let total = ops.len() as u64;
    let bucket = ops.len().div_ceil(options.samples.max(1)).max(1);
    let mut timeline = Timeline::default();
    let (mut live, mut live_peak, mut held_peak, mut pages_at_peak) = (0u64, 0u64, 0u64, 0u64);
    let (mut bucket_live, mut bucket_held) = (0u64, 0u64);
    let (mut failed, mut first_failure) = (0u64, None);
    for (i, op) in ops.iter().enumerate() {
        let slot = op.slot as usize;
        match op.action {
            Action::Alloc => match bench.mm.reserve(&bench.shim, op.size, PageUpdate::Allow) {
                Ok(h) => {
                    if let Some(v) = &mut verifier {
                        v.on_alloc(trace, i, &mut bench, &h)?;
                    }
                    handles[slot] = Some(h);
                    live += op.size;
                }
                Err(e) => {
                    failed += 1;
                    first_failure.get_or_insert_with(|| {
                        format!(
                            "op {i} ({}): reserve of {} bytes for id {}: {e}",
                            trace.place(op),
                            op.size,
                            op.id
                        )
                    });
                }
            },
            Action::Free => {
                if let Some(h) = handles[slot].take() {
                    if let Some(v) = &mut verifier {
                        v.on_free(op.slot);
                    }
                    drop(h);
                    live -= op.size;
                }
            }
        }
        let held = bench.mm.budget().held();
        if held > held_peak {
            held_peak = held;
            pages_at_peak = bench.shim.stats().device_pages_live;
        }
        live_peak = live_peak.max(live);
        bucket_live = bucket_live.max(live);
        bucket_held = bucket_held.max(held);
        if let Some(v) = &mut verifier {
            v.after_op(trace, i, &mut bench)?;
        }
        if (i + 1) % bucket == 0 || i + 1 == ops.len() {
            timeline.sample(i as u64 + 1, bucket_live, bucket_held, &mut bench.mm);
            (bucket_live, bucket_held) = (live, bench.mm.budget().held());
            if let Some(v) = &mut verifier
                && timeline.x.len() % 20 == 1
            {
                v.compare_allocations(trace, i, &mut bench)?;
            }
        }
        progress.update(i as u64, total);
    }
    let (pages_allocated, pages_freed) = bench.page_counts();
    let config = bench.mm.config();
    drop(handles);
    if let Some(v) = verifier {
        v.finish(&mut bench)?;
    }
    Ok(Measured {
        config,
        live_peak,
        held_peak,
        pages_at_peak,
        pages_allocated,
        pages_freed,
        failed,
        first_failure,
        timeline,
        verified_ops: if options.verify { total } else { 0 },
    })
}

/// Nanoseconds per operation of the timed replays.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timing {
    /// A fresh manager: page allocations included.
    pub cold_ns_per_op: f64,
    /// Once more over the same manager, whose pools are warm.
    pub warm_ns_per_op: f64,
}

/// Replays `trace` twice, timed, with nothing but the replay inside the timed loop (see the
/// module documentation).
pub fn time(
    trace: &Trace,
    device: Device,
    config: MemoryConfig,
    limit: Option<u64>,
    progress: &mut Progress,
) -> Timing {
    let mut bench = Bench::new(device, config, limit);
    let mut handles: Vec<Option<Handle>> = (0..trace.slots).map(|_| None).collect();
    let n = trace.ops.len().max(1) as f64;
    let total = 2 * trace.ops.len() as u64;
    let cold = replay_timed(trace, &mut bench, &mut handles, progress, 0, total);
    handles.iter_mut().for_each(|h| *h = None);
    let warm = replay_timed(trace, &mut bench, &mut handles, progress, total / 2, total);
    drop(handles);
    Timing {
        cold_ns_per_op: cold * 1e9 / n,
        warm_ns_per_op: warm * 1e9 / n,
    }
}

/// One replay; the seconds it took. Progress is drawn between chunks of operations.
fn replay_timed(
    trace: &Trace,
    bench: &mut Bench,
    handles: &mut [Option<Handle>],
    progress: &mut Progress,
    mut done: u64,
    total: u64,
) -> f64 {
    let start = Instant::now();
    for chunk in trace.ops.chunks(1 << 14) {
        for op in chunk {
            let slot = &mut handles[op.slot as usize];
            *slot = match op.action {
                Action::Alloc => bench
                    .mm
                    .reserve(&bench.shim, op.size, PageUpdate::Allow)
                    .ok(),
                Action::Free => None,
            };
        }
        done += chunk.len() as u64;
        progress.update(done, total);
    }
    start.elapsed().as_secs_f64()
}

/// Whether `trace` replays with `config` under a budget of `limit` bytes with no failed
/// reservation (stops at the first).
pub fn replays_within(
    trace: &Trace,
    device: Device,
    config: MemoryConfig,
    limit: u64,
    progress: &mut Progress,
) -> bool {
    let mut bench = Bench::new(device, config, Some(limit));
    let mut handles: Vec<Option<Handle>> = (0..trace.slots).map(|_| None).collect();
    let total = trace.ops.len() as u64;
    for (i, op) in trace.ops.iter().enumerate() {
        let slot = &mut handles[op.slot as usize];
        match op.action {
            Action::Alloc => match bench.mm.reserve(&bench.shim, op.size, PageUpdate::Allow) {
                Ok(h) => *slot = Some(h),
                Err(_) => return false,
            },
            Action::Free => *slot = None,
        }
        if i % 4096 == 0 {
            progress.update(i as u64, total);
        }
    }
    true
}
