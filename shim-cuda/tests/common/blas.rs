//! What the library tests share: cuBLAS or a visible skip, reproducible random operands,
//! f16 encoding, and a CPU reference of a GEMM in f64 (see `library.rs` for the tolerances).

use super::{gpu, say};
use devcmd::{Device, Gemm, GemmType, Handle, ReadRequest, ServerError, StreamId};
use devcmd_cuda::{Cublas, CublasInitError, CudaShim};

/// The device and cuBLAS, or `None` after printing why `test` is skipped.
pub fn blas(test: &str) -> Option<(CudaShim, Cublas)> {
    let shim = gpu(test)?;
    match Cublas::new(&shim) {
        Ok(b) => Some((shim, b)),
        Err(e @ CublasInitError::NotFound { .. }) => {
            say(&format!("skipped: no cuBLAS ({test}): {e}"));
            None
        }
        Err(e) => panic!("cuBLAS is present but could not be set up: {e}"),
    }
}

/// A small xorshift generator: fresh data for every test, reproducible from its seed.
pub struct Rng(u64);

impl Rng {
    pub fn seeded(test: &str) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64);
        let seed = test
            .bytes()
            .fold(nanos | 1, |h, b| h.rotate_left(5) ^ u64::from(b));
        say(&format!("{test}: seed {seed:#x}"));
        Self(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A non-zero value in [-1, 1] of the GEMM's type: for f16 a multiple of 1/1024 (exact in
    /// f16); for f32 a multiple of 2^-23, which uses the whole f32 mantissa, so a product
    /// computed with TF32's shorter one fails the f32 tolerance.
    pub fn value(&mut self, dtype: GemmType) -> f32 {
        match dtype {
            GemmType::F16 => {
                let k = (self.next() % 2048) as i32 - 1024;
                let k = if k >= 0 { k + 1 } else { k };
                k as f32 / 1024.0
            }
            GemmType::F32 => {
                let k = (self.next() >> 40) as i64 - (1 << 23);
                let k = if k == 0 { 1 } else { k };
                k as f32 / (1 << 23) as f32
            }
        }
    }

    pub fn values(&mut self, dtype: GemmType, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.value(dtype)).collect()
    }
}

/// The f16 bits of `x`: a NaN (the poison), or a normal value exactly representable in f16
/// (the generator's).
pub fn f16_bits(x: f32) -> u16 {
    if x.is_nan() {
        return 0xffff;
    }
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32 - 127 + 15;
    assert!(
        (1..31).contains(&exp) && b & 0x1fff == 0,
        "{x} is not an exact f16"
    );
    sign | ((exp as u16) << 10) | ((b >> 13) & 0x3ff) as u16
}

/// The f32 value of f16 bits (normals, subnormals, zero, infinities and NaN).
pub fn f16_value(h: u16) -> f32 {
    let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exp = i32::from((h >> 10) & 0x1f);
    let frac = f32::from(h & 0x3ff);
    sign * match exp {
        0 => frac * 2f32.powi(-24),
        31 if frac == 0.0 => f32::INFINITY,
        31 => f32::NAN,
        e => (1.0 + frac / 1024.0) * 2f32.powi(e - 15),
    }
}

/// The bytes of `values` as the GEMM's element type.
pub fn encode(dtype: GemmType, values: &[f32]) -> Vec<u8> {
    match dtype {
        GemmType::F32 => values.iter().flat_map(|v| v.to_ne_bytes()).collect(),
        GemmType::F16 => values
            .iter()
            .flat_map(|v| f16_bits(*v).to_ne_bytes())
            .collect(),
    }
}

pub fn decode(dtype: GemmType, bytes: &[u8]) -> Vec<f32> {
    match dtype {
        GemmType::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
            .collect(),
        GemmType::F16 => bytes
            .chunks_exact(2)
            .map(|c| f16_value(u16::from_ne_bytes(c.try_into().unwrap())))
            .collect(),
    }
}

/// Elements of a matrix of `rows` x `cols` stored with leading dimension `ld`.
pub fn stored(rows: u32, cols: u32, ld: u32) -> usize {
    if rows == 0 || cols == 0 {
        0
    } else {
        ((cols - 1) * ld + rows) as usize
    }
}

/// The operands of `g` as stored (A, B, C), random; C is NaN where `beta` is 0.
pub fn operands(g: &Gemm, rng: &mut Rng) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (ar, ac) = if g.trans_a { (g.k, g.m) } else { (g.m, g.k) };
    let (br, bc) = if g.trans_b { (g.n, g.k) } else { (g.k, g.n) };
    let a = rng.values(g.dtype, stored(ar, ac, g.lda));
    let b = rng.values(g.dtype, stored(br, bc, g.ldb));
    let c = if g.beta == 0.0 {
        vec![f32::NAN; stored(g.m, g.n, g.ldc)]
    } else {
        rng.values(g.dtype, stored(g.m, g.n, g.ldc))
    };
    (a, b, c)
}

/// `alpha op(A) op(B) + beta C` in f64, column-major, C's elements at their stored places
/// (the padding rows of C keep `c`'s values).
pub fn reference(g: &Gemm, a: &[f32], b: &[f32], c: &[f32]) -> Vec<f64> {
    let at = |i: u32, p: u32| {
        let idx = if g.trans_a {
            p + i * g.lda
        } else {
            i + p * g.lda
        };
        f64::from(a[idx as usize])
    };
    let bt = |p: u32, j: u32| {
        let idx = if g.trans_b {
            j + p * g.ldb
        } else {
            p + j * g.ldb
        };
        f64::from(b[idx as usize])
    };
    let mut out: Vec<f64> = c.iter().map(|v| f64::from(*v)).collect();
    for j in 0..g.n {
        for i in 0..g.m {
            let sum: f64 = (0..g.k).map(|p| at(i, p) * bt(p, j)).sum();
            let idx = (i + j * g.ldc) as usize;
            let old = if g.beta == 0.0 {
                0.0
            } else {
                f64::from(c[idx])
            };
            out[idx] = f64::from(g.alpha) * sum + f64::from(g.beta) * old;
        }
    }
    out
}

/// ‖out − ref‖ / ‖ref‖ over C's m x n elements (NaN if any is NaN).
pub fn relative_error(g: &Gemm, out: &[f32], want: &[f64]) -> f64 {
    let (mut diff, mut norm) = (0.0, 0.0);
    for j in 0..g.n {
        for i in 0..g.m {
            let idx = (i + j * g.ldc) as usize;
            let d = f64::from(out[idx]) - want[idx];
            diff += d * d;
            norm += want[idx] * want[idx];
        }
    }
    (diff / norm).sqrt()
}

pub fn tolerance(dtype: GemmType) -> f64 {
    match dtype {
        GemmType::F32 => 1e-5,
        GemmType::F16 => 2e-3,
    }
}

pub fn read(
    dev: &mut Device<CudaShim>,
    stream: StreamId,
    h: &Handle,
) -> Result<Vec<u8>, ServerError> {
    let back = dev
        .command(stream)?
        .read_async(&[ReadRequest::whole(h)])?
        .wait()?;
    Ok(back[0].as_slice().to_vec())
}
