/* Stand-ins for CUDA's builtins, enough for a host C++ compiler to parse and type-check
   kernels.cu (`c++ -fsyntax-only -include kernels_host_check.h -x c++ kernels.cu`): a test runs
   it where no GPU and no NVRTC are, so a kernel that would not compile fails `cargo test`
   instead of the first run on a GPU. None of this runs; it only has to declare the names. What it
   cannot check: the PTX inside `asm` (swallowed here) and names the host's headers declare that
   NVRTC lacks. */
#include <cmath>
#include <cstddef>
#define __device__
#define __global__
#define __forceinline__ inline
#define __shared__
#define asm(...) ((void)0)
struct dim3_stand_in { unsigned x, y, z; };
extern dim3_stand_in threadIdx, blockIdx, blockDim, gridDim;
struct uint4 { unsigned x, y, z, w; };
template <class V> V __shfl_xor_sync(unsigned mask, V v, int lane_mask);
void __syncthreads();
void __threadfence();
float rsqrtf(float x);
float __int_as_float(int v);
float __uint_as_float(unsigned v);
unsigned __float_as_uint(float v);
unsigned atomicInc(unsigned *p, unsigned limit);
template <class V> V __ldcg(const V *p);
