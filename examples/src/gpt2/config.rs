//! `config.json`: the GPT2Config fields the host reads (transformers' names), their defaults,
//! and the refusal of what the host does not run. Every error names the file and the field.

use serde_json::Value;
use std::fmt;
use std::path::{Path, PathBuf};

/// The activation of the MLP (`activation_function`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// GPT-2's `gelu_new` (also `gelu_pytorch_tanh`, `gelu_fast`): the tanh approximation
    /// `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`.
    GeluTanh,
}

/// What the host needs of a GPT2Config.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `vocab_size`.
    pub vocab: usize,
    /// `n_positions`: the longest sequence (the position table's rows).
    pub positions: usize,
    /// `n_embd`: the model width.
    pub embd: usize,
    /// `n_layer`.
    pub layers: usize,
    /// `n_head`.
    pub heads: usize,
    /// `n_inner` (null: 4 × `n_embd`): the MLP width.
    pub inner: usize,
    /// `layer_norm_epsilon`.
    pub eps: f32,
    /// `activation_function`.
    pub activation: Activation,
    /// `scale_attn_weights`: scores divided by √head_dim.
    pub scale_attn: bool,
    /// `scale_attn_by_inverse_layer_idx`: scores of layer `l` further divided by `l + 1`.
    pub inverse_layer_scale: bool,
    /// `tie_word_embeddings`: the output projection is `wte` (no `lm_head.weight` needed).
    pub tied: bool,
}

impl Config {
    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.embd / self.heads
    }

    /// The scale of layer `layer`'s attention scores.
    pub fn attn_scale(&self, layer: usize) -> f32 {
        let mut s = 1.0f32;
        if self.scale_attn {
            s /= (self.head_dim() as f32).sqrt();
        }
        if self.inverse_layer_scale {
            s /= (layer + 1) as f32;
        }
        s
    }

    /// Parameters of the model (the output projection counted once when tied).
    pub fn parameters(&self) -> usize {
        let (e, i) = (self.embd, self.inner);
        let layer = 2 * e + (e * 3 * e + 3 * e) + (e * e + e) + 2 * e + (e * i + i) + (i * e + e);
        let head = if self.tied { 0 } else { self.vocab * e };
        self.vocab * e + self.positions * e + self.layers * layer + 2 * e + head
    }
}

/// Why `config.json` cannot be run.
#[derive(Debug)]
pub enum ConfigError {
    /// Reading the file failed.
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The file is not JSON (serde_json's words).
    Json { path: PathBuf, what: String },
    /// A field is missing or not what it must be.
    Field {
        path: PathBuf,
        field: &'static str,
        found: String,
        expected: &'static str,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Read { path, source } => {
                write!(
                    f,
                    "cannot read the model config {}: {source}",
                    path.display()
                )
            }
            Self::Json { path, what } => write!(
                f,
                "the model config {} is not JSON: {what}; pass the config.json transformers' \
                 save_pretrained writes",
                path.display()
            ),
            Self::Field {
                path,
                field,
                found,
                expected,
            } => write!(
                f,
                "the model config {}: \"{field}\" is {found}, expected {expected}",
                path.display()
            ),
        }
    }
}

impl std::error::Error for ConfigError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Read { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// Reads and checks the config at `path`.
///
/// # Errors
///
/// [`ConfigError`], naming the file and the field.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    parse(&text, path)
}

/// Parses and checks `text`, the config at `path`.
///
/// # Errors
///
/// As [`load`].
pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
    let v: Value = serde_json::from_str(text).map_err(|e| ConfigError::Json {
        path: path.to_owned(),
        what: e.to_string(),
    })?;
    let bad =
        |field: &'static str, found: Option<&Value>, expected: &'static str| ConfigError::Field {
            path: path.to_owned(),
            field,
            found: found.map_or_else(|| "missing".to_owned(), Value::to_string),
            expected,
        };
    const COUNT: &str = "a whole number from 1 to 1048576";
    let count = |field: &'static str| -> Result<usize, ConfigError> {
        let found = v.get(field);
        found
            .and_then(Value::as_u64)
            .filter(|n| (1..=1 << 20).contains(n))
            .map(|n| n as usize)
            .ok_or_else(|| bad(field, found, COUNT))
    };
    let flag = |field: &'static str, default: bool| -> Result<bool, ConfigError> {
        match v.get(field) {
            None | Some(Value::Null) => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            other => Err(bad(field, other, "true or false")),
        }
    };
    if let Some(t) = v.get("model_type")
        && t.as_str() != Some("gpt2")
    {
        return Err(bad("model_type", Some(t), "\"gpt2\""));
    }
    let embd = count("n_embd")?;
    let heads = count("n_head")?;
    if !embd.is_multiple_of(heads) {
        return Err(bad(
            "n_head",
            v.get("n_head"),
            "a divisor of n_embd (each head is n_embd / n_head wide)",
        ));
    }
    let inner = match v.get("n_inner") {
        None | Some(Value::Null) => 4 * embd,
        Some(_) => count("n_inner")?,
    };
    let eps = match v.get("layer_norm_epsilon") {
        None => 1e-5,
        Some(e) => e
            .as_f64()
            .filter(|e| *e > 0.0 && *e < 1.0)
            .map(|e| e as f32)
            .ok_or_else(|| bad("layer_norm_epsilon", Some(e), "a number between 0 and 1"))?,
    };
    const ACTIVATIONS: &str = "\"gelu_new\", \"gelu_pytorch_tanh\" or \"gelu_fast\" (GPT-2's tanh \
                               GELU; the erf \"gelu\" is not implemented)";
    let activation = match v.get("activation_function") {
        None => Activation::GeluTanh,
        Some(a) => match a.as_str() {
            Some("gelu_new" | "gelu_pytorch_tanh" | "gelu_fast") => Activation::GeluTanh,
            _ => return Err(bad("activation_function", Some(a), ACTIVATIONS)),
        },
    };
    if flag("add_cross_attention", false)? {
        return Err(bad(
            "add_cross_attention",
            v.get("add_cross_attention"),
            "false (a decoder-only GPT-2)",
        ));
    }
    Ok(Config {
        vocab: count("vocab_size")?,
        positions: count("n_positions")?,
        embd,
        layers: count("n_layer")?,
        heads,
        inner,
        eps,
        activation,
        scale_attn: flag("scale_attn_weights", true)?,
        inverse_layer_scale: flag("scale_attn_by_inverse_layer_idx", false)?,
        tied: flag("tie_word_embeddings", true)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TINY: &str = r#"{"model_type": "gpt2", "vocab_size": 256, "n_positions": 64,
        "n_embd": 64, "n_layer": 2, "n_head": 4, "n_inner": null,
        "activation_function": "gelu_new", "layer_norm_epsilon": 1e-05}"#;

    #[test]
    fn a_transformers_config_reads_with_its_defaults() {
        let c = parse(TINY, Path::new("c.json")).expect("parses");
        assert_eq!((c.vocab, c.positions, c.embd, c.layers), (256, 64, 64, 2));
        assert_eq!((c.heads, c.head_dim(), c.inner), (4, 16, 256));
        assert!(c.scale_attn && !c.inverse_layer_scale && c.tied);
        assert_eq!(c.attn_scale(1), 0.25);
        // GPT-2 small: 124,439,808 parameters.
        let small = r#"{"vocab_size": 50257, "n_positions": 1024, "n_embd": 768,
            "n_layer": 12, "n_head": 12}"#;
        let c = parse(small, Path::new("c.json")).expect("parses");
        assert_eq!(c.parameters(), 124_439_808);
    }

    #[test]
    fn what_the_host_does_not_run_is_refused_naming_file_and_field() {
        for (edit, says) in [
            (
                ("\"n_head\": 4", "\"n_head\": 5"),
                "\"n_head\" is 5, expected a divisor",
            ),
            (
                ("\"gelu_new\"", "\"relu\""),
                "\"activation_function\" is \"relu\", expected \"gelu_new\"",
            ),
            (
                ("\"n_layer\": 2", "\"n_layer\": 0"),
                "\"n_layer\" is 0, expected a whole",
            ),
            (
                ("\"vocab_size\": 256,", ""),
                "\"vocab_size\" is missing, expected",
            ),
            (("\"gpt2\"", "\"llama\""), "\"model_type\" is \"llama\""),
        ] {
            let text = TINY.replace(edit.0, edit.1);
            let e = parse(&text, Path::new("dir/config.json"))
                .expect_err("refused")
                .to_string();
            assert!(e.starts_with("the model config dir/config.json: "), "{e}");
            assert!(e.contains(says), "{e}");
        }
        let e = parse("{", Path::new("c.json")).expect_err("not JSON");
        assert!(e.to_string().contains("is not JSON"), "{e}");
    }
}
