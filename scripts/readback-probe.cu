// readback-probe: where a small staged readback's time goes on this host (issue 18).
//
// A staged `read_to` of 64 KiB-4 MiB is one DMA into pinned memory, a wait, then a host copy
// out into the caller's memory. This probe times those steps by hand, with the CUDA runtime
// alone, so the layer's figures can be read against what the host allows. Four tables:
//   1. the DMA into pinned memory + cudaStreamSynchronize (the anchor); the copy out alone on
//      one thread right after it, and again at once (source hot); the DMA and the copy out
//      split among 1, 4 or 8 threads that spin between copies; the DMA cut into 4 or 8 pieces,
//      each copied out (8 threads) as soon as its event passed;
//   2. the same DMA into a cudaHostAlloc page and into registered heap memory, the copy out
//      of each, and a heap-to-heap copy of the same size (the host's own copy rate);
//   3. the next DMA's time when the copy out left the buffer's lines in the cores' caches,
//      and when it flushed (clflushopt) or demoted (cldemote) them, or read them led by
//      prefetchnta;
//   4. the same with reads taking R buffers in turn instead of reusing one.
// Build and run on the GPU machine (BENCHMARKS.md, "Reads spread over the ring"):
//   nvcc -O2 -Xcompiler -mclflushopt,-mcldemote -o /tmp/readback-probe scripts/readback-probe.cu -lpthread && /tmp/readback-probe
#include <cuda_runtime.h>
#include <pthread.h>
#include <atomic>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <algorithm>
#include <vector>

#define CK(x) do { cudaError_t ck_ = (x); if (ck_ != cudaSuccess) { \
    fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(ck_)); exit(1); } } while (0)

static double now_us() {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

// Spinning helpers: each waits for a new generation, copies its share, counts itself done.
struct Pool {
    int k = 0;
    std::vector<pthread_t> th;
    std::atomic<unsigned long> gen{0};
    std::atomic<int> done{0};
    std::atomic<int> quit{0};
    char *dst = nullptr;
    const char *src = nullptr;
    size_t len = 0;
};
static Pool pool;

static void share(int i, int k, size_t len, size_t *off, size_t *n) {
    size_t part = (len / k + 4095) & ~size_t(4095);
    *off = std::min(len, part * i);
    *n = std::min(len - *off, part);
}

// When set, each share's source lines are flushed from the caches after they are copied, so
// the next DMA into the staging buffer finds no line a core holds.
static std::atomic<int> flush_src{0};

static void copy_share(char *dst, const char *src, size_t n) {
    int mode = flush_src.load(std::memory_order_relaxed);
    if (mode == 0) { memcpy(dst, src, n); return; }
    if (mode == 3) {
        // Loads led by prefetchnta (fills close to the core, not the whole hierarchy).
        size_t off = 0;
        for (; off + 64 <= n; off += 64) {
            __builtin_prefetch(src + off + 1024, 0, 0);
            memcpy(dst + off, src + off, 64);
        }
        memcpy(dst + off, src + off, n - off);
        return;
    }
    for (size_t off = 0; off < n; off += 4096) {
        size_t m = std::min<size_t>(4096, n - off);
        memcpy(dst + off, src + off, m);
        if (mode == 1)
            for (size_t l = 0; l < m; l += 64) __builtin_ia32_clflushopt((void *)(src + off + l));
        else
            for (size_t l = 0; l < m; l += 64) __builtin_ia32_cldemote((void *)(src + off + l));
    }
    if (mode == 1) __builtin_ia32_sfence();
}

static void *helper(void *arg) {
    int i = (int)(size_t)arg;
    unsigned long seen = 0;
    while (!pool.quit.load()) {
        unsigned long g = pool.gen.load(std::memory_order_acquire);
        if (g == seen) { __builtin_ia32_pause(); continue; }
        seen = g;
        size_t off, n;
        share(i, pool.k, pool.len, &off, &n);
        copy_share(pool.dst + off, pool.src + off, n);
        pool.done.fetch_add(1, std::memory_order_release);
    }
    return nullptr;
}

static void pool_start(int k) {
    pool.k = k;
    pool.th.resize(k);
    for (int i = 1; i < k; i++) pthread_create(&pool.th[i], nullptr, helper, (void *)(size_t)i);
}
static void pool_stop() {
    pool.quit.store(1);
    for (int i = 1; i < pool.k; i++) pthread_join(pool.th[i], nullptr);
    pool.quit.store(0);
    pool.gen.store(0);
}
// Copies with the caller as share 0 and k-1 spinning helpers.
static void pool_copy(char *dst, const char *src, size_t len) {
    if (pool.k <= 1) { copy_share(dst, src, len); return; }
    pool.dst = dst; pool.src = src; pool.len = len;
    pool.done.store(0);
    pool.gen.fetch_add(1, std::memory_order_release);
    size_t off, n;
    share(0, pool.k, len, &off, &n);
    copy_share(dst + off, src + off, n);
    while (pool.done.load(std::memory_order_acquire) < pool.k - 1) __builtin_ia32_pause();
}

// One DMA of `len` bytes from the device into `dst`, waited for.
static void dma_in(char *dst, const char *dev, size_t len, cudaStream_t s) {
    CK(cudaMemcpyAsync(dst, dev, len, cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
}

static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}


// Where the copy out's rate comes from: the same DMA + copy out into heap memory, from a
// cudaHostAlloc page, from heap memory registered with cudaHostRegister, and heap to heap.
static void sources(char *dev, cudaStream_t s) {
    const size_t sizes[] = {64 << 10, 256 << 10, 1 << 20, 4 << 20};
    size_t maxb = 4 << 20;
    char *pin, *reg, *src, *dst;
    CK(cudaHostAlloc((void **)&pin, maxb, cudaHostAllocPortable));
    if (posix_memalign((void **)&reg, 4096, maxb) || posix_memalign((void **)&src, 4096, maxb)) exit(1);
    dst = (char *)malloc(maxb);
    memset(reg, 2, maxb); memset(src, 3, maxb); memset(dst, 4, maxb); memset(pin, 5, maxb);
    CK(cudaHostRegister(reg, maxb, cudaHostRegisterPortable));
    printf("\n| size | dma only: alloc us | dma only: registered us | dma+out alloc | dma+out registered | "
           "hot out alloc | hot out registered | hot heap->heap |\n|---|---|---|---|---|---|---|---|\n");
    for (size_t len : sizes) {
        std::vector<double> da, dr, oa, orr, ha, hr, hh;
        for (int r = 0; r < 200; r++) {
            double a = now_us();
            dma_in(pin, dev, len, s);
            double b = now_us();
            dma_in(reg, dev, len, s);
            double c = now_us();
            da.push_back(b - a); dr.push_back(c - b);
        }
        for (int r = 0; r < 200; r++) {
            double a = now_us();
            dma_in(pin, dev, len, s);
            memcpy(dst, pin, len);
            double b = now_us();
            memcpy(dst, pin, len);
            double c = now_us();
            dma_in(reg, dev, len, s);
            memcpy(dst, reg, len);
            double d = now_us();
            memcpy(dst, reg, len);
            double e = now_us();
            memcpy(dst, src, len);
            double f = now_us();
            oa.push_back(b - a); ha.push_back(c - b); orr.push_back(d - c); hr.push_back(e - d);
            hh.push_back(f - e);
        }
        printf("| %zu KiB | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f |\n", len >> 10,
               median(da), median(dr), median(oa), median(orr), median(ha), median(hr), median(hh));
    }
}

// The next DMA's rate when the copy out left the staging buffer's lines in the caches, and when
// it flushed them (clflushopt of every line it read, by the copying threads).
static void flushed(char *dev, cudaStream_t s) {
    const size_t sizes[] = {64 << 10, 256 << 10, 1 << 20, 4 << 20};
    size_t maxb = 4 << 20;
    char *pin;
    CK(cudaHostAlloc((void **)&pin, maxb, cudaHostAllocPortable));
    char *dst = (char *)malloc(maxb);
    memset(dst, 4, maxb);
    printf("\n| size | k | dma / out / total: plain | clflushopt | cldemote | prefetchnta |\n|---|---|---|---|---|---|\n");
    for (int k : {1, 8}) {
        pool_start(k);
        for (size_t len : sizes) {
            std::vector<double> d[4], o[4], t[4];
            for (int f = 0; f < 4; f++) {
                flush_src.store(f);
                for (int r = 0; r < 200; r++) {
                    double a = now_us();
                    dma_in(pin, dev, len, s);
                    double b = now_us();
                    pool_copy(dst, pin, len);
                    double c = now_us();
                    d[f].push_back(b - a); o[f].push_back(c - b); t[f].push_back(c - a);
                }
            }
            flush_src.store(0);
            printf("| %zu KiB | %d |", len >> 10, k);
            for (int f = 0; f < 4; f++)
                printf(" %.1f / %.1f / %.1f |", median(d[f]), median(o[f]), median(t[f]));
            printf("\n");
        }
        pool_stop();
    }
}

// The next DMA's rate when reads rotate over R staging buffers (least recently used first)
// instead of reusing one: a buffer's lines may have left the copying cores' caches by the
// time it is reused.
static void rotated(char *dev, cudaStream_t s) {
    const size_t sizes[] = {64 << 10, 256 << 10, 1 << 20, 4 << 20};
    const int rots[] = {1, 2, 4, 8, 16};
    char *pin;
    size_t total = 64 << 20;
    CK(cudaHostAlloc((void **)&pin, total, cudaHostAllocPortable));
    memset(pin, 1, total);
    char *dst = (char *)malloc(4 << 20);
    memset(dst, 4, 4 << 20);
    printf("\n| size | dma / out / total (us), k=8, R buffers in turn: R=1 | 2 | 4 | 8 | 16 |\n|---|---|---|---|---|---|\n");
    pool_start(8);
    for (size_t len : sizes) {
        printf("| %zu KiB |", len >> 10);
        for (int R : rots) {
            if (len * R > total) { printf(" - |"); continue; }
            std::vector<double> d, o, t;
            for (int r = 0; r < 200; r++) {
                char *buf = pin + (r % R) * len;
                double a = now_us();
                dma_in(buf, dev, len, s);
                double b = now_us();
                pool_copy(dst, buf, len);
                double c = now_us();
                d.push_back(b - a); o.push_back(c - b); t.push_back(c - a);
            }
            printf(" %.1f / %.1f / %.1f |", median(d), median(o), median(t));
        }
        printf("\n");
    }
    pool_stop();
}

int main() {
    const size_t sizes[] = {64 << 10, 256 << 10, 1 << 20, 4 << 20};
    const int reps = 300;
    size_t maxb = 4 << 20;
    char *dev, *pin;
    CK(cudaMalloc(&dev, maxb));
    CK(cudaMemset(dev, 7, maxb));
    CK(cudaHostAlloc((void **)&pin, maxb, cudaHostAllocPortable));
    char *heap = (char *)malloc(maxb);
    memset(heap, 1, maxb);
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t ev[16];
    for (auto &e : ev) CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    int flags = 0;
    CK(cudaGetDeviceFlags((unsigned *)&flags));
    printf("device flags 0x%x (schedule: 0 auto, 1 spin, 2 yield, 4 blocking)\n", flags);
    printf("| size | dma us | GB/s | out1 us | hot1 us | dma+out1 | dma+out4 | dma+out8 | "
           "4 pieces k8 | 8 pieces k8 | best / dma |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (size_t len : sizes) {
        std::vector<double> dma, out1, hot1, t1, t4, t8, p4, p8;
        for (int r = 0; r < reps; r++) {
            double a = now_us();
            dma_in(pin, dev, len, s);
            double b = now_us();
            memcpy(heap, pin, len);
            double c = now_us();
            memcpy(heap, pin, len);
            double d = now_us();
            dma.push_back(b - a); out1.push_back(c - b); hot1.push_back(d - c);
            t1.push_back(c - a);
        }
        for (int k : {4, 8}) {
            pool_start(k);
            for (int r = 0; r < reps; r++) {
                double a = now_us();
                dma_in(pin, dev, len, s);
                pool_copy(heap, pin, len);
                (k == 4 ? t4 : t8).push_back(now_us() - a);
            }
            pool_stop();
        }
        pool_start(8);
        for (int pieces : {4, 8}) {
            size_t piece = (len / pieces + 4095) & ~size_t(4095);
            for (int r = 0; r < reps; r++) {
                double a = now_us();
                int n = 0;
                for (size_t off = 0; off < len; off += piece, n++) {
                    size_t m = std::min(piece, len - off);
                    CK(cudaMemcpyAsync(pin + off, dev + off, m, cudaMemcpyDeviceToHost, s));
                    CK(cudaEventRecord(ev[n], s));
                }
                for (int i = 0; i < n; i++) {
                    while (cudaEventQuery(ev[i]) == cudaErrorNotReady) __builtin_ia32_pause();
                    size_t off = piece * i;
                    pool_copy(heap + off, pin + off, std::min(piece, len - off));
                }
                (pieces == 4 ? p4 : p8).push_back(now_us() - a);
            }
        }
        pool_stop();
        double md = median(dma);
        double best = std::min({median(t1), median(t4), median(t8), median(p4), median(p8)});
        printf("| %zu KiB | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.2f |\n",
               len >> 10, md, len / md / 1e3, median(out1), median(hot1), median(t1), median(t4),
               median(t8), median(p4), median(p8), md / best);
    }
    sources(dev, s);
    flushed(dev, s);
    rotated(dev, s);
    return 0;
}
