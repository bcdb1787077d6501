//! Output projections cut along k: how many parts a device wants (`GPT2_SPLIT_K`, or the
//! device's default), the parts a projection of a given k gets, and the portable way to run a
//! split product (one GEMM per part over views). A device whose library batches the parts
//! (cuBLAS's strided-batched GEMM, `devices.rs`) makes one call instead; the residual add sums
//! the partials (`residual_ln` in both kernel sets).
//!
//! Owns the choice of parts and the per-part fallback. Does not own the GEMMs themselves
//! ([`Backend::gemm`]) nor where the step uses them (`step.rs`).

use super::config::Config;
use super::decode::Backend;
use devcmd::{Command, Gemm, Handle, ServerError, Shim, Validation};

/// `GPT2_SPLIT_K`, when set to a whole number of at least 1.
pub fn split_k_from_env() -> Option<usize> {
    std::env::var("GPT2_SPLIT_K")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n >= 1)
}

/// The parts a split of `k` wanting `wanted` parts gets: the largest divisor of `k` at most
/// `wanted` (1 when nothing else divides it, and for `k = 0`).
pub fn split_parts(k: usize, wanted: usize) -> usize {
    (1..=wanted.clamp(1, k.max(1)))
        .rev()
        .find(|&p| k.is_multiple_of(p))
        .unwrap_or(1)
}

/// [`Backend::gemm_split_k`] as one [`Backend::gemm`] per part, over views of A, B and
/// `partials`, for a packed product (`lda = m`, `ldb = k`, `ldc = m`, nothing transposed,
/// `beta = 0`: the step's projections).
///
/// # Errors
///
/// [`Validation::LibrarySplit`] when `parts` is 0 or does not divide `g.k`;
/// [`Validation::LibraryUnsupported`] for a product that is not packed; the device's refusal.
pub fn gemm_parts<S: Shim, B: Backend<S> + ?Sized>(
    be: &B,
    cmd: &mut Command<'_, S>,
    name: &'static str,
    g: Gemm,
    parts: usize,
    [a, b]: [&Handle; 2],
    partials: &Handle,
) -> Result<(), ServerError> {
    const WORK: &str = "a GEMM cut along k, one GEMM per part";
    if parts == 0 || !(g.k as usize).is_multiple_of(parts) {
        return Err(Validation::LibrarySplit {
            work: WORK,
            k: u64::from(g.k),
            parts: parts as u64,
        }
        .into());
    }
    let packed = Gemm::packed(g.dtype, g.m, g.n, g.k);
    if (g.trans_a, g.trans_b, g.lda, g.ldb, g.ldc, g.beta)
        != (false, false, packed.lda, packed.ldb, packed.ldc, 0.0)
    {
        return Err(Validation::LibraryUnsupported {
            work: WORK,
            what: "a product that is not packed (lda = m, ldb = k, ldc = m, nothing \
                   transposed, beta = 0)",
        }
        .into());
    }
    let es = g.dtype.bytes();
    let (m, n, k) = (u64::from(g.m), u64::from(g.n), u64::from(g.k));
    let slice = k / parts as u64;
    let part = Gemm {
        k: slice as u32,
        ..g
    };
    for p in 0..parts as u64 {
        // Columns `p·slice ..` of A (lda = m: contiguous), rows `p·slice ..` of every column of
        // B (ldb = k: the view runs to the last column's slice), the part's block of C.
        let a_part = a.view(p * slice * m * es, slice * m * es)?;
        let b_part = b.view(p * slice * es, (n.saturating_sub(1) * k + slice) * es)?;
        let c_part = partials.view(p * m * n * es, m * n * es)?;
        be.gemm(cmd, name, part, &a_part, &b_part, &c_part)?;
    }
    Ok(())
}

/// The parts the attention's and the MLP's output projections cut their k into, for a device
/// that wants `split` ([`Backend::split_k`]): each the largest divisor of its k at most `split`.
pub fn projection_parts(c: &Config, split: usize) -> (usize, usize) {
    (split_parts(c.embd, split), split_parts(c.inner, split))
}

#[cfg(test)]
mod tests {
    use super::split_parts;

    #[test]
    fn parts_are_the_largest_divisor_of_k_at_most_the_wish() {
        assert_eq!(split_parts(768, 4), 4);
        assert_eq!(split_parts(768, 5), 4);
        assert_eq!(split_parts(3072, 6), 6);
        assert_eq!(split_parts(64, 3), 2);
        assert_eq!(split_parts(7, 4), 1);
        assert_eq!(split_parts(64, 0), 1, "no wish is no split");
        assert_eq!(split_parts(64, 1), 1);
    }
}
