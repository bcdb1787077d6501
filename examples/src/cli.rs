//! The edge host's command line: the flags, their defaults and limits, the help text that shows
//! them, and the refusal of every value or combination that makes no sense, before anything
//! touches a file or the device. Every refusal names the flag, the value given and what is
//! expected.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::path::PathBuf;

/// The most requests in one batch. Each batch's device buffers take about 6 KiB per request and
/// a few batches are in flight at once: 8192 requests keep them well inside the std device's
/// 2 GiB, the kernels' `u32` dimensions and the host's `usize` arithmetic.
pub const MAX_BATCH_SIZE: usize = 8192;

/// The device the host serves on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceKind {
    /// devcmd's std shim: a CPU device, runs anywhere.
    #[default]
    Std,
    /// The first NVIDIA GPU, through devcmd-cuda (needs the NVIDIA driver and NVRTC).
    Cuda,
}

impl DeviceKind {
    /// The name `--device` takes.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Std => "std",
            Self::Cuda => "cuda",
        }
    }
}

/// What the host was asked to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// The device to serve on.
    pub device: DeviceKind,
    /// Batches to serve (at least 1).
    pub batches: usize,
    /// Requests per batch (1 to [`MAX_BATCH_SIZE`]).
    pub batch_size: usize,
    /// Runs the shim's streams only when a fence is waited on or queried.
    pub lazy: bool,
    /// Records one batch's work into graphs once and replays them per batch.
    pub graph: bool,
    /// Memory-maps the weights from this file instead of seeding them.
    pub weights: Option<PathBuf>,
    /// Writes the seeded weights to this file before serving (never with `weights`).
    pub save_weights: Option<PathBuf>,
    /// Seeds the weights (unless mapped from a file) and the inputs.
    pub seed: u64,
    /// The devices to serve across (`--devices`).
    pub devices: Devices,
}

/// How many devices `--devices` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Devices {
    /// This many (1 to [`MAX_DEVICES`]).
    Count(usize),
    /// Every GPU the driver lists (`--device cuda` only).
    All,
}

/// The most devices `--devices` takes.
pub const MAX_DEVICES: usize = 64;

impl Default for Options {
    fn default() -> Self {
        Self {
            device: DeviceKind::Std,
            batches: 400,
            batch_size: 32,
            lazy: false,
            graph: false,
            weights: None,
            save_weights: None,
            seed: 7,
            devices: Devices::Count(1),
        }
    }
}

/// The outcome of a command line that parsed.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    /// Serve with these options.
    Run(Options),
    /// Print [`usage`] and exit successfully.
    Help,
}

/// A command line the host refuses.
#[derive(Debug, PartialEq, Eq)]
pub enum UsageError {
    /// A flag that takes a value came last, with none.
    MissingValue {
        flag: String,
        expected: &'static str,
    },
    /// A flag's value is not what the flag expects.
    BadValue {
        flag: String,
        value: String,
        expected: &'static str,
    },
    /// A flag that takes no value was given one (`--lazy=yes`).
    UnexpectedValue { flag: String, value: String },
    /// A flag the host does not know.
    UnknownFlag(String),
    /// An argument that is not a flag (the host takes flags only).
    UnexpectedArgument(String),
    /// The command line could not be read (the parser's own words).
    Unreadable(String),
    /// Two flags that cannot be used together.
    Conflict {
        first: &'static str,
        second: &'static str,
        why: &'static str,
    },
}

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::MissingValue { flag, expected } => {
                write!(f, "{flag} needs a value and got none: expected {expected}")
            }
            Self::BadValue {
                flag,
                value,
                expected,
            } => write!(f, "{flag} got {value:?}: expected {expected}"),
            Self::UnexpectedValue { flag, value } => {
                write!(
                    f,
                    "{flag} takes no value but got {value:?}: write {flag} alone"
                )
            }
            Self::UnknownFlag(flag) => write!(
                f,
                "unknown flag {flag}: expected one of --device, --batches, --batch-size, --lazy, \
                 --graph, --weights, --save-weights, --seed, --devices, --help"
            ),
            Self::UnexpectedArgument(arg) => write!(
                f,
                "unexpected argument {arg:?}: edge-host takes flags only (a file goes after \
                 --weights or --save-weights)"
            ),
            Self::Unreadable(what) => {
                write!(f, "cannot read the command line: {what}")
            }
            Self::Conflict { first, second, why } => {
                write!(f, "{first} and {second} cannot be used together: {why}")
            }
        }
    }
}

impl std::error::Error for UsageError {}

const BATCHES: &str = "a whole number of batches, at least 1";
/// Ends with [`MAX_BATCH_SIZE`] (a test checks it).
const BATCH_SIZE: &str = "a whole number of requests per batch, from 1 to 8192";
const SEED: &str = "a whole number from 0 to 18446744073709551615";
const FILE: &str = "a file path";
const DEVICE: &str = "std (the CPU device) or cuda (the first NVIDIA GPU)";
/// Ends with [`MAX_DEVICES`].
const DEVICES: &str = "a whole number of devices from 1 to 64, or all (every GPU)";

/// Parses the flags in `args` (without the program name).
pub fn parse<I>(args: I) -> Result<Parsed, UsageError>
where
    I: IntoIterator,
    I::Item: Into<OsString>,
{
    use lexopt::prelude::*;
    let mut o = Options::default();
    let mut p = lexopt::Parser::from_args(args);
    loop {
        let arg = match p.next() {
            Ok(Some(arg)) => arg,
            Ok(None) => break,
            Err(e) => return Err(from_lexopt(e)),
        };
        match arg {
            Long("device") => o.device = device(&mut p)?,
            Long("batches") => o.batches = number(&mut p, "--batches", BATCHES, 1, usize::MAX)?,
            Long("batch-size") => {
                o.batch_size = number(&mut p, "--batch-size", BATCH_SIZE, 1, MAX_BATCH_SIZE)?;
            }
            Long("lazy") => o.lazy = true,
            Long("graph") => o.graph = true,
            Long("weights") => o.weights = Some(path(&mut p, "--weights")?),
            Long("save-weights") => o.save_weights = Some(path(&mut p, "--save-weights")?),
            Long("seed") => o.seed = number(&mut p, "--seed", SEED, 0, u64::MAX)?,
            Long("devices") => o.devices = devices(&mut p)?,
            Long("help") | Short('h') => return Ok(Parsed::Help),
            Long(flag) => return Err(UsageError::UnknownFlag(format!("--{flag}"))),
            Short(flag) => return Err(UsageError::UnknownFlag(format!("-{flag}"))),
            Value(v) => return Err(UsageError::UnexpectedArgument(lossy(&v))),
        }
    }
    if o.weights.is_some() && o.save_weights.is_some() {
        return Err(UsageError::Conflict {
            first: "--save-weights",
            second: "--weights",
            why: "--save-weights writes the weights seeded from --seed, while --weights serves \
                  the weights of a file, so the saved file would not hold the weights served; \
                  pass one of them (to copy a weights file, copy the file)",
        });
    }
    if o.lazy && o.device == DeviceKind::Cuda {
        return Err(UsageError::Conflict {
            first: "--lazy",
            second: "--device cuda",
            why: "lazy streams are a mode of the std shim (its streams run only when a fence is \
                  waited on); a GPU runs its streams as work arrives; drop --lazy or use \
                  --device std",
        });
    }
    if o.devices != Devices::Count(1) && o.graph {
        return Err(UsageError::Conflict {
            first: "--graph",
            second: "--devices",
            why: "graphs are recorded and replayed on one device for now; drop --graph or serve \
                  on one device",
        });
    }
    if o.devices == Devices::All && o.device == DeviceKind::Std {
        return Err(UsageError::Conflict {
            first: "--devices all",
            second: "--device std",
            why: "`all` counts the GPUs the driver lists; the std shim makes as many CPU devices \
                  as asked: pass a number",
        });
    }
    Ok(Parsed::Run(o))
}

/// The devices `--devices` asks for: a number, or `all`.
fn devices(p: &mut lexopt::Parser) -> Result<Devices, UsageError> {
    let v = value(p, "--devices", DEVICES)?;
    match v.to_str() {
        Some("all") => Ok(Devices::All),
        Some(s) => s
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=MAX_DEVICES).contains(n))
            .map(Devices::Count)
            .ok_or_else(|| UsageError::BadValue {
                flag: "--devices".to_owned(),
                value: lossy(&v),
                expected: DEVICES,
            }),
        None => Err(UsageError::BadValue {
            flag: "--devices".to_owned(),
            value: lossy(&v),
            expected: DEVICES,
        }),
    }
}

/// The device `--device` names.
fn device(p: &mut lexopt::Parser) -> Result<DeviceKind, UsageError> {
    let v = value(p, "--device", DEVICE)?;
    match v.to_str() {
        Some("std") => Ok(DeviceKind::Std),
        Some("cuda") => Ok(DeviceKind::Cuda),
        _ => Err(UsageError::BadValue {
            flag: "--device".to_owned(),
            value: lossy(&v),
            expected: DEVICE,
        }),
    }
}

/// The value of `flag` (`--flag V` or `--flag=V`).
fn value(
    p: &mut lexopt::Parser,
    flag: &str,
    expected: &'static str,
) -> Result<OsString, UsageError> {
    p.value().map_err(|_| UsageError::MissingValue {
        flag: flag.to_owned(),
        expected,
    })
}

/// A whole number in `min..=max` for `flag`.
fn number<T>(
    p: &mut lexopt::Parser,
    flag: &str,
    expected: &'static str,
    min: T,
    max: T,
) -> Result<T, UsageError>
where
    T: std::str::FromStr + PartialOrd,
{
    let v = value(p, flag, expected)?;
    v.to_str()
        .and_then(|s| s.parse::<T>().ok())
        .filter(|n| (min..=max).contains(n))
        .ok_or_else(|| UsageError::BadValue {
            flag: flag.to_owned(),
            value: lossy(&v),
            expected,
        })
}

/// A non-empty path for `flag` (any bytes the OS allows).
fn path(p: &mut lexopt::Parser, flag: &str) -> Result<PathBuf, UsageError> {
    let v = value(p, flag, FILE)?;
    if v.is_empty() {
        return Err(UsageError::BadValue {
            flag: flag.to_owned(),
            value: String::new(),
            expected: FILE,
        });
    }
    Ok(PathBuf::from(v))
}

fn lossy(v: &OsStr) -> String {
    v.to_string_lossy().into_owned()
}

/// The errors `lexopt::Parser::next` returns, in the host's words.
fn from_lexopt(e: lexopt::Error) -> UsageError {
    match e {
        lexopt::Error::UnexpectedValue { option, value } => UsageError::UnexpectedValue {
            flag: option,
            value: lossy(&value),
        },
        lexopt::Error::UnexpectedOption(flag) => UsageError::UnknownFlag(flag),
        lexopt::Error::UnexpectedArgument(v) => UsageError::UnexpectedArgument(lossy(&v)),
        // `next` returns no other error; should a later lexopt do so, say what it said.
        other => UsageError::Unreadable(other.to_string()),
    }
}

/// The help text: every flag with what it expects and its default, wrapped to 100 columns.
/// `weights_bytes` is the size of a weights file.
pub fn usage(weights_bytes: usize) -> String {
    let d = Options::default();
    let flags = [
        (
            "--device NAME",
            format!("the device to serve on: {DEVICE}"),
            d.device.name().to_owned(),
        ),
        (
            "--batches N",
            "batches to serve, at least 1".to_owned(),
            d.batches.to_string(),
        ),
        (
            "--batch-size B",
            format!("requests per batch, 1 to {MAX_BATCH_SIZE}"),
            d.batch_size.to_string(),
        ),
        (
            "--lazy",
            "run the shim's streams only when a fence is waited on or queried".to_owned(),
            (if d.lazy { "on" } else { "off" }).to_owned(),
        ),
        (
            "--graph",
            "record one batch's work into graphs once (a few, one per batch in flight) and \
             replay them per batch, each input written into its graph's input buffer"
                .to_owned(),
            (if d.graph { "on" } else { "off" }).to_owned(),
        ),
        (
            "--weights FILE",
            format!(
                "memory-map the weights from FILE instead of seeding them: {weights_bytes} \
                 bytes of raw little-endian f32, W1 b1 W2 b2 W3 b3, as --save-weights writes them"
            ),
            "none, the weights are seeded from --seed".to_owned(),
        ),
        (
            "--save-weights FILE",
            "write the seeded weights to FILE (created or replaced) before serving; not with \
             --weights"
                .to_owned(),
            "none, nothing is written".to_owned(),
        ),
        (
            "--seed S",
            "seed of the weights and of the inputs".to_owned(),
            d.seed.to_string(),
        ),
        (
            "--devices N",
            "serve across N devices (1 to 64), or all (every GPU, with --device cuda): the \
             weights are uploaded to the first and copied device to device to the others, \
             batches are dealt round-robin; on std, N std shims; on cuda, GPUs 0 to N-1 (with \
             fewer GPUs, devices share them in turn); not with --graph"
                .to_owned(),
            "1".to_owned(),
        ),
        (
            "-h, --help",
            "print this help and exit".to_owned(),
            String::new(),
        ),
    ];
    let mut out = String::from(
        "edge-host: serves batches of requests through a 3-layer MLP on a devcmd device (the std\n\
         shim, or an NVIDIA GPU) and checks every result against a reference computed on the host.\n\n\
         usage: edge-host [--device std|cuda] [--batches N] [--batch-size B] [--lazy] [--graph]\n\
         \x20                [--weights FILE | --save-weights FILE] [--seed S] [--devices N|all]\n\n",
    );
    const INDENT: usize = 23;
    for (flag, about, default) in flags {
        // The default is one unit: never split across lines.
        let default = (!default.is_empty()).then(|| format!("[default: {default}]"));
        let mut line = format!("  {flag:<w$}", w = INDENT - 2);
        for word in about.split(' ').map(str::to_owned).chain(default) {
            if line.len() > INDENT && line.len() + 1 + word.len() > 100 {
                out.push_str(line.trim_end());
                out.push('\n');
                line = " ".repeat(INDENT);
            } else if line.len() > INDENT {
                line.push(' ');
            }
            line.push_str(&word);
        }
        out.push_str(&line);
        out.push('\n');
    }
    out.push('\n');
    out.push_str(crate::exit::HELP);
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(args: &[&str]) -> Result<Parsed, UsageError> {
        parse(args.iter().copied())
    }

    fn refusal(args: &[&str]) -> String {
        match parse_str(args) {
            Err(e) => e.to_string(),
            Ok(p) => panic!("{args:?} was accepted as {p:?}"),
        }
    }

    #[test]
    fn no_flags_give_the_defaults() {
        assert_eq!(parse_str(&[]), Ok(Parsed::Run(Options::default())));
    }

    #[test]
    fn every_flag_is_read_in_both_spellings() {
        let want = Options {
            device: DeviceKind::Std,
            batches: 3,
            batch_size: MAX_BATCH_SIZE,
            lazy: true,
            graph: true,
            weights: Some("w.bin".into()),
            save_weights: None,
            seed: u64::MAX,
            devices: Devices::Count(1),
        };
        let split = [
            "--batches",
            "3",
            "--batch-size",
            "8192",
            "--lazy",
            "--graph",
            "--weights",
            "w.bin",
            "--seed",
            "18446744073709551615",
        ];
        assert_eq!(parse_str(&split), Ok(Parsed::Run(want.clone())));
        let joined = [
            "--batches=3",
            "--batch-size=8192",
            "--lazy",
            "--graph",
            "--weights=w.bin",
            "--seed=18446744073709551615",
        ];
        assert_eq!(parse_str(&joined), Ok(Parsed::Run(want)));
        let save = parse_str(&["--save-weights", "out.bin"]);
        assert!(matches!(save, Ok(Parsed::Run(o)) if o.save_weights == Some("out.bin".into())));
        assert_eq!(parse_str(&["-h"]), Ok(Parsed::Help));
        assert_eq!(
            parse_str(&["--batches", "0", "--help"]),
            Err(bad("--batches", "0", BATCHES))
        );
        assert_eq!(parse_str(&["--help", "--batches", "0"]), Ok(Parsed::Help));
    }

    fn bad(flag: &str, value: &str, expected: &'static str) -> UsageError {
        UsageError::BadValue {
            flag: flag.into(),
            value: value.into(),
            expected,
        }
    }

    #[test]
    fn zero_batches_and_empty_batches_are_refused_up_front() {
        let e = refusal(&["--batch-size", "0"]);
        assert_eq!(
            e,
            "--batch-size got \"0\": expected a whole number of requests per batch, from 1 to 8192"
        );
        assert!(BATCH_SIZE.ends_with(&format!(" {MAX_BATCH_SIZE}")));
        assert_eq!(
            parse_str(&["--batch-size=8193"]),
            Err(bad("--batch-size", "8193", BATCH_SIZE))
        );
        assert_eq!(
            refusal(&["--batches", "0"]),
            "--batches got \"0\": expected a whole number of batches, at least 1"
        );
    }

    #[test]
    fn a_value_that_does_not_parse_names_the_flag_the_value_and_what_is_expected() {
        for (args, flag, value, expected) in [
            (&["--batches", "many"][..], "--batches", "many", BATCHES),
            (&["--batches", "-5"], "--batches", "-5", BATCHES),
            (&["--batches", "1.5"], "--batches", "1.5", BATCHES),
            (&["--batch-size", ""], "--batch-size", "", BATCH_SIZE),
            (
                &["--batch-size", "99999999999999999999999"],
                "--batch-size",
                "99999999999999999999999",
                BATCH_SIZE,
            ),
            (&["--seed", "-1"], "--seed", "-1", SEED),
            (&["--seed", "0x10"], "--seed", "0x10", SEED),
            (&["--weights", ""], "--weights", "", FILE),
            (&["--save-weights="], "--save-weights", "", FILE),
        ] {
            assert_eq!(parse_str(args), Err(bad(flag, value, expected)), "{args:?}");
        }
        let e = refusal(&["--seed", "x"]);
        assert!(
            e.starts_with("--seed got \"x\": expected a whole number"),
            "{e}"
        );
    }

    #[test]
    fn missing_values_unknown_flags_and_stray_arguments_are_named() {
        assert_eq!(
            refusal(&["--batches"]),
            "--batches needs a value and got none: expected a whole number of batches, at least 1"
        );
        assert_eq!(
            parse_str(&["--weights"]),
            Err(UsageError::MissingValue {
                flag: "--weights".into(),
                expected: FILE
            })
        );
        assert_eq!(
            refusal(&["--lazy=yes"]),
            "--lazy takes no value but got \"yes\": write --lazy alone"
        );
        assert!(refusal(&["--batch"]).starts_with("unknown flag --batch: expected one of "));
        assert_eq!(
            parse_str(&["-x"]),
            Err(UsageError::UnknownFlag("-x".into()))
        );
        assert!(refusal(&["weights.bin"]).starts_with("unexpected argument \"weights.bin\""));
    }

    #[test]
    fn the_device_is_std_or_cuda_and_nothing_else() {
        let cuda = parse_str(&["--device", "cuda"]);
        assert!(matches!(cuda, Ok(Parsed::Run(o)) if o.device == DeviceKind::Cuda));
        let std = parse_str(&["--device=std"]);
        assert!(matches!(std, Ok(Parsed::Run(o)) if o.device == DeviceKind::Std));
        for name in ["tpu", "CUDA", "gpu", ""] {
            assert_eq!(
                parse_str(&["--device", name]),
                Err(bad("--device", name, DEVICE)),
                "{name}"
            );
        }
        assert_eq!(
            refusal(&["--device", "tpu"]),
            "--device got \"tpu\": expected std (the CPU device) or cuda (the first NVIDIA GPU)"
        );
        assert!(refusal(&["--device"]).starts_with("--device needs a value"));
        let e = refusal(&["--lazy", "--device", "cuda"]);
        assert!(
            e.starts_with("--lazy and --device cuda cannot be used together: "),
            "{e}"
        );
        assert!(matches!(
            parse_str(&["--lazy", "--device", "std"]),
            Ok(Parsed::Run(o)) if o.lazy
        ));
    }

    #[test]
    fn devices_are_a_count_or_all_and_not_with_graphs() {
        assert!(matches!(
            parse_str(&["--devices", "3"]),
            Ok(Parsed::Run(o)) if o.devices == Devices::Count(3)
        ));
        assert!(matches!(
            parse_str(&["--devices=all", "--device", "cuda"]),
            Ok(Parsed::Run(o)) if o.devices == Devices::All
        ));
        for v in ["0", "65", "two", ""] {
            assert_eq!(
                parse_str(&["--devices", v]),
                Err(bad("--devices", v, DEVICES)),
                "{v:?}"
            );
        }
        let e = refusal(&["--devices", "all"]);
        assert!(
            e.starts_with("--devices all and --device std cannot be used together: "),
            "{e}"
        );
        let e = refusal(&["--devices", "2", "--graph"]);
        assert!(
            e.starts_with("--graph and --devices cannot be used together: "),
            "{e}"
        );
        assert!(matches!(
            parse_str(&["--devices", "1", "--graph"]),
            Ok(Parsed::Run(o)) if o.graph
        ));
    }

    #[test]
    fn saving_while_loading_weights_is_refused() {
        let e = refusal(&["--weights", "a.bin", "--save-weights", "b.bin"]);
        assert!(
            e.starts_with("--save-weights and --weights cannot be used together: "),
            "{e}"
        );
        assert_eq!(
            refusal(&["--save-weights=b.bin", "--weights=a.bin"]),
            e,
            "in either order"
        );
    }

    #[test]
    fn help_shows_every_flag_with_its_default() {
        let text = usage(1234);
        let d = Options::default();
        for (flag, default) in [
            ("--device NAME", "std".to_owned()),
            ("--batches N", d.batches.to_string()),
            ("--batch-size B", d.batch_size.to_string()),
            ("--lazy", "off".to_owned()),
            ("--graph", "off".to_owned()),
            (
                "--weights FILE",
                "none, the weights are seeded from --seed".to_owned(),
            ),
            ("--save-weights FILE", "none, nothing is written".to_owned()),
            ("--seed S", d.seed.to_string()),
        ] {
            // The flag's entry: its line and the indented lines that continue it.
            let entry: Vec<&str> = text
                .lines()
                .skip_while(|l| !l.trim_start().starts_with(flag))
                .enumerate()
                .take_while(|(i, l)| *i == 0 || l.starts_with(&" ".repeat(23)))
                .map(|(_, l)| l.trim())
                .collect();
            assert!(!entry.is_empty(), "no entry for {flag} in:\n{text}");
            assert!(
                entry.join(" ").ends_with(&format!("[default: {default}]")),
                "{flag}: {entry:?}"
            );
        }
        assert!(text.contains("1234 bytes"), "the weights file size: {text}");
        assert!(text.contains("-h, --help"));
        assert!(text.lines().all(|l| l.len() <= 100), "{text}");
    }
}
