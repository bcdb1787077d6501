//! The command line: options, their parsing, and `--help`.
//!
//! Owns [`Options`] and [`parse`] (`--opt value` and `--opt=value`; every error names the option
//! and is a usage error, exit 2) and the help text, which lists the presets and the `--set` fields
//! from their tables in `presets.rs`.

use crate::device::{Device, Pages};
use crate::error::Failure;
use crate::input::ReadOptions;
use crate::presets::{FIELDS, Kind, Override, PRESETS, Preset, preset};
use crate::units::{parse_bytes, parse_count};

/// What to do.
#[derive(Debug)]
pub enum Command {
    /// Replay a trace.
    Run(Box<Options>),
    /// Print the help.
    Help,
    /// Print the version.
    Version,
}

/// The options of a replay.
#[derive(Debug, Clone)]
pub struct Options {
    /// The trace file.
    pub trace: String,
    /// The configurations, side by side (`default` when none is named).
    pub configs: Vec<&'static Preset>,
    /// Field overrides applied to every configuration.
    pub overrides: Vec<Override>,
    /// One JSON object on stdout instead of the human report.
    pub json: bool,
    /// Where to write the SVG timeline.
    pub svg: Option<String>,
    /// Check every operation against an independent model.
    pub verify: bool,
    /// Progress on stderr: forced on or off, or `None` (when stderr is a terminal).
    pub progress: Option<bool>,
    /// A budget for the measured and timed replays.
    pub budget: Option<u64>,
    /// Search the smallest budget.
    pub search: bool,
    /// Run the timed replays.
    pub timing: bool,
    /// The least replay time of each timed figure, in seconds.
    pub timing_seconds: f64,
    /// The search's precision (`None`: 1 MiB or 1 % of the live peak, the larger).
    pub precision: Option<u64>,
    /// How to read the trace.
    pub read: ReadOptions,
    /// The device facts.
    pub device: Device,
    /// Most timeline samples.
    pub samples: usize,
}

/// The help text.
pub fn help() -> String {
    let mut presets = String::new();
    for p in PRESETS {
        presets.push_str(&format!("      {:<18} {}\n", p.name, p.about));
    }
    let mut fields = String::new();
    for f in FIELDS {
        let kind = match f.kind {
            Kind::Bytes => "bytes",
            Kind::Count => "count",
            Kind::Flag => "true or false",
        };
        fields.push_str(&format!("      {:<18} {kind}\n", f.key));
    }
    format!(
        "\
devcmd-trace: replays an allocation trace through devcmd's memory manager and reports what it
holds for what is live, its pages, the time per operation and the smallest budget that suffices.

USAGE:
    devcmd-trace [OPTIONS] TRACE
    devcmd-trace TRACE --config default --config pages --svg timeline.svg --json

TRACE (the format is told by the file's first bytes, not its name):
    CSV      a header `seq,action,id,size,stream`, then one operation a line: action `alloc` or
             `free`, id a whole number (decimal or 0x hex), size in bytes (on a free: the
             allocation's size, 0 or empty); seq and stream optional; `#` lines skipped.
    CSV.GZ   the same, gzipped.
    SNAPSHOT a PyTorch memory snapshot (torch.cuda.memory._dump_snapshot, pickle protocol 2-5,
             gzipped or not): `alloc` entries become allocations, `free_completed` entries (else
             `free_requested`) frees; segment, snapshot and oom entries are ignored; a free of a
             block allocated before the recording began is skipped.
    Streams are replayed as one stream (a manager serves one); the report says how many there were.

CONFIGURATIONS:
    -c, --config NAME      a preset; repeat for several, reported side by side (default: default)
{presets}    -s, --set KEY=VALUE    a MemoryConfig field for every configuration (repeatable); sizes
                           take units (4096, 64KiB, 8MiB, 1GiB):
{fields}
OUTPUT:
        --json             stdout is one JSON object: trace, ops, live_peak, and per config
                           (`configs`) live_peak, held_peak, held_over_live, ns_per_op,
                           ns_per_op_warm, pages, pages_allocated, pages_freed,
                           failed_reservations, min_budget, ...; the first config's live_peak,
                           held_peak, held_over_live, ns_per_op and pages also at the top level
        --svg FILE         a timeline of live and held bytes per pool and in total; with several
                           configs one file each, the name inserted (t.svg -> t-default.svg)
        --samples N        points of the timeline (default 2000), evenly across the trace
        --progress         progress on stderr even when it is not a terminal
        --no-progress      no progress (default: progress when stderr is a terminal)

REPLAY:
        --verify           check after every operation, against an independent model, that no
                           two live allocations overlap and each lies in a page the manager
                           reports; at the end that nothing is held after dropping everything
                           and an explicit cleanup (also at the smallest budget found)
        --budget BYTES     replay under this MemoryBudget (default: none); the search is apart
        --no-search        skip the search of the smallest budget
        --no-timing        skip the timed replays (ns_per_op is then null)
        --timing-seconds S the least replay time of each timed figure (default 1): replays are
                           repeated until it is reached (at least one)
        --budget-precision BYTES
                           the search's precision (default: 1 MiB or 1 % of the live peak, the
                           larger)
        --lenient          skip frees of ids that are not live, and free an id allocated again
                           while live, instead of refusing the trace
        --device N         the device of a snapshot with traces of several devices
        --total-memory BYTES  the device's memory (default 140GiB, about an H200's: what the
                           manager fits its pages to, and the most a replay may hold)
        --alignment BYTES  page and slice alignment (default 256, as on CUDA)
        --max-page BYTES   the largest page (default: the device's memory, as on CUDA)
        --pages std|address
                           the device the manager runs on: address (default) hands out address
                           ranges with nothing behind them: no RAM, and only the manager in the
                           times; std is devcmd-std's CPU device, whose pages are zeroed heap
                           blocks: the same figures, but a replay needs RAM for the held peak
                           and a cold replay's time is mostly zeroing pages
        --fenced           memory the manager lets go waits for a fence, as on a device: a
                           fence is recorded when 64 items or 64 MiB wait (DropPolicy's
                           defaults) and passes at the next one; a placement may take a waiting
                           granule back first, with no device call (default: memory goes back
                           at once)

FIGURES:
    live peak    the most bytes live at once, as asked for
    held peak    the most bytes of device pages the manager held at once
    pages        pages held at the held peak (the manager's report); allocated / freed: device
                 pages over the whole replay (the device's device_alloc / device_free calls)
    ns per op    replay time / operations (an alloc or a free) of uninstrumented replays, each on
                 a fresh manager (cold: page allocations included), repeated for at least a
                 second, then over the last one's warm pools for another second (warm); build
                 with --release for meaningful times
    held / live over time
                 held bytes summed after every operation over live bytes summed at the same
                 points (JSON: held_over_live_time)
    map+unmap calls / op
                 device calls that put memory behind an address or take it away (pages
                 allocated and freed, map and unmap calls: one granule each, or several with
                 map_spans) per operation, in the measured replay and in the last warm one
                 (JSON: map_calls_per_op, _warm)
    min budget   the smallest MemoryBudget limit under which no reservation fails, by bisection
                 between the live peak and the held peak, to the precision shown

EXIT STATUS (the codes every devcmd program uses; 3, no device, and 4 do not occur here):
    0 done; 1 --verify found an inconsistency (results wrong); 2 bad usage or a malformed trace
    (the message names the line, or the snapshot entry, and the field)

    -h, --help     this text
    -V, --version  the version
"
    )
}

fn usage(message: String) -> Failure {
    Failure::Usage(message)
}

/// Parses the arguments (without the program's name).
pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Command, Failure> {
    let mut args = args.into_iter();
    let mut trace = None;
    let mut o = Options {
        trace: String::new(),
        configs: Vec::new(),
        overrides: Vec::new(),
        json: false,
        svg: None,
        verify: false,
        progress: None,
        budget: None,
        search: true,
        timing: true,
        timing_seconds: 1.0,
        precision: None,
        read: ReadOptions::default(),
        device: Device::default(),
        samples: 2000,
    };
    let mut positional_only = false;
    while let Some(arg) = args.next() {
        if positional_only || !arg.starts_with('-') || arg == "-" {
            if trace.replace(arg.clone()).is_some() {
                return Err(usage(format!(
                    "one trace at a time: {arg:?} is a second (run the tool once a trace)"
                )));
            }
            continue;
        }
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n.to_owned(), Some(v.to_owned())),
            _ => (arg.clone(), None),
        };
        let mut value = |what: &str| -> Result<String, Failure> {
            inline
                .clone()
                .or_else(|| args.next())
                .ok_or_else(|| usage(format!("{name} needs {what}")))
        };
        let bytes = |v: String| parse_bytes(&v).map_err(|e| usage(format!("{name}: {e}")));
        match name.as_str() {
            "-h" | "--help" => return Ok(Command::Help),
            "-V" | "--version" => return Ok(Command::Version),
            "--" => positional_only = true,
            "-c" | "--config" => {
                let p = preset(&value("a preset name")?).map_err(usage)?;
                if o.configs.iter().any(|q| q.name == p.name) {
                    return Err(usage(format!("--config {}: named twice", p.name)));
                }
                o.configs.push(p);
            }
            "-s" | "--set" => o
                .overrides
                .push(Override::parse(&value("KEY=VALUE")?).map_err(usage)?),
            "--json" => o.json = true,
            "--svg" => o.svg = Some(value("a file name")?),
            "--samples" => {
                let n =
                    parse_count(&value("a count")?).map_err(|e| usage(format!("{name}: {e}")))?;
                o.samples = usize::try_from(n).unwrap_or(usize::MAX).clamp(2, 100_000);
            }
            "--progress" => o.progress = Some(true),
            "--no-progress" => o.progress = Some(false),
            "--verify" => o.verify = true,
            "--budget" => o.budget = Some(bytes(value("a byte count")?)?),
            "--no-search" => o.search = false,
            "--no-timing" => o.timing = false,
            "--timing-seconds" => {
                let v = value("seconds")?;
                o.timing_seconds = v
                    .parse::<f64>()
                    .ok()
                    .filter(|s| s.is_finite() && *s >= 0.0)
                    .ok_or_else(|| usage(format!("{name}: {v:?} is not a number of seconds")))?;
            }
            "--budget-precision" => o.precision = Some(bytes(value("a byte count")?)?.max(1)),
            "--lenient" => o.read.lenient = true,
            "--device" => {
                let n = parse_count(&value("a device index")?)
                    .map_err(|e| usage(format!("{name}: {e}")))?;
                o.read.device = Some(usize::try_from(n).unwrap_or(usize::MAX));
            }
            "--total-memory" => o.device.total_memory = bytes(value("a byte count")?)?.max(1),
            "--alignment" => {
                let a = bytes(value("a byte count")?)?;
                if !a.is_power_of_two() {
                    return Err(usage(format!("{name}: {a} is not a power of two")));
                }
                o.device.alignment = a;
            }
            "--pages" => {
                o.device.pages = match value("std or address")?.as_str() {
                    "std" => Pages::Std,
                    "address" => Pages::Address,
                    other => {
                        return Err(usage(format!(
                            "--pages {other:?}: std (devcmd-std's CPU device) or address (address \
                             ranges only)"
                        )));
                    }
                }
            }
            "--max-page" => o.device.max_page = Some(bytes(value("a byte count")?)?.max(1)),
            "--fenced" => o.device.fenced = true,
            _ => return Err(usage(format!("unknown option {arg:?}"))),
        }
    }
    o.trace = trace.ok_or_else(|| usage("no trace given: devcmd-trace [OPTIONS] TRACE".into()))?;
    if o.configs.is_empty() {
        o.configs.push(&PRESETS[0]);
    }
    Ok(Command::Run(Box::new(o)))
}
