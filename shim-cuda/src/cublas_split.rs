//! Split-K products: one GEMM cut along k into equal parts, each part's product written to a
//! partial output of its own, all in one strided-batched cuBLAS call
//! (`cublasGemmStridedBatchedEx`). The caller sums the partials (a kernel that reads the GEMM's
//! output anyway can do it for nothing: GPT-2's residual add does).
//!
//! Why: for a product with few columns (a decode step's matrix-vector products) cuBLAS runs one
//! thread block per output tile, too few to fill the GPU, and where k is long it adds a
//! split-K pass of its own plus a reduction kernel. Cutting k here gives cuBLAS `parts` times
//! the blocks in one kernel and no reduction launch. On the H200 (GPT-2 small's shapes, f16,
//! one column, inside a graph, probed through PyTorch's cuBLAS) a 3072 → 768 product took
//! 6.2 µs plain and 3.2-3.5 µs in 4-8 parts, 768 → 768 3.3 and 2.6 µs; GPT-2 small's decode
//! step went from 448 to 413 µs with its two output projections in 4 parts (BENCHMARKS.md).
//!
//! Owns the mapping of a split [`Gemm`] onto the batched call and its checks. Does not own the
//! stream's handle and workspace, nor the library work (`cublas.rs`).

use crate::cublas::Cublas;
use crate::device::CudaShim;
use cudarc::cublas::sys as cb;
use devcmd::{Command, Gemm, GemmType, Handle, ServerError, Validation};
use std::ffi::c_void;

impl Cublas {
    /// `C_p = alpha · A[:, p·k/parts ..][.. k/parts] · B[p·k/parts .., :] ` for every part `p`:
    /// the product `g` (A and B untransposed, `beta = 0`) cut along k into `parts` equal
    /// parts, part `p`'s `m × n` result (leading dimension `g.ldc`) at element
    /// `p · g.ldc · g.n` of `partials`, in one `cublasGemmStridedBatchedEx` (f32 or f16 data,
    /// fp32 compute) on `cmd`'s stream, as library work that reads `a` and `b` and writes the
    /// span of `partials` the parts cover (an update where `ldc > m` leaves rows unwritten:
    /// [`Gemm::declared_c`]). Summed, the partials are `g`'s product; `parts = 1` is the plain GEMM.
    ///
    /// # Errors
    ///
    /// [`Validation::LibrarySplit`] when `parts` is 0 or does not divide `g.k`;
    /// [`Validation::LibraryUnsupported`] when `g` transposes an operand or has `beta != 0`;
    /// [`Validation::LibraryOperand`] when `a`, `b` or `partials` is too short for it (every
    /// part's output included); otherwise as [`Cublas::gemm`].
    pub fn gemm_split_k(
        &self,
        cmd: &mut Command<'_, CudaShim>,
        g: Gemm,
        parts: u32,
        a: &Handle,
        b: &Handle,
        partials: &Handle,
    ) -> Result<(), ServerError> {
        const NAME: &str = "cublasGemmStridedBatchedEx (split-K)";
        if parts == 0 || !g.k.is_multiple_of(parts) {
            return Err(Validation::LibrarySplit {
                work: NAME,
                k: u64::from(g.k),
                parts: u64::from(parts),
            }
            .into());
        }
        if g.trans_a || g.trans_b || g.beta != 0.0 {
            return Err(Validation::LibraryUnsupported {
                work: NAME,
                what: "a transposed operand or beta != 0 (the parts are summed by the caller)",
            }
            .into());
        }
        // The whole product's A and B lie in `a` and `b` (each part reads a block of them), and
        // one part's C in `partials` (this also refuses sizes past cuBLAS's int).
        g.check_handles(NAME, a, b, partials)?;
        let part = Gemm {
            k: g.k / parts,
            ..g
        };
        // The parts' outputs follow each other `ldc · n` elements apart, the last one holding
        // its `m × n` block: their span (refused past the end of `partials`), an update when
        // rows between columns or parts stay unwritten.
        let (partials, update) = g.declared_c(NAME, partials, parts)?;
        let (c, none): ([&Handle; 1], [&Handle; 0]) = ([&*partials], []);
        let (updates, writes): (&[&Handle], &[&Handle]) =
            if update { (&c, &none) } else { (&none, &c) };
        // SAFETY: part `p` reads columns `p·k/parts ..` (k/parts of them) of A and the same rows
        // of B's columns, inside the whole product `Gemm::check` placed in `a` and `b`, and
        // writes its `m × n` block at `p · ldc · n` of `partials`, inside the span `declared_c`
        // checked above; cuBLAS touches nothing else but the workspace `call` declares, enqueues
        // on the stream it is given and returns without waiting.
        unsafe {
            self.call(cmd, NAME, &[a, b], updates, writes, |handle, spans| {
                split_raw(
                    handle,
                    &part,
                    parts,
                    spans[0].addr.0,
                    spans[1].addr.0,
                    spans[2].addr.0,
                )
            })
        }
    }
}

/// The batched call: `parts` products of `part` (k already divided), A advancing `k · lda`
/// elements per part, B `k`, C `ldc · n`.
fn split_raw(
    handle: cb::cublasHandle_t,
    part: &Gemm,
    parts: u32,
    a: u64,
    b: u64,
    c: u64,
) -> cb::cublasStatus_t {
    let ints = [part.m, part.n, part.k, part.lda, part.ldb, part.ldc, parts]
        .map(|v| i32::try_from(v).ok());
    let [
        Some(m),
        Some(n),
        Some(k),
        Some(lda),
        Some(ldb),
        Some(ldc),
        Some(count),
    ] = ints
    else {
        // `Gemm::check` refused sizes past `int` before; cuBLAS answers the same.
        return cb::cublasStatus_t::CUBLAS_STATUS_INVALID_VALUE;
    };
    let stride_a = i64::from(k) * i64::from(lda);
    let stride_b = i64::from(k);
    let stride_c = i64::from(ldc) * i64::from(n);
    let data = match part.dtype {
        GemmType::F32 => cb::cudaDataType::CUDA_R_32F,
        GemmType::F16 => cb::cudaDataType::CUDA_R_16F,
    };
    let (alpha, beta) = (part.alpha, 0.0f32);
    let none = cb::cublasOperation_t::CUBLAS_OP_N;
    // SAFETY: the caller's contract (`Cublas::gemm_split_k`): every part's matrices lie in live
    // device memory the core resolved; with `CUBLAS_COMPUTE_32F` alpha and beta are host
    // `float`s read during the call.
    unsafe {
        cb::cublasGemmStridedBatchedEx(
            handle,
            none,
            none,
            m,
            n,
            k,
            (&raw const alpha).cast(),
            a as *const c_void,
            data,
            lda,
            stride_a,
            b as *const c_void,
            data,
            ldb,
            stride_b,
            (&raw const beta).cast(),
            c as *mut c_void,
            data,
            ldc,
            stride_c,
            count,
            cb::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            cb::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }
}
