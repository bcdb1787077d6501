//! `devcmd-trace`: replays an allocation trace through devcmd's memory manager.
//!
//! A user runs it on their own model's trace (a CSV `seq,action,id,size,stream`, gzipped or not,
//! or a PyTorch memory snapshot) with one or more configurations of the manager side by side,
//! and reads held/live, pages, the time per operation, the smallest budget under which the trace
//! replays, and an SVG timeline per pool. `devcmd-trace --help` documents the options.
//!
//! This file owns the run: for each configuration, a measured replay (with `--verify`'s checks),
//! the timed replays, the budget search, the check at the budget found, and the plot; then the
//! [`Outcome`] the report prints. The parts, one a file:
//! - `cli.rs`: options, parsing, `--help`;
//! - `input/`: reading traces (`csv.rs`, `snapshot.rs`, `pickle/`: a pickle reader with no
//!   recursion and memory bounded by the input) into operations on dense slots;
//! - `presets.rs`: the presets and `--set`'s fields, one table each;
//! - `device.rs`: the device facts and the two devices (devcmd-std's, or address ranges only);
//! - `replay.rs`: the manager and the replays;
//! - `verify.rs`: the independent model `--verify` checks against;
//! - `search.rs`: the smallest budget;
//! - `svg.rs`: the timeline plot; `report.rs`: the human report and `--json`;
//! - `progress.rs`: progress on stderr; `units.rs`: byte counts; `error.rs`: failures and exit
//!   codes.

pub mod cli;
pub mod device;
pub mod error;
pub mod input;
pub mod presets;
pub mod progress;
pub mod replay;
pub mod report;
pub mod search;
pub mod svg;
pub mod units;
pub mod verify;

use cli::Options;
use devcmd_std::StdShim;
use device::{AddressShim, Pages, ReplayShim};
use error::Failure;
use input::Trace;
use presets::Preset;
use progress::Progress;
use replay::{MeasureOptions, measure, time};
use report::{ConfigResult, Outcome};

/// Where the SVG of configuration `name` goes: `file` itself when there is one configuration,
/// else `file` with `-name` inserted before its extension.
pub fn svg_path(file: &str, name: &str, several: bool) -> String {
    if !several {
        return file.to_owned();
    }
    let safe: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let path = std::path::Path::new(file);
    match (path.file_stem(), path.extension()) {
        (Some(stem), Some(ext)) => path
            .with_file_name(format!(
                "{}-{safe}.{}",
                stem.to_string_lossy(),
                ext.to_string_lossy()
            ))
            .to_string_lossy()
            .into_owned(),
        _ => format!("{file}-{safe}"),
    }
}

/// Reads the trace and runs every configuration (see the module documentation).
pub fn run(o: &Options) -> Result<Outcome, Failure> {
    let mut progress = Progress::new(o.progress);
    let trace = input::read(&o.trace, o.read, &mut progress)?;
    let mut configs = Vec::new();
    for preset in &o.configs {
        configs.push(match o.device.pages {
            Pages::Std => run_config::<StdShim>(&trace, o, preset, &mut progress)?,
            Pages::Address => run_config::<AddressShim>(&trace, o, preset, &mut progress)?,
        });
    }
    progress.finish();
    Ok(Outcome {
        trace,
        overrides: o.overrides.clone(),
        budget: o.budget,
        pages: o.device.pages,
        configs,
    })
}

/// Everything one configuration does, on a device of type `S`.
fn run_config<S: ReplayShim>(
    trace: &Trace,
    o: &Options,
    preset: &'static Preset,
    progress: &mut Progress,
) -> Result<ConfigResult, Failure> {
    let mut config = (preset.config)();
    for ov in &o.overrides {
        ov.apply(&mut config);
    }
    let name = preset.name;
    progress.phase(format!(
        "{name}: replay{}",
        if o.verify { " (verify)" } else { "" }
    ));
    let options = MeasureOptions {
        limit: o.budget,
        samples: o.samples,
        verify: o.verify,
    };
    let measured = measure::<S>(trace, o.device, config, options, progress)
        .map_err(|e| Failure::Verify(format!("{name}: {e}")))?;
    let timing = o.timing.then(|| {
        progress.phase(format!("{name}: timed replays"));
        time::<S>(
            trace,
            o.device,
            config,
            o.budget,
            o.timing_seconds,
            progress,
        )
    });
    let search = o.search.then(|| {
        if measured.failed > 0 && o.budget.is_none() {
            return search::Search {
                min_budget: None,
                fails_at: 0,
                precision: 0,
                probes: 0,
                why_none: Some("reservations fail even without a budget".into()),
            };
        }
        let precision = o
            .precision
            .unwrap_or_else(|| search::default_precision(trace.live_peak));
        search::min_budget::<S>(
            trace,
            o.device,
            config,
            measured.held_peak,
            precision,
            progress,
            name,
        )
    });
    if o.verify
        && let Some(limit) = search.as_ref().and_then(|s| s.min_budget)
    {
        progress.phase(format!("{name}: replay at the smallest budget (verify)"));
        let at_min = MeasureOptions {
            limit: Some(limit),
            samples: 2,
            verify: true,
        };
        let m = measure::<S>(trace, o.device, config, at_min, progress).map_err(|e| {
            Failure::Verify(format!("{name}, at the smallest budget ({limit} B): {e}"))
        })?;
        if m.failed > 0 {
            return Err(Failure::Verify(format!(
                "{name}: the smallest budget found ({limit} B) fails on replay: {}",
                m.first_failure.unwrap_or_default()
            )));
        }
    }
    let svg = match &o.svg {
        Some(file) => {
            let path = svg_path(file, name, o.configs.len() > 1);
            let title = format!("{}: {name}", trace.path);
            let figures = ConfigResult::figures(&measured, trace.ops.len());
            let plot = svg::Plot {
                title: &title,
                ops: trace.ops.len() as u64,
                min_budget: search.as_ref().and_then(|s| s.min_budget),
                figures: &figures,
            };
            std::fs::write(&path, svg::render(&measured.timeline, &plot))
                .map_err(|e| Failure::Input(format!("{path}: cannot write the SVG: {e}")))?;
            Some(path)
        }
        None => None,
    };
    Ok(ConfigResult {
        preset,
        measured,
        timing,
        search,
        verified: o.verify,
        svg,
    })
}
