//! Copy layouts and staging: the pure rules, and pitched copies through a real device.

use crate::harness::{Harness, Mode};
use crate::util::{Ctx, first_diff, must, pattern};
use devcmd::memory::PoolKind;
use devcmd::staging::{Staging, StagingPolicy};
use devcmd::{
    CopyLayout, DeviceConfig, ExternalBytes, HostBuffer, HostOrigin, IoError, ReadRequest,
    ServerError, StreamId, Validation,
};

const MIB: u64 = 1 << 20;

/// Bytes the caller owns, claiming to be a memory-mapped file.
struct MappedFile(Vec<u8>);

// SAFETY: the vector is owned by the value and never modified: `bytes` returns the same slice
// until the value drops.
unsafe impl ExternalBytes for MappedFile {
    fn bytes(&self) -> &[u8] {
        &self.0
    }
    fn origin(&self) -> HostOrigin {
        HostOrigin::FileMapped
    }
}

fn layout_rules() {
    // Contiguous: linear.
    let l = CopyLayout::of(&[4, 8], &[8, 1], 4).expect("packed rows");
    assert!(l.is_linear(), "packed rows must be one linear copy");
    assert_eq!(l, CopyLayout::linear(128));
    assert_eq!(
        CopyLayout::of(&[8], &[1], 4).unwrap(),
        CopyLayout::linear(32)
    );
    // (4, 8) with strides (12, 1), f32: 4 rows of 32 bytes, 48 apart.
    let l = CopyLayout::of(&[4, 8], &[12, 1], 4).expect("pitched rows");
    assert_eq!((l.width(), l.pitch(), l.height()), (32, 48, 4));
    assert!(!l.is_linear());
    assert_eq!((l.packed_bytes(), l.device_span()), (128, 3 * 48 + 32));
    // (2, 3, 8) with strides (36, 12, 1): every row counts.
    let l = CopyLayout::of(&[2, 3, 8], &[36, 12, 1], 4).expect("3-d pitched");
    assert_eq!((l.width(), l.pitch(), l.height()), (32, 48, 6));
    // The element size scales bytes, not rows.
    for elem in [1, 2, 8] {
        let l = CopyLayout::of(&[4, 8], &[12, 1], elem).unwrap();
        assert_eq!(
            (l.width(), l.pitch(), l.height()),
            (8 * elem, 12 * elem, 4),
            "element size {elem}"
        );
    }
    // Empty data is checked for nothing.
    assert_eq!(
        CopyLayout::of(&[0, 8], &[0, 3], 4).unwrap(),
        CopyLayout::linear(0)
    );
}

fn staging_rules() {
    let p = StagingPolicy::default();
    for size in [1, 10 * MIB, 100 * MIB, 400 * MIB] {
        let s = Staging::of(size, HostOrigin::FileMapped, &p);
        assert!(
            s.through_pinned && s.flush_after,
            "file-backed data of {size} bytes must always be staged and flushed after"
        );
        assert!(
            !Staging::of(size, HostOrigin::Pinned, &p).through_pinned,
            "pinned data of {size} bytes must never be restaged"
        );
    }
    assert!(Staging::of(100 * MIB - 1, HostOrigin::Heap, &p).through_pinned);
    assert!(
        !Staging::of(100 * MIB, HostOrigin::Heap, &p).through_pinned,
        "heap data of exactly 100 MiB is not staged"
    );
    assert!(!Staging::of(10 * MIB, HostOrigin::Heap, &p).flush_after);
    assert!(Staging::of(10 * MIB + 1, HostOrigin::Heap, &p).flush_after);
    assert!(Staging::of(10 * MIB + 1, HostOrigin::Pinned, &p).flush_after);
}

/// Uploads `packed` with `layout` into a buffer pre-filled with `0xEE`, then checks the device
/// bytes row by row (padding untouched) and the pitched read back.
fn pitched_round_trip<H: Harness>(c: &mut Ctx<H>, s: StreamId, layout: CopyLayout, offset: u64) {
    let mode = c.mode;
    let span = layout.device_span();
    let total = offset + span + 16;
    let whole = must(c.create(s, &vec![0xEE; total as usize]), "create");
    let view = whole
        .view(offset, span)
        .expect("view inside the allocation");
    let packed = pattern(layout.packed_bytes() as usize, 77);
    must(
        c.dev
            .command(s)
            .and_then(|mut k| k.write_layout(&view, HostBuffer::from_vec(packed.clone()), layout)),
        "pitched write",
    );
    let device = must(c.read(s, &whole), "read back");
    let mut expected = vec![0xEEu8; total as usize];
    for row in 0..layout.height() {
        let (w, p) = (layout.width(), layout.pitch());
        let dst = (offset + row * p) as usize;
        let src = (row * w) as usize;
        expected[dst..dst + w as usize].copy_from_slice(&packed[src..src + w as usize]);
    }
    assert!(
        device == expected,
        "[{mode}] pitched upload {layout:?} at offset {offset}: device bytes wrong ({})",
        first_diff(&device, &expected)
    );
    let fut = must(
        c.dev.command(s).and_then(|mut k| {
            k.read_async(&[ReadRequest {
                handle: &view,
                layout,
            }])
        }),
        "pitched read",
    );
    let back = must(fut.wait(), "pitched read wait").remove(0).into_vec();
    assert!(
        back == packed,
        "[{mode}] pitched read {layout:?} did not pack the rows back ({})",
        first_diff(&back, &packed)
    );
    // A layout past the view is refused, not clipped.
    let short = whole.view(offset, span - 1).unwrap();
    let err = c
        .dev
        .command(s)
        .and_then(|mut k| k.write_layout(&short, HostBuffer::from_vec(packed.clone()), layout))
        .expect_err("a layout past the view must be refused");
    assert!(
        matches!(
            err,
            ServerError::Validation(Validation::LayoutPastView { .. })
        ),
        "[{mode}] layout past the view: {err}"
    );
}

fn pinned_allocations<H: Harness>(c: &mut Ctx<H>, s: StreamId) -> u64 {
    let report = c.dev.memory_report();
    report
        .streams
        .iter()
        .filter(|(id, _)| *id == s)
        .flat_map(|(_, r)| r.pools.iter())
        .filter(|p| p.kind == PoolKind::PinnedHost)
        .map(|p| p.allocations)
        .sum()
}

fn flushes<H: Harness>(c: &Ctx<H>, s: StreamId) -> u64 {
    c.dev
        .drop_stats()
        .into_iter()
        .find(|(id, _)| *id == s)
        .map_or(0, |(_, st)| st.flushes)
}

/// The layout and staging group. Checks:
///
/// - `CopyLayout::of`: contiguous rows are linear; `(4, 8)` strides `(12, 1)` f32 is width 32,
///   pitch 48, height 4; `(2, 3, 8)` strides `(36, 12, 1)` has height 6; the element size
///   scales bytes; empty data is accepted;
/// - `Staging::of`: file-backed always staged and flushed; pinned never restaged; heap staged
///   below 100 MiB exactly; flush after more than 10 MiB;
/// - through a real device: pitched writes land row by row (padding untouched), pitched reads
///   pack the rows back, at an offset view too; a layout past the view is refused;
/// - the staging rules as a device applies them (with a small policy so the thresholds are cheap
///   to cross): file-backed data is staged through pinned memory and flushed at once; pinned
///   data is not copied again; heap data is staged below the threshold only; an upload over the
///   flush threshold flushes at once.
pub fn layouts<H: Harness>(h: &H, mode: Mode) {
    layout_rules();
    staging_rules();
    // The pipeline off: these cases pin the staging of whole copies (the `pipelined` group
    // checks the pipeline).
    let policy = StagingPolicy {
        max_staged: 4096,
        flush_after: 2048,
        pipeline_from: u64::MAX,
        ..StagingPolicy::default()
    };
    let config = DeviceConfig {
        staging: policy,
        ..DeviceConfig::default()
    };
    let Some(mut c) = Ctx::new(h, mode, config, "layouts") else {
        return;
    };
    let s = StreamId(0);
    for (shape, strides, elem) in [
        (&[4u64, 8][..], &[12u64, 1][..], 4u64),
        (&[2, 3, 8], &[36, 12, 1], 4),
        (&[5, 3], &[7, 1], 2),
        (&[4, 8], &[8, 1], 4),
    ] {
        let layout = CopyLayout::of(shape, strides, elem).unwrap();
        for offset in [0, 40] {
            pitched_round_trip(&mut c, s, layout, offset);
        }
    }

    // Staging as applied, one fresh stream per case so the pinned counts are its own. A shim may
    // serve no pinned memory (the core then stages through the heap, which nothing counts): the
    // pinned counts are checked only when it serves some.
    let dst = must(c.empty(s, 8192), "empty");
    let pinned_stream = StreamId(7);
    let mut pinned = must(
        must(c.dev.command(pinned_stream), "command").reserve_host(512, true),
        "reserve_host",
    );
    let serves_pinned = pinned.origin() == HostOrigin::Pinned;
    let cases: [(&str, HostBuffer, bool, bool); 5] = [
        (
            "file-backed",
            HostBuffer::external(Box::new(MappedFile(pattern(100, 1)))),
            true,
            true,
        ),
        (
            "heap below the threshold",
            HostBuffer::from_vec(pattern(4095, 2)),
            true,
            true,
        ),
        (
            "heap at the threshold",
            HostBuffer::from_vec(pattern(4096, 3)),
            false,
            true,
        ),
        (
            "heap at the flush size",
            HostBuffer::from_vec(pattern(2048, 4)),
            true,
            false,
        ),
        (
            "small heap",
            HostBuffer::from_vec(pattern(100, 5)),
            true,
            false,
        ),
    ];
    for (i, (what, data, staged, flushed)) in cases.into_iter().enumerate() {
        let s = StreamId(1 + i as u32);
        let bytes = data.as_slice().to_vec();
        let view = dst.view(0, bytes.len() as u64).unwrap();
        must(c.flush(s), "flush");
        let (p0, f0) = (pinned_allocations(&mut c, s), flushes(&c, s));
        must(
            c.dev.command(s).and_then(|mut k| k.write(&view, data)),
            what,
        );
        let (p1, f1) = (pinned_allocations(&mut c, s), flushes(&c, s));
        let staged = staged && serves_pinned;
        assert_eq!(
            p1 - p0,
            u64::from(staged),
            "[{mode}] {what} ({} bytes): staged through pinned memory: expected {staged}",
            bytes.len()
        );
        assert_eq!(
            f1 - f0,
            u64::from(flushed),
            "[{mode}] {what} ({} bytes): flushed right after: expected {flushed}",
            bytes.len()
        );
        let back = must(c.read(s, &view), "read");
        assert!(
            back == bytes,
            "[{mode}] {what}: {}",
            first_diff(&back, &bytes)
        );
    }
    // Pinned data is not copied again (if the shim serves pinned memory at all).
    if serves_pinned {
        let s = pinned_stream;
        pinned.as_mut_slice().copy_from_slice(&pattern(512, 6));
        let p0 = pinned_allocations(&mut c, s);
        let view = dst.view(0, 512).unwrap();
        must(
            c.dev.command(s).and_then(|mut k| k.write(&view, pinned)),
            "write",
        );
        assert_eq!(
            pinned_allocations(&mut c, s),
            p0,
            "[{mode}] pinned data was staged again"
        );
        let back = must(c.read(s, &view), "read");
        assert!(
            back == pattern(512, 6),
            "[{mode}] pinned upload: wrong bytes"
        );
    }
    // Bad strides never reach the device.
    assert!(matches!(
        CopyLayout::of(&[4, 8], &[1, 4], 4),
        Err(IoError::UnsupportedStrides { .. })
    ));
    drop(dst);
    c.assert_no_leak("layouts");
}
