//! The engine's alias check.

use super::*;
use crate::memory::{Issuer, ReturnQueue};

#[test]
fn an_output_may_not_overlap_any_other_buffer() {
    let returns = Arc::new(ReturnQueue::default());
    let issuer = Issuer {
        device: 1,
        stream: 0,
    };
    let a = Handle::new(1, issuer, 64, &returns);
    let b = Handle::new(2, issuer, 64, &returns);
    assert_eq!(aliased(&[&a], &[&b]), None);
    assert_eq!(aliased(&[&a, &a], &[&b]), None, "inputs may repeat");
    assert_eq!(aliased(&[&a], &[&a]), Some((1, 0)));
    assert_eq!(aliased(&[], &[&b, &b]), Some((0, 1)));
    let low = a.view(0, 32).unwrap();
    let high = a.view(32, 32).unwrap();
    assert_eq!(aliased(&[&low], &[&high]), None, "disjoint views");
    let mid = a.view(16, 32).unwrap();
    assert_eq!(aliased(&[&low], &[&mid]), Some((1, 0)));
    let empty = a.view(16, 0).unwrap();
    assert_eq!(
        aliased(&[&a], &[&empty]),
        None,
        "an empty view shares no byte"
    );
    // Updates are written too, and count between the inputs and the outputs.
    fn with(i: &[&Handle], u: &[&Handle], o: &[&Handle]) -> Option<(usize, usize)> {
        Buffers {
            inputs: i,
            updates: u,
            outputs: o,
        }
        .aliased()
    }
    assert_eq!(with(&[&a], &[&b], &[&b]), Some((1, 2)), "update = output");
    assert_eq!(with(&[&a], &[&a], &[]), Some((1, 0)), "update = input");
    assert_eq!(with(&[&low], &[&high], &[&b]), None, "disjoint");
    assert_eq!(
        with(&[], &[&b], &[&mid, &low]),
        Some((1, 2)),
        "outputs overlap: the first written buffer that overlaps another is named first"
    );
}
