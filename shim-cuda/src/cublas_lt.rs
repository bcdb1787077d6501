//! cuBLASLt's fused epilogue as library work: `C = gelu(op(A) op(B) + bias)` in one kernel
//! ([`Cublas::gemm_bias_gelu`]), where plain cuBLAS needs the GEMM and a second launch for the
//! bias and the activation (a GPT-2 MLP's first layer).
//!
//! Owns: finding and checking cuBLASLt ([`LT_SYMBOLS`]), the cuBLASLt handle of a [`Cublas`],
//! and one plan per GEMM shape (the matmul description, the three matrix layouts and the
//! algorithm cuBLASLt's heuristic chose, kept for the next call of that shape). Does not own:
//! the per-stream workspace, the stream binding and the library-work declaration (`cublas.rs`:
//! this path is enqueued through the same [`Cublas`] lane, so ordering, guards, capture and the
//! failure rule are the core's, as for every cuBLAS call).
//!
//! cuBLASLt is loaded beside cuBLAS by [`Cublas::new`]; a machine with cuBLAS but not cuBLASLt
//! still gets a [`Cublas`], and [`Cublas::gemm_bias_gelu`] then answers with the loader's reason
//! ([`Cublas::lt`] says which it is). The activation is GPT-2's tanh GELU (cuBLASLt's
//! `CUBLASLT_EPILOGUE_GELU_BIAS`), applied in fp32 before the one rounding to C's type.
//!
//! **Set-up happens before anything is enqueued.** The cuBLASLt handle (made with the shim's
//! context bound, by [`Cublas::prepare`] or the first call, never while a stream records: it may
//! allocate on the device) and the plan of a shape (host state: the heuristic is asked with the
//! operands' alignments and the stream's workspace) are made before the library work; when
//! either fails, or the bias does not start on a 16-byte boundary (the epilogue reads it 16 bytes
//! at a time), the call returns [`LaunchError::Library`] with work [`LT_SETUP`] and nothing is
//! enqueued or marked, so a caller may run the GEMM and the activation separately instead.
//!
//! Every call sets the bias pointer on its plan's description under the [`Cublas`]'s mutex, just
//! before `cublasLtMatmul`, which reads the description while it enqueues: a recorded call keeps
//! the bias it was recorded with, whatever later calls of the shape set.

use crate::cublas::{Cublas, Lanes, library_result};
use cudarc::cublaslt::sys as lt;
use devcmd::{
    CapturePhase, Command, Gemm, GemmType, Handle, LaunchError, LibraryError, LibraryWork,
    ServerError, ShimOp, Validation,
};
use std::ffi::c_void;

/// Every cuBLASLt function this module calls, checked in the loaded library before the first
/// call (a test checks that the sources call no other `lt::cublasLt*` function).
pub const LT_SYMBOLS: &[&str] = &[
    "cublasLtCreate",
    "cublasLtDestroy",
    "cublasLtMatmulDescCreate",
    "cublasLtMatmulDescDestroy",
    "cublasLtMatmulDescSetAttribute",
    "cublasLtMatrixLayoutCreate",
    "cublasLtMatrixLayoutDestroy",
    "cublasLtMatmulPreferenceCreate",
    "cublasLtMatmulPreferenceDestroy",
    "cublasLtMatmulPreferenceSetAttribute",
    "cublasLtMatmulAlgoGetHeuristic",
    "cublasLtMatmul",
];

/// Finds cuBLASLt (the names cudarc tries) and checks [`LT_SYMBOLS`] in it: the library's name,
/// or why not (every name tried and what the loader said, or the missing function).
pub(crate) fn load_lt() -> Result<String, String> {
    let mut names: Vec<String> = Vec::new();
    for name in cudarc::get_lib_name_candidates("cublasLt") {
        if !names.contains(&name) {
            names.push(name);
        }
    }
    let library = crate::driver::first_that_loads(&names, &["libcublasLt.so", "libcublasLt.so.13"])
        .map_err(|reasons| {
            let said: Vec<String> = reasons.iter().map(|(n, r)| format!("{n}: {r}")).collect();
            format!(
                "no cuBLASLt library found (tried {}; {}): install the CUDA toolkit's cuBLAS \
                 (it ships libcublasLt) or put its directory on LD_LIBRARY_PATH",
                names.join(", "),
                said.join("; ")
            )
        })?;
    // SAFETY: `first_that_loads` just loaded one of cudarc's candidates; cudarc tries the same
    // names in the same order, so it loads that library instead of panicking.
    let lib = unsafe { lt::culib() };
    for symbol in LT_SYMBOLS {
        // SAFETY: the symbol is only looked up, never called through this type.
        if unsafe { lib.get::<unsafe extern "C" fn()>(*symbol) }.is_err() {
            return Err(format!(
                "{library} has no {symbol}: install a cuBLAS of CUDA 11.4 or newer"
            ));
        }
    }
    Ok(library)
}

/// The work name of a failure to set a cuBLASLt call up ([`LaunchError::Library`]): nothing
/// was enqueued or marked.
pub const LT_SETUP: &str = "cuBLASLt set-up";

/// What a plan is for: a GEMM's shape, types, transposes and the alignment of A, B and C.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Key {
    dtype: GemmType,
    dims: [u32; 6],
    trans: (bool, bool),
    align: [u32; 3],
    /// Bytes of the workspace the plan's algorithm was chosen for (the lane's: a plan made
    /// for a larger one would be refused by `cublasLtMatmul` on a smaller one).
    workspace: u64,
}

/// The most plans a [`Cublas`] keeps: past it the oldest goes (shapes that change every call,
/// a growing decode length, would otherwise grow the list without end).
const MAX_PLANS: usize = 64;

/// The alignment of `h`'s first byte, up to 256 (a devcmd allocation starts on a 256-byte
/// boundary; a view starts at its offset into it).
fn alignment(h: &Handle) -> u32 {
    match h.offset() {
        0 => 256,
        o => 1u32 << o.trailing_zeros().min(8),
    }
}

/// A set-up failure as the error a call returns (nothing enqueued).
fn setup_error(error: LibraryError) -> ServerError {
    LaunchError::Library {
        work: LT_SETUP,
        error,
    }
    .into()
}

/// What a call needs of its plan, copied out of the cache (raw handles and the algorithm).
#[derive(Clone, Copy)]
struct Ready {
    handle: lt::cublasLtHandle_t,
    desc: lt::cublasLtMatmulDesc_t,
    a: lt::cublasLtMatrixLayout_t,
    b: lt::cublasLtMatrixLayout_t,
    c: lt::cublasLtMatrixLayout_t,
    algo: lt::cublasLtMatmulAlgo_t,
}

/// One shape's description, layouts and algorithm, made by the first call of that shape.
struct Plan {
    key: Key,
    desc: lt::cublasLtMatmulDesc_t,
    a: lt::cublasLtMatrixLayout_t,
    b: lt::cublasLtMatrixLayout_t,
    c: lt::cublasLtMatrixLayout_t,
    algo: lt::cublasLtMatmulAlgo_t,
}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: each object not null was created for this plan and is destroyed once, here;
        // destroying host-side descriptions waits for nothing. Errors cannot be reported.
        unsafe {
            for layout in [self.c, self.b, self.a] {
                if !layout.is_null() {
                    let _ = lt::cublasLtMatrixLayoutDestroy(layout);
                }
            }
            if !self.desc.is_null() {
                let _ = lt::cublasLtMatmulDescDestroy(self.desc);
            }
        }
    }
}

/// The cuBLASLt handle of a [`Cublas`] and its plans; used under the [`Cublas`]'s mutex.
pub(crate) struct Lt {
    handle: lt::cublasLtHandle_t,
    plans: Vec<Plan>,
}

impl Drop for Lt {
    fn drop(&mut self) {
        self.plans.clear();
        // SAFETY: the handle was created by `cublasLtCreate` and is destroyed once, here.
        let _ = unsafe { lt::cublasLtDestroy(self.handle) };
    }
}

impl Lt {
    /// A new handle, for the device whose context the calling thread has bound.
    fn new() -> Result<Self, LibraryError> {
        let mut handle = std::ptr::null_mut();
        // SAFETY: the library was checked (`load_lt`); the pointer is valid for one write.
        let s = unsafe { lt::cublasLtCreate(&mut handle) };
        check("cublasLtCreate", s)?;
        Ok(Self {
            handle,
            plans: Vec::new(),
        })
    }

    /// The plan for `key` with the GELU-and-bias epilogue, made on first use: the heuristic's
    /// first algorithm for those alignments that fits the key's workspace.
    fn ready(&mut self, key: Key) -> Result<Ready, LibraryError> {
        let i = match self.plans.iter().position(|p| p.key == key) {
            Some(i) => i,
            None => {
                let plan = make_plan(self.handle, key)?;
                if self.plans.len() >= MAX_PLANS {
                    // The objects of a plan are host state, read when a call enqueues: one
                    // enqueued (or recorded) before keeps what it read.
                    self.plans.remove(0);
                }
                self.plans.push(plan);
                self.plans.len() - 1
            }
        };
        let p = &self.plans[i];
        Ok(Ready {
            handle: self.handle,
            desc: p.desc,
            a: p.a,
            b: p.b,
            c: p.c,
            algo: p.algo,
        })
    }
}

/// `Ok` for success, else the library error naming the call and the status.
fn check(call: &str, s: lt::cublasStatus_t) -> Result<(), LibraryError> {
    // cuBLASLt's status is cuBLAS's (`cublasStatus_t`, the same values): report it the same way.
    // SAFETY: both enums are `#[repr(u32)]` bindings of the one C enum `cublasStatus_t`, and
    // every value cuBLASLt returns is one of cuBLAS's.
    let s: cudarc::cublas::sys::cublasStatus_t = unsafe { std::mem::transmute(s) };
    library_result(call, s)
}

fn make_plan(handle: lt::cublasLtHandle_t, key: Key) -> Result<Plan, LibraryError> {
    let [m, n, k, lda, ldb, ldc] = key.dims.map(u64::from);
    let ty = match key.dtype {
        GemmType::F32 => lt::cudaDataType::CUDA_R_32F,
        GemmType::F16 => lt::cudaDataType::CUDA_R_16F,
    };
    let op = |t: bool| {
        if t {
            cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_T
        } else {
            cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_N
        }
    };
    let mut plan = Plan {
        key,
        desc: std::ptr::null_mut(),
        a: std::ptr::null_mut(),
        b: std::ptr::null_mut(),
        c: std::ptr::null_mut(),
        // SAFETY: the algorithm is plain data (an array of integers); all zeros is a valid value
        // that the heuristic overwrites before any use.
        algo: unsafe { std::mem::zeroed() },
    };
    // A plan half made is destroyed by its drop, which skips what was not made (null).
    // SAFETY: every call below gets out-pointers valid for one write and attribute buffers
    // valid for the sizes given; the handle is alive.
    unsafe {
        check(
            "cublasLtMatmulDescCreate",
            lt::cublasLtMatmulDescCreate(
                &mut plan.desc,
                lt::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                lt::cudaDataType::CUDA_R_32F,
            ),
        )?;
        let set = |attr, v: &cudarc::cublas::sys::cublasOperation_t| {
            lt::cublasLtMatmulDescSetAttribute(
                plan.desc,
                attr,
                (v as *const cudarc::cublas::sys::cublasOperation_t).cast(),
                std::mem::size_of::<cudarc::cublas::sys::cublasOperation_t>(),
            )
        };
        let (ta, tb) = (op(key.trans.0), op(key.trans.1));
        use lt::cublasLtMatmulDescAttributes_t as A;
        check(
            "cublasLtMatmulDescSetAttribute",
            set(A::CUBLASLT_MATMUL_DESC_TRANSA, &ta),
        )?;
        check(
            "cublasLtMatmulDescSetAttribute",
            set(A::CUBLASLT_MATMUL_DESC_TRANSB, &tb),
        )?;
        let epilogue = lt::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_GELU_BIAS;
        check(
            "cublasLtMatmulDescSetAttribute",
            lt::cublasLtMatmulDescSetAttribute(
                plan.desc,
                A::CUBLASLT_MATMUL_DESC_EPILOGUE,
                (&raw const epilogue).cast(),
                std::mem::size_of::<lt::cublasLtEpilogue_t>(),
            ),
        )?;
        // The stored shapes of A and B: op(A) is m x k, op(B) is k x n.
        let (a_rows, a_cols) = if key.trans.0 { (k, m) } else { (m, k) };
        let (b_rows, b_cols) = if key.trans.1 { (n, k) } else { (k, n) };
        let layout = |out: &mut lt::cublasLtMatrixLayout_t, rows, cols, ld: u64| {
            check(
                "cublasLtMatrixLayoutCreate",
                lt::cublasLtMatrixLayoutCreate(out, ty, rows, cols, ld as i64),
            )
        };
        layout(&mut plan.a, a_rows, a_cols, lda)?;
        layout(&mut plan.b, b_rows, b_cols, ldb)?;
        layout(&mut plan.c, m, n, ldc)?;
        let mut pref = std::ptr::null_mut();
        check(
            "cublasLtMatmulPreferenceCreate",
            lt::cublasLtMatmulPreferenceCreate(&mut pref),
        )?;
        let bytes = key.workspace;
        let s = lt::cublasLtMatmulPreferenceSetAttribute(
            pref,
            lt::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
            (&raw const bytes).cast(),
            std::mem::size_of::<u64>(),
        );
        use lt::cublasLtMatmulPreferenceAttributes_t as P;
        let aligns = [
            (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align[0]),
            (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align[1]),
            (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align[2]),
            (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align[2]),
        ];
        let mut s = s;
        for (attr, align) in aligns {
            if s == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
                s = lt::cublasLtMatmulPreferenceSetAttribute(
                    pref,
                    attr,
                    (&raw const align).cast(),
                    std::mem::size_of::<u32>(),
                );
            }
        }
        let mut result: lt::cublasLtMatmulHeuristicResult_t = std::mem::zeroed();
        let mut found = 0;
        let h = if s == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            lt::cublasLtMatmulAlgoGetHeuristic(
                handle,
                plan.desc,
                plan.a,
                plan.b,
                plan.c,
                plan.c,
                pref,
                1,
                &mut result,
                &mut found,
            )
        } else {
            s
        };
        let _ = lt::cublasLtMatmulPreferenceDestroy(pref);
        check("cublasLtMatmulAlgoGetHeuristic", h)?;
        if found < 1 {
            return Err(LibraryError::new(
                15, // CUBLAS_STATUS_NOT_SUPPORTED
                "CUBLAS_STATUS_NOT_SUPPORTED (cublasLtMatmulAlgoGetHeuristic: no algorithm for \
                 this shape and these alignments with the GELU-and-bias epilogue; run \
                 Cublas::gemm and the activation separately)"
                    .to_owned(),
            ));
        }
        plan.algo = result.algo;
    }
    Ok(plan)
}

impl Cublas {
    /// Whether cuBLASLt loaded (and so [`Cublas::gemm_bias_gelu`] can run), or why not.
    pub fn lt(&self) -> Result<&str, &str> {
        self.lt_library.as_deref().map_err(String::as_str)
    }

    /// The cuBLASLt handle, made now (the shim's context bound) if it is not yet; refused while
    /// a stream of the process records.
    pub(crate) fn ensure_lt<'l>(
        &self,
        lanes: &'l mut Lanes,
        cmd: &mut Command<'_, crate::CudaShim>,
    ) -> Result<&'l mut Lt, ServerError> {
        if let Err(why) = &self.lt_library {
            return Err(setup_error(LibraryError::new(-1, why.clone())));
        }
        if lanes.lt.is_none() {
            if cmd.capture_phase() == CapturePhase::Recording || self.shim.is_any_stream_capturing()
            {
                return Err(Validation::Recording {
                    op: "the first cuBLASLt call (cublasLtCreate may allocate device memory, \
                         which a recording of any device of the process would not survive; \
                         call Cublas::prepare on a stream before recording)",
                }
                .into());
            }
            self.shim
                .context()
                .bind(ShimOp::StreamCreate)
                .map_err(|e| setup_error(LibraryError::new(-1, e.to_string())))?;
            lanes.lt = Some(Lt::new().map_err(setup_error)?);
        }
        Ok(lanes.lt.as_mut().expect("just made"))
    }

    /// `C = gelu(alpha op(A) op(B) + beta C + bias)` (GPT-2's tanh GELU; `bias` one value per
    /// row of C, that is `g.m` values of `g.dtype`, starting on a 16-byte boundary) on `cmd`'s
    /// stream in one cuBLASLt kernel, as library work reading `a`, `b` and `bias` and writing
    /// `c` (read too where `beta != 0`, like [`Cublas::gemm`]) and the stream's workspace.
    ///
    /// # Errors
    ///
    /// Those of [`Cublas::gemm`]; [`Validation::LibraryOperand`] for a `bias` shorter than
    /// `g.m` values; [`LaunchError::Library`] with work [`LT_SETUP`], nothing enqueued or
    /// marked, when cuBLASLt did not load, its handle or the shape's plan cannot be made
    /// (`CUBLAS_STATUS_NOT_SUPPORTED` where it has no algorithm), or the bias is not 16-byte
    /// aligned: the caller may run [`Cublas::gemm`] and the activation separately instead.
    pub fn gemm_bias_gelu(
        &self,
        cmd: &mut Command<'_, crate::CudaShim>,
        g: Gemm,
        a: &Handle,
        b: &Handle,
        bias: &Handle,
        c: &Handle,
    ) -> Result<(), ServerError> {
        const NAME: &str = "cublasLtMatmul (GELU and bias epilogue)";
        g.check_handles(NAME, a, b, c)?;
        let bias_bytes = u64::from(g.m) * g.dtype.bytes();
        if bias.len() < bias_bytes {
            return Err(Validation::LibraryOperand {
                work: NAME,
                operand: "bias",
                needs: bias_bytes,
                found: bias.len(),
            }
            .into());
        }
        if alignment(bias) < 16 {
            return Err(setup_error(LibraryError::new(
                -1,
                format!(
                    "the bias starts {} bytes into its allocation, not on a 16-byte boundary: \
                     cuBLASLt's epilogue reads it 16 bytes at a time; give it a view that starts \
                     on a 16-byte boundary, or run Cublas::gemm and the activation separately",
                    bias.offset()
                ),
            )));
        }
        let mut guard = self.lock();
        let lanes = &mut *guard;
        // The plan is chosen for the workspace the stream's lane has (made with the size the
        // `Cublas` had then), not for the size set now.
        let workspace = self.lane(lanes, cmd)?.workspace.len();
        let key = Key {
            dtype: g.dtype,
            dims: [g.m, g.n, g.k, g.lda, g.ldb, g.ldc],
            trans: (g.trans_a, g.trans_b),
            align: [alignment(a), alignment(b), alignment(c)],
            workspace,
        };
        let ready = self
            .ensure_lt(lanes, cmd)?
            .ready(key)
            .map_err(setup_error)?;
        let lane = self.lane(lanes, cmd)?;
        let ws = &lane.workspace;
        // C narrowed and an update when read or with skipped rows, as for `Cublas::gemm`.
        let (c, update) = g.declared_c(NAME, c, 1)?;
        let (only_c, c_and_ws, only_ws) = ([&*c], [&*c, ws], [ws]);
        let (updates, writes): (&[&Handle], &[&Handle]) = if update {
            (&only_c, &only_ws)
        } else {
            (&[], &c_and_ws)
        };
        let reads = [a, b, bias];
        let work = LibraryWork::new(NAME, &reads, writes).updating(updates);
        let (alpha, beta) = (g.alpha, g.beta);
        // SAFETY: `Gemm::check` showed that A, B and C lie inside `a`, `b` and `c`, and the bias
        // check that `g.m` values lie inside `bias`, 16-byte aligned; cuBLASLt touches those and
        // the workspace it is given (the lane's, declared among the writes: its span, whose
        // length the plan's heuristic was bounded by), enqueues on the stream it is given and
        // returns without waiting. The plan's objects live in the cache until a newer plan
        // evicts them (past `MAX_PLANS`) or the `Cublas` is dropped; the mutex, held from
        // `ready` across the bias pointer's setting and the call, keeps any eviction out.
        unsafe {
            cmd.library(work, |native, spans| {
                // Reads, updates, writes: A, B, bias, C, workspace whatever `beta` is.
                let [sa, sb, sbias, sc, sws] = spans else {
                    unreachable!("five spans: A, B, bias, C and the workspace");
                };
                let ptr = sbias.addr.0 as *const c_void;
                check(
                    "cublasLtMatmulDescSetAttribute",
                    lt::cublasLtMatmulDescSetAttribute(
                        ready.desc,
                        lt::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                        (&raw const ptr).cast(),
                        std::mem::size_of::<*const c_void>(),
                    ),
                )?;
                let s = lt::cublasLtMatmul(
                    ready.handle,
                    ready.desc,
                    (&raw const alpha).cast(),
                    sa.addr.0 as *const c_void,
                    ready.a,
                    sb.addr.0 as *const c_void,
                    ready.b,
                    (&raw const beta).cast(),
                    sc.addr.0 as *const c_void,
                    ready.c,
                    sc.addr.0 as *mut c_void,
                    ready.c,
                    &ready.algo,
                    sws.addr.0 as *mut c_void,
                    usize::try_from(sws.len).unwrap_or(usize::MAX),
                    (*native).cast(),
                );
                check(NAME, s)
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `lt::cublasLt*` function this file calls is checked before the first call.
    #[test]
    fn every_cublaslt_function_called_is_checked_first() {
        use crate::cublas::tests::{assert_checked, called};
        let called = called(include_str!("cublas_lt.rs"), "lt", "cublasLt");
        assert!(called.len() >= 10, "{called:?}");
        assert_checked(&called, LT_SYMBOLS, "LT_SYMBOLS");
    }

    /// Without the library (CI), loading is the clear error, never a panic.
    #[test]
    fn without_cublaslt_loading_is_the_clear_error_never_a_panic() {
        use std::io::Write;
        match load_lt() {
            Ok(name) => {
                let _ = writeln!(
                    std::io::stderr(),
                    "skipped: {name} loads here; tests/library_lt.rs covers the epilogue"
                );
            }
            Err(why) => {
                assert!(why.starts_with("no cuBLASLt library found"), "{why}");
                assert!(why.contains("LD_LIBRARY_PATH"), "{why}");
            }
        }
    }
}
