//! Checking the device's results against the host reference, NaN-safe: a result that is not
//! within tolerance of a finite reference — NaN and infinities included — is a mismatch, and a
//! reference that is not finite is an error (nothing can be verified against it), never a pass.

use std::fmt;

/// Whether `got` is within tolerance of the finite reference `want` (false for a NaN `got`).
pub fn close(got: f32, want: f32) -> bool {
    (got - want).abs() <= 1e-5 * want.abs().max(1e-3) + 1e-7
}

/// The outputs that differ from the reference.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Mismatches {
    /// Outputs not within tolerance, plus outputs one side has and the other lacks.
    pub count: usize,
    /// The first output that differs: its index, the result and the reference (`None` for the
    /// side that lacks it).
    pub first: Option<(usize, Option<f32>, Option<f32>)>,
}

/// A reference value nothing can be verified against.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReferenceNotFinite {
    /// The output index and the reference's value there.
    pub index: usize,
    pub value: f32,
}

impl fmt::Display for ReferenceNotFinite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the host reference of output {} is {}, so no result can be verified against it; \
             the weights or inputs overflow the model's f32 arithmetic: use weights of moderate \
             size (as --save-weights writes them)",
            self.index, self.value
        )
    }
}

impl std::error::Error for ReferenceNotFinite {}

/// Compares `got` with `want` output by output.
pub fn compare(got: &[f32], want: &[f32]) -> Result<Mismatches, ReferenceNotFinite> {
    if let Some(index) = want.iter().position(|w| !w.is_finite()) {
        return Err(ReferenceNotFinite {
            index,
            value: want[index],
        });
    }
    let mut m = Mismatches::default();
    for i in 0..got.len().max(want.len()) {
        let (g, w) = (got.get(i).copied(), want.get(i).copied());
        let same = matches!((g, w), (Some(g), Some(w)) if close(g, w));
        if !same {
            m.count += 1;
            m.first.get_or_insert((i, g, w));
        }
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_and_nearly_equal_results_pass() {
        let want = [0.25, 1e-9, 0.0, 0.999_999];
        let got = [0.25, 0.0, 1e-8, 0.999_998_5];
        assert_eq!(compare(&got, &want), Ok(Mismatches::default()));
        assert!(!close(0.26, 0.25));
    }

    #[test]
    fn nan_and_infinite_results_are_mismatches() {
        let want = [0.1, 0.2, 0.3, 0.4];
        let got = [f32::NAN, 0.2, f32::INFINITY, f32::NEG_INFINITY];
        let m = compare(&got, &want).expect("the reference is finite");
        assert_eq!(m.count, 3);
        let (i, g, w) = m.first.expect("a first mismatch");
        assert_eq!((i, w), (0, Some(0.1)));
        assert!(g.is_some_and(f32::is_nan));
        assert!(!close(f32::NAN, 0.0));
        let all_nan = vec![f32::NAN; 320];
        assert_eq!(compare(&all_nan, &[0.1; 320]).map(|m| m.count), Ok(320));
    }

    #[test]
    fn a_non_finite_reference_is_an_error_never_a_pass() {
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let want = [0.5, bad, 0.5];
            for got in [[0.5, 0.5, 0.5], [0.5, bad, 0.5], [f32::NAN; 3]] {
                let err = compare(&got, &want).expect_err("cannot verify against it");
                assert_eq!(err.index, 1);
                assert!(
                    err.value.is_nan() == bad.is_nan()
                        && err.value.is_infinite() == bad.is_infinite()
                );
            }
        }
        let msg = compare(&[0.0], &[f32::NAN]).unwrap_err().to_string();
        assert!(
            msg.starts_with("the host reference of output 0 is NaN"),
            "{msg}"
        );
    }

    #[test]
    fn missing_and_extra_outputs_are_mismatches() {
        assert_eq!(
            compare(&[1.0], &[1.0, 2.0]),
            Ok(Mismatches {
                count: 1,
                first: Some((1, None, Some(2.0)))
            })
        );
        assert_eq!(compare(&[1.0, 2.0, 3.0], &[1.0]).map(|m| m.count), Ok(2));
    }
}
