//! `model.safetensors` in the Hugging Face GPT-2 layout: mapped whole and read-only (a GPU
//! page-locks the mapping in place, read-only), read with the `safetensors`
//! crate, every tensor the model needs found by its name (with or without the `transformer.`
//! prefix transformers' `GPT2LMHeadModel` writes), its shape checked against the config, and its
//! place in the file kept: the device gets the whole file in one upload and each tensor is a view
//! of it.

use super::config::Config;
use crate::weights::{self, MappedFile, Mapping};
use devcmd::ExternalBytes;
use safetensors::{Dtype, SafeTensors};
use std::fmt;
use std::path::{Path, PathBuf};

/// The element type of the weights (in the file, or on the device).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    /// IEEE single precision.
    F32,
    /// IEEE half precision.
    F16,
}

impl DType {
    /// Bytes per element.
    pub const fn bytes(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 => 2,
        }
    }

    /// The name `--dtype` takes.
    pub const fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
        }
    }
}

/// One layer's tensors.
#[derive(Debug, Clone)]
pub struct Layer<T> {
    /// `ln_1.weight`, `ln_1.bias`: `[embd]`.
    pub ln1_g: T,
    pub ln1_b: T,
    /// `attn.c_attn.weight` `[embd, 3·embd]` (Conv1D: in × out), `attn.c_attn.bias` `[3·embd]`.
    pub attn_w: T,
    pub attn_b: T,
    /// `attn.c_proj.weight` `[embd, embd]`, `.bias` `[embd]`.
    pub proj_w: T,
    pub proj_b: T,
    /// `ln_2.weight`, `ln_2.bias`.
    pub ln2_g: T,
    pub ln2_b: T,
    /// `mlp.c_fc.weight` `[embd, inner]`, `.bias` `[inner]`.
    pub fc_w: T,
    pub fc_b: T,
    /// `mlp.c_proj.weight` `[inner, embd]`, `.bias` `[embd]`.
    pub out_w: T,
    pub out_b: T,
}

/// Every tensor of the model, as `T` (a place in the file, or a device handle).
#[derive(Debug, Clone)]
pub struct Tensors<T> {
    /// `wte.weight`: `[vocab, embd]`, also the output projection when tied.
    pub wte: T,
    /// `wpe.weight`: `[n_positions, embd]`.
    pub wpe: T,
    /// The layers in order.
    pub layers: Vec<Layer<T>>,
    /// `ln_f.weight`, `ln_f.bias`.
    pub lnf_g: T,
    pub lnf_b: T,
    /// `lm_head.weight` `[vocab, embd]` when the config unties it (else `wte` serves).
    pub lm_head: Option<T>,
}

impl<T> Layer<T> {
    /// Maps every tensor of the layer.
    pub fn try_map<U, E>(&self, mut f: impl FnMut(&T) -> Result<U, E>) -> Result<Layer<U>, E> {
        Ok(Layer {
            ln1_g: f(&self.ln1_g)?,
            ln1_b: f(&self.ln1_b)?,
            attn_w: f(&self.attn_w)?,
            attn_b: f(&self.attn_b)?,
            proj_w: f(&self.proj_w)?,
            proj_b: f(&self.proj_b)?,
            ln2_g: f(&self.ln2_g)?,
            ln2_b: f(&self.ln2_b)?,
            fc_w: f(&self.fc_w)?,
            fc_b: f(&self.fc_b)?,
            out_w: f(&self.out_w)?,
            out_b: f(&self.out_b)?,
        })
    }
}

impl<T> Tensors<T> {
    /// Maps every tensor.
    pub fn try_map<U, E>(&self, mut f: impl FnMut(&T) -> Result<U, E>) -> Result<Tensors<U>, E> {
        Ok(Tensors {
            wte: f(&self.wte)?,
            wpe: f(&self.wpe)?,
            layers: self
                .layers
                .iter()
                .map(|l| l.try_map(&mut f))
                .collect::<Result<_, _>>()?,
            lnf_g: f(&self.lnf_g)?,
            lnf_b: f(&self.lnf_b)?,
            lm_head: self.lm_head.as_ref().map(&mut f).transpose()?,
        })
    }

    /// The output projection: `lm_head` when untied, else `wte`.
    pub fn head(&self) -> &T {
        self.lm_head.as_ref().unwrap_or(&self.wte)
    }
}

/// Where a tensor lies in the file: its first byte and its length in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    pub offset: usize,
    pub len: usize,
}

/// A mapped `model.safetensors` whose tensors fit the config.
#[derive(Debug)]
pub struct ModelFile {
    /// The whole file.
    pub file: MappedFile,
    /// The element type of every tensor.
    pub dtype: DType,
    /// Each tensor's place in the file.
    pub places: Tensors<Place>,
    /// What the file holds beside: see [`Found`].
    pub found: Found,
}

/// What [`find`] saw in the file beside the tensors the model uses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Found {
    /// Bytes of tensors the model does not use (uploaded with the rest: the file goes whole).
    pub unused_bytes: usize,
    /// The first f32 weight past f16's range (65504), as its tensor's name and element: it
    /// would become infinite in f16.
    pub past_half: Option<(String, usize)>,
}

/// Why the weights file cannot be run.
#[derive(Debug)]
pub enum WeightsError {
    /// Opening or mapping the file failed.
    Io {
        path: PathBuf,
        doing: &'static str,
        source: std::io::Error,
    },
    /// The safetensors crate refused the file.
    Format { path: PathBuf, what: String },
    /// A tensor the config needs is not in the file.
    Missing { path: PathBuf, name: String },
    /// A tensor's shape is not the one the config gives it.
    Shape {
        path: PathBuf,
        name: String,
        found: Vec<usize>,
        want: Vec<usize>,
    },
    /// A tensor's element type is not f32 or f16, or differs from the others'.
    Dtype {
        path: PathBuf,
        name: String,
        found: String,
        want: &'static str,
    },
    /// A tensor does not start on a multiple of its element size.
    Misaligned {
        path: PathBuf,
        name: String,
        offset: usize,
    },
    /// A weight is NaN or infinite: every logit would be garbage.
    NonFinite {
        path: PathBuf,
        name: String,
        index: usize,
    },
    /// The file holds a layer past the config's `n_layer`: the config describes another model.
    ExtraLayer {
        path: PathBuf,
        name: String,
        layers: usize,
    },
}

impl fmt::Display for WeightsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Io {
                path,
                doing,
                source,
            } => write!(f, "cannot {doing} the weights {}: {source}", path.display()),
            Self::Format { path, what } => write!(
                f,
                "the weights {} are not a safetensors file: {what}",
                path.display()
            ),
            Self::NonFinite { path, name, index } => write!(
                f,
                "the weights {} hold a NaN or infinite value in {name} (element {index}): every \
                 logit would be garbage; re-export the model",
                path.display()
            ),
            Self::ExtraLayer { path, name, layers } => write!(
                f,
                "the weights {} hold {name}, a layer past the config's n_layer = {layers}: the \
                 config does not describe this file; set n_layer to the file's layer count",
                path.display()
            ),
            Self::Missing { path, name } => write!(
                f,
                "the weights {} hold no tensor {name} (nor transformer.{name}): pass the \
                 model.safetensors of a GPT2LMHeadModel or GPT2Model with this config",
                path.display()
            ),
            Self::Shape {
                path,
                name,
                found,
                want,
            } => write!(
                f,
                "the weights {}: {name} has shape {found:?}, the config needs {want:?}",
                path.display()
            ),
            Self::Dtype {
                path,
                name,
                found,
                want,
            } => write!(
                f,
                "the weights {}: {name} is {found}, expected {want}",
                path.display()
            ),
            Self::Misaligned { path, name, offset } => write!(
                f,
                "the weights {}: {name} starts at byte {offset} of the file, not on a multiple \
                 of its element size; rewrite the file with safetensors' save_file",
                path.display()
            ),
        }
    }
}

impl std::error::Error for WeightsError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// Maps `path` as `mapping` says and finds every tensor `config` needs.
///
/// # Errors
///
/// [`WeightsError`], naming the file and the tensor.
pub fn load(path: &Path, config: &Config, mapping: Mapping) -> Result<ModelFile, WeightsError> {
    let io = |doing| {
        move |source| WeightsError::Io {
            path: path.to_owned(),
            doing,
            source,
        }
    };
    let f = std::fs::File::open(path).map_err(io("open"))?;
    let file = weights::map(&f, mapping).map_err(io("memory-map"))?;
    let (dtype, places, found) = find(file.bytes(), config, path)?;
    Ok(ModelFile {
        file,
        dtype,
        places,
        found,
    })
}

/// One pass over a tensor's little-endian `dtype` values: the index of the first NaN or
/// infinite one (an exponent of all ones; the pass stops there), and of the first f32 one past
/// f16's largest finite value, 65504 (`0x477f_e000`; none for f16 data).
fn scan(data: &[u8], dtype: DType) -> (Option<usize>, Option<usize>) {
    match dtype {
        DType::F32 => {
            let mut past_half = None;
            for (i, c) in data.chunks_exact(4).enumerate() {
                let magnitude = u32::from_le_bytes([c[0], c[1], c[2], c[3]]) & 0x7fff_ffff;
                if magnitude >= 0x7f80_0000 {
                    return (Some(i), past_half);
                }
                if past_half.is_none() && magnitude > 0x477f_e000 {
                    past_half = Some(i);
                }
            }
            (None, past_half)
        }
        DType::F16 => (
            data.chunks_exact(2)
                .position(|c| u16::from_le_bytes([c[0], c[1]]) & 0x7c00 == 0x7c00),
            None,
        ),
    }
}

/// Finds the tensors of `config` in the safetensors bytes `bytes` (the file at `path`).
///
/// # Errors
///
/// As [`load`].
pub fn find(
    bytes: &[u8],
    config: &Config,
    path: &Path,
) -> Result<(DType, Tensors<Place>, Found), WeightsError> {
    let st = SafeTensors::deserialize(bytes).map_err(|e| WeightsError::Format {
        path: path.to_owned(),
        what: e.to_string(),
    })?;
    let (v, e, i, p) = (config.vocab, config.embd, config.inner, config.positions);
    let mut dtype: Option<DType> = None;
    let mut found = Found {
        unused_bytes: st.tensors().iter().map(|(_, t)| t.data().len()).sum(),
        past_half: None,
    };
    let mut get = |name: String, want: Vec<usize>| -> Result<Place, WeightsError> {
        let view = st
            .tensor(&format!("transformer.{name}"))
            .or_else(|_| st.tensor(&name))
            .map_err(|_| WeightsError::Missing {
                path: path.to_owned(),
                name: name.clone(),
            })?;
        if view.shape() != want.as_slice() {
            return Err(WeightsError::Shape {
                path: path.to_owned(),
                name,
                found: view.shape().to_vec(),
                want,
            });
        }
        let this = match view.dtype() {
            Dtype::F32 => DType::F32,
            Dtype::F16 => DType::F16,
            other => {
                return Err(WeightsError::Dtype {
                    path: path.to_owned(),
                    name,
                    found: format!("{other:?}"),
                    want: "F32 or F16",
                });
            }
        };
        match dtype {
            Some(d) if d != this => {
                return Err(WeightsError::Dtype {
                    path: path.to_owned(),
                    name,
                    found: format!("{:?}", view.dtype()),
                    want: if d == DType::F32 {
                        "F32, as the tensors before it"
                    } else {
                        "F16, as the tensors before it"
                    },
                });
            }
            _ => dtype = Some(this),
        }
        let (non_finite, past_half) = scan(view.data(), this);
        if let Some(index) = non_finite {
            return Err(WeightsError::NonFinite {
                path: path.to_owned(),
                name,
                index,
            });
        }
        if let (None, Some(index)) = (&found.past_half, past_half) {
            found.past_half = Some((name.clone(), index));
        }
        found.unused_bytes -= view.data().len();
        let offset = view.data().as_ptr().addr() - bytes.as_ptr().addr();
        if !offset.is_multiple_of(this.bytes()) {
            return Err(WeightsError::Misaligned {
                path: path.to_owned(),
                name,
                offset,
            });
        }
        Ok(Place {
            offset,
            len: view.data().len(),
        })
    };
    // A layer past the config's would be ignored without a word (transformers warns of unused
    // weights); other extra tensors (the attention mask buffers of older files, an untied head
    // of a tied config) are ignored.
    for name in st.names() {
        let short = name.strip_prefix("transformer.").unwrap_or(name);
        let layer = short
            .strip_prefix("h.")
            .and_then(|rest| rest.split('.').next())
            .and_then(|n| n.parse::<usize>().ok());
        if layer.is_some_and(|l| l >= config.layers) {
            return Err(WeightsError::ExtraLayer {
                path: path.to_owned(),
                name: name.to_string(),
                layers: config.layers,
            });
        }
    }
    let wte = get("wte.weight".into(), vec![v, e])?;
    let wpe = get("wpe.weight".into(), vec![p, e])?;
    let mut layers = Vec::with_capacity(config.layers);
    for l in 0..config.layers {
        let mut t = |suffix: &str, want: Vec<usize>| get(format!("h.{l}.{suffix}"), want);
        layers.push(Layer {
            ln1_g: t("ln_1.weight", vec![e])?,
            ln1_b: t("ln_1.bias", vec![e])?,
            attn_w: t("attn.c_attn.weight", vec![e, 3 * e])?,
            attn_b: t("attn.c_attn.bias", vec![3 * e])?,
            proj_w: t("attn.c_proj.weight", vec![e, e])?,
            proj_b: t("attn.c_proj.bias", vec![e])?,
            ln2_g: t("ln_2.weight", vec![e])?,
            ln2_b: t("ln_2.bias", vec![e])?,
            fc_w: t("mlp.c_fc.weight", vec![e, i])?,
            fc_b: t("mlp.c_fc.bias", vec![i])?,
            out_w: t("mlp.c_proj.weight", vec![i, e])?,
            out_b: t("mlp.c_proj.bias", vec![e])?,
        });
    }
    let lnf_g = get("ln_f.weight".into(), vec![e])?;
    let lnf_b = get("ln_f.bias".into(), vec![e])?;
    // transformers writes the untied head without the prefix.
    let lm_head = if config.tied {
        None
    } else {
        Some(get("lm_head.weight".into(), vec![v, e])?)
    };
    let dtype = dtype.unwrap_or(DType::F32);
    Ok((
        dtype,
        Tensors {
            wte,
            wpe,
            layers,
            lnf_g,
            lnf_b,
            lm_head,
        },
        found,
    ))
}

/// IEEE half bits to `f32` (exact).
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h >> 15) << 31;
    let exp = u32::from((h >> 10) & 0x1f);
    let man = u32::from(h & 0x3ff);
    let bits = match (exp, man) {
        (0, 0) => sign,
        (0, _) => {
            // Subnormal: normalise.
            let shift = man.leading_zeros() - 21;
            let man = (man << shift) & 0x3ff;
            sign | ((113 - shift) << 23) | (man << 13)
        }
        (0x1f, _) => sign | 0x7f80_0000 | (man << 13),
        _ => sign | ((exp + 112) << 23) | (man << 13),
    };
    f32::from_bits(bits)
}

/// Little-endian element bytes of `dtype` as `f32`s.
pub fn to_f32(bytes: &[u8], dtype: DType) -> Vec<f32> {
    match dtype {
        DType::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        DType::F16 => bytes
            .chunks_exact(2)
            .map(|c| f16_to_f32(u16::from_le_bytes([c[0], c[1]])))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_finite_and_past_half_values_are_found() {
        let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let ok = f32s(&[0.0, -1.5, 65504.0, -65504.0, f32::MIN_POSITIVE]);
        assert_eq!(scan(&ok, DType::F32), (None, None));
        for bad in [f32::NAN, -f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            assert_eq!(scan(&f32s(&[1.0, bad]), DType::F32), (Some(1), None));
        }
        assert_eq!(
            scan(&f32s(&[1.0, 2.0, -65520.0]), DType::F32),
            (None, Some(2))
        );
        assert_eq!(
            scan(&f32s(&[f32::MAX, f32::NAN]), DType::F32),
            (Some(1), Some(0))
        );
        // f16: 0x7c00 is +inf, 0xfe00 a NaN, 0x7bff the largest finite value.
        let halves = |v: &[u16]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        assert_eq!(scan(&halves(&[0x7bff, 0x3c00]), DType::F16), (None, None));
        assert_eq!(
            scan(&halves(&[0x3c00, 0x7c00]), DType::F16),
            (Some(1), None)
        );
        assert_eq!(scan(&halves(&[0xfe00]), DType::F16), (Some(0), None));
    }

    #[test]
    fn half_bits_convert_exactly() {
        for (h, f) in [
            (0x3c00u16, 1.0f32),
            (0xc000, -2.0),
            (0x3555, 0.333_251_95),
            (0x0001, 5.960_464_5e-8),
            (0x7bff, 65504.0),
            (0x0000, 0.0),
        ] {
            assert_eq!(f16_to_f32(h), f, "{h:#x}");
        }
        assert!(f16_to_f32(0x7c00).is_infinite() && f16_to_f32(0x7e00).is_nan());
    }
}
