//! The results, for people (a table, configurations side by side) and for scripts (`--json`).
//!
//! Owns [`Outcome`] (what a run found) and how it prints: [`human`] and [`json()`]. Does not
//! compute anything: `lib.rs` runs the replays, the search and the plot.

use crate::device::Pages;
use crate::input::Trace;
use crate::presets::{Override, Preset};
use crate::replay::{Measured, Timing};
use crate::search::Search;
use crate::units::{bytes, ratio};
use serde_json::{Value, json};

/// What one configuration did.
#[derive(Debug, Clone)]
pub struct ConfigResult {
    /// The preset.
    pub preset: &'static Preset,
    /// The measured replay.
    pub measured: Measured,
    /// The timed replays, unless skipped.
    pub timing: Option<Timing>,
    /// The smallest budget, when searched.
    pub search: Option<Search>,
    /// Whether `--verify` passed (at the budget given and at the smallest budget found).
    pub verified: bool,
    /// The SVG written, if any.
    pub svg: Option<String>,
}

impl ConfigResult {
    /// Held peak / live peak.
    pub fn held_over_live(&self) -> Option<f64> {
        ratio(self.measured.held_peak, self.measured.live_peak)
    }

    /// Device calls that map or unmap memory per operation in the measured replay (a fresh
    /// manager: its first maps included).
    pub fn map_calls_per_op(&self, ops: usize) -> f64 {
        self.measured.map_calls as f64 / ops.max(1) as f64
    }

    /// The same in the last warm timed replay, when timed.
    pub fn map_calls_per_op_warm(&self, ops: usize) -> Option<f64> {
        self.timing
            .map(|t| t.map_calls.1 as f64 / ops.max(1) as f64)
    }

    /// The lines of figures the SVG prints under its legend.
    pub fn figures(measured: &Measured, ops: usize) -> Vec<String> {
        vec![
            format!(
                "held / live at the peak: {}",
                f2(ratio(measured.held_peak, measured.live_peak))
            ),
            format!(
                "held / live over time: {}",
                f2(measured.held_over_live_time)
            ),
            format!(
                "map + unmap calls / op: {:.3}",
                measured.map_calls as f64 / ops.max(1) as f64
            ),
        ]
    }
}

/// What a run found.
#[derive(Debug)]
pub struct Outcome {
    /// The trace (its operations included).
    pub trace: Trace,
    /// The overrides applied to every configuration.
    pub overrides: Vec<Override>,
    /// The budget of the measured and timed replays.
    pub budget: Option<u64>,
    /// The device the replays ran on.
    pub pages: Pages,
    /// One result per configuration, in the order asked.
    pub configs: Vec<ConfigResult>,
}

const TIMING: &str = "replay time / operations (an alloc or a free) of uninstrumented replays, \
                      each on a fresh manager (cold: page allocations included), repeated for at \
                      least --timing-seconds (default 1), then over the last one's warm pools for \
                      as long again (warm)";

fn build() -> &'static str {
    if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    }
}

fn f2(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.2}"))
}

/// The human report.
pub fn human(o: &Outcome) -> String {
    let t = &o.trace;
    let mut s = format!(
        "trace: {} ({}): {} ops ({} allocs, {} frees), {}\nlive peak: {} ({} B, as asked for)\n",
        t.path,
        t.format,
        t.ops.len(),
        t.allocs,
        t.frees,
        match t.streams {
            0 | 1 => "one stream".to_owned(),
            n => format!("{n} streams replayed as one"),
        },
        bytes(t.live_peak),
        t.live_peak
    );
    if !o.overrides.is_empty() {
        let list: Vec<String> = o.overrides.iter().map(ToString::to_string).collect();
        s += &format!("overrides (every config): {}\n", list.join(", "));
    }
    s += &format!(
        "device: {}\n",
        match o.pages {
            Pages::Std => "std (devcmd-std's CPU device: real, zeroed pages)",
            Pages::Address => "address (address ranges only: no memory behind the pages)",
        }
    );
    if let Some(b) = o.budget {
        s += &format!("budget of the replays: {}\n", bytes(b));
    }
    s.push('\n');
    let mut rows: Vec<(&str, Vec<String>)> = vec![(
        "",
        o.configs.iter().map(|c| c.preset.name.to_owned()).collect(),
    )];
    let row = |f: &dyn Fn(&ConfigResult) -> String| o.configs.iter().map(f).collect::<Vec<_>>();
    rows.push(("held peak", row(&|c| bytes(c.measured.held_peak))));
    rows.push(("held / live", row(&|c| f2(c.held_over_live()))));
    rows.push((
        "held / live over time",
        row(&|c| f2(c.measured.held_over_live_time)),
    ));
    let ops = t.ops.len();
    rows.push((
        "map+unmap calls / op",
        row(&|c| {
            let warm = c
                .map_calls_per_op_warm(ops)
                .map_or(String::new(), |w| format!(" ({w:.3} warm)"));
            format!("{:.3}{warm}", c.map_calls_per_op(ops))
        }),
    ));
    rows.push((
        "pages at held peak",
        row(&|c| c.measured.pages_at_peak.to_string()),
    ));
    rows.push((
        "pages allocated / freed",
        row(&|c| {
            format!(
                "{} / {}",
                c.measured.pages_allocated, c.measured.pages_freed
            )
        }),
    ));
    let ns = |f: fn(&Timing) -> (f64, u32, u64, u64)| {
        move |c: &ConfigResult| {
            c.timing.as_ref().map_or("not timed".into(), |t| {
                let (ns, reps, pages, failed) = f(t);
                let failed = if failed > 0 {
                    format!(", {failed} failed")
                } else {
                    String::new()
                };
                format!("{ns:.1} ({reps}x, {pages} page allocs{failed})")
            })
        }
    };
    rows.push((
        "ns per op (cold)",
        row(&ns(|t| {
            (t.cold_ns_per_op, t.replays.0, t.page_allocs.0, t.failed.0)
        })),
    ));
    rows.push((
        "ns per op (warm)",
        row(&ns(|t| {
            (t.warm_ns_per_op, t.replays.1, t.page_allocs.1, t.failed.1)
        })),
    ));
    rows.push((
        "failed reservations",
        row(&|c| c.measured.failed.to_string()),
    ));
    rows.push((
        "min budget",
        row(&|c| match &c.search {
            None => "not searched".into(),
            Some(Search {
                min_budget: Some(b),
                precision,
                probes,
                ..
            }) => {
                format!(
                    "{} (within {}, {probes} replays)",
                    bytes(*b),
                    bytes(*precision)
                )
            }
            Some(_) => "none".into(),
        }),
    ));
    if o.configs.iter().any(|c| c.verified) {
        rows.push((
            "verified",
            row(&|c| {
                if c.verified {
                    "yes".into()
                } else {
                    "no".into()
                }
            }),
        ));
    }
    if o.configs.iter().any(|c| c.svg.is_some()) {
        rows.push(("timeline", row(&|c| c.svg.clone().unwrap_or_default())));
    }
    let widths: Vec<usize> = (0..o.configs.len())
        .map(|i| {
            rows.iter()
                .map(|(_, v)| v[i].len())
                .max()
                .unwrap_or(0)
                .max(8)
        })
        .collect();
    for (label, values) in &rows {
        s += &format!("{label:<24}");
        for (v, w) in values.iter().zip(&widths) {
            s += &format!("  {v:>w$}");
        }
        s = s.trim_end().to_owned();
        s.push('\n');
    }
    s.push('\n');
    for c in &o.configs {
        if let Some(f) = &c.measured.first_failure {
            s += &format!("{}: first failed reservation: {f}\n", c.preset.name);
        }
        if let Some(Search {
            why_none: Some(w), ..
        }) = &c.search
        {
            s += &format!("{}: no budget found: {w}\n", c.preset.name);
        }
    }
    for n in &t.notes {
        s += &format!("note: {n}\n");
    }
    s += "held / live over time: held bytes summed after every operation over live bytes summed \
          at the same points. map+unmap calls: pages allocated and freed, map and unmap calls \
          (a granule each, or several with map_spans), in the measured replay (a fresh manager) \
          and in the last warm timed one.\n";
    s += &format!(
        "ns per op: {TIMING}; a {} build.\nmin budget: the smallest MemoryBudget limit under \
         which the replay has no failed reservation, by bisection between the live peak and the \
         held peak; the value shown replayed without failure (the bisection assumes a larger \
         budget never fails where a smaller one passed).\n",
        build()
    );
    s
}

fn config_json(c: &ConfigResult, o: &Outcome) -> Value {
    let m = &c.measured;
    let search = c.search.as_ref();
    let pools: Vec<Value> = m
        .timeline
        .pools
        .iter()
        .map(|p| {
            json!({
                "name": p.name,
                "held_max": p.held.iter().max().copied().unwrap_or(0),
                "used_max": p.used.iter().max().copied().unwrap_or(0),
            })
        })
        .collect();
    json!({
        "name": c.preset.name,
        "overrides": o.overrides.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "config": format!("{:?}", m.config),
        "budget": o.budget,
        "live_peak": m.live_peak,
        "held_peak": m.held_peak,
        "held_over_live": c.held_over_live(),
        "held_over_live_time": m.held_over_live_time,
        "map_calls": m.map_calls,
        "map_calls_per_op": c.map_calls_per_op(o.trace.ops.len()),
        "map_calls_per_op_warm": c.map_calls_per_op_warm(o.trace.ops.len()),
        "ns_per_op": c.timing.map(|t| t.cold_ns_per_op),
        "ns_per_op_warm": c.timing.map(|t| t.warm_ns_per_op),
        "timed_replays": c.timing.map(|t| [t.replays.0, t.replays.1]),
        "timed_page_allocs": c.timing.map(|t| [t.page_allocs.0, t.page_allocs.1]),
        "timed_failed_reservations": c.timing.map(|t| [t.failed.0, t.failed.1]),
        "pages": m.pages_at_peak,
        "pages_allocated": m.pages_allocated,
        "pages_freed": m.pages_freed,
        "failed_reservations": m.failed,
        "first_failure": m.first_failure,
        "min_budget": search.and_then(|s| s.min_budget),
        "min_budget_precision": search.map(|s| s.precision),
        "min_budget_fails_at": search.map(|s| s.fails_at),
        "min_budget_probes": search.map(|s| s.probes),
        "min_budget_note": search.and_then(|s| s.why_none.clone()),
        "verified": c.verified,
        "verified_ops": m.verified_ops,
        "pools": pools,
        "svg": c.svg,
    })
}

/// The `--json` object (one line).
pub fn json(o: &Outcome) -> String {
    let t = &o.trace;
    let configs: Vec<Value> = o.configs.iter().map(|c| config_json(c, o)).collect();
    let first = &configs[0];
    let v = json!({
        "trace": t.path,
        "format": t.format,
        "ops": t.ops.len(),
        "allocs": t.allocs,
        "frees": t.frees,
        "streams": t.streams,
        "trace_live_peak": t.live_peak,
        "live_peak": first["live_peak"],
        "held_peak": first["held_peak"],
        "held_over_live": first["held_over_live"],
        "held_over_live_time": first["held_over_live_time"],
        "map_calls_per_op": first["map_calls_per_op"],
        "ns_per_op": first["ns_per_op"],
        "pages": first["pages"],
        "timing": TIMING,
        "build": build(),
        "device": o.pages.name(),
        "notes": t.notes,
        "configs": configs,
    });
    v.to_string()
}
