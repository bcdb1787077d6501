//! The edge-inference host as a library: everything the `edge-host` program and the GPU
//! benchmark (`cuda-bench`) share.
//!
//! | module | owns |
//! |---|---|
//! | [`cli`] | the host's flags, their defaults and the refusal of bad values |
//! | [`model`] | the MLP: shapes, seeded weights and inputs, each launch's geometry and parameters, the CUDA C kernels, the host reference |
//! | [`serve`] | the serving loop, generic over the shim, and the weights' upload |
//! | [`replay`] | the serving loop with graphs (`--graph`): one batch recorded, replayed per batch |
//! | [`std_device`] | the kernels on the std shim (Rust closures) and its device |
//! | [`cuda_device`] | the GPU's set-up: kernels compiled with NVRTC, what the host says about the device |
//! | [`verify`] | the NaN-safe comparison with the reference |
//! | [`exit`] | the exit codes every program uses (and lists in `--help`), and which error gets which |
//! | [`weights`] | the weights file: format, writing, mapping |
//! | [`gpt2`] | the GPT-2 decoding host (`gpt2`): config, safetensors, kernels, the decoding loop, the check |

pub mod cli;
pub mod cuda_device;
pub mod exit;
pub mod gpt2;
pub mod model;
pub mod replay;
pub mod serve;
pub mod several;
pub mod std_device;
pub mod verify;
pub mod weights;

/// An error and its causes, one per line: how the hosts print a failure. Each devcmd error prints
/// its own message once and leaves its cause to `source()`, so printing only the top would drop
/// the device's own answer.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut said = text.clone();
    let mut next = e.source();
    while let Some(cause) = next {
        let line = cause.to_string();
        // A cause whose words the error before it already printed (a message that quotes its
        // OS error) is not said again.
        if !said.contains(&line) {
            text.push_str("\n  caused by: ");
            text.push_str(&line);
        }
        said = line;
        next = cause.source();
    }
    text
}
