//! The decoding step's kernels as every device sees them: their signatures (the CUDA C source,
//! whose parameter order the std kernels read by position), each launch's geometry and
//! parameters, and the GEMM's description.
//!
//! Every kernel takes its outputs first, then its inputs, then its scalars (`unsigned` or
//! `float`, 4 bytes each). A launch passes its inputs, then its outputs, as devcmd's buffer slots,
//! so the parameter list is `Buffer(inputs..inputs+outputs)`, `Buffer(0..inputs)`, scalars
//! ([`params`]). `T` is the element type of activations and weights (f32, or f16 on CUDA: the
//! source is compiled once per type with `-DGPT2_HALF`); arithmetic is f32 throughout.
//!
//! | kernel | outputs | inputs | scalars |
//! |---|---|---|---|
//! | `embed` | x, h | next, prompt, wte, wpe, state, g, b | rows, embd, prompt_len, vocab, positions, eps |
//! | `attention` | out, k cache, v cache | qkv, qkv bias, state | rows, heads, head_dim, cap, scale |
//! | `residual_ln` | x, h | y (`[parts][rows][n]`), bias, g, b | rows, n, parts, eps |
//! | `bias_gelu` | f | bias | rows, n |
//! | `argmax` | next, history, state, partials, count | logits | rows, vocab, cap |
//! | `copy_cache` | new cache | old cache | blocks, old_cap, new_cap, head_dim |
//! | `gemm` (CUDA, without cuBLAS) | c | a, b | m, n, k, trans_a, trans_b, lda, ldb, ldc, alpha, beta |
//! | `cast_f16` (CUDA) | out (f16) | in (f32) | n |
//!
//! `state[0]` is the position the step works on (the cache length before it): read by `embed`,
//! `attention` and `argmax`, incremented by `argmax` at the end of the step, so a recorded step
//! replays unchanged. `embed` also norms the row for the first layer (`h`).
//!
//! At batch 1 a step is latency-bound: what counts is launches and dependent memory round trips,
//! not bandwidth. So the embedding carries the first norm, the argmax the position's advance,
//! and the argmax runs over [`ARGMAX_SPLIT`] blocks per row (each leaves its winner in a
//! scratch buffer; the grid's last block to finish, counted with an atomic, picks each row's
//! token; the count, an `atomicInc` wrapping at the grid size, is 0 again after every launch:
//! [`argmax_partials`]). Splitting the attention the same
//! way (flash-decoding) was measured and lost: 12.8 against 7.7 µs a layer on the H200 at 160
//! positions, its extra round trips (publish, count, combine) costing more than the parallelism
//! gains. GEMMs are library work ([`devcmd::Gemm`]: `devcmd_std::blas` on std,
//! cuBLAS on a GPU); the CUDA `gemm` kernel runs only where cuBLAS does not load. Token buffers
//! are `u32`; `prompt` is `[prompt_len][rows]`, `history` `[positions][rows]` (row `p` holds the
//! tokens predicted at position `p`); a cache is `[rows · heads][cap][head_dim]`.

use devcmd::{Command, Gemm, GemmType, Handle, KernelParam, Launch, LaunchDims, ServerError, Shim};

/// Threads per block of the row kernels (layer norms, embedding).
pub const ROW_BLOCK: u32 = 256;
/// Threads per block of the attention kernel (one block per row and head): a thread per
/// position for the scores (one pass up to 256 positions, the first 256 rows' keys loaded with
/// the query), 32 groups of 8 lanes for the weighted values of a 64-wide f16 head (16 groups
/// of 16 lanes in f32). 256 leaves a thread the registers the fast path's early loads need; no
/// kernel declares `__launch_bounds__`, which slowed a step from 439 to 463 µs on the H200.
pub const ATTN_BLOCK: u32 = 256;
// The 64-wide path keeps a (max, sum) pair per warp in 32 floats: 16 warps at most.
const _: () = assert!(ATTN_BLOCK.is_multiple_of(32) && ATTN_BLOCK <= 512);
/// Threads per block of the argmax.
pub const ARGMAX_BLOCK: u32 = 256;
/// Blocks per row of the argmax, each over a slice of the vocabulary.
pub const ARGMAX_SPLIT: usize = 16;
/// Threads per block of the element-wise kernels.
pub const ELEM_BLOCK: u32 = 256;

/// The step's kernels of one device, loaded once.
#[derive(Debug, Clone)]
pub struct Kernels<K> {
    pub embed: K,
    pub attention: K,
    pub residual_ln: K,
    pub bias_gelu: K,
    pub argmax: K,
    pub copy_cache: K,
}

/// `Y[rows × out] = X[rows × in] · W[in × out]` over row-major activations and a Conv1D weight
/// (`[in, out]` row-major, Hugging Face's layout): the column-major `Yᵀ = Wᵀ · Xᵀ` with `A = W`,
/// `B = X`, `C = Y`, all packed.
pub fn linear(dtype: GemmType, rows: usize, inputs: usize, outputs: usize) -> Gemm {
    Gemm::packed(dtype, outputs as u32, rows as u32, inputs as u32)
}

/// `logits[rows × vocab] = X[rows × embd] · Eᵀ` with `E` the `[vocab, embd]` embedding (or untied
/// head): the column-major product with `A = E` transposed (`lda = embd`).
pub fn head(dtype: GemmType, rows: usize, embd: usize, vocab: usize) -> Gemm {
    Gemm {
        trans_a: true,
        lda: embd as u32,
        ..Gemm::packed(dtype, vocab as u32, rows as u32, embd as u32)
    }
}

/// The scalars of the fallback `gemm` kernel, in its order.
pub fn gemm_scalars(g: &Gemm) -> [[u8; 4]; 10] {
    let u = |v: u32| v.to_ne_bytes();
    [
        u(g.m),
        u(g.n),
        u(g.k),
        u(u32::from(g.trans_a)),
        u(u32::from(g.trans_b)),
        u(g.lda),
        u(g.ldb),
        u(g.ldc),
        g.alpha.to_ne_bytes(),
        g.beta.to_ne_bytes(),
    ]
}

/// A scalar parameter's bytes.
pub fn u32s(v: usize) -> [u8; 4] {
    (v as u32).to_ne_bytes()
}

/// A float parameter's bytes.
pub fn f32s(v: f32) -> [u8; 4] {
    v.to_ne_bytes()
}

/// The parameters of a kernel above for a launch of `inputs` inputs and `outputs` outputs:
/// outputs, inputs, then the scalars.
pub fn params(inputs: usize, outputs: usize, scalars: &[[u8; 4]]) -> Vec<KernelParam<'_>> {
    (inputs..inputs + outputs)
        .chain(0..inputs)
        .map(KernelParam::Buffer)
        .chain(scalars.iter().map(|s| KernelParam::Scalar(s)))
        .collect()
}

/// Launches kernel `k` over `inputs` and `outputs` with `scalars`.
///
/// # Errors
///
/// The launch's refusal ([`Command::launch`]).
pub fn launch<S: Shim>(
    cmd: &mut Command<'_, S>,
    k: &S::Kernel,
    dims: LaunchDims,
    inputs: &[&Handle],
    outputs: &[&Handle],
    scalars: &[[u8; 4]],
) -> Result<(), ServerError> {
    cmd.launch(Launch {
        kernel: k,
        dims,
        inputs,
        outputs,
        params: &params(inputs.len(), outputs.len(), scalars),
    })
}

/// 16-byte vectors a lane of a one-warp row kernel keeps (`ROW_VECS` in the source).
pub const ROW_VECS: usize = 4;

/// One block per row of `n` elements of `elem_bytes` each: one warp where the row is a whole
/// number of 16-byte vectors per lane, at most [`ROW_VECS`] (the kernels then norm it from
/// registers with shuffles alone: at batch 1 a row kernel is latency-bound), else
/// [`ROW_BLOCK`] threads.
pub fn rows_dims(rows: usize, n: usize, elem_bytes: usize) -> LaunchDims {
    let per_warp = 32 * (16 / elem_bytes.max(1));
    let warp = n.is_multiple_of(per_warp) && n / per_warp <= ROW_VECS;
    LaunchDims::linear(rows as u32, if warp { 32 } else { ROW_BLOCK })
}

/// One block per row and head, with its dynamic shared memory ([`attention_shared_bytes`]).
pub fn attention_dims(rows: usize, heads: usize, head_dim: usize, cap: usize) -> LaunchDims {
    let mut d = LaunchDims::linear((rows * heads) as u32, ATTN_BLOCK);
    d.shared_bytes = attention_shared_bytes(head_dim, cap) as u32;
    d
}

/// Bytes of shared memory the attention kernel needs over `cap` positions, all f32. A 64-wide
/// head: the query, the new key and value, the scores, a reduction's room (32 floats) and a
/// warp's partial sums per warp. Any other width: the query, the scores, the reduction's room
/// and the partial sums of its groups of `head_dim` threads (one group when a head is wider
/// than a block).
pub fn attention_shared_bytes(head_dim: usize, cap: usize) -> usize {
    if head_dim == 64 {
        return (3 * 64 + cap + 32 + ATTN_BLOCK as usize / 32 * 64) * 4;
    }
    let width = head_dim.clamp(1, ATTN_BLOCK as usize);
    let groups = ATTN_BLOCK as usize / width;
    (head_dim + cap + 32 + groups * head_dim) * 4
}

/// Elements (u32) of the argmax's partials: per row and block a value's bits and its index.
pub fn argmax_partials(rows: usize) -> usize {
    rows * ARGMAX_SPLIT * 2
}

/// The most shared memory a kernel may use without opting in, on every CUDA device.
pub const SHARED_LIMIT: usize = 48 << 10;

/// [`ARGMAX_SPLIT`] blocks of [`ARGMAX_BLOCK`] threads per row.
pub fn argmax_dims(rows: usize) -> LaunchDims {
    LaunchDims::linear((rows * ARGMAX_SPLIT) as u32, ARGMAX_BLOCK)
}

/// One thread per element.
pub fn elem_dims(elements: usize) -> LaunchDims {
    LaunchDims::covering(elements as u64, ELEM_BLOCK)
}

/// The signatures of the kernels (name, parameter sizes in bytes) for bindings that cannot read
/// them from the driver.
pub const SIGNATURES: &[(&str, &[usize])] = &[
    ("embed", &[8, 8, 8, 8, 8, 8, 8, 8, 8, 4, 4, 4, 4, 4, 4]),
    ("attention", &[8, 8, 8, 8, 8, 8, 4, 4, 4, 4, 4]),
    ("residual_ln", &[8, 8, 8, 8, 8, 8, 4, 4, 4, 4]),
    ("bias_gelu", &[8, 8, 4, 4]),
    ("argmax", &[8, 8, 8, 8, 8, 8, 4, 4, 4]),
    ("copy_cache", &[8, 8, 4, 4, 4, 4]),
    ("gemm", &[8, 8, 8, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4]),
    ("cast_f16", &[8, 8, 4]),
];

/// The kernels in CUDA C. `T` is `float`, or IEEE half bits (`unsigned short`) with
/// `-DGPT2_HALF`, converted with PTX's `cvt` (no header needed).
pub const CUDA_SOURCE: &str = include_str!("kernels.cu");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_is_in_the_source_with_its_parameter_count() {
        for (name, sizes) in SIGNATURES {
            // The kernel's own line: `extern "C" __global__ void name(`.
            let start = CUDA_SOURCE
                .match_indices(&format!(" {name}("))
                .map(|(at, _)| at + 1)
                .find(|&at| {
                    let line = CUDA_SOURCE[..at].rsplit('\n').next().unwrap_or("");
                    line.starts_with("extern \"C\" __global__ void")
                })
                .unwrap_or_else(|| panic!("{name} is not in the source"));
            let sig = &CUDA_SOURCE[start..];
            let sig = &sig[..sig.find(')').expect("closing parenthesis")];
            assert_eq!(sig.matches(',').count() + 1, sizes.len(), "{name}: {sig}");
            assert_eq!(
                sig.matches('*').count(),
                sizes.iter().filter(|&&s| s == 8).count()
            );
        }
    }

    #[test]
    fn rows_take_one_warp_where_they_are_whole_vectors_per_lane() {
        // GPT-2 small in f16: 768 = 3 vectors of 8 per lane.
        assert_eq!(rows_dims(1, 768, 2).block.x, 32);
        // In f32 the same row is 6 vectors per lane: past ROW_VECS, the block-wide path.
        assert_eq!(rows_dims(1, 768, 4).block.x, ROW_BLOCK);
        // Not a whole number of vectors per lane.
        assert_eq!(rows_dims(8, 64, 2).block.x, ROW_BLOCK);
        assert_eq!(rows_dims(8, 512, 4).grid.x, 8);
    }

    #[test]
    fn the_argmax_splits_every_row_and_keeps_a_pair_per_block() {
        assert_eq!(argmax_dims(3).grid.x, 3 * ARGMAX_SPLIT as u32);
        assert_eq!(argmax_partials(3), 3 * ARGMAX_SPLIT * 2);
    }

    #[test]
    fn a_linear_layer_and_the_head_are_column_major_products() {
        let g = linear(GemmType::F32, 2, 64, 192);
        assert_eq!(
            (g.m, g.n, g.k, g.lda, g.ldb, g.ldc),
            (192, 2, 64, 192, 64, 192)
        );
        assert_eq!(g.bytes(), (64 * 192 * 4, 2 * 64 * 4, 2 * 192 * 4));
        let h = head(GemmType::F32, 2, 64, 256);
        assert_eq!(h.bytes(), (256 * 64 * 4, 2 * 64 * 4, 2 * 256 * 4));
        assert!(
            h.check("lm_head", 256 * 64 * 4, 2 * 64 * 4, 2 * 256 * 4)
                .is_ok()
        );
        let p = params(2, 1, &[[0; 4]]);
        assert!(matches!(
            p.as_slice(),
            [
                KernelParam::Buffer(2),
                KernelParam::Buffer(0),
                KernelParam::Buffer(1),
                KernelParam::Scalar(_)
            ]
        ));
    }

    /// Every kernel parses and type-checks, in f32 and f16, with the host's C++ compiler and
    /// stand-ins for CUDA's builtins (`kernels_host_check.h`): NVRTC compiles them only on a GPU
    /// machine, which `cargo test` here does not reach. Skipped, with a line saying so (seen
    /// with `--nocapture`), where no `c++` runs, unless `DEVCMD_REQUIRE_CXX` is set, as
    /// `scripts/test` sets it: there a missing compiler fails.
    #[test]
    fn the_kernels_parse_and_type_check_with_the_host_compiler() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/gpt2");
        for define in [None, Some("-DGPT2_HALF")] {
            let mut c = std::process::Command::new("c++");
            c.args([
                "-std=c++17",
                "-fsyntax-only",
                "-Werror",
                "-Wno-unknown-pragmas",
            ])
            .args(define)
            .args(["-include", &format!("{dir}/kernels_host_check.h")])
            .args(["-x", "c++", &format!("{dir}/kernels.cu")]);
            let out = match c.output() {
                Ok(out) => out,
                Err(e) => {
                    assert!(
                        std::env::var_os("DEVCMD_REQUIRE_CXX").is_none(),
                        "DEVCMD_REQUIRE_CXX is set but `c++` does not run ({e}): install g++"
                    );
                    println!("SKIPPED: no host C++ compiler to check kernels.cu with ({e})");
                    return;
                }
            };
            assert!(
                out.status.success(),
                "kernels.cu ({define:?}) does not compile:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}
