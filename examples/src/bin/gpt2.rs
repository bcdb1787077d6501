//! The GPT-2 decoding host: a Hugging Face GPT-2 (`config.json` + `model.safetensors`) decoded
//! greedily through devcmd on the std shim (the default) or an NVIDIA GPU (`--device cuda`),
//! eagerly or by replaying one recorded step (`--graph`; `--graph-update` records it again before
//! every replay, to measure that design); `--check DIR` compares the run with
//! transformers' references (`scripts/gpt2/make_fixture.py`) and exits 1 on a mismatch.
//!
//! This file owns the choice of device and what the host prints; the loop is
//! [`devcmd_examples::gpt2::decode`], the same for every device.

use devcmd::{Device, DeviceConfig, Shim};
use devcmd_examples::cli::DeviceKind;
use devcmd_examples::exit::{self, BadInput};
use devcmd_examples::gpt2::check::{self, Fixture};
use devcmd_examples::gpt2::cli::{self, DEFAULT_NEW_TOKENS, Options, Parsed};
use devcmd_examples::gpt2::config::{self, Config};
use devcmd_examples::gpt2::decode::{self, Backend, COMPUTE, Decoded, KvCache, Plan};
use devcmd_examples::gpt2::devices::{CudaBackend, StdBackend, std_shim};
use devcmd_examples::gpt2::weights::{self, ModelFile};
use devcmd_examples::gpt2::{split, step};
use devcmd_examples::serve::WeightsPath;
use devcmd_examples::weights::Mapping;
use std::error::Error;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// The prompt rows of the run, checked against the vocabulary and repeated to `--batch`.
fn prompt(
    o: &Options,
    fixture: Option<&Fixture>,
    config: &Config,
) -> Result<Vec<Vec<u32>>, Box<dyn Error>> {
    let (mut rows, source) = if let Some(f) = fixture {
        (f.prompt.clone(), format!("the fixture {}", f.dir.display()))
    } else if let Some(text) = &o.prompt {
        let rows =
            check::parse_prompt(&text.replace(';', "\n")).map_err(|e| format!("--prompt: {e}"))?;
        (rows, "--prompt".to_owned())
    } else if let Some(path) = &o.prompt_file {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the prompt file {}: {e}", path.display()))?;
        let source = format!("the prompt file {}", path.display());
        (
            check::parse_prompt(&text).map_err(|e| format!("{source}: {e}"))?,
            source,
        )
    } else {
        (vec![vec![0]], "the default prompt".to_owned())
    };
    prompt_rows(&mut rows, o, config).map_err(|e| format!("{source}: {e}"))?;
    Ok(rows)
}

/// Checks the prompt's rows (repeated to `--batch`) against the batch limits and the
/// vocabulary.
fn prompt_rows(rows: &mut Vec<Vec<u32>>, o: &Options, config: &Config) -> Result<(), String> {
    if let Some(b) = o.batch {
        if rows.len() == 1 {
            *rows = vec![rows[0].clone(); b];
        } else if rows.len() != b {
            return Err(format!(
                "--batch {b} and a prompt of {} rows: pass one row (repeated) or {b}",
                rows.len()
            ));
        }
    }
    if rows.is_empty() || rows.len() > cli::MAX_BATCH {
        return Err(format!(
            "the prompt has {} rows: expected 1 to {} (one row of token ids per line)",
            rows.len(),
            cli::MAX_BATCH
        ));
    }
    let len = rows[0].len();
    if len == 0 || rows.iter().any(|r| r.len() != len) {
        return Err(format!(
            "the prompt's rows have {:?} tokens: every row needs the same number, at least 1 (no \
             padding)",
            rows.iter().map(Vec::len).collect::<Vec<_>>()
        ));
    }
    for (r, row) in rows.iter().enumerate() {
        if let Some(t) = row.iter().find(|&&t| t as usize >= config.vocab) {
            return Err(format!(
                "prompt row {r}: token {t} is outside the vocabulary (0 to {})",
                config.vocab - 1
            ));
        }
    }
    Ok(())
}

/// Refuses, before anything is loaded, a run the model's positions cannot hold, naming the most
/// new tokens that fit.
fn check_positions(
    plan: &Plan,
    config: &Config,
    asked: bool,
    fixture: bool,
) -> Result<(), Box<dyn Error>> {
    let prompt_len = plan.prompt[0].len();
    if plan.passes() <= config.positions {
        return Ok(());
    }
    let default = if asked { "" } else { " (the default)" };
    let what = if fixture {
        "the fixture was made for a model of more positions: make it again for this one".to_owned()
    } else if prompt_len > config.positions {
        format!(
            "shorten the prompt to at most {} tokens, or pass fewer --new-tokens",
            (config.positions + 1)
                .saturating_sub(plan.new_tokens)
                .max(1)
        )
    } else {
        format!(
            "pass --new-tokens {} or fewer",
            config.positions + 1 - prompt_len
        )
    };
    Err(BadInput::boxed(format!(
        "a prompt of {prompt_len} tokens and {} new tokens{default} need {} positions, the \
         model has {} (n_positions): {what}",
        plan.new_tokens,
        plan.passes(),
        config.positions
    )))
}

/// `d` in microseconds.
fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Median, 99th percentile and worst of `times` (nearest rank).
fn spread(times: &[Duration]) -> Option<(Duration, Duration, Duration)> {
    let mut t = times.to_vec();
    t.sort_unstable();
    let at = |q: f64| t[((q * t.len() as f64).ceil() as usize).clamp(1, t.len()) - 1];
    (!t.is_empty()).then(|| (at(0.5), at(0.99), t[t.len() - 1]))
}

/// What the run printed and whether its check passed.
fn report_run(o: &Options, plan: &Plan, run: &Decoded, launches: usize) {
    for (r, (p, t)) in plan.prompt.iter().zip(&run.tokens).enumerate() {
        let join = |v: &[u32]| v.iter().map(u32::to_string).collect::<Vec<_>>().join(" ");
        println!("row {r}: {} | {}", join(p), join(t));
    }
    let rows = plan.prompt.len();
    let mode = if o.graph_update {
        format!(
            "graph (one step of {launches} launches recorded in {:.1} ms, then recorded again and \
             the graph updated in place before every replay after the first)",
            run.record.map_or(0.0, |d| d.as_secs_f64() * 1e3)
        )
    } else if o.graph {
        format!(
            "graph (one step of {launches} launches recorded once in {:.1} ms, replayed per \
             position)",
            run.record.map_or(0.0, |d| d.as_secs_f64() * 1e3)
        )
    } else {
        format!("eager ({launches} launches per step)")
    };
    println!(
        "decoded {rows} x {} new tokens after a {}-token prompt, {mode}",
        plan.new_tokens,
        plan.prompt[0].len()
    );
    println!(
        "first token after {:.3} ms (the prompt's {} steps and one)",
        run.first_token.as_secs_f64() * 1e3,
        plan.prompt[0].len() - 1
    );
    match spread(&run.step_times) {
        Some((median, p99, worst)) => {
            let total: Duration = run.step_times.iter().sum();
            let tokens = rows * run.step_times.len();
            println!(
                "decode: {tokens} tokens in {:.3} ms: {:.1} tokens/s; per step (token to token, \
                 {} steps): median {:.1} us, p99 {:.1} us, worst {:.1} us",
                total.as_secs_f64() * 1e3,
                tokens as f64 / total.as_secs_f64(),
                run.step_times.len(),
                us(median),
                us(p99),
                us(worst)
            );
        }
        None => println!("decode: one new token only, no step after the first to time"),
    }
    println!(
        "memory: {} bytes held at the peak, {} bytes live after the last step (weights, cache, \
         buffers): {:.3}x",
        run.held_peak,
        run.live,
        run.held_peak as f64 / run.live.max(1) as f64
    );
    match plan.kv {
        KvCache::Ahead => println!(
            "KV cache: {} bytes, room held ahead for the run's {} positions",
            run.cache_bytes,
            plan.passes()
        ),
        KvCache::Grow => println!(
            "KV cache: {} bytes at the end, for the run's {} positions: grew {} time{} from the \
             prompt, doubling{}",
            run.cache_bytes,
            plan.passes(),
            run.growths,
            if run.growths == 1 { "" } else { "s" },
            if o.graph {
                " (the step recorded again into the same graph each time)"
            } else {
                ""
            }
        ),
    }
}

/// The run as one JSON object (`--json FILE`): what ran, its times and its memory.
fn summary(
    job: &Job<'_>,
    launches: usize,
    run: &Decoded,
    model: &decode::DeviceModel,
    scratch: u64,
    check: serde_json::Value,
) -> serde_json::Value {
    let (o, plan) = (job.o, job.plan);
    let rows = plan.prompt.len();
    let spread = spread(&run.step_times);
    let decode_s: f64 = run.step_times.iter().map(Duration::as_secs_f64).sum();
    serde_json::json!({
        "device": o.device.name(),
        "dtype": model.dtype.name(),
        "batch": rows,
        "prompt_len": plan.prompt[0].len(),
        "new_tokens": plan.new_tokens,
        "graph": o.graph,
        "graph_update": o.graph_update,
        "kv": match plan.kv { KvCache::Ahead => "ahead", KvCache::Grow => "grow" },
        "launches_per_step": launches,
        "first_token_ms": run.first_token.as_secs_f64() * 1e3,
        "decode_tokens_per_s": if decode_s > 0.0 {
            (rows * run.step_times.len()) as f64 / decode_s
        } else {
            0.0
        },
        "step_us": spread.map(|(m, p, w)| serde_json::json!({
            "median": us(m), "p99": us(p), "worst": us(w), "steps": run.step_times.len(),
        })),
        "held_peak_bytes": run.held_peak,
        "live_bytes": run.live,
        "library_scratch_bytes": scratch,
        "weights_bytes": model.bytes,
        "cache_bytes": run.cache_bytes,
        "growths": run.growths,
        "record_ms": run.record.map(|d| d.as_secs_f64() * 1e3),
        "tokens": run.tokens,
        "check": check,
    })
}

/// What a run decodes, on any device.
struct Job<'a> {
    o: &'a Options,
    config: &'a Config,
    plan: &'a Plan,
    fixture: Option<&'a Fixture>,
}

/// Uploads `file` (page-locked in place first when `register`), decodes, prints, checks and
/// reports. Returns whether the check (if any) passed.
fn decode_on<S, B>(
    job: &Job<'_>,
    mut device: Device<S>,
    backend: &B,
    file: ModelFile,
    register: bool,
) -> Result<bool, Box<dyn Error>>
where
    S: Shim + Send + Sync + 'static,
    S::Registration: 'static,
    B: Backend<S>,
{
    let Job {
        o,
        config,
        plan,
        fixture,
    } = *job;
    let file_dtype = file.dtype;
    let unused = file.found.unused_bytes;
    let model = decode::upload(&mut device, backend, file, config, register)?;
    if unused > 0 && model.dtype == file_dtype {
        println!(
            "note: the weights file holds {unused} bytes of tensors the model does not use (an \
             older file's attention mask buffers, say); the file goes to the device whole, so \
             they are held and counted live: save the model again without them to save the room"
        );
    }
    let how = match &model.path {
        WeightsPath::Registered => "page-locked in place and copied by DMA".to_owned(),
        WeightsPath::NotRegistered(why) => format!("staged (page-locking refused: {why})"),
        _ => "mapped and staged through pinned memory".to_owned(),
    };
    println!(
        "model: {} layers, width {}, {} heads, vocabulary {}, {} positions; {} parameters; \
         {} bytes of {} weights {how}, on the device as {}",
        config.layers,
        config.embd,
        config.heads,
        config.vocab,
        config.positions,
        config.parameters(),
        model.bytes,
        file_dtype.name(),
        model.dtype.name()
    );
    let (proj_parts, out_parts) = split::projection_parts(config, backend.split_k());
    if proj_parts.max(out_parts) > 1 {
        println!(
            "output projections: k cut into {proj_parts} (attention) and {out_parts} (MLP) parts, \
             the partials summed by the residual add"
        );
    }
    let run = decode::decode(&mut device, backend, &model, plan)?;
    let launches = step::launches_per_step(config.layers, backend.fuses_bias_gelu());
    report_run(o, plan, &run, launches);
    let mut passed = true;
    let mut checked = serde_json::Value::Null;
    if let Some(f) = fixture {
        match check::compare(&run, f, model.dtype) {
            Ok(p) => {
                let tokens = if p.diverged.is_empty() {
                    "greedy tokens identical".to_string()
                } else {
                    let at: Vec<String> = p
                        .diverged
                        .iter()
                        .map(|(row, step)| format!("row {row} at step {step}"))
                        .collect();
                    format!(
                        "greedy tokens identical up to a near tie within the tolerance ({}; \
                         not compared after it)",
                        at.join(", ")
                    )
                };
                println!(
                    "check against {}: {tokens}, max abs logit difference {:.3e} (tolerance \
                     {:.1e})",
                    f.dir.display(),
                    p.max_abs,
                    p.tolerance
                );
                checked = serde_json::json!({
                    "passed": true, "max_abs": p.max_abs, "tolerance": p.tolerance,
                    "diverged_at": p.diverged,
                });
            }
            Err(m) => {
                eprintln!("gpt2: check against {} failed: {m}", f.dir.display());
                checked = serde_json::json!({ "passed": false, "mismatch": m.to_string() });
                passed = false;
            }
        }
    }
    if let Some(path) = &o.json {
        let scratch = backend.library_scratch_bytes();
        let summary = summary(job, launches, &run, &model, scratch, checked);
        std::fs::write(path, format!("{summary:#}\n"))
            .map_err(|e| format!("cannot write --json {}: {e}", path.display()))?;
    }
    println!(
        "\nmemory report after the last step (weights, KV cache and the step's buffers live):\n{}",
        run.memory
    );
    drop(model);
    for _ in 0..2 {
        device.command(COMPUTE)?.flush_drops()?;
    }
    println!(
        "\nmemory report at the end (everything dropped, pools keep their pages):\n{}",
        device.memory_report()
    );
    Ok(passed)
}

fn run(o: &Options) -> Result<bool, Box<dyn Error>> {
    let fixture = o.check.as_deref().map(check::load).transpose()?;
    let dir: PathBuf = o
        .model
        .clone()
        .or_else(|| o.check.clone())
        .ok_or_else(|| BadInput::boxed("no model: pass --model DIR or --check DIR"))?;
    let config = config::load(&dir.join("config.json"))?;
    if let Some(f) = &fixture
        && f.vocab != config.vocab
    {
        return Err(BadInput::boxed(format!(
            "the fixture {} has a vocabulary of {}, the model {}",
            f.dir.display(),
            f.vocab,
            config.vocab
        )));
    }
    let plan = Plan {
        prompt: prompt(o, fixture.as_ref(), &config).map_err(BadInput::boxed)?,
        new_tokens: fixture
            .as_ref()
            .map(|f| f.new_tokens)
            .or(o.new_tokens)
            .unwrap_or(DEFAULT_NEW_TOKENS),
        graph: o.graph,
        update_each_step: o.graph_update,
        keep_logits: fixture.is_some(),
        kv: o.kv,
    };
    check_positions(
        &plan,
        &config,
        fixture.is_some() || o.new_tokens.is_some(),
        fixture.is_some(),
    )?;
    // The summary's file is made before the run, so a path that cannot be written stops it
    // before anything is loaded (and cannot hide a check's result at the end).
    if let Some(path) = &o.json {
        // Opened for writing, not truncated: a run that fails later leaves the file as it was.
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| BadInput::boxed(format!("cannot write --json {}: {e}", path.display())))?;
    }
    let weights_path = dir.join("model.safetensors");
    let job = Job {
        o,
        config: &config,
        plan: &plan,
        fixture: fixture.as_ref(),
    };
    match o.device {
        DeviceKind::Std => {
            let file = weights::load(&weights_path, &config, Mapping::ReadOnly)?;
            let shim = std_shim(o.lazy);
            let backend = StdBackend::new(&shim);
            let device = Device::new(shim, DeviceConfig::default());
            decode_on(&job, device, &backend, file, false)
        }
        DeviceKind::Cuda => {
            // Read-only: devcmd-cuda registers it read-only (`cuMemHostRegister` with
            // READ_ONLY). A private copy-on-write mapping made the driver copy every page when it
            // locked them: 40 s of system time for GPT-2 small's 498 MB on the H200.
            let file = weights::load(&weights_path, &config, Mapping::ReadOnly)?;
            let backend = CudaBackend::open(0, o.dtype)?;
            println!("{}", backend.describe());
            let device = Device::new(backend.shim.clone(), DeviceConfig::default());
            decode_on(&job, device, &backend, file, true)
        }
    }
}

fn main() -> ExitCode {
    devcmd_examples::exit::quiet_on_closed_output();
    let options = match cli::parse(std::env::args_os().skip(1)) {
        Ok(Parsed::Run(o)) => o,
        Ok(Parsed::Help) => {
            println!("{}", cli::usage());
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("gpt2: {e} (try --help)");
            return ExitCode::from(exit::BAD_INPUT);
        }
    };
    match run(&options) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(exit::MISMATCH),
        Err(e) => exit::report("gpt2", &*e),
    }
}
