//! The model every device serves: a 3-layer MLP (layer shapes, seeded weights and inputs), the
//! launch of each kernel (its geometry and parameters, the same on every device), the kernels'
//! CUDA C source, and the reference computed on the host without the layer.
//!
//! Owns what must be identical across devices, so a result on the GPU and one on the CPU answer
//! the same question. Does not own the kernels' bodies on the CPU ([`crate::std_device`]) nor the
//! serving loop ([`crate::serve`]).

use devcmd::{KernelParam, LaunchDims};

/// Inputs of a request.
pub const INPUT: usize = 256;
/// Width of the first hidden layer.
pub const HIDDEN1: usize = 512;
/// Width of the second hidden layer.
pub const HIDDEN2: usize = 128;
/// Outputs of a request (class probabilities).
pub const CLASSES: usize = 10;
/// Layer shapes: (inputs, outputs).
pub const LAYERS: [(usize, usize); 3] = [(INPUT, HIDDEN1), (HIDDEN1, HIDDEN2), (HIDDEN2, CLASSES)];
/// Threads per block of every launch.
pub const BLOCK: u32 = 128;

/// SplitMix64: a small seeded generator for weights and inputs.
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-scale, scale).
    pub fn f32(&mut self, scale: f32) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
    }
}

/// The weights as host floats, in file order: W1 b1 W2 b2 W3 b3 (W is inputs × outputs).
pub fn seeded_weights(seed: u64) -> Vec<Vec<f32>> {
    let mut rng = Rng(seed);
    let mut out = Vec::new();
    for (i, o) in LAYERS {
        let scale = 1.0 / (i as f32).sqrt();
        out.push((0..i * o).map(|_| rng.f32(scale)).collect());
        out.push((0..o).map(|_| rng.f32(0.1)).collect());
    }
    out
}

/// The inputs of batches: `batch_size` requests of [`INPUT`] floats each, drawn in order from
/// one seeded generator (the GPU benchmark's plain driver program draws the same ones).
#[derive(Debug, Clone)]
pub struct Inputs {
    rng: Rng,
    batch_size: usize,
}

impl Inputs {
    /// The inputs of a host seeded with `seed`.
    pub fn new(seed: u64, batch_size: usize) -> Self {
        Self {
            rng: Rng(seed ^ 0xA5A5),
            batch_size,
        }
    }

    /// The next batch.
    pub fn next_batch(&mut self) -> Vec<f32> {
        (0..self.batch_size * INPUT)
            .map(|_| self.rng.f32(1.0))
            .collect()
    }
}

/// Writes `floats` into `bytes` in the device's byte order (little-endian), without an
/// intermediate vector. `bytes` holds exactly four bytes per float.
pub fn put_floats(bytes: &mut [u8], floats: &[f32]) {
    debug_assert_eq!(bytes.len(), floats.len() * 4);
    for (b, f) in bytes.chunks_exact_mut(4).zip(floats) {
        b.copy_from_slice(&f.to_le_bytes());
    }
}

// ---- the launches: the same geometry and parameters on every device ----
//
// matmul(float *out, const float *a, const float *b, unsigned m, unsigned k, unsigned n)
// bias_relu(float *out, const float *x, const float *bias, unsigned m, unsigned n)
// bias_softmax(float *out, const float *x, const float *bias, unsigned m, unsigned n)
//
// Every launch passes its two inputs then its output, so the buffer slots are a/x = 0,
// b/bias = 1, out = 2, and the first three parameters are Buffer(2), Buffer(0), Buffer(1).

/// The parameters of a kernel above: the three pointers, then the `unsigned` scalars.
pub fn params(scalars: &[[u8; 4]]) -> Vec<KernelParam<'_>> {
    let mut p = vec![
        KernelParam::Buffer(2),
        KernelParam::Buffer(0),
        KernelParam::Buffer(1),
    ];
    p.extend(scalars.iter().map(|s| KernelParam::Scalar(s)));
    p
}

/// `matmul` over an m×n output: one thread per output element.
pub fn matmul_dims(m: usize, n: usize) -> LaunchDims {
    LaunchDims::covering((m * n) as u64, BLOCK)
}

/// `bias_relu` over an m×n output: one thread per element.
pub fn bias_relu_dims(m: usize, n: usize) -> LaunchDims {
    LaunchDims::covering((m * n) as u64, BLOCK)
}

/// `bias_softmax` over m rows: one thread per row (a row is [`CLASSES`] wide).
pub fn bias_softmax_dims(m: usize) -> LaunchDims {
    LaunchDims::covering(m as u64, BLOCK)
}

/// The three kernels of a device, loaded once.
#[derive(Debug, Clone)]
pub struct Kernels<K> {
    /// `out[m×n] = a[m×k] · b[k×n]`.
    pub matmul: K,
    /// `out = relu(x + bias)`, bias broadcast over rows.
    pub bias_relu: K,
    /// `out = softmax(x + bias)` row by row.
    pub bias_softmax: K,
}

/// NVRTC options of [`CUDA_SOURCE`]: no fused multiply-add, so each product is rounded before
/// it is added, in the order the host reference adds them (the matmul is then bit-exact with it).
pub const CUDA_OPTIONS: &[&str] = &["--fmad=false"];

/// The kernels in CUDA C, compiled once at start-up with NVRTC. Each one follows the signature
/// above and the geometry of [`matmul_dims`], [`bias_relu_dims`] and [`bias_softmax_dims`], and
/// adds in the order of the host reference ([`reference()`]).
pub const CUDA_SOURCE: &str = r#"
extern "C" __global__ void matmul(float *out, const float *a, const float *b,
                                  unsigned m, unsigned k, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= m * n) return;
    unsigned row = i / n, col = i - row * n;
    const float *ar = a + (size_t)row * k;
    float acc = 0.0f;
    for (unsigned kk = 0; kk < k; ++kk) acc += ar[kk] * b[(size_t)kk * n + col];
    out[i] = acc;
}

extern "C" __global__ void bias_relu(float *out, const float *x, const float *bias,
                                     unsigned m, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= m * n) return;
    out[i] = fmaxf(x[i] + bias[i % n], 0.0f);
}

extern "C" __global__ void bias_softmax(float *out, const float *x, const float *bias,
                                        unsigned m, unsigned n) {
    unsigned row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= m) return;
    const float *xr = x + (size_t)row * n;
    float *o = out + (size_t)row * n;
    float mx = __int_as_float(0xff800000); /* -infinity */
    for (unsigned j = 0; j < n; ++j) mx = fmaxf(mx, xr[j] + bias[j]);
    float sum = 0.0f;
    for (unsigned j = 0; j < n; ++j) sum += expf(xr[j] + bias[j] - mx);
    for (unsigned j = 0; j < n; ++j) o[j] = expf(xr[j] + bias[j] - mx) / sum;
}
"#;

// ---- the reference, computed on the host without the layer ----

/// `out = softmax(logits)`, max-subtracted.
pub fn softmax_into(logits: &[f32], out: &mut [f32]) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f32 = logits.iter().map(|l| (l - max).exp()).sum();
    for (o, l) in out.iter_mut().zip(logits) {
        *o = (l - max).exp() / sum;
    }
}

/// The model's outputs for `m` requests of `input`, computed on the host.
pub fn reference(weights: &[Vec<f32>], input: &[f32], m: usize) -> Vec<f32> {
    let mut act = input.to_vec();
    for (l, &(k, n)) in LAYERS.iter().enumerate() {
        let (w, b) = (&weights[2 * l], &weights[2 * l + 1]);
        let mut next = vec![0.0f32; m * n];
        for row in 0..m {
            for kk in 0..k {
                let av = act[row * k + kk];
                for j in 0..n {
                    next[row * n + j] += av * w[kk * n + j];
                }
            }
        }
        if l + 1 < LAYERS.len() {
            for (i, v) in next.iter_mut().enumerate() {
                *v = (*v + b[i % n]).max(0.0);
            }
        } else {
            for row in 0..m {
                let logits: Vec<f32> = (0..n).map(|j| next[row * n + j] + b[j]).collect();
                softmax_into(&logits, &mut next[row * n..(row + 1) * n]);
            }
        }
        act = next;
    }
    act
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_launch_geometry_covers_every_output() {
        for (m, n) in [(1, 10), (32, 512), (8192, 128)] {
            let d = matmul_dims(m, n);
            assert!(d.grid.count() * d.block.count() >= (m * n) as u64);
            assert_eq!(bias_relu_dims(m, n), d);
            let s = bias_softmax_dims(m);
            assert!(s.grid.count() * s.block.count() >= m as u64);
        }
    }

    #[test]
    fn every_cuda_kernel_is_extern_c_with_the_documented_signature() {
        for sig in [
            "void matmul(float *out, const float *a, const float *b,",
            "void bias_relu(float *out, const float *x, const float *bias,",
            "void bias_softmax(float *out, const float *x, const float *bias,",
        ] {
            assert!(CUDA_SOURCE.contains(sig), "{sig}");
        }
        assert_eq!(CUDA_SOURCE.matches("extern \"C\" __global__").count(), 3);
    }

    #[test]
    fn floats_are_written_little_endian_in_place() {
        let mut bytes = [0u8; 8];
        put_floats(&mut bytes, &[1.0, -2.5]);
        assert_eq!(bytes[..4], 1.0f32.to_le_bytes());
        assert_eq!(bytes[4..], (-2.5f32).to_le_bytes());
    }
}
