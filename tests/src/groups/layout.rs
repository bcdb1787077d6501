//! Copy layouts and staging: the pure rules, and pitched copies through a real device.

use crate::harness::{Harness, Mode};
use crate::util::{Ctx, expect_same, must, pattern, suspect};
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

/// What a failure of the pure rules says: they are the core's, not the shim's.
const CORE_RULE: &str = "a rule of the core (devcmd::CopyLayout), no shim call is involved";

fn layout_rules() {
    // Contiguous: linear.
    let l = CopyLayout::of(&[4, 8], &[8, 1], 4).expect("packed rows");
    assert!(
        l.is_linear() && l == CopyLayout::linear(128),
        "layouts: CopyLayout::of shape (4, 8) strides (8, 1) f32 (packed rows) gave {l:?}, \
         expected one linear copy of 128 bytes; {CORE_RULE}"
    );
    let l = CopyLayout::of(&[8], &[1], 4).unwrap();
    assert_eq!(
        l,
        CopyLayout::linear(32),
        "layouts: CopyLayout::of shape (8,) strides (1,) f32 gave {l:?}, expected one linear \
         copy of 32 bytes; {CORE_RULE}"
    );
    // (4, 8) with strides (12, 1), f32: 4 rows of 32 bytes, 48 apart.
    let l = CopyLayout::of(&[4, 8], &[12, 1], 4).expect("pitched rows");
    let got = (l.width(), l.pitch(), l.height(), l.is_linear());
    assert_eq!(
        got,
        (32, 48, 4, false),
        "layouts: CopyLayout::of shape (4, 8) strides (12, 1) f32: (width, pitch, height, \
         linear) is {got:?}, expected 4 rows of 32 bytes 48 apart; {CORE_RULE}"
    );
    let got = (l.packed_bytes(), l.device_span());
    assert_eq!(
        got,
        (128, 3 * 48 + 32),
        "layouts: CopyLayout::of shape (4, 8) strides (12, 1) f32: (packed bytes, device span) \
         is {got:?}, expected 128 packed and 3 pitches plus one row on the device; {CORE_RULE}"
    );
    // (2, 3, 8) with strides (36, 12, 1): every row counts.
    let l = CopyLayout::of(&[2, 3, 8], &[36, 12, 1], 4).expect("3-d pitched");
    let got = (l.width(), l.pitch(), l.height());
    assert_eq!(
        got,
        (32, 48, 6),
        "layouts: CopyLayout::of shape (2, 3, 8) strides (36, 12, 1) f32: (width, pitch, \
         height) is {got:?}, expected 6 rows (every row of both planes); {CORE_RULE}"
    );
    // The element size scales bytes, not rows.
    for elem in [1, 2, 8] {
        let l = CopyLayout::of(&[4, 8], &[12, 1], elem).unwrap();
        let got = (l.width(), l.pitch(), l.height());
        assert_eq!(
            got,
            (8 * elem, 12 * elem, 4),
            "layouts: CopyLayout::of shape (4, 8) strides (12, 1), element size {elem}: \
             (width, pitch, height) is {got:?}; the element size must scale bytes, not rows; \
             {CORE_RULE}"
        );
    }
    // Empty data is checked for nothing.
    let l = CopyLayout::of(&[0, 8], &[0, 3], 4).unwrap();
    assert_eq!(
        l,
        CopyLayout::linear(0),
        "layouts: CopyLayout::of an empty shape (0, 8) gave {l:?}, expected an empty linear \
         copy; {CORE_RULE}"
    );
}

fn staging_rules() {
    const STAGING_RULE: &str = "a rule of the core (devcmd::staging::Staging::of under the \
                                default StagingPolicy), no shim call is involved";
    let p = StagingPolicy::default();
    for size in [1, 10 * MIB, 100 * MIB, 400 * MIB] {
        let s = Staging::of(size, HostOrigin::FileMapped, &p);
        assert!(
            s.through_pinned && s.flush_after,
            "layouts: file-backed data of {size} bytes must always be staged and flushed after, \
             got {s:?}; {STAGING_RULE}"
        );
        let s = Staging::of(size, HostOrigin::Pinned, &p);
        assert!(
            !s.through_pinned,
            "layouts: pinned data of {size} bytes must never be restaged, got {s:?}; \
             {STAGING_RULE}"
        );
    }
    for (size, origin, staged, flushed) in [
        (100 * MIB - 1, HostOrigin::Heap, Some(true), None),
        (100 * MIB, HostOrigin::Heap, Some(false), None),
        (10 * MIB, HostOrigin::Heap, None, Some(false)),
        (10 * MIB + 1, HostOrigin::Heap, None, Some(true)),
        (10 * MIB + 1, HostOrigin::Pinned, None, Some(true)),
    ] {
        let s = Staging::of(size, origin, &p);
        assert!(
            staged.is_none_or(|v| s.through_pinned == v)
                && flushed.is_none_or(|v| s.flush_after == v),
            "layouts: {origin:?} data of {size} bytes: got {s:?}, expected staged through \
             pinned memory {staged:?} and a flush after {flushed:?} (heap data is staged below \
             100 MiB, any upload over 10 MiB is flushed after; None: not checked); \
             {STAGING_RULE}"
        );
    }
}

/// The calls a pitched copy goes through: the layout reaches them as it is.
const PITCHED: &str = "copy_to_device / copy_to_host with a pitched CopyLayout (height rows of \
                       width bytes, pitch apart on the device: the copy ignored the pitch, or \
                       wrote into the padding between rows)";

/// Uploads `packed` with `layout` into a buffer pre-filled with `0xEE`, then checks the device
/// bytes row by row (padding untouched) and the pitched read back.
fn pitched_round_trip<H: Harness>(c: &mut Ctx<H>, s: StreamId, layout: CopyLayout, offset: u64) {
    let mode = c.mode;
    let span = layout.device_span();
    let total = offset + span + 16;
    let what = format!("[{mode}] layouts: a pitched upload {layout:?} at offset {offset}");
    let whole = must(c.create(s, &vec![0xEE; total as usize]), &what);
    let view = whole
        .view(offset, span)
        .expect("view inside the allocation");
    let packed = pattern(layout.packed_bytes() as usize, 77);
    must(
        c.dev
            .command(s)
            .and_then(|mut k| k.write_layout(&view, HostBuffer::from_vec(packed.clone()), layout)),
        &what,
    );
    let device = must(c.read(s, &whole), &what);
    let mut expected = vec![0xEEu8; total as usize];
    for row in 0..layout.height() {
        let (w, p) = (layout.width(), layout.pitch());
        let dst = (offset + row * p) as usize;
        let src = (row * w) as usize;
        expected[dst..dst + w as usize].copy_from_slice(&packed[src..src + w as usize]);
    }
    expect_same(
        &device,
        &expected,
        &format!("{what}, then a linear read of the whole allocation (padding 0xEE)"),
        &[PITCHED, suspect::EARLY_WAIT],
    );
    let what = format!("[{mode}] layouts: a pitched read {layout:?} at offset {offset}");
    let fut = must(
        c.dev.command(s).and_then(|mut k| {
            k.read_async(&[ReadRequest {
                handle: &view,
                layout,
            }])
        }),
        &what,
    );
    let back = must(fut.wait(), &what).remove(0).into_vec();
    expect_same(
        &back,
        &packed,
        &format!("{what}: the rows packed back"),
        &[PITCHED, suspect::EARLY_WAIT],
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
        "[{mode}] layouts: a pitched write {layout:?} into a view one byte short must be \
         refused by the core as LayoutPastView (before any shim call), got: {err}"
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
            "[{mode}] layouts: an upload of {what} ({} bytes): pinned allocations it made, \
             expected {} (staged through pinned memory: {staged}); the staging rule as the \
             core applies it (Command::write), or host_alloc_pinned",
            bytes.len(),
            u64::from(staged)
        );
        assert_eq!(
            f1 - f0,
            u64::from(flushed),
            "[{mode}] layouts: an upload of {what} ({} bytes): flushes right after it, \
             expected {} (flushed: {flushed}); the staging rule as the core applies it \
             (Command::write)",
            bytes.len(),
            u64::from(flushed)
        );
        let read = format!(
            "[{mode}] layouts: an upload of {what} ({} bytes)",
            bytes.len()
        );
        c.expect_read(
            s,
            &view,
            &bytes,
            &read,
            &[suspect::COPIES, suspect::EARLY_WAIT],
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
            "[{mode}] layouts: an upload of pinned data (reserve_host) made a pinned allocation: \
             the core staged it again (the staging rule as Command::write applies it)"
        );
        let what = format!("[{mode}] layouts: an upload of 512 bytes of pinned data");
        c.expect_read(
            s,
            &view,
            &pattern(512, 6),
            &what,
            &[
                "copy_to_device from HostMemory::Pinned (the pinned page's bytes moved wrong)",
                suspect::EARLY_WAIT,
            ],
        );
    }
    // Bad strides never reach the device.
    let bad = CopyLayout::of(&[4, 8], &[1, 4], 4);
    assert!(
        matches!(bad, Err(IoError::UnsupportedStrides { .. })),
        "layouts: CopyLayout::of shape (4, 8) strides (1, 4) (columns, not rows) must be \
         UnsupportedStrides, got {bad:?}; {CORE_RULE}"
    );
    drop(dst);
    c.assert_no_leak("layouts");
}
