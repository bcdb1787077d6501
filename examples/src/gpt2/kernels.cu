/* The decoding step's kernels in CUDA C: see kernels.rs, which includes this file. */
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

/* One-warp rows: a block of 32 threads holds a row of n elements in registers, lane l keeping
   16-byte vectors l, l + 32, ... (ROW_VECS at most); loads and stores are 16 bytes and the
   reductions shuffles alone, so the row costs one round trip to memory. Taken where the host
   launched 32 threads, n is a whole number of vectors per lane and every row is 16-byte aligned
   (else the kernels fall back to the block-wide path). */
#define ROW_VECS 4u
#define VEC (16u / (unsigned)sizeof(T))
union V16 { uint4 u; T e[16u / sizeof(T)]; };

__device__ __forceinline__ bool al16(const void *p) { return ((size_t)p & 15u) == 0u; }

__device__ __forceinline__ bool warp_row(unsigned n) {
    return blockDim.x == 32u && n % (32u * VEC) == 0u && n / (32u * VEC) <= ROW_VECS;
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* out = layer norm of the row the warp holds in v (0 past the row's vectors) with the scale
   and shift the warp loaded (gk, bk: its vectors of g and b). */
__device__ __forceinline__ void warp_norm_kept(T *out, const float *v, const V16 *gk,
                                               const V16 *bk, unsigned n, float eps) {
    unsigned lane = threadIdx.x, nv = n / (32u * VEC);
    float s = 0.0f;
#pragma unroll
    for (unsigned i = 0; i < ROW_VECS * VEC; ++i) s += v[i];
    float mean = warp_sum(s) / (float)n;
    float q = 0.0f;
#pragma unroll
    for (unsigned i = 0; i < ROW_VECS * VEC; ++i) {
        float d = i / VEC < nv ? v[i] - mean : 0.0f;
        q += d * d;
    }
    float rstd = rsqrtf(warp_sum(q) / (float)n + eps);
    uint4 *o4 = (uint4 *)out;
#pragma unroll
    for (unsigned i = 0; i < ROW_VECS; ++i) {
        if (i < nv) {
            V16 o;
#pragma unroll
            for (unsigned j = 0; j < VEC; ++j)
                o.e[j] = st((v[i * VEC + j] - mean) * rstd * ld(gk[i].e[j]) + ld(bk[i].e[j]));
            o4[i * 32u + lane] = o.u;
        }
    }
}

/* out = layer norm of the row the warp holds in v (0 past the row's vectors) with g, b. */
__device__ __forceinline__ void warp_norm(T *out, const float *v, const T *g, const T *b,
                                          unsigned n, float eps) {
    unsigned lane = threadIdx.x, nv = n / (32u * VEC);
    const uint4 *g4 = (const uint4 *)g, *b4 = (const uint4 *)b;
    V16 gk[ROW_VECS], bk[ROW_VECS];
#pragma unroll
    for (unsigned i = 0; i < ROW_VECS; ++i)
        if (i < nv) { gk[i].u = g4[i * 32u + lane]; bk[i].u = b4[i * 32u + lane]; }
    warp_norm_kept(out, v, gk, bk, n, eps);
}

/* The row's embedding (token plus position) into x, and its norm for the first layer into h. */
extern "C" __global__ void embed(T *x, T *h, const unsigned *next, const unsigned *prompt,
                                 const T *wte, const T *wpe, const unsigned *state, const T *g,
                                 const T *b, unsigned rows, unsigned embd, unsigned prompt_len,
                                 unsigned vocab, unsigned positions, float eps) {
    __shared__ float red[32];
    unsigned r = blockIdx.x;
    if (r >= rows) return;
    unsigned pos = state[0];
    unsigned tok = pos < prompt_len ? prompt[(size_t)pos * rows + r] : next[r];
    if (tok >= vocab) tok = vocab - 1;
    if (pos >= positions) pos = positions - 1;
    T *xr = x + (size_t)r * embd;
    const T *te = wte + (size_t)tok * embd, *pe = wpe + (size_t)pos * embd;
    if (warp_row(embd) && al16(xr) && al16(te) && al16(pe) && al16(h) && al16(g) && al16(b)) {
        unsigned lane = threadIdx.x, nv = embd / (32u * VEC);
        const uint4 *t4 = (const uint4 *)te, *p4 = (const uint4 *)pe;
        uint4 *x4 = (uint4 *)xr;
        float v[ROW_VECS * VEC];
#pragma unroll
        for (unsigned i = 0; i < ROW_VECS; ++i) {
            if (i < nv) {
                V16 a, c, o;
                a.u = t4[i * 32u + lane];
                c.u = p4[i * 32u + lane];
#pragma unroll
                for (unsigned j = 0; j < VEC; ++j) {
                    o.e[j] = st(ld(a.e[j]) + ld(c.e[j]));
                    v[i * VEC + j] = ld(o.e[j]);
                }
                x4[i * 32u + lane] = o.u;
            } else {
#pragma unroll
                for (unsigned j = 0; j < VEC; ++j) v[i * VEC + j] = 0.0f;
            }
        }
        warp_norm(h + (size_t)r * embd, v, g, b, embd, eps);
        return;
    }
    if (embd > NORM_PER * blockDim.x) {
        /* Each thread reads back only the elements it wrote. */
        for (unsigned j = threadIdx.x; j < embd; j += blockDim.x) xr[j] = st(ld(te[j]) + ld(pe[j]));
        norm_row(h + (size_t)r * embd, xr, g, b, embd, eps, red);
        return;
    }
    float v[NORM_PER];
#pragma unroll
    for (unsigned i = 0; i < NORM_PER; ++i) {
        unsigned j = threadIdx.x + i * blockDim.x;
        v[i] = 0.0f;
        if (j < embd) {
            T sum = st(ld(te[j]) + ld(pe[j]));
            xr[j] = sum;
            v[i] = ld(sum);
        }
    }
    norm_kept(h + (size_t)r * embd, v, g, b, embd, eps, red);
}

/* The projection's output at element j of row r: its `parts` partials summed (one for a plain
   GEMM), plus the bias: `bias + y` exactly as before when there is one part. */
__device__ __forceinline__ float proj_out(const T *yr, const T *bias, unsigned j, unsigned parts,
                                          size_t part) {
    float s = ld(bias[j]);
    for (unsigned p = 0; p < parts; ++p) s += ld(yr[p * part + j]);
    return s;
}

/* Partials the one-warp path loads at once (a row of more takes the block-wide path). */
#define ROW_PARTS 8u

/* The one-warp path of residual_ln: every load of the row (x, the bias, the partials, the
   norm's scale and shift) is issued before the first store, so the row costs one round trip
   to memory for up to ROW_PARTS partials (a store to x between them would order the loads
   after it). The row's buffers never overlap (x, h and the partials are separate
   allocations, the bias and the norm's weights disjoint read-only parts of the weights),
   which `__restrict__` tells the compiler. */
__device__ __forceinline__ void residual_ln_warp(T *__restrict__ xr, T *__restrict__ hr,
                                                 const T *__restrict__ yr,
                                                 const T *__restrict__ bias,
                                                 const T *__restrict__ g,
                                                 const T *__restrict__ b, unsigned n,
                                                 unsigned parts, size_t part, float eps) {
    unsigned lane = threadIdx.x, nv = n / (32u * VEC);
    const uint4 *c4 = (const uint4 *)bias, *g4 = (const uint4 *)g, *b4 = (const uint4 *)b;
    uint4 *x4 = (uint4 *)xr;
    V16 a[ROW_VECS], c[ROW_VECS], gk[ROW_VECS], bk[ROW_VECS], yy[ROW_PARTS][ROW_VECS];
#pragma unroll
    for (unsigned i = 0; i < ROW_VECS; ++i)
        if (i < nv) {
            a[i].u = x4[i * 32u + lane];
            c[i].u = c4[i * 32u + lane];
            gk[i].u = g4[i * 32u + lane];
            bk[i].u = b4[i * 32u + lane];
        }
#pragma unroll
    for (unsigned p = 0; p < ROW_PARTS; ++p) {
#pragma unroll
        for (unsigned i = 0; i < ROW_VECS; ++i) {
            if (p < parts && i < nv) yy[p][i].u = ((const uint4 *)(yr + p * part))[i * 32u + lane];
        }
    }
    float v[ROW_VECS * VEC];
#pragma unroll
    for (unsigned i = 0; i < ROW_VECS; ++i) {
        if (i < nv) {
            V16 o;
#pragma unroll
            for (unsigned j = 0; j < VEC; ++j) {
                float s = ld(c[i].e[j]);
#pragma unroll
                for (unsigned p = 0; p < ROW_PARTS; ++p) {
                    if (p < parts) s += ld(yy[p][i].e[j]);
                }
                o.e[j] = st(ld(a[i].e[j]) + s);
                v[i * VEC + j] = ld(o.e[j]);
            }
            x4[i * 32u + lane] = o.u;
        } else {
#pragma unroll
            for (unsigned j = 0; j < VEC; ++j) v[i * VEC + j] = 0.0f;
        }
    }
    warp_norm_kept(hr, v, gk, bk, n, eps);
}

/* x += (sum of y's partials) + bias, h = norm(x). y is [parts][rows][n]. */
extern "C" __global__ void residual_ln(T *x, T *h, const T *y, const T *bias, const T *g,
                                       const T *b, unsigned rows, unsigned n, unsigned parts,
                                       float eps) {
    __shared__ float red[32];
    unsigned r = blockIdx.x;
    if (r >= rows) return;
    const size_t part = (size_t)rows * n;
    T *xr = x + (size_t)r * n;
    const T *yr = y + (size_t)r * n;
    if (warp_row(n) && parts <= ROW_PARTS && al16(xr) && al16(yr) && al16(bias) && al16(h) &&
        al16(g) && al16(b) && (part * sizeof(T)) % 16u == 0u) {
        residual_ln_warp(xr, h + (size_t)r * n, yr, bias, g, b, n, parts, part, eps);
        return;
    }
    if (n > NORM_PER * blockDim.x) {
        /* Each thread reads back only the elements it wrote. */
        for (unsigned j = threadIdx.x; j < n; j += blockDim.x)
            xr[j] = st(ld(xr[j]) + proj_out(yr, bias, j, parts, part));
        norm_row(h + (size_t)r * n, xr, g, b, n, eps, red);
        return;
    }
    float v[NORM_PER];
#pragma unroll
    for (unsigned i = 0; i < NORM_PER; ++i) {
        unsigned j = threadIdx.x + i * blockDim.x;
        v[i] = 0.0f;
        if (j < n) {
            T sum = st(ld(xr[j]) + proj_out(yr, bias, j, parts, part));
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

/* The attention of any head width (see `attention`): the scores a thread per cached position
   (one pass up to blockDim.x positions); the weighted values with the block split into `groups`
   of `hd` threads, group g summing positions g, g + groups, ... with eight accumulators (eight
   loads in flight); the groups' partial sums meet in shared memory. */
__device__ void attention_any(T *out, T *kc, T *vc, const T *qkv, const T *bias, unsigned pos,
                              unsigned r, unsigned h, unsigned heads, unsigned hd, unsigned cap,
                              float scale, float *sm) {
    float *q = sm, *s = sm + hd, *red = sm + hd + cap, *part = red + 32;
    unsigned e = heads * hd;
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
            float a[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
            unsigned t = g;
            for (; t + 7u * groups <= pos; t += 8u * groups) {
#pragma unroll
                for (unsigned c = 0; c < 8u; ++c)
                    a[c] += s[t + c * groups] * ld(v[(size_t)(t + c * groups) * hd]);
            }
            for (; t <= pos; t += groups) a[0] += s[t] * ld(v[(size_t)t * hd]);
            part[g * hd + d] = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
        }
    }
    __syncthreads();
    for (unsigned d = threadIdx.x; d < hd; d += blockDim.x) {
        float acc = 0.0f;
        for (unsigned i = 0; i < groups; ++i) acc += part[i * hd + d];
        out[(size_t)r * e + h * hd + d] = st(acc / sum);
    }
}


/* Max and sum of exponentials of two sets of scores merged into (m, l). */
__device__ __forceinline__ void merge_max_sum(float &m, float &l, float m2, float l2) {
    float mm = fmaxf(m, m2);
    if (mm == NEG_INF) return;
    l = l * expf(m - mm) + l2 * expf(m2 - mm);
    m = mm;
}

/* The width of a head the fast path takes (every GPT-2 from small to XL). */
#define HEAD64 64u
/* Value rows a thread of the fast path loads before the scores. */
#define V_AHEAD 4u

/* The attention of 64-wide heads, laid out for latency (a step runs 12 to 48 of these with
   one to eight rows, so each is a handful of blocks waiting on memory): once the position is
   known, every thread issues its first cached key row (16-byte loads) and its first V_AHEAD
   value rows with the query's loads, so the step costs about two round trips to memory
   instead of one per phase. The new key and value are kept in shared memory for the
   position's own score and weight. The softmax's max and sum are one reduction (each thread's
   scores merged as (max, sum of exponentials)). The weighted values: `lpr` lanes cover a row
   (16 bytes each), the block's groups of `lpr` lanes take positions in turn; the groups of a
   warp meet by shuffles, the warps in shared memory. Needs hd == 64, a whole number of warps,
   at most 16 of them (their (max, sum) pairs fill the 32 floats of `red`) and 16-byte aligned
   caches. */
__device__ void attention_64(T *out, T *kc, T *vc, const T *qkv, const T *bias, unsigned pos,
                             unsigned r, unsigned hh, unsigned heads, unsigned cap, float scale,
                             float *sm) {
    const unsigned per = 16u / sizeof(T), kv4 = HEAD64 / per, e = heads * HEAD64;
    float *q = sm, *kn = q + HEAD64, *vn = kn + HEAD64, *s = vn + HEAD64, *red = s + cap,
          *part = red + 32;
    size_t base = ((size_t)r * heads + hh) * cap;
    const unsigned lpr = HEAD64 / per, groups = blockDim.x / lpr;
    unsigned ch = threadIdx.x % lpr, g = threadIdx.x / lpr, t0 = threadIdx.x;
    uint4 kw[HEAD64 / (16u / sizeof(T))], vw[V_AHEAD];
    if (t0 < pos) {
        const uint4 *k4 = (const uint4 *)(kc + (base + t0) * HEAD64);
#pragma unroll
        for (unsigned i = 0; i < kv4; ++i) kw[i] = k4[i];
    }
    const T *vb = vc + base * HEAD64 + ch * per;
#pragma unroll
    for (unsigned i = 0; i < V_AHEAD; ++i)
        if (g + i * groups < pos) vw[i] = *(const uint4 *)(vb + (size_t)(g + i * groups) * HEAD64);
    const T *row = qkv + (size_t)r * 3 * e;
    for (unsigned d = threadIdx.x; d < HEAD64; d += blockDim.x) {
        unsigned c = hh * HEAD64 + d;
        T qa = st(ld(row[c]) + ld(bias[c]));
        T ka = st(ld(row[e + c]) + ld(bias[e + c]));
        T va = st(ld(row[2 * e + c]) + ld(bias[2 * e + c]));
        q[d] = ld(qa);
        kn[d] = ld(ka);
        vn[d] = ld(va);
        kc[(base + pos) * HEAD64 + d] = ka;
        vc[(base + pos) * HEAD64 + d] = va;
    }
    __syncthreads();
    float mx = NEG_INF;
    for (unsigned t = threadIdx.x; t <= pos; t += blockDim.x) {
        float acc = 0.0f;
        if (t == pos) {
#pragma unroll
            for (unsigned d = 0; d < HEAD64; ++d) acc += q[d] * kn[d];
        } else {
            if (t != t0) {
                const uint4 *k4 = (const uint4 *)(kc + (base + t) * HEAD64);
#pragma unroll
                for (unsigned i = 0; i < kv4; ++i) kw[i] = k4[i];
            }
#pragma unroll
            for (unsigned i = 0; i < kv4; ++i) {
                const T *el = (const T *)&kw[i];
#pragma unroll
                for (unsigned j = 0; j < per; ++j) acc += q[i * per + j] * ld(el[j]);
            }
        }
        acc *= scale;
        s[t] = acc;
        mx = fmaxf(mx, acc);
    }
    float l = 0.0f;
    for (unsigned t = threadIdx.x; t <= pos; t += blockDim.x) l += expf(s[t] - mx);
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, mx, o), l2 = __shfl_xor_sync(0xffffffffu, l, o);
        merge_max_sum(mx, l, m2, l2);
    }
    unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    if (lane == 0) {
        red[2 * warp] = mx;
        red[2 * warp + 1] = l;
    }
    __syncthreads();
    float m = red[0], sum = red[1];
    for (unsigned w = 1; w < warps; ++w) merge_max_sum(m, sum, red[2 * w], red[2 * w + 1]);
    float acc[16u / sizeof(T)];
#pragma unroll
    for (unsigned j = 0; j < per; ++j) acc[j] = 0.0f;
#pragma unroll
    for (unsigned i = 0; i < V_AHEAD; ++i) {
        unsigned t = g + i * groups;
        if (t < pos) {
            float p = expf(s[t] - m);
            const T *el = (const T *)&vw[i];
#pragma unroll
            for (unsigned j = 0; j < per; ++j) acc[j] += p * ld(el[j]);
        }
    }
#pragma unroll 4
    for (unsigned t = g + V_AHEAD * groups; t < pos; t += groups) {
        uint4 w = *(const uint4 *)(vb + (size_t)t * HEAD64);
        float p = expf(s[t] - m);
        const T *el = (const T *)&w;
#pragma unroll
        for (unsigned j = 0; j < per; ++j) acc[j] += p * ld(el[j]);
    }
    if (g <= pos && (pos - g) % groups == 0u) { /* this group's turn includes the new row */
        float p = expf(s[pos] - m);
#pragma unroll
        for (unsigned j = 0; j < per; ++j) acc[j] += p * vn[ch * per + j];
    }
    for (unsigned o = lpr; o < 32u; o <<= 1) {
#pragma unroll
        for (unsigned j = 0; j < per; ++j) acc[j] += __shfl_xor_sync(0xffffffffu, acc[j], o);
    }
    if (lane < lpr) {
#pragma unroll
        for (unsigned j = 0; j < per; ++j) part[warp * HEAD64 + ch * per + j] = acc[j];
    }
    __syncthreads();
    for (unsigned d = threadIdx.x; d < HEAD64; d += blockDim.x) {
        float a = 0.0f;
        for (unsigned i = 0; i < warps; ++i) a += part[i * HEAD64 + d];
        out[(size_t)r * e + hh * HEAD64 + d] = st(a / sum);
    }
}

/* One block per row and head: this step's key and value into the cache at the position, then
   the softmax-weighted sum of the cached values over positions 0..=pos. */
extern "C" __global__ void attention(T *out, T *kc, T *vc, const T *qkv, const T *bias,
                                     const unsigned *state, unsigned rows, unsigned heads,
                                     unsigned hd, unsigned cap, float scale) {
    extern __shared__ float sm[];
    unsigned bh = blockIdx.x;
    if (bh >= rows * heads) return;
    unsigned r = bh / heads, h = bh - r * heads;
    unsigned pos = state[0];
    if (pos >= cap) pos = cap - 1;
    if (hd == HEAD64 && blockDim.x % 32u == 0u && blockDim.x <= 512u && al16(kc) && al16(vc)) {
        attention_64(out, kc, vc, qkv, bias, pos, r, h, heads, cap, scale, sm);
        return;
    }
    attention_any(out, kc, vc, qkv, bias, pos, r, h, heads, hd, cap, scale, sm);
}

extern "C" __global__ void bias_gelu(T *f, const T *bias, unsigned rows, unsigned n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)rows * n) return;
    float v = ld(st(ld(f[i]) + ld(bias[i % n])));
    f[i] = st(0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v))));
}

/* ARGMAX_SPLIT blocks per row (gridDim.x / rows), each over a slice of the vocabulary, leave
   their first largest value and its index in `part`; the grid's last block to count picks each
   row's winner (the smaller index wins a tie), writes next and history and advances the
   position; the count wraps back to 0 as it counts that block. NaNs never win; a row of nothing but NaNs gives token 0. */
extern "C" __global__ void argmax(unsigned *next, unsigned *history, unsigned *state,
                                  unsigned *part, unsigned *count, const T *logits,
                                  unsigned rows, unsigned vocab, unsigned cap) {
    __shared__ float bv[32];
    __shared__ unsigned bi[32];
    __shared__ unsigned last;
    unsigned per = gridDim.x / rows;
    unsigned r = blockIdx.x / per, sb = blockIdx.x - r * per;
    unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, warps = (blockDim.x + 31u) >> 5;
    float best = NEG_INF;
    unsigned idx = 0xffffffffu;
    if (r < rows) {
        unsigned slice = (vocab + per - 1u) / per, lo = sb * slice;
        unsigned hi = lo + slice < vocab ? lo + slice : vocab;
        const T *l = logits + (size_t)r * vocab;
        /* Four lanes of candidates per thread, so four loads are in flight; each keeps its
           first maximum (its indices only grow). */
        float bb[4] = {NEG_INF, NEG_INF, NEG_INF, NEG_INF};
        unsigned ii[4] = {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu};
        unsigned j = lo + threadIdx.x, bd = blockDim.x;
        for (; j + 3u * bd < hi; j += 4u * bd) {
#pragma unroll
            for (unsigned c = 0; c < 4u; ++c) {
                float v = ld(l[j + c * bd]);
                if (v > bb[c]) { bb[c] = v; ii[c] = j + c * bd; }
            }
        }
        for (; j < hi; j += bd) {
            float v = ld(l[j]);
            if (v > bb[0]) { bb[0] = v; ii[0] = j; }
        }
        best = bb[0];
        idx = ii[0];
#pragma unroll
        for (unsigned c = 1; c < 4u; ++c)
            if (bb[c] > best || (bb[c] == best && ii[c] < idx)) { best = bb[c]; idx = ii[c]; }
    }
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, best, o);
        unsigned oi = __shfl_xor_sync(0xffffffffu, idx, o);
        if (ov > best || (ov == best && oi < idx)) { best = ov; idx = oi; }
    }
    if (lane == 0) { bv[warp] = best; bi[warp] = idx; }
    __syncthreads();
    if (warp == 0) {
        best = lane < warps ? bv[lane] : NEG_INF;
        idx = lane < warps ? bi[lane] : 0xffffffffu;
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, best, o);
            unsigned oi = __shfl_xor_sync(0xffffffffu, idx, o);
            if (ov > best || (ov == best && oi < idx)) { best = ov; idx = oi; }
        }
        if (lane == 0 && r < rows) {
            part[2u * blockIdx.x] = __float_as_uint(best);
            part[2u * blockIdx.x + 1u] = idx;
        }
    }
    /* Publish the partial, then count; the last block sees every other block's. */
    __threadfence();
    __syncthreads();
    /* atomicInc wraps to 0 at the last block: the count is 0 for the next launch whatever
       happens after. */
    if (threadIdx.x == 0) last = atomicInc(count, gridDim.x - 1u) == gridDim.x - 1u;
    __syncthreads();
    if (!last) return;
    __threadfence();
    unsigned pos = state[0];
    for (unsigned rr = warp; rr < rows; rr += warps) {
        best = NEG_INF;
        idx = 0xffffffffu;
        for (unsigned k = lane; k < per; k += 32u) {
            unsigned at = 2u * (rr * per + k);
            float v = __uint_as_float(__ldcg(part + at));
            unsigned i = __ldcg(part + at + 1u);
            if (v > best || (v == best && i < idx)) { best = v; idx = i; }
        }
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, best, o);
            unsigned oi = __shfl_xor_sync(0xffffffffu, idx, o);
            if (ov > best || (ov == best && oi < idx)) { best = ov; idx = oi; }
        }
        if (lane == 0) {
            if (idx >= vocab) idx = 0;
            next[rr] = idx;
            if (pos < cap) history[(size_t)pos * rows + rr] = idx;
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) state[0] = pos + 1u;
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
