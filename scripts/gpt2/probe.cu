// In-graph time of GPT-2 small's decode kernels and GEMMs at batch 1 on a GPU (issue 17's
// breakdown): each kernel or cuBLAS call captured many times into one CUDA graph, replayed,
// the best of 7 replays divided by the calls. The attention's key and value caches rotate over
// 1024 copies (at position 32 about 100 MB touched a rotation, twice the H200's L2) and the
// GEMMs' weights over up to 64 copies (72-288 MB), so they come from memory as in a decode
// step; the residual's partials, bias and norm weights stay in L2 (in a step they were just
// written, or are small).
//
// Build and run on the GPU machine (repository root; CUDA toolkit with cuBLAS):
//     nvcc -O3 -arch=sm_90 -I examples/src/gpt2 -o /tmp/gpt2-probe scripts/gpt2/probe.cu -lcublas
//     /tmp/gpt2-probe
//
// scripts/gpt2/bench.sh builds and runs it after the timed runs, so the breakdown comes from the
// same run as the table (BENCHMARKS.md).
#define GPT2_HALF
#include "kernels.cu"
#include <cstdio>
#include <initializer_list>
#include <cstdlib>
#include <cuda_runtime.h>
#include <cublas_v2.h>

#define CK(x) do { auto e_ = (x); if (e_ != cudaSuccess) { printf("CUDA: %s (line %d)\n", cudaGetErrorString(e_), __LINE__); exit(1); } } while (0)
#define CB(x) do { auto e_ = (x); if (e_ != CUBLAS_STATUS_SUCCESS) { printf("cuBLAS: status %d (line %d)\n", (int)e_, __LINE__); exit(1); } } while (0)

static cudaStream_t strm;

// µs per call of `call(i)` for i in 0..reps, captured into one graph.
template <class F> float graph_us(F call, int reps) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(strm, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < reps; i++) call(i);
    CK(cudaStreamEndCapture(strm, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    CK(cudaGraphLaunch(ge, strm));
    CK(cudaStreamSynchronize(strm));
    float best = 1e9f;
    for (int r = 0; r < 7; r++) {
        CK(cudaEventRecord(a, strm));
        CK(cudaGraphLaunch(ge, strm));
        CK(cudaEventRecord(b, strm));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        if (ms < best) best = ms;
    }
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    return best * 1000.0f / reps;
}

__global__ void nothing(int m) { if (m) __syncthreads(); }

int main() {
    CK(cudaStreamCreate(&strm));
    const unsigned E = 768, H = 12, HD = 64, CAP = 256, I = 3072, R = 1;
    const int COPIES = 1024;
    const size_t kvn = (size_t)R * H * CAP * HD;
    T *x, *h, *y, *bias, *g, *b, *qkv, *out, *kv, *f;
    unsigned *state;
    CK(cudaMalloc(&x, E * sizeof(T)));
    CK(cudaMalloc(&h, E * sizeof(T)));
    CK(cudaMalloc(&y, 8 * E * sizeof(T)));
    CK(cudaMalloc(&bias, 3 * E * sizeof(T)));
    CK(cudaMalloc(&g, E * sizeof(T)));
    CK(cudaMalloc(&b, E * sizeof(T)));
    CK(cudaMalloc(&qkv, 3 * E * sizeof(T)));
    CK(cudaMalloc(&out, E * sizeof(T)));
    CK(cudaMalloc(&f, I * sizeof(T)));
    CK(cudaMalloc(&kv, 2 * kvn * COPIES * sizeof(T)));
    CK(cudaMalloc(&state, 16));
    CK(cudaMemset(x, 0, E * sizeof(T)));
    CK(cudaMemset(y, 0, 8 * E * sizeof(T)));
    CK(cudaMemset(bias, 0, 3 * E * sizeof(T)));
    CK(cudaMemset(g, 0, E * sizeof(T)));
    CK(cudaMemset(b, 0, E * sizeof(T)));
    CK(cudaMemset(qkv, 0, 3 * E * sizeof(T)));
    CK(cudaMemset(f, 0, I * sizeof(T)));
    CK(cudaMemset(kv, 0, 2 * kvn * COPIES * sizeof(T)));

    printf("an empty kernel                 %6.2f us\n", graph_us([&](int) { nothing<<<1, 32, 0, strm>>>(0); }, 256));
    for (unsigned parts : {1u, 4u, 8u}) {
        float t = graph_us([&](int) { residual_ln<<<R, 32, 0, strm>>>(x, h, y, bias, g, b, R, E, parts, 1e-5f); }, 256);
        printf("residual + norm, %u partial(s)   %6.2f us\n", parts, t);
    }
    // The kernel's shared memory as kernels.rs's attention_shared_bytes gives it for 64-wide heads.
    const size_t shared = (3 * HD + CAP + 32 + 256 / 32 * HD) * 4;
    for (unsigned pos : {32u, 64u, 100u, 128u, 159u}) {
        CK(cudaMemcpy(state, &pos, 4, cudaMemcpyHostToDevice));
        float t = graph_us([&](int i) {
            T *k = kv + (size_t)(i % COPIES) * kvn * 2;
            attention<<<R * H, 256, shared, strm>>>(out, k, k + kvn, qkv, bias, state, R, H, HD, CAP, 0.125f);
        }, 256);
        printf("attention at position %3u       %6.2f us\n", pos, t);
    }

    // cuBLAS, f16 with fp32 compute, one column; the weights rotate over up to 64 copies.
    cublasHandle_t hb;
    CB(cublasCreate(&hb));
    CB(cublasSetStream(hb, strm));
    // No workspace, as the host runs cuBLAS by default (GPT2_CUBLAS_WORKSPACE_MIB unset).
    CB(cublasSetWorkspace(hb, nullptr, 0));
    const size_t span = (size_t)512 << 20;
    T *w, *c;
    CK(cudaMalloc(&w, span));
    CK(cudaMalloc(&c, 65536 * sizeof(T)));  // the most outputs: the head, or 8 parts of 3072
    CK(cudaMemset(w, 0, span));
    const float one = 1.0f, zero = 0.0f;
    struct { const char *name; int m, k; } shapes[] = {
        {"QKV 768 -> 2304", 2304, 768}, {"attention projection 768 -> 768", 768, 768},
        {"MLP 768 -> 3072", 3072, 768}, {"MLP projection 3072 -> 768", 768, 3072},
        {"head 768 -> 50257", 50257, 768}};
    for (auto &s : shapes) {
        const size_t bytes = (size_t)s.m * s.k * sizeof(T);
        const int copies = (int)(span / bytes) < 64 ? (int)(span / bytes) : 64;
        for (int parts : {1, 4, 8}) {
            if (s.k % parts || (parts > 1 && s.m > 4096)) continue;
            const int k = s.k / parts;
            float t = graph_us([&](int i) {
                const T *a = w + (size_t)(i % copies) * s.m * s.k;
                CB(cublasGemmStridedBatchedEx(hb, CUBLAS_OP_N, CUBLAS_OP_N, s.m, 1, k, &one, a,
                    CUDA_R_16F, s.m, (long long)s.m * k, f, CUDA_R_16F, s.k, k, &zero, c,
                    CUDA_R_16F, s.m, s.m, parts, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
            }, copies * 2);
            printf("%-32s %d part(s) %6.2f us (%.2f TB/s)\n", s.name, parts, t, bytes / (t * 1e6));
        }
    }
    return 0;
}
