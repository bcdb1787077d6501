//! A CPU GEMM as library work: [`gemm`] runs a [`Gemm`] on the stream's worker with the
//! `matrixmultiply` crate, through [`Command::library`], so it is ordered, guarded, captured and
//! failure-ruled like any launch. The same operation devcmd-cuda offers with cuBLAS.
//!
//! Owns the mapping of a [`Gemm`] (BLAS column-major, leading dimensions, transposes) onto
//! `matrixmultiply`'s row and column strides. Does not own the shape checks
//! ([`Gemm::check_handles`], in the core) nor the steps around the call (the core's engine).

use crate::StdShim;
use devcmd::{Command, Gemm, GemmType, Handle, LibraryError, LibraryWork, ServerError};

/// Enqueues `C = alpha · op(A) · op(B) + beta · C` on `cmd`'s stream, named `"sgemm"` in failure
/// chains. `a` and `b` are read; the span of `c` the product covers is written, and updated in
/// place (read too, for the failure rule) when `beta` is not 0 or `ldc > m` leaves rows
/// unwritten ([`Gemm::declared_c`]); that span must not overlap `a` or `b`.
///
/// ```
/// use devcmd::{Device, DeviceConfig, Gemm, GemmType, StreamId};
/// use devcmd_std::{StdShim, blas};
///
/// let mut device = Device::new(StdShim::new(), DeviceConfig::default());
/// let mut cmd = device.command(StreamId(0)).unwrap();
/// let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_ne_bytes()).collect::<Vec<u8>>();
/// // Column-major A (2 × 2) = [[1, 2], [3, 4]] and B = identity.
/// let a = cmd.create(&f32s(&[1.0, 3.0, 2.0, 4.0])).unwrap();
/// let b = cmd.create(&f32s(&[1.0, 0.0, 0.0, 1.0])).unwrap();
/// let c = cmd.empty(16).unwrap();
/// blas::gemm(&mut cmd, Gemm::packed(GemmType::F32, 2, 2, 2), &a, &b, &c).unwrap();
/// let back = cmd.read_owned(c).unwrap().wait().unwrap();
/// assert_eq!(back[0].as_slice(), f32s(&[1.0, 3.0, 2.0, 4.0]));
/// ```
///
/// # Errors
///
/// [`devcmd::Validation::LibraryOperand`] when an operand is too short for the shape (and the
/// other refusals of [`Gemm::check_handles`]);
/// [`devcmd::LaunchError::Library`] for [`GemmType::F16`] (the CPU GEMM computes in `f32` only);
/// what [`Command::library`] returns.
pub fn gemm(
    cmd: &mut Command<'_, StdShim>,
    g: Gemm,
    a: &Handle,
    b: &Handle,
    c: &Handle,
) -> Result<(), ServerError> {
    const NAME: &str = "sgemm";
    g.check_handles(NAME, a, b, c)?;
    // C narrowed to the bytes the product spans; an update when it is read or has skipped rows.
    let (c, update) = g.declared_c(NAME, c, 1)?;
    let (ab, c) = ([a, b], [&*c]);
    let work = if update {
        LibraryWork::new(NAME, &ab, &[]).updating(&c)
    } else {
        LibraryWork::new(NAME, &ab, &c)
    };
    let call = |native: &crate::StdStream, spans: &[devcmd::DeviceSpan]| {
        if g.dtype != GemmType::F32 {
            return Err(LibraryError::new(
                1,
                "the CPU GEMM computes f32 only: convert the operands or use a GPU shim",
            ));
        }
        let (pa, pb, pc) = (spans[0].addr.0, spans[1].addr.0, spans[2].addr.0);
        // Column-major with leading dimensions: element (i, j) of X is at i + j·ld; a transposed
        // operand swaps the strides.
        let strides = |trans: bool, ld: u32| {
            if trans {
                (ld as isize, 1)
            } else {
                (1, ld as isize)
            }
        };
        let (rsa, csa) = strides(g.trans_a, g.lda);
        let (rsb, csb) = strides(g.trans_b, g.ldb);
        let (m, n, k) = (g.m as usize, g.n as usize, g.k as usize);
        native.enqueue_host(move || {
            if m == 0 || n == 0 {
                return Ok(());
            }
            // SAFETY: a std device address is the host address of its bytes; `Gemm::check`
            // bounded every element the strides reach inside the resolved spans, which the core
            // keeps alive until the stream passed this work; C overlaps neither A nor B (the
            // core refuses aliased writes).
            unsafe {
                matrixmultiply::sgemm(
                    m,
                    k,
                    n,
                    g.alpha,
                    std::ptr::with_exposed_provenance::<f32>(pa as usize),
                    rsa,
                    csa,
                    std::ptr::with_exposed_provenance::<f32>(pb as usize),
                    rsb,
                    csb,
                    g.beta,
                    std::ptr::with_exposed_provenance_mut::<f32>(pc as usize),
                    1,
                    g.ldc as isize,
                )
            };
            Ok(())
        });
        Ok(())
    };
    // SAFETY: the call only enqueues host work on the stream it is given; that work reads the
    // spans of `a` and `b` and writes (or updates) the span of `c`, inside the bounds
    // `Gemm::check` proved (no span overflows: a product whose span overflows is refused);
    // it returns `Err` only before enqueuing anything; recorded, it runs again at each replay.
    unsafe { cmd.library(work, call) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use devcmd::{Device, DeviceConfig, LaunchError, StreamId, Validation};

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_ne_bytes()).collect()
    }

    fn floats(b: &[u8]) -> Vec<f32> {
        b.chunks_exact(4)
            .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
            .collect()
    }

    /// Every byte of `c` carries a failure: library work that wrote it failed, saying
    /// "no (code 3)".
    fn fail(cmd: &mut Command<'_, StdShim>, c: &Handle) {
        let writes = [c];
        let work = LibraryWork::new("fails", &[], &writes);
        // SAFETY: the call enqueues nothing.
        let e = unsafe { cmd.library(work, |_, _| Err(LibraryError::new(3, "no"))) };
        assert!(e.is_err());
    }

    /// `result` is the skip of a GEMM whose input carried a failure.
    fn skipped(result: Result<(), ServerError>) {
        assert!(
            matches!(
                result,
                Err(ServerError::Skipped {
                    kernel: "sgemm",
                    ..
                })
            ),
            "{result:?}"
        );
    }

    /// Column-major reference of `alpha · op(A) · op(B) + beta · C`.
    fn reference(g: &Gemm, a: &[f32], b: &[f32], c: &[f32]) -> Vec<f32> {
        let mut out = c.to_vec();
        for j in 0..g.n as usize {
            for i in 0..g.m as usize {
                let mut acc = 0.0f64;
                for p in 0..g.k as usize {
                    let x = if g.trans_a {
                        a[p + i * g.lda as usize]
                    } else {
                        a[i + p * g.lda as usize]
                    };
                    let y = if g.trans_b {
                        b[j + p * g.ldb as usize]
                    } else {
                        b[p + j * g.ldb as usize]
                    };
                    acc += f64::from(x) * f64::from(y);
                }
                let at = i + j * g.ldc as usize;
                out[at] = (f64::from(g.alpha) * acc + f64::from(g.beta) * f64::from(c[at])) as f32;
            }
        }
        out
    }

    #[test]
    fn products_match_a_reference_with_transposes_and_leading_dimensions() {
        let mut device = Device::new(StdShim::new(), DeviceConfig::default());
        let mut seed = 7u32;
        let mut next = || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        };
        for (m, n, k, ta, tb) in [
            (5, 3, 4, false, false),
            (7, 9, 2, true, false),
            (4, 6, 8, false, true),
            (3, 3, 3, true, true),
        ] {
            let mut g = Gemm::packed(GemmType::F32, m, n, k);
            g.trans_a = ta;
            g.trans_b = tb;
            g.lda = if ta { k + 1 } else { m + 2 };
            g.ldb = if tb { n + 3 } else { k };
            g.ldc = m + 1;
            g.alpha = 1.5;
            g.beta = 0.25;
            let (na, nb, nc) = g.bytes();
            let a: Vec<f32> = (0..na / 4).map(|_| next()).collect();
            let b: Vec<f32> = (0..nb / 4).map(|_| next()).collect();
            let c: Vec<f32> = (0..nc / 4).map(|_| next()).collect();
            let mut cmd = device.command(StreamId(0)).unwrap();
            let (ha, hb, hc) = (
                cmd.create(&f32s(&a)).unwrap(),
                cmd.create(&f32s(&b)).unwrap(),
                cmd.create(&f32s(&c)).unwrap(),
            );
            gemm(&mut cmd, g, &ha, &hb, &hc).unwrap();
            let back = floats(cmd.read_owned(hc).unwrap().wait().unwrap()[0].as_slice());
            let want = reference(&g, &a, &b, &c);
            for (x, y) in back.iter().zip(&want) {
                assert!(
                    (x - y).abs() <= 1e-5 * (1.0 + y.abs()),
                    "{m}x{n}x{k} ta={ta} tb={tb}: {x} vs {y}"
                );
            }
        }
    }

    #[test]
    fn an_update_of_c_that_carries_a_failure_is_skipped_and_a_huge_shape_refused() {
        let mut device = Device::new(StdShim::new(), DeviceConfig::default());
        let mut cmd = device.command(StreamId(0)).unwrap();
        let one = f32s(&[1.0]);
        let (a, b, c) = (
            cmd.create(&one).unwrap(),
            cmd.create(&one).unwrap(),
            cmd.empty(4).unwrap(),
        );
        fail(&mut cmd, &c);
        let mut g = Gemm::packed(GemmType::F32, 1, 1, 1);
        g.beta = 1.0;
        skipped(gemm(&mut cmd, g, &a, &b, &c));
        // The library's words are the unwritten read's root cause: its error's source.
        let unwritten = cmd.read_owned(c).unwrap_err();
        let root = core::error::Error::source(&unwritten).map(ToString::to_string);
        assert!(
            root.as_deref().is_some_and(|r| r.contains("no (code 3)")),
            "{unwritten}: {root:?}"
        );
        // A shape whose spans overflow is refused before the library sees it.
        let c = cmd.empty(4).unwrap();
        let huge = Gemm {
            n: 1 << 30,
            ldb: 1 << 30,
            ldc: 1 << 30,
            ..Gemm::packed(GemmType::F32, 1, 1, 1)
        };
        assert!(
            gemm(&mut cmd, huge, &a, &b, &c)
                .unwrap_err()
                .to_string()
                .contains("operand")
        );
    }

    #[test]
    fn bytes_the_product_skips_keep_the_failure_they_carry() {
        let mut device = Device::new(StdShim::new(), DeviceConfig::default());
        let mut cmd = device.command(StreamId(0)).unwrap();
        let (a, b) = (
            cmd.create(&f32s(&[1.0, 2.0, 3.0, 4.0])).unwrap(),
            cmd.create(&f32s(&[1.0, 0.0, 0.0, 1.0])).unwrap(),
        );
        // C twice the product's size: the product's 16 bytes are written and lose the failure;
        // the 16 after it were not and keep it.
        let c = cmd.empty(32).unwrap();
        fail(&mut cmd, &c);
        gemm(&mut cmd, Gemm::packed(GemmType::F32, 2, 2, 2), &a, &b, &c).unwrap();
        let head = cmd
            .read_owned(c.view(0, 16).unwrap())
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(head[0].as_slice(), f32s(&[1.0, 2.0, 3.0, 4.0]));
        let tail = cmd.read_owned(c.view(16, 16).unwrap()).unwrap_err();
        assert!(
            tail.to_string().contains("failed work left unwritten"),
            "{tail}"
        );
        // ldc = 3 leaves row 2 of column 0 unwritten: C is an update, so the failure it carries
        // skips the product instead of being wiped off that row.
        let c = cmd.empty(20).unwrap();
        fail(&mut cmd, &c);
        let padded = Gemm {
            ldc: 3,
            ..Gemm::packed(GemmType::F32, 2, 2, 2)
        };
        skipped(gemm(&mut cmd, padded, &a, &b, &c));
        assert!(cmd.read_owned(c.view(8, 4).unwrap()).is_err());
        // Without a failure, the padded product writes its rows and leaves the skipped one.
        let c = cmd.create(&f32s(&[9.0; 5])).unwrap();
        gemm(&mut cmd, padded, &a, &b, &c).unwrap();
        let back = cmd.read_owned(c).unwrap().wait().unwrap();
        assert_eq!(back[0].as_slice(), f32s(&[1.0, 2.0, 9.0, 3.0, 4.0]));
    }

    #[test]
    fn short_operands_and_half_precision_are_refused_with_reasons() {
        let mut device = Device::new(StdShim::new(), DeviceConfig::default());
        let mut cmd = device.command(StreamId(0)).unwrap();
        let (a, b, c) = (
            cmd.empty(64).unwrap(),
            cmd.empty(64).unwrap(),
            cmd.empty(60).unwrap(),
        );
        let short = gemm(&mut cmd, Gemm::packed(GemmType::F32, 4, 4, 4), &a, &b, &c).unwrap_err();
        assert!(short.to_string().contains("operand C"), "{short}");
        let c = cmd.empty(64).unwrap();
        let half = gemm(&mut cmd, Gemm::packed(GemmType::F16, 4, 4, 4), &a, &b, &c).unwrap_err();
        assert!(
            matches!(half, ServerError::Launch(LaunchError::Library { .. })),
            "{half:?}"
        );
        assert!(half.to_string().contains("f32 only"));
    }

    #[test]
    fn a_short_leading_dimension_and_a_view_between_elements_are_refused_with_reasons() {
        let mut device = Device::new(StdShim::new(), DeviceConfig::default());
        let mut cmd = device.command(StreamId(0)).unwrap();
        let (a, b, c) = (
            cmd.empty(64).unwrap(),
            cmd.empty(64).unwrap(),
            cmd.empty(64).unwrap(),
        );
        // lda below A's rows: named as a leading dimension, with the least it may be.
        let narrow = Gemm {
            lda: 2,
            ..Gemm::packed(GemmType::F32, 4, 4, 4)
        };
        let e = gemm(&mut cmd, narrow, &a, &b, &c).unwrap_err();
        assert!(
            matches!(
                e,
                ServerError::Validation(Validation::LibraryLeadingDimension {
                    operand: "A",
                    name: "lda",
                    value: 2,
                    least: 4,
                    ..
                })
            ),
            "{e:?}"
        );
        assert!(e.to_string().contains("pass lda of 4 or more"), "{e}");
        // An operand viewed 2 bytes in: between two f32s, refused before the library reads
        // it (matrixmultiply, like a GPU, reads whole aligned elements).
        let odd = b.view(2, 60).unwrap();
        let e = gemm(&mut cmd, Gemm::packed(GemmType::F32, 2, 2, 2), &a, &odd, &c).unwrap_err();
        assert!(
            matches!(
                e,
                ServerError::Validation(Validation::LibraryAlignment {
                    operand: "B",
                    offset: 2,
                    element: 4,
                    ..
                })
            ),
            "{e:?}"
        );
        assert!(
            e.to_string().contains("starts at a multiple of 4 bytes"),
            "{e}"
        );
        // A view at a whole element is fine.
        let whole = b.view(4, 60).unwrap();
        gemm(
            &mut cmd,
            Gemm::packed(GemmType::F32, 2, 2, 2),
            &a,
            &whole,
            &c,
        )
        .unwrap();
        cmd.sync().unwrap();
    }
}
