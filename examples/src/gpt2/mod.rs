//! The GPT-2 decoding host (`gpt2`): a Hugging Face GPT-2 (`config.json` + `model.safetensors`)
//! decoded greedily through devcmd, on the std shim or an NVIDIA GPU, eagerly or by replaying one
//! recorded step, and checked against transformers (`--check`).
//!
//! | module | owns |
//! |---|---|
//! | [`cli`] | the flags, their defaults and refusals |
//! | [`config`] | `config.json`: the GPT2Config fields read and checked |
//! | [`weights`] | `model.safetensors`: mapped, every tensor found and its shape checked |
//! | [`kernels`] | the step's kernels as every device sees them: signatures, geometry, the CUDA C source, the GEMM's description |
//! | [`std_kernels`] | the kernels' Rust bodies on the std shim and the CPU GEMM |
//! | [`devices`] | the std device and the GPU: their kernels and GEMM |
//! | [`decode`] | the model on the device and the loop (eager or graph) |
//! | [`step`] | one step's buffers, the KV cache and the step's work |
//! | [`split`] | output projections cut along k: the parts, and one GEMM per part where the library does not batch them |
//! | [`check`] | the fixture and the comparison with transformers |

pub mod check;
pub mod cli;
pub mod config;
pub mod decode;
pub mod devices;
pub mod kernels;
pub mod split;
pub mod std_kernels;
pub mod step;
pub mod weights;
