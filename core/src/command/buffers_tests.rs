//! The alias rule and its quick test on device ranges.

use super::*;
use crate::memory::{Issuer, ReturnQueue};
use crate::shim::DeviceAddr;
use alloc::sync::Arc;
use alloc::vec::Vec;

/// Two allocations of `size` bytes (ids 1 and 2) of one device and stream.
fn two_allocations(size: u64) -> [Handle; 2] {
    let issuer = Issuer {
        device: 1,
        stream: 0,
    };
    let returns = Arc::new(ReturnQueue::issued_by(issuer, None));
    [1, 2].map(|id| Handle::new(id, size, &returns))
}

#[test]
fn an_output_may_not_overlap_any_other_buffer() {
    let [a, b] = two_allocations(64);
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

fn span(addr: u64, len: u64) -> DeviceSpan {
    DeviceSpan {
        addr: DeviceAddr(addr),
        len,
    }
}

#[test]
fn ranges_meet_when_a_written_span_shares_a_byte_with_another() {
    assert!(!ranges_meet(&[span(0, 64), span(64, 64)], 1), "adjacent");
    assert!(ranges_meet(&[span(0, 64), span(63, 64)], 1), "one byte");
    assert!(
        !ranges_meet(&[span(0, 64), span(0, 64)], 2),
        "inputs may share"
    );
    assert!(ranges_meet(&[span(0, 64), span(0, 64)], 0), "two written");
    assert!(
        !ranges_meet(&[span(0, 64), span(16, 0)], 1),
        "an empty span meets nothing"
    );
    assert!(
        ranges_meet(&[span(u64::MAX - 8, 64), span(u64::MAX - 4, 1)], 1),
        "saturates at the top of the address space, never wraps"
    );
    assert!(
        ranges_meet(&[span(u64::MAX - 3, 4), span(u64::MAX, 1)], 1),
        "the last byte of the address space is compared too"
    );
    assert!(!ranges_meet(&[span(u64::MAX - 3, 3), span(u64::MAX, 1)], 1));
}

/// Every pair once, from its later span: the same answer as comparing each written span with
/// every other span (the plain rule), for every list of up to four spans over a small address
/// range and every count of inputs (under miri, up to three spans).
#[test]
fn ranges_meet_agrees_with_every_pair_compared() {
    let most: u32 = if cfg!(miri) { 3 } else { 4 };
    let plain = |spans: &[DeviceSpan], first_written: usize| {
        (first_written..spans.len()).any(|o| {
            spans.iter().enumerate().any(|(i, s)| {
                i != o
                    && s.len != 0
                    && spans[o].len != 0
                    && s.addr.0 < spans[o].addr.0 + spans[o].len
                    && spans[o].addr.0 < s.addr.0 + s.len
            })
        })
    };
    // Spans of 0 to 2 bytes starting at 0 to 3: 12 shapes, lists drawn by a counter in base 12.
    let shapes: Vec<DeviceSpan> = (0..4)
        .flat_map(|a| (0..3).map(move |l| span(a, l)))
        .collect();
    let mut checked = 0;
    for n in 0..=most {
        let lists = 12usize.pow(n);
        for code in 0..lists {
            let mut c = code;
            let spans: Vec<DeviceSpan> = (0..n)
                .map(|k| {
                    let s = shapes[(c + k as usize) % 12];
                    c /= 12;
                    s
                })
                .collect();
            for first_written in 0..=spans.len() {
                assert_eq!(
                    ranges_meet(&spans, first_written),
                    plain(&spans, first_written),
                    "{spans:?}, written from {first_written}"
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 5_000, "{checked} lists");
}

/// The engine asks the handles only when ranges meet: every alias must show as meeting ranges
/// (views of one allocation resolve to its base plus their offset). Every pair of views of two
/// allocations (adjacent in device memory, so different allocations meet nowhere), in every
/// position, written or not. Under miri, allocations of 4 bytes (900 pairs instead of 93 636,
/// which took miri over ten minutes of CI).
#[test]
fn every_alias_shows_as_meeting_ranges() {
    let size: u64 = if cfg!(miri) { 4 } else { 16 };
    let bases = [1024, 1024 + size];
    let allocations = two_allocations(size);
    let mut views = Vec::new();
    for (a, base) in allocations.iter().zip(bases) {
        for offset in 0..=size {
            for len in 0..=size - offset {
                views.push((a.view(offset, len).unwrap(), base + offset, len));
            }
        }
    }
    let mut checked = 0;
    for (x, x_addr, x_len) in &views {
        for (y, y_addr, y_len) in &views {
            let spans = [span(*x_addr, *x_len), span(*y_addr, *y_len)];
            let both = Buffers {
                inputs: &[x],
                updates: &[],
                outputs: &[y],
            };
            let met = ranges_meet(&spans, 1);
            assert!(
                both.aliased().is_none() || met,
                "{x:?} and {y:?} alias but their ranges do not meet"
            );
            assert_eq!(
                met,
                both.aliased().is_some(),
                "only views of one allocation meet here"
            );
            checked += 1;
        }
    }
    // Every ordered pair of all 2 (size + 1)(size + 2) / 2 views (of both allocations).
    let per_allocation = (size + 1) * (size + 2) / 2;
    assert_eq!(checked, (2 * per_allocation).pow(2));
}
