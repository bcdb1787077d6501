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
//! | `embed` | x | next, prompt, wte, wpe, state | rows, embd, prompt_len, vocab, positions |
//! | `layer_norm` | out | x, g, b | rows, n, eps |
//! | `attention` | out, k cache, v cache | qkv, qkv bias, state | rows, heads, head_dim, cap, scale |
//! | `residual_ln` | x, h | y, bias, g, b | rows, n, eps |
//! | `bias_gelu` | f | bias | rows, n |
//! | `argmax` | next, history | logits, state | rows, vocab, cap |
//! | `advance` | state | | |
//! | `copy_cache` | new cache | old cache | blocks, old_cap, new_cap, head_dim |
//! | `gemm` (CUDA, without cuBLAS) | c | a, b | m, n, k, trans_a, trans_b, lda, ldb, ldc, alpha, beta |
//! | `cast_f16` (CUDA) | out (f16) | in (f32) | n |
//!
//! `state[0]` is the position the step works on (the cache length before it): read by `embed`,
//! `attention` and `argmax`, incremented by `advance` at the end of the step, so a recorded step
//! replays unchanged. GEMMs are library work ([`devcmd::Gemm`]: `devcmd_std::blas` on std,
//! cuBLAS on a GPU); the CUDA `gemm` kernel runs only where cuBLAS does not load. Token buffers
//! are `u32`; `prompt` is `[prompt_len][rows]`, `history` `[positions][rows]` (row `p` holds the
//! tokens predicted at position `p`); a cache is `[rows · heads][cap][head_dim]`.

use devcmd::{Command, Gemm, GemmType, Handle, KernelParam, Launch, LaunchDims, ServerError, Shim};

/// Threads per block of the row kernels (layer norms, embedding).
pub const ROW_BLOCK: u32 = 256;
/// Threads per block of the attention kernel (one block per row and head): a thread per
/// position for the scores (one pass up to 512 positions), 8 groups of a 64-wide head for the
/// weighted values.
pub const ATTN_BLOCK: u32 = 512;
/// Threads per block of the argmax (one block per row of a vocabulary of 50,257). Neither kernel
/// declares `__launch_bounds__`: on the H200 declaring 512 and 1024 slowed a GPT-2 small step
/// from 439 to 463 µs (two runs each, alternating).
pub const ARGMAX_BLOCK: u32 = 1024;
/// Threads per block of the element-wise kernels.
pub const ELEM_BLOCK: u32 = 256;

/// The step's kernels of one device, loaded once.
#[derive(Debug, Clone)]
pub struct Kernels<K> {
    pub embed: K,
    pub layer_norm: K,
    pub attention: K,
    pub residual_ln: K,
    pub bias_gelu: K,
    pub argmax: K,
    pub advance: K,
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

/// One block per row.
pub fn rows_dims(rows: usize) -> LaunchDims {
    LaunchDims::linear(rows as u32, ROW_BLOCK)
}

/// One block per row and head, with its dynamic shared memory ([`attention_shared_bytes`]).
pub fn attention_dims(rows: usize, heads: usize, head_dim: usize, cap: usize) -> LaunchDims {
    let mut d = LaunchDims::linear((rows * heads) as u32, ATTN_BLOCK);
    d.shared_bytes = attention_shared_bytes(head_dim, cap) as u32;
    d
}

/// Bytes of shared memory the attention kernel needs over `cap` positions: the query, the
/// scores, a reduction's room (32 floats) and the partial sums of its groups of `head_dim`
/// threads (one group when a head is wider than a block), all f32.
pub fn attention_shared_bytes(head_dim: usize, cap: usize) -> usize {
    let width = head_dim.clamp(1, ATTN_BLOCK as usize);
    let groups = ATTN_BLOCK as usize / width;
    (head_dim + cap + 32 + groups * head_dim) * 4
}

/// The most shared memory a kernel may use without opting in, on every CUDA device.
pub const SHARED_LIMIT: usize = 48 << 10;

/// One block of [`ARGMAX_BLOCK`] threads per row.
pub fn argmax_dims(rows: usize) -> LaunchDims {
    LaunchDims::linear(rows as u32, ARGMAX_BLOCK)
}

/// One thread per element.
pub fn elem_dims(elements: usize) -> LaunchDims {
    LaunchDims::covering(elements as u64, ELEM_BLOCK)
}

/// The signatures of the kernels (name, parameter sizes in bytes) for bindings that cannot read
/// them from the driver.
pub const SIGNATURES: &[(&str, &[usize])] = &[
    ("embed", &[8, 8, 8, 8, 8, 8, 4, 4, 4, 4, 4]),
    ("layer_norm", &[8, 8, 8, 8, 4, 4, 4]),
    ("attention", &[8, 8, 8, 8, 8, 8, 4, 4, 4, 4, 4]),
    ("residual_ln", &[8, 8, 8, 8, 8, 8, 4, 4, 4]),
    ("bias_gelu", &[8, 8, 4, 4]),
    ("argmax", &[8, 8, 8, 8, 4, 4, 4]),
    ("advance", &[8]),
    ("copy_cache", &[8, 8, 4, 4, 4, 4]),
    ("gemm", &[8, 8, 8, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4]),
    ("cast_f16", &[8, 8, 4]),
];

/// The kernels in CUDA C. `T` is `float`, or IEEE half bits (`unsigned short`) with
/// `-DGPT2_HALF`, converted with PTX's `cvt` (no header needed).
pub const CUDA_SOURCE: &str = r#"
__device__ __forceinline__ float h2f(unsigned short v) {
    float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v)); return f;
}
__device__ __forceinline__ unsigned short f2h(float f) {
    unsigned short v; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(v) : "f"(f)); return v;
}
#ifdef GPT2_HALF
typedef unsigned short T;
__device__ __forceinline__ float ld(T v) { return h2f(v); }
__device__ __forceinline__ T st(float f) { return f2h(f); }
#else
typedef float T;
__device__ __forceinline__ float ld(T v) { return v; }
__device__ __forceinline__ T st(float f) { return f; }
#endif
#define NEG_INF __int_as_float(0xff800000)

/* Block-wide sum and max over a block of whole warps; every thread gets the result. */
__device__ float block_sum(float v, float *red) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    unsigned warps = (blockDim.x + 31u) >> 5;
    v = lane < warps ? red[lane] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ float block_max(float v, float *red) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    unsigned warps = (blockDim.x + 31u) >> 5;
    v = lane < warps ? red[lane] : NEG_INF;
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* out = layer norm of x (already in T) with g, b: mean, then the biased variance around it. */
__device__ void norm_row(T *out, const T *x, const T *g, const T *b, unsigned n, float eps,
                         float *red) {
    float s = 0.0f;
    for (unsigned j = threadIdx.x; j < n; j += blockDim.x) s += ld(x[j]);
    float mean = block_sum(s, red) / (float)n;
    float q = 0.0f;
    for (unsigned j = threadIdx.x; j < n; j += blockDim.x) { float d = ld(x[j]) - mean; q += d * d; }
    float rstd = rsqrtf(block_sum(q, red) / (float)n + eps);
    for (unsigned j = threadIdx.x; j < n; j += blockDim.x)
        out[j] = st((ld(x[j]) - mean) * rstd * ld(g[j]) + ld(b[j]));
}

extern "C" __global__ void embed(T *x, const unsigned *next, const unsigned *prompt,
                                 const T *wte, const T *wpe, const unsigned *state,
                                 unsigned rows, unsigned embd, unsigned prompt_len,
                                 unsigned vocab, unsigned positions) {
    unsigned r = blockIdx.x;
    if (r >= rows) return;
    unsigned pos = state[0];
    unsigned tok = pos < prompt_len ? prompt[(size_t)pos * rows + r] : next[r];
    if (tok >= vocab) tok = vocab - 1;
    if (pos >= positions) pos = positions - 1;
    for (unsigned j = threadIdx.x; j < embd; j += blockDim.x)
        x[(size_t)r * embd + j] = st(ld(wte[(size_t)tok * embd + j]) + ld(wpe[(size_t)pos * embd + j]));
}

/* Elements of a row a thread keeps in registers: rows up to NORM_PER * blockDim.x wide are
   normed from registers (one read of the row), wider ones by norm_row. */
#define NORM_PER 8u

/* norm_row over a row kept in registers: v[i] is element threadIdx.x + i * blockDim.x (in T's
   precision), 0 past n. The scale and shift are read before the reductions, beside the row. */
__device__ __forceinline__ void norm_kept(T *out, const float *v, const T *g, const T *b,
                                          unsigned n, float eps, float *red) {
    float gk[NORM_PER], bk[NORM_PER];
#pragma unroll
    for (unsigned i = 0; i < NORM_PER; ++i) {
        unsigned j = threadIdx.x + i * blockDim.x;
        gk[i] = j < n ? ld(g[j]) : 0.0f;
        bk[i] = j < n ? ld(b[j]) : 0.0f;
    }
    float s = 0.0f;
#pragma unroll
    for (unsigned i = 0; i < NORM_PER; ++i) s += v[i];
    float mean = block_sum(s, red) / (float)n;
    float q = 0.0f;
#pragma unroll
    for (unsigned i = 0; i < NORM_PER; ++i) {
        unsigned j = threadIdx.x + i * blockDim.x;
        float d = j < n ? v[i] - mean : 0.0f;
        q += d * d;
    }
    float rstd = rsqrtf(block_sum(q, red) / (float)n + eps);
#pragma unroll
    for (unsigned i = 0; i < NORM_PER; ++i) {
        unsigned j = threadIdx.x + i * blockDim.x;
        if (j < n) out[j] = st((v[i] - mean) * rstd * gk[i] + bk[i]);
    }
}

extern "C" __global__ void layer_norm(T *out, const T *x, const T *g, const T *b,
                                      unsigned rows, unsigned n, float eps) {
    __shared__ float red[32];
    unsigned r = blockIdx.x;
    if (r >= rows) return;
    const T *xr = x + (size_t)r * n;
    if (n > NORM_PER * blockDim.x) {
        norm_row(out + (size_t)r * n, xr, g, b, n, eps, red);
        return;
    }
    float v[NORM_PER];
#pragma unroll
    for (unsigned i = 0; i < NORM_PER; ++i) {
        unsigned j = threadIdx.x + i * blockDim.x;
        v[i] = j < n ? ld(xr[j]) : 0.0f;
    }
    norm_kept(out + (size_t)r * n, v, g, b, n, eps, red);
}

extern "C" __global__ void residual_ln(T *x, T *h, const T *y, const T *bias, const T *g,
                                       const T *b, unsigned rows, unsigned n, float eps) {
    __shared__ float red[32];
    unsigned r = blockIdx.x;
    if (r >= rows) return;
    T *xr = x + (size_t)r * n;
    const T *yr = y + (size_t)r * n;
    if (n > NORM_PER * blockDim.x) {
        /* Each thread reads back only the elements it wrote. */
        for (unsigned j = threadIdx.x; j < n; j += blockDim.x)
            xr[j] = st(ld(xr[j]) + (ld(yr[j]) + ld(bias[j])));
        norm_row(h + (size_t)r * n, xr, g, b, n, eps, red);
        return;
    }
    float v[NORM_PER];
#pragma unroll
    for (unsigned i = 0; i < NORM_PER; ++i) {
        unsigned j = threadIdx.x + i * blockDim.x;
        v[i] = 0.0f;
        if (j < n) {
            T sum = st(ld(xr[j]) + (ld(yr[j]) + ld(bias[j])));
            xr[j] = sum;
            v[i] = ld(sum);
        }
    }
    norm_kept(h + (size_t)r * n, v, g, b, n, eps, red);
}

/* q · k over a head: 16-byte loads where a cached row is a whole number of them (the cache's
   rows start 16-byte aligned then), else one element at a time. */
__device__ __forceinline__ float dot_head(const float *q, const T *k, unsigned hd) {
    float acc = 0.0f;
    const unsigned per = 16u / sizeof(T);
    if (hd % per == 0u) {
        const uint4 *k4 = (const uint4 *)k;
        for (unsigned i = 0; i < hd / per; ++i) {
            uint4 w = k4[i];
            const T *e = (const T *)&w;
#pragma unroll
            for (unsigned j = 0; j < per; ++j) acc += q[i * per + j] * ld(e[j]);
        }
    } else {
        for (unsigned d = 0; d < hd; ++d) acc += q[d] * ld(k[d]);
    }
    return acc;
}

/* One block per row and head. The scores: a thread per cached position (one pass up to
   blockDim.x positions). The weighted values: the block splits into `groups` of `hd` threads,
   group g summing positions g, g + groups, ... with four accumulators; the groups' partial sums
   meet in shared memory. */
extern "C" __global__ void attention(T *out, T *kc, T *vc, const T *qkv, const T *bias,
                                     const unsigned *state, unsigned rows, unsigned heads,
                                     unsigned hd, unsigned cap, float scale) {
    extern __shared__ float sm[];
    float *q = sm, *s = sm + hd, *red = sm + hd + cap, *part = red + 32;
    unsigned bh = blockIdx.x;
    if (bh >= rows * heads) return;
    unsigned r = bh / heads, h = bh - r * heads, e = heads * hd;
    unsigned pos = state[0];
    if (pos >= cap) pos = cap - 1;
    const T *row = qkv + (size_t)r * 3 * e;
    size_t base = ((size_t)r * heads + h) * cap;
    for (unsigned d = threadIdx.x; d < hd; d += blockDim.x) {
        unsigned c = h * hd + d;
        q[d] = ld(st(ld(row[c]) + ld(bias[c])));
        kc[(base + pos) * hd + d] = st(ld(row[e + c]) + ld(bias[e + c]));
        vc[(base + pos) * hd + d] = st(ld(row[2 * e + c]) + ld(bias[2 * e + c]));
    }
    __syncthreads();
    float mx = NEG_INF;
    for (unsigned t = threadIdx.x; t <= pos; t += blockDim.x) {
        float acc = dot_head(q, kc + (base + t) * hd, hd) * scale;
        s[t] = acc;
        mx = fmaxf(mx, acc);
    }
    mx = block_max(mx, red);
    float sum = 0.0f;
    for (unsigned t = threadIdx.x; t <= pos; t += blockDim.x) {
        float p = expf(s[t] - mx);
        s[t] = p;
        sum += p;
    }
    sum = block_sum(sum, red);
    __syncthreads();
    unsigned width = hd < blockDim.x ? hd : blockDim.x;
    unsigned groups = blockDim.x / width, g = threadIdx.x / width;
    if (g < groups) {
        for (unsigned d = threadIdx.x - g * width; d < hd; d += width) {
            const T *v = vc + base * hd + d;
            float a[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            unsigned t = g;
            for (; t + 3u * groups <= pos; t += 4u * groups) {
#pragma unroll
                for (unsigned c = 0; c < 4u; ++c)
                    a[c] += s[t + c * groups] * ld(v[(size_t)(t + c * groups) * hd]);
            }
            for (; t <= pos; t += groups) a[0] += s[t] * ld(v[(size_t)t * hd]);
            part[g * hd + d] = (a[0] + a[1]) + (a[2] + a[3]);
        }
    }
    __syncthreads();
    for (unsigned d = threadIdx.x; d < hd; d += blockDim.x) {
        float acc = 0.0f;
        for (unsigned i = 0; i < groups; ++i) acc += part[i * hd + d];
        out[(size_t)r * e + h * hd + d] = st(acc / sum);
    }
}

extern "C" __global__ void bias_gelu(T *f, const T *bias, unsigned rows, unsigned n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)rows * n) return;
    float v = ld(st(ld(f[i]) + ld(bias[i % n])));
    f[i] = st(0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v))));
}

extern "C" __global__ void argmax(unsigned *next, unsigned *history, const T *logits,
                                  const unsigned *state, unsigned rows, unsigned vocab,
                                  unsigned cap) {
    __shared__ float bv[32];
    __shared__ unsigned bi[32];
    unsigned r = blockIdx.x;
    if (r >= rows) return;
    const T *l = logits + (size_t)r * vocab;
    /* Four lanes of candidates per thread, so four loads are in flight; each keeps its first
       maximum (its indices only grow), and the smaller index wins a tie between them. */
    float bb[4] = {NEG_INF, NEG_INF, NEG_INF, NEG_INF};
    unsigned ii[4] = {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu};
    unsigned j = threadIdx.x, bd = blockDim.x;
    for (; j + 3u * bd < vocab; j += 4u * bd) {
#pragma unroll
        for (unsigned c = 0; c < 4u; ++c) {
            float v = ld(l[j + c * bd]);
            if (v > bb[c]) { bb[c] = v; ii[c] = j + c * bd; }
        }
    }
    for (; j < vocab; j += bd) {
        float v = ld(l[j]);
        if (v > bb[0]) { bb[0] = v; ii[0] = j; }
    }
    float best = bb[0];
    unsigned idx = ii[0];
#pragma unroll
    for (unsigned c = 1; c < 4u; ++c)
        if (bb[c] > best || (bb[c] == best && ii[c] < idx)) { best = bb[c]; idx = ii[c]; }
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, best, o);
        unsigned oi = __shfl_xor_sync(0xffffffffu, idx, o);
        if (ov > best || (ov == best && oi < idx)) { best = ov; idx = oi; }
    }
    unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    if (lane == 0) { bv[warp] = best; bi[warp] = idx; }
    __syncthreads();
    if (warp == 0) {
        unsigned warps = (blockDim.x + 31u) >> 5;
        best = lane < warps ? bv[lane] : NEG_INF;
        idx = lane < warps ? bi[lane] : 0xffffffffu;
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, best, o);
            unsigned oi = __shfl_xor_sync(0xffffffffu, idx, o);
            if (ov > best || (ov == best && oi < idx)) { best = ov; idx = oi; }
        }
        if (lane == 0) {
            if (idx >= vocab) idx = 0;
            next[r] = idx;
            unsigned pos = state[0];
            if (pos < cap) history[(size_t)pos * rows + r] = idx;
        }
    }
}

extern "C" __global__ void advance(unsigned *state) {
    if (blockIdx.x == 0 && threadIdx.x == 0) state[0] += 1u;
}

/* A cache moved to room for new_cap positions: every cached position of every row and head. */
extern "C" __global__ void copy_cache(T *dst, const T *src, unsigned blocks, unsigned old_cap,
                                      unsigned new_cap, unsigned hd) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t per = (size_t)old_cap * hd;
    if (i >= (size_t)blocks * per || old_cap > new_cap) return;
    size_t b = i / per, rest = i - b * per;
    dst[b * new_cap * hd + rest] = src[i];
}

/* The fallback GEMM where cuBLAS does not load (one thread per element of C), column-major as cuBLAS. */
extern "C" __global__ void gemm(T *c, const T *a, const T *b, unsigned m, unsigned n, unsigned k,
                                unsigned ta, unsigned tb, unsigned lda, unsigned ldb,
                                unsigned ldc, float alpha, float beta) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)m * n) return;
    unsigned i = (unsigned)(idx % m), j = (unsigned)(idx / m);
    float acc = 0.0f;
    for (unsigned kk = 0; kk < k; ++kk) {
        float av = ld(ta ? a[(size_t)i * lda + kk] : a[i + (size_t)kk * lda]);
        float bv = ld(tb ? b[j + (size_t)kk * ldb] : b[kk + (size_t)j * ldb]);
        acc += av * bv;
    }
    T *cp = c + i + (size_t)j * ldc;
    float v = alpha * acc;
    if (beta != 0.0f) v += beta * ld(*cp);
    *cp = st(v);
}

extern "C" __global__ void cast_f16(unsigned short *out, const float *in, unsigned n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = f2h(in[i]);
}
"#;

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
}
