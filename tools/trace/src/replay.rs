//! Replaying a trace through a `MemoryManager` (over devcmd-std's `StdShim`, or the address-only
//! device: see `device.rs`): the measured replay, the timed ones and the probes of the budget
//! search.
//!
//! Owns a manager over its own device ([`Bench`]: one stream, pages freed at once, since no
//! device work ever runs; the device is `device.rs`'s), and three kinds of replay:
//! - [`measure`]: with the figures (held peak, pages, failures), the timeline sampled evenly
//!   across the trace from the manager's report, and `--verify`'s checks after every operation;
//! - [`time`]: uninstrumented (the device's own checks off too), on fresh managers (cold: page
//!   allocations included), then over the last one's warm pools, each for at least a second of
//!   replays (`--timing-seconds`);
//! - [`replays_within`]: under a budget, stopping at the first failed reservation.
//!
//! An operation is an allocation (`reserve(.., PageUpdate::Allow)`) or a free (dropping the
//! handle). A reservation that fails is counted and its later free skipped.

use crate::device::{Device, ReplayShim};
use crate::input::{Action, Trace};
use crate::progress::Progress;
use crate::verify::Verifier;
use devcmd::DropPolicy;
use devcmd::memory::{
    Handle, Issuer, MemoryBudget, MemoryConfig, MemoryManager, PageUpdate, Released, RetiredPage,
};
use std::time::Instant;

/// A manager over its own device.
#[derive(Debug)]
pub struct Bench<S: ReplayShim> {
    // Declared before the shim: the manager's pages go back before the shim does.
    /// The manager.
    pub mm: MemoryManager<S>,
    /// Memory the manager let go, waiting for a fence (`--fenced`).
    fences: Option<Fences<S>>,
    /// Its device.
    pub shim: S,
}

/// Retired pages and granules on their way back, as a device's drop queue holds them: staged,
/// then pending behind a fence recorded when the staged ones reach the drop policy's thresholds
/// (64 items or 64 MiB by default), freed at the next such point (the fence has passed by then:
/// the replay's device runs no work). A retiring granule the manager takes back before then is
/// left mapped when its turn comes.
#[derive(Debug)]
struct Fences<S: ReplayShim> {
    policy: DropPolicy,
    staged: Vec<RetiredPage<Released<S>>>,
    staged_bytes: u64,
    pending: Vec<RetiredPage<Released<S>>>,
}

impl<S: ReplayShim> Fences<S> {
    /// Takes what the manager retired since the last call; at the thresholds, frees the pending
    /// batch and makes the staged one pending.
    fn settle(&mut self, mm: &mut MemoryManager<S>, shim: &S) {
        for page in mm.take_retired() {
            self.staged_bytes += page.size();
            self.staged.push(page);
        }
        let p = &self.policy;
        if self.staged.len() as u64 >= p.max_items || self.staged_bytes >= p.max_bytes {
            self.free_pending(shim);
            self.pending = std::mem::take(&mut self.staged);
            self.staged_bytes = 0;
        }
    }

    fn free_pending(&mut self, shim: &S) {
        for page in self.pending.drain(..) {
            // SAFETY: the replay's device runs no work: no fence is ever still pending.
            unsafe { page.free(shim) };
        }
    }

    /// Takes what the manager retired and frees everything waiting (a flush and a wait).
    fn drain(&mut self, mm: &mut MemoryManager<S>, shim: &S) {
        self.free_pending(shim);
        self.pending = mm.take_retired();
        self.pending.append(&mut self.staged);
        self.staged_bytes = 0;
        self.free_pending(shim);
    }
}

impl<S: ReplayShim> Bench<S> {
    /// A fresh device and manager with `config`, under `limit` bytes (`None`: no budget).
    pub fn new(device: Device, config: MemoryConfig, limit: Option<u64>) -> Self {
        Self::on(S::build(device), device, config, limit)
    }

    /// [`Self::new`] for a timed replay: the device without its costly checks
    /// ([`ReplayShim::for_timing`]).
    fn timed(device: Device, config: MemoryConfig, limit: Option<u64>) -> Self {
        let shim = S::build(device);
        shim.for_timing();
        Self::on(shim, device, config, limit)
    }

    fn on(shim: S, device: Device, config: MemoryConfig, limit: Option<u64>) -> Self {
        let mut mm = MemoryManager::new(
            &shim.facts(),
            config,
            Issuer {
                device: 0,
                stream: 0,
            },
            MemoryBudget::new(limit),
        );
        let fences = device.fenced.then(|| Fences {
            policy: DropPolicy::default(),
            staged: Vec::new(),
            staged_bytes: 0,
            pending: Vec::new(),
        });
        if fences.is_none() {
            // SAFETY: no device work is ever enqueued on this shim: a page may go back as soon
            // as the manager lets it go.
            unsafe { mm.release_pages_immediately() };
        }
        Self { mm, fences, shim }
    }

    /// With `--fenced`, frees everything retired and waiting, as a device's flush and wait
    /// would.
    pub fn drain(&mut self) {
        if let Some(f) = &mut self.fences {
            f.drain(&mut self.mm, &self.shim);
        }
    }

    /// After an operation: with `--fenced`, moves what the manager retired along the fences.
    #[inline]
    pub fn settle(&mut self) {
        if let Some(f) = &mut self.fences {
            f.settle(&mut self.mm, &self.shim);
        }
    }
}

impl<S: ReplayShim> Drop for Bench<S> {
    fn drop(&mut self) {
        self.drain();
        // SAFETY: no work was ever enqueued on the shim: nothing is pending on any stream.
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
    fn sample(&mut self, at: u64, live: u64, held: u64, mm: &mut MemoryManager<impl ReplayShim>) {
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

/// Pages the manager holds, by its report (device pools).
fn pages_held(mm: &mut MemoryManager<impl ReplayShim>) -> u64 {
    mm.report()
        .pools
        .iter()
        .filter(|p| !p.is_host())
        .map(|p| u64::from(p.pages))
        .sum()
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
    /// Pages held when the held peak was first reached (the manager's report).
    pub pages_at_peak: u64,
    /// Device pages allocated during the replay (the device's `device_alloc` calls).
    pub pages_allocated: u64,
    /// Device pages freed during the replay, before the final teardown (`device_free` calls).
    pub pages_freed: u64,
    /// Held bytes summed over every operation (after each), over live bytes summed at the same
    /// points: how much is held for what is live over the run, not only at the peak (`None`
    /// when nothing was ever live).
    pub held_over_live_time: Option<f64>,
    /// Pages allocated and freed, map and unmap calls during the replay (before the final
    /// teardown): see [`Counters::map_calls`](crate::device::Counters::map_calls).
    pub map_calls: u64,
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
pub fn measure<S: ReplayShim>(
    trace: &Trace,
    device: Device,
    config: MemoryConfig,
    options: MeasureOptions,
    progress: &mut Progress,
) -> Result<Measured, String> {
    let mut bench = Bench::<S>::new(device, config, options.limit);
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
    let (mut live_sum, mut held_sum) = (0u128, 0u128);
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
        bench.settle();
        let held = bench.mm.budget().held();
        if held > held_peak {
            held_peak = held;
            pages_at_peak = pages_held(&mut bench.mm);
        }
        live_peak = live_peak.max(live);
        live_sum += u128::from(live);
        held_sum += u128::from(held);
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
    let counters = bench.shim.counters();
    let (pages_allocated, pages_freed) = (counters.allocated, counters.freed);
    let held_over_live_time = (live_sum > 0).then(|| held_sum as f64 / live_sum as f64);
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
        held_over_live_time,
        map_calls: counters.map_calls(),
        failed,
        first_failure,
        timeline,
        verified_ops: if options.verify { total } else { 0 },
    })
}

/// Nanoseconds per operation of the timed replays.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timing {
    /// Replays on a fresh manager each: page allocations included.
    pub cold_ns_per_op: f64,
    /// Replays over the manager of the last cold replay, whose pools are warm.
    pub warm_ns_per_op: f64,
    /// Replays timed, cold and warm.
    pub replays: (u32, u32),
    /// Reservations that failed per replay, cold and warm (the last replay of each).
    pub failed: (u64, u64),
    /// Pages the device allocated per replay, cold and warm (the last replay of each).
    pub page_allocs: (u64, u64),
    /// Device calls that map or unmap memory per replay, cold and warm (the last replay of
    /// each, which also collects what the replay before it dropped at its end: see
    /// [`Counters::map_calls`](crate::device::Counters::map_calls)).
    pub map_calls: (u64, u64),
}

/// Times replays of `trace` (see the module documentation): cold replays, each on a fresh
/// manager, until `min_seconds` of replay time are reached (at least one), then warm replays
/// over the last one's manager until `min_seconds` again. Only the replay loop is timed (not
/// building the manager, nor dropping what is live at the end).
pub fn time<S: ReplayShim>(
    trace: &Trace,
    device: Device,
    config: MemoryConfig,
    limit: Option<u64>,
    min_seconds: f64,
    progress: &mut Progress,
) -> Timing {
    let mut handles: Vec<Option<Handle>> = (0..trace.slots).map(|_| None).collect();
    let n = trace.ops.len().max(1) as f64;
    let total = trace.ops.len() as u64;
    let (mut cold, mut cold_reps) = (0.0, 0u32);
    let (mut cold_failed, mut cold_pages, mut cold_calls);
    // Progress: by operations within the first replay (a long trace), then by time spent (drawn
    // between replays, never inside the timed loop of a short one).
    let ms = |secs: f64| (secs * 1000.0) as u64;
    // Replays too short for the clock (building managers dominating) stop on the wall clock.
    let wall = Instant::now();
    let enough = |timed: f64, since: Instant| {
        timed >= min_seconds || since.elapsed().as_secs_f64() >= 3.0 * min_seconds
    };
    let mut bench = loop {
        let mut bench = Bench::<S>::timed(device, config, limit);
        let first = (cold_reps == 0).then_some(&mut *progress);
        let (t, failed) = replay_timed(trace, &mut bench, &mut handles, first, total);
        handles.iter_mut().for_each(|h| *h = None);
        (cold, cold_reps) = (cold + t, cold_reps + 1);
        let c = bench.shim.counters();
        (cold_failed, cold_pages, cold_calls) = (failed, c.allocated, c.map_calls());
        progress.update(ms(cold), ms(2.0 * min_seconds));
        if enough(cold, wall) {
            break bench;
        }
    };
    let (mut warm, mut warm_reps) = (0.0, 0u32);
    let (mut warm_failed, mut warm_pages, mut warm_calls) = (0, 0, 0);
    let wall = Instant::now();
    while warm_reps == 0 || !enough(warm, wall) {
        let before = bench.shim.counters();
        let first = (warm_reps == 0).then_some(&mut *progress);
        let (t, failed) = replay_timed(trace, &mut bench, &mut handles, first, total);
        handles.iter_mut().for_each(|h| *h = None);
        (warm, warm_reps) = (warm + t, warm_reps + 1);
        progress.update(ms(min_seconds + warm), ms(2.0 * min_seconds));
        let c = bench.shim.counters();
        (warm_failed, warm_pages, warm_calls) = (
            failed,
            c.allocated - before.allocated,
            c.map_calls() - before.map_calls(),
        );
    }
    drop(handles);
    Timing {
        cold_ns_per_op: cold * 1e9 / (n * f64::from(cold_reps)),
        warm_ns_per_op: warm * 1e9 / (n * f64::from(warm_reps)),
        replays: (cold_reps, warm_reps),
        failed: (cold_failed, warm_failed),
        page_allocs: (cold_pages, warm_pages),
        map_calls: (cold_calls, warm_calls),
    }
}

/// One replay; the seconds it took and the reservations that failed. Progress, if given, is
/// drawn between chunks of operations.
fn replay_timed<S: ReplayShim>(
    trace: &Trace,
    bench: &mut Bench<S>,
    handles: &mut [Option<Handle>],
    mut progress: Option<&mut Progress>,
    total: u64,
) -> (f64, u64) {
    let mut failed = 0u64;
    let mut done = 0;
    let start = Instant::now();
    for chunk in trace.ops.chunks(1 << 14) {
        for op in chunk {
            let slot = &mut handles[op.slot as usize];
            *slot = match op.action {
                Action::Alloc => match bench.mm.reserve(&bench.shim, op.size, PageUpdate::Allow) {
                    Ok(h) => Some(h),
                    Err(_) => {
                        failed += 1;
                        None
                    }
                },
                Action::Free => None,
            };
            bench.settle();
        }
        done += chunk.len() as u64;
        if let Some(p) = progress.as_deref_mut() {
            p.update(done, total);
        }
    }
    (start.elapsed().as_secs_f64(), failed)
}

/// Whether `trace` replays with `config` under a budget of `limit` bytes with no failed
/// reservation (stops at the first).
pub fn replays_within<S: ReplayShim>(
    trace: &Trace,
    device: Device,
    config: MemoryConfig,
    limit: u64,
    progress: &mut Progress,
) -> bool {
    let mut bench = Bench::<S>::new(device, config, Some(limit));
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
        bench.settle();
        if i % 4096 == 0 {
            progress.update(i as u64, total);
        }
    }
    true
}
