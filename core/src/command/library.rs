//! Library work: device work the core does not launch itself (a cuBLAS GEMM, a TensorRT
//! engine's `enqueueV3(stream)`, a vendor's DSP library on a firmware board), declared by the
//! handles it reads and writes and run by the engine exactly like a launch.
//!
//! Owns the public declaration ([`LibraryWork`]), the contract a caller promises, and [`Gemm`],
//! the description of one matrix product that the shims' BLAS wrappers share (its shape checked
//! against the handles here, once, so every wrapper refuses the same calls). Does not own the
//! steps (`engine.rs`) nor any library binding (the shims' crates: cuBLAS in devcmd-cuda, a CPU
//! GEMM in devcmd-std).

use super::Command;
use super::buffers::Buffers;
use super::engine::Work;
use crate::error::{LibraryError, ServerError, Validation};
use crate::memory::Handle;
use crate::shim::{DeviceSpan, Shim};
use alloc::borrow::Cow;

/// What library work touches: its name (named by failure chains and by a stream fault it may
/// cause) and the handles it reads, updates in place, and writes. The device ranges handed to the
/// library are the handles' views in this order: reads, updates, writes.
///
/// ```
/// # use devcmd::{Handle, LibraryWork};
/// # fn f(a: &Handle, b: &Handle, c: &Handle) {
/// // C = A·B + C: C is read and written, so it is an update, not a read and a write.
/// let (ab, c) = ([a, b], [c]);
/// let work = LibraryWork::new("gemm", &ab, &[]).updating(&c);
/// # let _ = work;
/// # }
/// ```
#[derive(Debug, Clone, Copy)]
pub struct LibraryWork<'a> {
    /// The work's name.
    pub name: &'static str,
    /// Handles whose views the work reads.
    pub reads: &'a [&'a Handle],
    /// Handles whose views the work reads and writes in place (a GEMM's C when `beta` is not
    /// 0): inputs for the failure rule, outputs for the marks. None may overlap another handle
    /// of the work.
    pub updates: &'a [&'a Handle],
    /// Handles whose views the work only writes, every byte of them: on success their failure
    /// marks go. A range the work may leave unwritten is declared as an update, or left out
    /// by narrowing the view ([`Handle::view`]); [`Gemm::declared_c`] does this for a product.
    /// None may overlap another handle of the work.
    pub writes: &'a [&'a Handle],
}

impl<'a> LibraryWork<'a> {
    /// Work named `name` that reads `reads` and writes `writes` (no update in place).
    pub const fn new(
        name: &'static str,
        reads: &'a [&'a Handle],
        writes: &'a [&'a Handle],
    ) -> Self {
        Self {
            name,
            reads,
            updates: &[],
            writes,
        }
    }

    /// The same work, also reading and writing `updates` in place.
    pub const fn updating(self, updates: &'a [&'a Handle]) -> Self {
        Self { updates, ..self }
    }
}

impl<S: Shim> Command<'_, S> {
    /// Enqueues library work on this stream: `call` gets the stream's native handle
    /// ([`Shim::native_stream`]: CUDA's `CUstream`) and the device ranges of `work`'s reads, then
    /// its updates, then its writes, and enqueues the library's work on that stream.
    ///
    /// The core treats it exactly as a launch: the stream is first ordered after other streams'
    /// work on the handles; if a read or an update carries a failure, `call` is not made, the
    /// updates and writes carry the failure and [`ServerError::Skipped`] names the work; an
    /// error `call` returns marks the updates and writes failed with the library's own code and message ([`LaunchError::Library`]); the
    /// handles stay alive until a fence after the work passed; while this stream records, the
    /// work is recorded into the graph (the library's enqueues are captured with the stream's)
    /// and each replay applies the failure rule again.
    ///
    /// # Errors
    ///
    /// [`Validation::AliasedLaunch`] when a write overlaps another handle of the work;
    /// [`LaunchError::Buffer`] for a handle that names no memory; [`ServerError::Skipped`];
    /// [`LaunchError::Library`]; the failures every operation begins with.
    ///
    /// # Safety
    ///
    /// The core cannot check what a library does, so the caller promises, for the whole time
    /// `call` runs and for the work it enqueues:
    /// - `call` only *enqueues* work, on the native stream it is given (no other stream, no host
    ///   wait for the device, no synchronisation of the device or context);
    /// - that work touches device memory only inside the ranges given, writes only the
    ///   ranges of `work.updates` and `work.writes`, and writes every byte of `work.writes`
    ///   (on success their failure marks go) or leaves none of them anyone reads (a library's
    ///   scratch workspace);
    /// - `call` returns `Err` only when it enqueued nothing that will still run;
    /// - while *any* stream of the device records (CUDA's global capture mode), `call` neither
    ///   allocates nor frees device or pinned memory nor synchronises anything (cuBLAS: its
    ///   handle and workspace set up before the recording, as devcmd-cuda's `Cublas::prepare`
    ///   does); on the recording stream, everything it enqueues can be captured.
    ///
    /// Should `call` panic, the panic propagates after the stream was ordered; the writes are
    /// not marked, so a host that catches the panic must treat the written handles as unknown
    /// (rewrite them). A stream fault found later may then name this work (`work.name`) as the
    /// last launched before its fence. While this stream records, the work joined the recording
    /// before `call` ran: whatever it enqueued before panicking is in the graph, and each replay
    /// keeps what it touches alive and applies the failure rule to it like any recorded work.
    ///
    /// [`LaunchError::Library`]: crate::LaunchError::Library
    /// [`LaunchError::Buffer`]: crate::LaunchError::Buffer
    pub unsafe fn library<F>(&mut self, work: LibraryWork<'_>, call: F) -> Result<(), ServerError>
    where
        F: FnOnce(&S::NativeStream, &[DeviceSpan]) -> Result<(), LibraryError>,
    {
        let mut call = Some(call);
        let mut once = |native: &S::NativeStream, spans: &[DeviceSpan]| match call.take() {
            Some(call) => call(native, spans),
            // The engine makes the call at most once.
            None => Ok(()),
        };
        let buffers = Buffers {
            inputs: work.reads,
            updates: work.updates,
            outputs: work.writes,
        };
        let call = &mut once;
        self.run(work.name, Work::Library { call, buffers })
    }
}

/// The element type of a [`Gemm`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum GemmType {
    /// `f32` operands and result, `f32` arithmetic.
    F32,
    /// IEEE half operands and result, `f32` accumulation.
    F16,
}

impl GemmType {
    /// Bytes per element.
    pub const fn bytes(self) -> u64 {
        match self {
            Self::F32 => 4,
            Self::F16 => 2,
        }
    }
}

/// One matrix product `C = alpha · op(A) · op(B) + beta · C` in BLAS's column-major convention
/// (cuBLAS's, so a wrapper passes the fields straight through): `op(A)` is `m × k`, `op(B)` is
/// `k × n`, `C` is `m × n`; `op(X)` is `X` or its transpose; `ld*` are the leading dimensions
/// (elements between consecutive columns as stored). A row-major product `Y = X · Wᵀ` is the
/// column-major `Yᵀ = W · Xᵀ`.
///
/// ```
/// use devcmd::{Gemm, GemmType};
///
/// // C (4 × 3) = A (4 × 2) · B (2 × 3), packed, f32.
/// let g = Gemm::packed(GemmType::F32, 4, 3, 2);
/// assert_eq!((g.lda, g.ldb, g.ldc), (4, 2, 4));
/// assert_eq!(g.bytes(), (4 * 2 * 4, 2 * 3 * 4, 4 * 3 * 4));
/// assert!(g.check("gemm", 32, 24, 48).is_ok());
/// assert!(g.check("gemm", 32, 24, 47).is_err(), "C is one byte short");
/// // Sizes whose spans overflow never pass: they fit no handle.
/// let huge = Gemm { n: 1 << 31, ldb: 1 << 30, ldc: 1 << 30, ..Gemm::packed(GemmType::F32, 1, 1, 1) };
/// assert!(huge.check("gemm", 4, 4, 4).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gemm {
    /// Element type of A, B and C.
    pub dtype: GemmType,
    /// Rows of `op(A)` and of C.
    pub m: u32,
    /// Columns of `op(B)` and of C.
    pub n: u32,
    /// Columns of `op(A)`, rows of `op(B)`.
    pub k: u32,
    /// `op(A) = Aᵀ`.
    pub trans_a: bool,
    /// `op(B) = Bᵀ`.
    pub trans_b: bool,
    /// Leading dimension of A.
    pub lda: u32,
    /// Leading dimension of B.
    pub ldb: u32,
    /// Leading dimension of C.
    pub ldc: u32,
    /// Scale of the product.
    pub alpha: f32,
    /// Scale of C's old value (0: C is only written).
    pub beta: f32,
}

impl Gemm {
    /// A product of packed, untransposed operands (`lda = m`, `ldb = k`, `ldc = m`), `alpha = 1`,
    /// `beta = 0`.
    pub const fn packed(dtype: GemmType, m: u32, n: u32, k: u32) -> Self {
        Self {
            dtype,
            m,
            n,
            k,
            trans_a: false,
            trans_b: false,
            lda: m,
            ldb: k,
            ldc: m,
            alpha: 1.0,
            beta: 0.0,
        }
    }

    /// The bytes A, B and C span as stored (leading dimensions included): the last column
    /// holds only its rows. `u64::MAX` stands for a span past what any address space holds (it
    /// never fits a handle).
    pub fn bytes(&self) -> (u64, u64, u64) {
        let e = self.dtype.bytes();
        let span = |rows: u32, cols: u32, ld: u32| -> u64 {
            if rows == 0 || cols == 0 {
                return 0;
            }
            (u64::from(cols) - 1)
                .checked_mul(u64::from(ld))
                .and_then(|x| x.checked_add(u64::from(rows)))
                .and_then(|x| x.checked_mul(e))
                .unwrap_or(u64::MAX)
        };
        let (a_rows, a_cols) = if self.trans_a {
            (self.k, self.m)
        } else {
            (self.m, self.k)
        };
        let (b_rows, b_cols) = if self.trans_b {
            (self.n, self.k)
        } else {
            (self.k, self.n)
        };
        (
            span(a_rows, a_cols, self.lda),
            span(b_rows, b_cols, self.ldb),
            span(self.m, self.n, self.ldc),
        )
    }

    /// The bytes the C of `batch` products spans, one after the other `ldc · n` elements apart
    /// (for one product, [`Self::bytes`]'s third; 0 when the products write nothing: `m`, `n`
    /// or `batch` is 0); `u64::MAX` past any address space.
    ///
    /// ```
    /// use devcmd::{Gemm, GemmType};
    ///
    /// let g = Gemm::packed(GemmType::F32, 4, 3, 2);
    /// assert_eq!(g.c_bytes(1), 48);
    /// assert_eq!(g.c_bytes(3), 144, "three packed 4 × 3 products");
    /// // Columns 6 apart: the last column holds its 4 rows only.
    /// assert_eq!(Gemm { ldc: 6, ..g }.c_bytes(1), (2 * 6 + 4) * 4);
    /// // No row, no column or a batch of none: nothing.
    /// assert_eq!(Gemm { m: 0, ldc: 6, ..g }.c_bytes(4), 0);
    /// assert_eq!(g.c_bytes(0), 0);
    /// ```
    pub fn c_bytes(&self, batch: u32) -> u64 {
        if self.m == 0 || self.n == 0 || batch == 0 {
            return 0;
        }
        u64::from(self.ldc)
            .checked_mul(u64::from(self.n))
            .and_then(|x| x.checked_mul(self.dtype.bytes()))
            .and_then(|x| x.checked_mul(u64::from(batch - 1)))
            .and_then(|x| x.checked_add(self.bytes().2))
            .unwrap_or(u64::MAX)
    }

    /// How library work named `work` running `batch` of this product (written one after the
    /// other `ldc · n` elements apart; 1 for one product) must declare `c`: the view of the
    /// bytes the products span (the rest of `c` is not touched, so whatever marks it carries
    /// stay) and whether that view is an *update* rather than a write.
    ///
    /// On success the engine takes a written view as wholly written, which would wipe a
    /// failure carried by rows the products skip; so C is an update when `beta` is not 0 (the
    /// library reads it) and also when rows lie unwritten between its columns or between the
    /// products (`ldc > m`): a failure there then skips the product and C keeps it. The price
    /// of that safe side: where C is one block of rows of a wider matrix, a failure in the
    /// other blocks' rows skips this product too and spreads over its rows.
    ///
    /// # Errors
    ///
    /// [`Validation::LibraryOperand`] when the products pass the end of `c`.
    pub fn declared_c<'h>(
        &self,
        work: &'static str,
        c: &'h Handle,
        batch: u32,
    ) -> Result<(Cow<'h, Handle>, bool), Validation> {
        let spanned = self.c_bytes(batch);
        let view = match spanned.cmp(&c.len()) {
            // Exactly C: no new handle (a clone costs two atomic updates and two at its drop).
            core::cmp::Ordering::Equal => Cow::Borrowed(c),
            core::cmp::Ordering::Less => match c.view(0, spanned) {
                Ok(narrow) => Cow::Owned(narrow),
                // Unreachable: `spanned` is below C's length.
                Err(_) => Cow::Borrowed(c),
            },
            core::cmp::Ordering::Greater => {
                return Err(Validation::LibraryOperand {
                    work,
                    operand: if batch > 1 { "C (every product)" } else { "C" },
                    needs: spanned,
                    found: c.len(),
                });
            }
        };
        let skips_rows = spanned > 0 && self.ldc > self.m && (self.n > 1 || batch > 1);
        Ok((view, self.beta != 0.0 || skips_rows))
    }

    /// [`Self::check`] of the three handles' views, after checking that each view starts at a
    /// multiple of the element's size (the allocations themselves start at the device's
    /// alignment): what the wrappers of devcmd-std and devcmd-cuda call.
    ///
    /// # Errors
    ///
    /// [`Validation::LibraryAlignment`] naming the first operand whose view starts between two
    /// elements; then those of [`Self::check`].
    pub fn check_handles(
        &self,
        work: &'static str,
        a: &Handle,
        b: &Handle,
        c: &Handle,
    ) -> Result<(), Validation> {
        let element = self.dtype.bytes();
        for (operand, h) in [("A", a), ("B", b), ("C", c)] {
            if !h.offset().is_multiple_of(element) {
                return Err(Validation::LibraryAlignment {
                    work,
                    operand,
                    offset: h.offset(),
                    element,
                });
            }
        }
        self.check(work, a.len(), b.len(), c.len())
    }

    /// Checks the product against the bytes the three handles view: every dimension and leading
    /// dimension fits BLAS's 32-bit signed integers, every leading dimension holds its column,
    /// and every operand is long enough. The wrappers of devcmd-std and devcmd-cuda call it
    /// (through [`Self::check_handles`]) before the library sees anything.
    ///
    /// # Errors
    ///
    /// [`Validation::LibraryDimension`] for a dimension past `i32::MAX`;
    /// [`Validation::LibraryLeadingDimension`] naming the first leading dimension below its
    /// column's rows; [`Validation::LibraryOperand`] naming the first operand that is too short.
    pub fn check(&self, work: &'static str, a: u64, b: u64, c: u64) -> Result<(), Validation> {
        const INT_MAX: u32 = i32::MAX as u32;
        let too_large = [
            ("m", self.m),
            ("n", self.n),
            ("k", self.k),
            ("lda", self.lda),
            ("ldb", self.ldb),
            ("ldc", self.ldc),
        ]
        .into_iter()
        .find(|&(_, x)| x > INT_MAX);
        if let Some((dimension, value)) = too_large {
            return Err(Validation::LibraryDimension {
                work,
                dimension,
                value: u64::from(value),
                max: u64::from(INT_MAX),
            });
        }
        let (a_rows, b_rows) = (
            if self.trans_a { self.k } else { self.m },
            if self.trans_b { self.n } else { self.k },
        );
        for (operand, name, value, rows) in [
            ("A", "lda", self.lda, a_rows),
            ("B", "ldb", self.ldb, b_rows),
            ("C", "ldc", self.ldc, self.m),
        ] {
            if value < rows.max(1) {
                return Err(Validation::LibraryLeadingDimension {
                    work,
                    operand,
                    name,
                    value: u64::from(value),
                    least: u64::from(rows.max(1)),
                });
            }
        }
        let (need_a, need_b, need_c) = self.bytes();
        for (operand, needs, found) in [("A", need_a, a), ("B", need_b, b), ("C", need_c, c)] {
            if needs > found {
                return Err(Validation::LibraryOperand {
                    work,
                    operand,
                    needs,
                    found,
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_shim::TestShim;
    use crate::{Device, DeviceConfig, StreamId};

    #[test]
    fn c_is_declared_as_the_bytes_the_products_span_and_an_update_where_rows_are_skipped() {
        let mut device = Device::new(
            TestShim::new(1 << 30, 256, 1 << 28),
            DeviceConfig::default(),
        );
        let c = device.command(StreamId(0)).unwrap().empty(64).unwrap();
        let g = Gemm::packed(GemmType::F32, 4, 3, 2);
        let declared = |g: Gemm, batch| {
            g.declared_c("gemm", &c, batch)
                .map(|(view, update)| (view.offset(), view.len(), update))
        };
        // Packed: the first 48 bytes, a write; with beta, an update.
        assert_eq!(declared(g, 1), Ok((0, 48, false)));
        assert_eq!(declared(Gemm { beta: 1.0, ..g }, 1), Ok((0, 48, true)));
        // ldc = 6 skips rows 4 and 5 of the first two columns: an update; one column skips
        // none; a batch of two skips them between the products too.
        assert_eq!(declared(Gemm { ldc: 6, ..g }, 1), Ok((0, 64, true)));
        let column = Gemm { n: 1, ldc: 6, ..g };
        assert_eq!(declared(column, 1), Ok((0, 16, false)));
        assert_eq!(declared(column, 2), Ok((0, 40, true)));
        // Nothing written: an empty write, whatever ldc.
        assert_eq!(declared(Gemm { m: 0, ldc: 6, ..g }, 4), Ok((0, 0, false)));
        assert_eq!(declared(g, 0), Ok((0, 0, false)));
        // Past the end of C: refused, naming the bytes.
        assert_eq!(
            declared(g, 2),
            Err(Validation::LibraryOperand {
                work: "gemm",
                operand: "C (every product)",
                needs: 96,
                found: 64,
            })
        );
    }
}
