//! `--check DIR`: the references `scripts/gpt2/make_fixture.py` writes (its head documents the
//! files), read, and a run compared with them: greedy tokens identical, logits within tolerance.
//! A mismatch names the step, the batch row and the position.
//!
//! Tolerances: fp32 logits within 1e-3 of transformers' fp32 logits (max abs). fp16 logits
//! against the same fp32 reference, within 3 × PyTorch's own fp16-vs-fp32 difference on the
//! fixture's run (`fp16_vs_fp32_max_abs`): an fp16 host rounds between kernels as PyTorch's
//! fp16 model does, in other places (f32 inside every kernel), so its error is of the same order
//! as PyTorch's; 3× leaves room for that without letting a wrong kernel through (a dropped bias
//! or a wrong position moves logits by far more).
//!
//! Greedy tokens in fp16: a model's top two logits can lie closer than fp16's own error (GPT-2
//! small from a seed: top-2 gaps down to 1e-4, PyTorch's fp16 error 1.6e-2), so an fp16 run may
//! pick the other token of a near tie. That is allowed only where the run's own logits put the
//! token it picked first (its argmax is right) and the reference calls it a tie within the
//! tolerance (the fp32 logit of the token picked is within the tolerance of the reference's best),
//! after that step's logits were compared; the row's later steps are then not compared (their
//! inputs differ), the pass says which rows diverged where, and fewer than half of the row steps
//! compared fails the check. fp32 runs must pick the reference's tokens everywhere.

use super::decode::Decoded;
use super::weights::DType;
use serde_json::Value;
use std::fmt;
use std::path::{Path, PathBuf};

/// The fp32 tolerance (max abs logit difference).
pub const FP32_TOLERANCE: f32 = 1e-3;
/// The fp16 tolerance as a multiple of PyTorch's own fp16-vs-fp32 difference.
pub const FP16_FACTOR: f32 = 3.0;

/// A fixture's references.
#[derive(Debug, Clone)]
pub struct Fixture {
    /// Where it was read from.
    pub dir: PathBuf,
    /// `[row][prompt_len]`.
    pub prompt: Vec<Vec<u32>>,
    /// New tokens per row.
    pub new_tokens: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// transformers' fp32 greedy tokens `[row][step]`.
    pub tokens: Vec<Vec<u32>>,
    /// transformers' fp32 logits `[step][row][vocab]`, flat.
    pub logits: Vec<f32>,
    /// PyTorch's fp16-vs-fp32 max abs logit difference, where the fixture has it.
    pub fp16_vs_fp32: Option<f32>,
}

/// Why a fixture cannot be read.
#[derive(Debug)]
pub struct FixtureError {
    /// The file at fault.
    pub path: PathBuf,
    /// What is wrong with it.
    pub what: String,
}

impl fmt::Display for FixtureError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the check fixture {}: {} (write one with scripts/gpt2/make_fixture.py)",
            self.path.display(),
            self.what
        )
    }
}

impl std::error::Error for FixtureError {}

/// Reads a prompt file: one row per line, token ids separated by spaces or commas; blank lines
/// and lines starting with `#` are skipped.
///
/// # Errors
///
/// A token that is not a whole number (naming the line).
pub fn parse_prompt(text: &str) -> Result<Vec<Vec<u32>>, String> {
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let row = line
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|t| !t.is_empty())
            .map(|t| {
                t.parse::<u32>()
                    .map_err(|_| format!("line {}: {t:?} is not a token id", i + 1))
            })
            .collect::<Result<Vec<u32>, String>>()?;
        rows.push(row);
    }
    Ok(rows)
}

/// Reads the fixture in `dir`.
///
/// # Errors
///
/// [`FixtureError`] naming the file.
pub fn load(dir: &Path) -> Result<Fixture, FixtureError> {
    let at = |name: &str| dir.join(name);
    let err = |path: PathBuf, what: String| FixtureError { path, what };
    let read = |name: &str| std::fs::read(at(name)).map_err(|e| err(at(name), e.to_string()));
    let reference: Value = serde_json::from_slice(&read("reference.json")?)
        .map_err(|e| err(at("reference.json"), e.to_string()))?;
    let field = |name: &str| -> Result<&Value, FixtureError> {
        reference
            .get(name)
            .ok_or_else(|| err(at("reference.json"), format!("no field \"{name}\"")))
    };
    let count = |name: &str| -> Result<usize, FixtureError> {
        field(name)?
            .as_u64()
            .map(|n| n as usize)
            .ok_or_else(|| err(at("reference.json"), format!("\"{name}\" is not a count")))
    };
    let ids = |name: &str| -> Result<Vec<Vec<u32>>, FixtureError> {
        serde_json::from_value(field(name)?.clone())
            .map_err(|e| err(at("reference.json"), format!("\"{name}\": {e}")))
    };
    let (batch, prompt_len, new_tokens, vocab) = (
        count("batch")?,
        count("prompt_len")?,
        count("new_tokens")?,
        count("vocab")?,
    );
    let prompt_text = String::from_utf8_lossy(&read("prompt.txt")?).into_owned();
    let prompt = parse_prompt(&prompt_text).map_err(|e| err(at("prompt.txt"), e))?;
    if prompt != ids("prompt")? {
        return Err(err(
            at("prompt.txt"),
            "differs from reference.json's \"prompt\"".into(),
        ));
    }
    let tokens = ids("tokens_fp32")?;
    let shapes_fit = prompt.len() == batch
        && prompt.iter().all(|r| r.len() == prompt_len)
        && tokens.len() == batch
        && tokens.iter().all(|r| r.len() == new_tokens);
    if !shapes_fit {
        return Err(err(
            at("reference.json"),
            format!(
                "the prompt and tokens are not {batch} rows of {prompt_len} and {new_tokens} ids"
            ),
        ));
    }
    let name = field("logits_fp32")?.as_str().ok_or_else(|| {
        err(
            at("reference.json"),
            "\"logits_fp32\" is no file name".into(),
        )
    })?;
    let raw = read(name)?;
    let want = new_tokens
        .checked_mul(batch)
        .and_then(|x| x.checked_mul(vocab))
        .and_then(|x| x.checked_mul(4))
        .ok_or_else(|| {
            err(
                at("reference.json"),
                format!(
                    "{new_tokens} steps x {batch} rows x {vocab} logits overflow what a file can \
                     hold; remake the fixture"
                ),
            )
        })?;
    if raw.len() != want {
        return Err(err(
            at(name),
            format!(
                "holds {} bytes, {new_tokens} steps x {batch} rows x {vocab} f32 are {want}",
                raw.len()
            ),
        ));
    }
    let logits = super::weights::to_f32(&raw, DType::F32);
    let fp16_vs_fp32 = reference
        .get("fp16_vs_fp32_max_abs")
        .and_then(Value::as_f64)
        .map(|v| v as f32);
    Ok(Fixture {
        dir: dir.to_owned(),
        prompt,
        new_tokens,
        vocab,
        tokens,
        logits,
        fp16_vs_fp32,
    })
}

/// The first difference a check found.
#[derive(Debug, Clone, PartialEq)]
pub enum Mismatch {
    /// A greedy token differs.
    Token {
        step: usize,
        row: usize,
        position: usize,
        got: u32,
        want: u32,
    },
    /// A logit is out of tolerance.
    Logit {
        step: usize,
        row: usize,
        position: usize,
        token: usize,
        got: f32,
        want: f32,
        tolerance: f32,
    },
    /// The run has other shapes than the fixture.
    Shape(String),
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Token {
                step,
                row,
                position,
                got,
                want,
            } => write!(
                f,
                "step {step}, row {row} (position {position}): greedy token {got}, transformers \
                 chose {want}"
            ),
            Self::Logit {
                step,
                row,
                position,
                token,
                got,
                want,
                tolerance,
            } => write!(
                f,
                "step {step}, row {row} (position {position}): logit of token {token} is {got}, \
                 transformers' is {want} (|difference| {} > {tolerance})",
                (got - want).abs()
            ),
            Self::Shape(what) => f.write_str(what),
        }
    }
}

/// What a passing check found.
#[derive(Debug, Clone, PartialEq)]
pub struct Passed {
    /// The largest logit difference.
    pub max_abs: f32,
    /// The tolerance it met.
    pub tolerance: f32,
    /// fp16 only: `(row, step)` where a row took the other token of a near tie (see the module
    /// documentation); its later steps were not compared.
    pub diverged: Vec<(usize, usize)>,
}

/// The logit tolerance of a run in `dtype` against `fixture`.
pub fn tolerance(fixture: &Fixture, dtype: DType) -> f32 {
    match dtype {
        DType::F32 => FP32_TOLERANCE,
        DType::F16 => fixture
            .fp16_vs_fp32
            .map_or(5e-2, |d| (FP16_FACTOR * d).max(FP32_TOLERANCE)),
    }
}

/// Compares `run` (decoded with `keep_logits`) with `fixture`: every step, in order; fp32 tokens
/// first, then logits; fp16 logits first, then tokens, a near tie allowed as the module says
/// (NaN is out of any tolerance).
///
/// # Errors
///
/// The first [`Mismatch`].
pub fn compare(run: &Decoded, fixture: &Fixture, dtype: DType) -> Result<Passed, Mismatch> {
    let rows = fixture.prompt.len();
    let prompt_len = fixture.prompt.first().map_or(0, Vec::len);
    let (v, n) = (fixture.vocab, fixture.new_tokens);
    if run.tokens.len() != rows || run.tokens.iter().any(|r| r.len() != n) || run.logits.len() != n
    {
        return Err(Mismatch::Shape(format!(
            "the run decoded {} rows x {:?} tokens with {} steps of logits; the fixture has {rows} \
             rows x {n} tokens",
            run.tokens.len(),
            run.tokens.iter().map(Vec::len).collect::<Vec<_>>(),
            run.logits.len()
        )));
    }
    let tolerance = tolerance(fixture, dtype);
    let mut max_abs = 0.0f32;
    let mut diverged: Vec<(usize, usize)> = Vec::new();
    for step in 0..n {
        let position = prompt_len - 1 + step;
        for row in 0..rows {
            if diverged.iter().any(|&(r, _)| r == row) {
                continue;
            }
            let (got, want) = (run.tokens[row][step], fixture.tokens[row][step]);
            let base = (step * rows + row) * v;
            let reference = &fixture.logits[base..base + v];
            let token_differs = Mismatch::Token {
                step,
                row,
                position,
                got,
                want,
            };
            // fp32 picks the reference's token first; fp16 is judged on its logits first.
            if got != want && dtype == DType::F32 {
                return Err(token_differs);
            }
            let g = run.logits[step].get(row * v..(row + 1) * v);
            let Some(g) = g else {
                return Err(Mismatch::Shape(format!(
                    "step {step} read {} logits, the fixture has {rows} rows x {v}",
                    run.logits[step].len()
                )));
            };
            for (token, (&got, &want)) in g.iter().zip(reference).enumerate() {
                let d = (got - want).abs();
                if d.is_nan() || d > tolerance {
                    return Err(Mismatch::Logit {
                        step,
                        row,
                        position,
                        token,
                        got,
                        want,
                        tolerance,
                    });
                }
                max_abs = max_abs.max(d);
            }
            if got != want {
                // The run's own argmax must have picked it (the first largest of the logits the
                // kernel read), and the reference must call it a tie within the tolerance.
                let own_pick = super::std_kernels::argmax_of(g) == got as usize;
                let near_tie = reference
                    .get(got as usize)
                    .zip(reference.get(want as usize))
                    .is_some_and(|(&picked, &best)| best - picked <= tolerance);
                if !(own_pick && near_tie) {
                    return Err(token_differs);
                }
                diverged.push((row, step));
            }
        }
    }
    // A divergence ends its row's comparison: at least half of every step's rows must have
    // been compared, or the check would say little.
    let compared: usize = (0..rows)
        .map(|row| {
            diverged
                .iter()
                .find(|&&(r, _)| r == row)
                .map_or(n, |&(_, step)| step + 1)
        })
        .sum();
    if compared * 2 < rows * n {
        return Err(Mismatch::Shape(format!(
            "only {compared} of {} row steps were compared: rows took the other token of a \
             near tie at {diverged:?} (row, step); use a fixture with wider top-2 gaps \
             (make_fixture.py --min-gap) or check in f32",
            rows * n
        )));
    }
    Ok(Passed {
        max_abs,
        tolerance,
        diverged,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn fixture() -> Fixture {
        Fixture {
            dir: PathBuf::new(),
            prompt: vec![vec![1, 2], vec![3, 4]],
            new_tokens: 2,
            vocab: 3,
            tokens: vec![vec![2, 0], vec![1, 1]],
            logits: vec![
                0.0, 0.1, 0.9, 0.0, 0.8, 0.1, // step 0: rows 0, 1
                0.7, 0.1, 0.2, 0.0, 0.5, 0.4, // step 1
            ],
            fp16_vs_fp32: Some(1e-3),
        }
    }

    fn run_of(f: &Fixture) -> Decoded {
        Decoded {
            tokens: f.tokens.clone(),
            logits: f.logits.chunks(6).map(<[f32]>::to_vec).collect(),
            first_token: Duration::ZERO,
            step_times: vec![],
            elapsed: Duration::ZERO,
            record: None,
            cache_bytes: 0,
            growths: 0,
            memory: String::new(),
            held_peak: 0,
            live: 0,
        }
    }

    #[test]
    fn an_exact_run_passes_and_a_mismatch_names_step_row_and_position() {
        let f = fixture();
        let mut run = run_of(&f);
        assert_eq!(
            compare(&run, &f, DType::F32).map(|p| p.max_abs),
            Ok(0.0),
            "exact"
        );
        run.logits[1][4] += 5e-4;
        assert!(compare(&run, &f, DType::F32).is_ok(), "within 1e-3");
        run.logits[1][4] += 1e-3;
        let e = compare(&run, &f, DType::F32).expect_err("out of tolerance");
        assert!(matches!(
            e,
            Mismatch::Logit {
                step: 1,
                row: 1,
                position: 2,
                token: 1,
                ..
            }
        ));
        assert!(
            e.to_string()
                .starts_with("step 1, row 1 (position 2): logit of token 1")
        );
        run.tokens[0][1] = 2;
        let e = compare(&run, &f, DType::F32).expect_err("a token differs");
        assert_eq!(
            e.to_string(),
            "step 1, row 0 (position 2): greedy token 2, transformers chose 0"
        );
        let mut nan = run_of(&f);
        nan.logits[0][0] = f32::NAN;
        assert!(matches!(
            compare(&nan, &f, DType::F32),
            Err(Mismatch::Logit {
                step: 0,
                row: 0,
                ..
            })
        ));
        assert_eq!(tolerance(&f, DType::F16), 3e-3);
    }

    #[test]
    fn fp16_may_take_the_other_token_of_a_near_tie_only() {
        let mut f = fixture();
        // Step 0, row 1: tokens 1 and 2 lie 2e-3 apart in the reference (a tie within 3e-3).
        f.logits[3..6].copy_from_slice(&[0.0, 0.8, 0.798]);
        let mut run = run_of(&f);
        run.tokens[1] = vec![2, 0];
        // The run's own logits (within the tolerance of the reference) put token 2 first.
        run.logits[0][3..6].copy_from_slice(&[0.0, 0.799, 0.7995]);
        // Its later steps are not compared: they saw another token.
        run.logits[1][3..6].copy_from_slice(&[9.0, 9.0, 9.0]);
        let p = compare(&run, &f, DType::F16).expect("a near tie within the fp16 tolerance");
        assert_eq!(p.diverged, vec![(1, 0)]);
        assert!(
            matches!(
                compare(&run, &f, DType::F32),
                Err(Mismatch::Token {
                    step: 0,
                    row: 1,
                    ..
                })
            ),
            "fp32 must pick the reference's token"
        );
        // The run's own logits put token 1 first: its argmax picked another than it reports.
        let mut wrong = run.clone();
        wrong.logits[0][3..6].copy_from_slice(&[0.0, 0.8, 0.798]);
        assert!(
            matches!(
                compare(&wrong, &f, DType::F16),
                Err(Mismatch::Token {
                    step: 0,
                    row: 1,
                    ..
                })
            ),
            "a token the run's own logits do not put first is a wrong argmax"
        );
        // Not a tie: the reference's best is 0.9 against 0.1 (row 0, step 0).
        let mut far = run_of(&f);
        far.tokens[0][0] = 1;
        assert!(matches!(
            compare(&far, &f, DType::F16),
            Err(Mismatch::Token {
                step: 0,
                row: 0,
                got: 1,
                want: 2,
                ..
            })
        ));
    }

    #[test]
    fn prompts_read_one_row_per_line() {
        assert_eq!(
            parse_prompt("# ids\n1 2, 3\n\n4,5,6\n"),
            Ok(vec![vec![1, 2, 3], vec![4, 5, 6]])
        );
        assert_eq!(
            parse_prompt("1 x"),
            Err("line 1: \"x\" is not a token id".into())
        );
    }
}
