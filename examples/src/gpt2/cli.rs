//! The decoding host's command line: its flags, defaults and refusals (each naming the flag, the
//! value given and what is expected), before any file or device is touched.

use super::decode::KvCache;
use super::weights::DType;
use crate::cli::DeviceKind;
use std::ffi::OsString;
use std::path::PathBuf;

/// The most batch rows.
pub const MAX_BATCH: usize = 8;
/// The most new tokens a run may ask for (the model's `n_positions` bounds it further).
pub const MAX_NEW_TOKENS: usize = 1 << 20;

/// What the host was asked to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// The device.
    pub device: DeviceKind,
    /// The model directory (`config.json`, `model.safetensors`); with `--check` alone, the
    /// fixture's.
    pub model: Option<PathBuf>,
    /// A fixture to compare with: prompt, new tokens, references.
    pub check: Option<PathBuf>,
    /// The prompt on the command line: rows separated by `;`, ids by spaces or commas.
    pub prompt: Option<String>,
    /// The prompt in a file: one row per line.
    pub prompt_file: Option<PathBuf>,
    /// Batch rows (a one-row prompt is repeated); `None`: the prompt's rows.
    pub batch: Option<usize>,
    /// New tokens per row.
    pub new_tokens: Option<usize>,
    /// The element type on the device.
    pub dtype: DType,
    /// Record one step into a graph and replay it per step.
    pub graph: bool,
    /// With `graph`: record the step again before every replay and update the graph in place
    /// (`end_capture_update`), to measure what a host that cannot keep the position on the
    /// device pays per token.
    pub graph_update: bool,
    /// The std shim's lazy streams.
    pub lazy: bool,
    /// How the KV cache gets its room.
    pub kv: KvCache,
    /// Writes the run's summary (times, memory, check) as JSON to this file.
    pub json: Option<PathBuf>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            device: DeviceKind::Std,
            model: None,
            check: None,
            prompt: None,
            prompt_file: None,
            batch: None,
            new_tokens: None,
            dtype: DType::F32,
            graph: false,
            graph_update: false,
            lazy: false,
            kv: KvCache::Ahead,
            json: None,
        }
    }
}

/// The new tokens of a run that names none (and is no check).
pub const DEFAULT_NEW_TOKENS: usize = 16;

/// The outcome of a command line that parsed.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    /// Decode with these options.
    Run(Options),
    /// Print [`usage`] and exit successfully.
    Help,
}

fn bad(flag: &str, value: &str, expected: &str) -> String {
    format!("{flag} got {value:?}: expected {expected}")
}

/// Parses the flags in `args` (without the program name).
///
/// # Errors
///
/// The refusal, in words naming the flag.
pub fn parse<I>(args: I) -> Result<Parsed, String>
where
    I: IntoIterator,
    I::Item: Into<OsString>,
{
    use lexopt::prelude::*;
    let mut o = Options::default();
    let mut p = lexopt::Parser::from_args(args);
    let value = |p: &mut lexopt::Parser, flag: &str, expected: &str| -> Result<String, String> {
        let v = p
            .value()
            .map_err(|_| format!("{flag} needs a value and got none: expected {expected}"))?;
        let s = v.to_string_lossy().into_owned();
        if s.is_empty() {
            return Err(bad(flag, &s, expected));
        }
        Ok(s)
    };
    let number = |p: &mut lexopt::Parser, flag: &str, max: usize| -> Result<usize, String> {
        let expected = format!("a whole number from 1 to {max}");
        let s = value(p, flag, &expected)?;
        s.parse::<usize>()
            .ok()
            .filter(|n| (1..=max).contains(n))
            .ok_or_else(|| bad(flag, &s, &expected))
    };
    loop {
        let arg = match p.next() {
            Ok(Some(arg)) => arg,
            Ok(None) => break,
            Err(e) => return Err(e.to_string()),
        };
        match arg {
            Long("device") => {
                const DEVICE: &str = "std (the CPU device) or cuda (the first NVIDIA GPU)";
                o.device = match value(&mut p, "--device", DEVICE)?.as_str() {
                    "std" => DeviceKind::Std,
                    "cuda" => DeviceKind::Cuda,
                    other => return Err(bad("--device", other, DEVICE)),
                };
            }
            Long("model") => o.model = Some(value(&mut p, "--model", "a directory")?.into()),
            Long("check") => o.check = Some(value(&mut p, "--check", "a directory")?.into()),
            Long("prompt") => {
                o.prompt = Some(value(&mut p, "--prompt", "token ids, rows separated by ;")?);
            }
            Long("prompt-file") => {
                o.prompt_file = Some(value(&mut p, "--prompt-file", "a file path")?.into());
            }
            Long("batch") => o.batch = Some(number(&mut p, "--batch", MAX_BATCH)?),
            Long("new-tokens") => {
                o.new_tokens = Some(number(&mut p, "--new-tokens", MAX_NEW_TOKENS)?);
            }
            Long("dtype") => {
                const DTYPE: &str = "f32, or f16 (on --device cuda)";
                o.dtype = match value(&mut p, "--dtype", DTYPE)?.as_str() {
                    "f32" => DType::F32,
                    "f16" => DType::F16,
                    other => return Err(bad("--dtype", other, DTYPE)),
                };
            }
            Long("kv") => {
                const KV: &str = "ahead (every position reserved before the first step) or grow \
                                  (doubled as the sequence grows)";
                o.kv = match value(&mut p, "--kv", KV)?.as_str() {
                    "ahead" => KvCache::Ahead,
                    "grow" => KvCache::Grow,
                    other => return Err(bad("--kv", other, KV)),
                };
            }
            Long("json") => o.json = Some(value(&mut p, "--json", "a file path")?.into()),
            Long("graph") => o.graph = true,
            Long("graph-update") => {
                o.graph = true;
                o.graph_update = true;
            }
            Long("lazy") => o.lazy = true,
            Long("help") | Short('h') => return Ok(Parsed::Help),
            Long(flag) => {
                return Err(format!(
                    "unknown flag --{flag}: expected one of --model, --check, --device, \
                     --prompt, --prompt-file, --batch, --new-tokens, --dtype, --kv, --graph, \
                     --graph-update, --lazy, --json, --help"
                ));
            }
            Short(flag) => return Err(format!("unknown flag -{flag}")),
            Value(v) => {
                return Err(format!(
                    "unexpected argument {:?}: the host takes flags only (the model goes after \
                     --model)",
                    v.to_string_lossy()
                ));
            }
        }
    }
    let conflict =
        |a: &str, b: &str, why: &str| Err(format!("{a} and {b} cannot be used together: {why}"));
    if o.model.is_none() && o.check.is_none() {
        return Err(
            "no model: pass --model DIR (a directory with config.json and \
                    model.safetensors) or --check DIR (a fixture)"
                .to_owned(),
        );
    }
    if o.prompt.is_some() && o.prompt_file.is_some() {
        return conflict("--prompt", "--prompt-file", "pass the prompt once");
    }
    if o.check.is_some() && (o.prompt.is_some() || o.prompt_file.is_some()) {
        return conflict(
            "--check",
            "--prompt",
            "a check decodes the fixture's own prompt (prompt.txt)",
        );
    }
    if o.check.is_some() && (o.batch.is_some() || o.new_tokens.is_some()) {
        return conflict(
            "--check",
            "--batch or --new-tokens",
            "a check decodes the fixture's batch and new tokens",
        );
    }
    if o.dtype == DType::F16 && o.device == DeviceKind::Std {
        return conflict(
            "--dtype f16",
            "--device std",
            "the std device computes in f32; use --device cuda for f16",
        );
    }
    if o.lazy && o.device == DeviceKind::Cuda {
        return conflict(
            "--lazy",
            "--device cuda",
            "lazy streams are a mode of the std shim",
        );
    }
    Ok(Parsed::Run(o))
}

/// The help text.
pub fn usage() -> String {
    format!(
        "gpt2: greedy decoding of a GPT-2 (Hugging Face layout) through devcmd, on the std shim
or an NVIDIA GPU

usage: gpt2 --model DIR [--prompt IDS | --prompt-file FILE] [--batch B] [--new-tokens N]
            [--device std|cuda] [--dtype f32|f16] [--kv ahead|grow]
            [--graph | --graph-update] [--lazy] [--json FILE]
       gpt2 --check FIXTURE [--model DIR] [--device std|cuda] [--dtype f32|f16] [--kv ahead|grow]
            [--graph | --graph-update] [--lazy] [--json FILE]

  --model DIR          config.json (GPT2Config) and model.safetensors (memory-mapped; on a GPU
                       page-locked in place and copied by DMA)
  --check DIR          decode a fixture of scripts/gpt2/make_fixture.py (its prompt and length)
                       and compare with transformers: greedy tokens identical, logits within 1e-3
                       (f32; f16: 3x PyTorch's own f16 error, and a row may take the other token
                       of a near tie within it); exit 1 naming the step, row and position of the
                       first mismatch
  --prompt IDS         token ids, rows separated by ';' (\"464 3290 318; 40 588\")
                       [default: the token 0]
  --prompt-file FILE   one row of token ids per line
  --batch B            rows, 1 to {MAX_BATCH}; a one-row prompt is repeated
                       [default: the prompt's rows]
  --new-tokens N       new tokens per row [default: {DEFAULT_NEW_TOKENS}]
  --device NAME        std (the CPU device) or cuda (the first NVIDIA GPU) [default: std]
  --dtype T            f32, or f16 on cuda (f32 weights are converted on the device)
                       [default: f32]
  --kv HOW             the KV cache: ahead (every position of the run reserved before the first
                       step) or grow (from the prompt, doubled when full: a device copy, and
                       with --graph the step recorded again in place) [default: ahead]
  --graph              record one decoding step into a graph once and replay it per token (the
                       position lives in device memory) [default: off]
  --graph-update       as --graph, but the step is recorded again before every replay after the
                       first and the graph updated in place (end_capture_update): close to
                       what a host that passes the position as a kernel argument would pay
                       per token (to measure)
  --lazy               the std shim's lazy streams [default: off]
  --json FILE          also write the run's summary (times, memory, check) as one JSON object
  -h, --help           print this help

{}",
        crate::exit::HELP
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> Result<Options, String> {
        match parse(args.iter().copied())? {
            Parsed::Run(o) => Ok(o),
            Parsed::Help => Err("help".into()),
        }
    }

    #[test]
    fn flags_read_and_conflicts_are_refused() {
        let o = run(&[
            "--model",
            "m",
            "--prompt",
            "1 2;3 4",
            "--new-tokens=5",
            "--graph",
            "--batch",
            "2",
        ])
        .expect("parses");
        assert_eq!(o.model, Some("m".into()));
        assert_eq!((o.new_tokens, o.batch, o.graph), (Some(5), Some(2), true));
        for (args, says) in [
            (&["--prompt", "1"][..], "no model"),
            (
                &["--model", "m", "--batch", "9"],
                "--batch got \"9\": expected a whole number from 1 to 8",
            ),
            (
                &["--check", "f", "--prompt", "1"],
                "--check and --prompt cannot",
            ),
            (
                &["--check", "f", "--new-tokens", "3"],
                "--check and --batch or --new-tokens",
            ),
            (
                &["--model", "m", "--dtype", "f16"],
                "--dtype f16 and --device std",
            ),
            (&["--model", "m", "--dtype", "bf16"], "--dtype got \"bf16\""),
            (&["--model", "m", "--tokens"], "unknown flag --tokens"),
            (&["--model"], "--model needs a value"),
        ] {
            let e = run(args).expect_err("refused");
            assert!(e.starts_with(says), "{args:?}: {e}");
        }
        assert_eq!(parse(["-h"]), Ok(Parsed::Help));
        assert!(usage().lines().all(|l| l.len() <= 100));
    }
}
