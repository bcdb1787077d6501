//! What a graph keeps and gives back: no page allocated or freed while recording, room held
//! ahead, an allocation freed inside the recording kept until the graph is gone, nothing reused
//! under a live graph, everything back after the graph drops and a fence passes; and a recording
//! that needs a page, discarded cleanly.

use super::{LARGE, S0, SMALL, begin, ctx, end, expect_filled, expect_phase, pages_live, replay};
use crate::harness::{Harness, Mode, TestKernel};
use crate::util::{Ctx, must, pattern, plus, suspect};
use devcmd::{CaptureError, CapturePhase, Handle, IoError, ServerError, StreamId};

/// More than any page of [`crate::util::small_pages`] holds: a reservation of it needs a page.
const NEEDS_A_PAGE: u64 = 1 << 20;

fn range<H: Harness>(c: &mut Ctx<H>, s: StreamId, h: &Handle) -> (u64, u64) {
    let r = must(
        c.dev
            .command(s)
            .and_then(|mut k| k.resource(h).map_err(Into::into)),
        "resource",
    );
    (r.addr.0, r.addr.0 + r.len)
}

/// Room held with `hold` serves a reservation inside the recording, which then drops its handle
/// there; no page is allocated or freed while it records. While the graph lives that allocation
/// stays (it is counted), and reservations made afterwards never overlap it; replays compute
/// right. The graph is dropped with replays in flight: they still compute right, and once a
/// fence after them passed the allocation is back.
pub(crate) fn memory_stays_under_a_live_graph<H: Harness>(h: &H, mode: Mode) {
    let what = format!("[{mode}] capture: memory under a live graph");
    let mut c = ctx(h, mode, "capture");
    let p = pattern(LARGE, 11);
    let inp = must(c.create(S0, &p), &what);
    let out = must(c.empty(S0, LARGE as u64), &what);
    must(
        c.dev.command(S0).and_then(|mut k| k.hold(&[LARGE as u64])),
        format!("{what}: hold room for the recording"),
    );
    let base = c.live_on(S0).0;
    let pages = pages_live(&c);
    let rec = begin(&mut c, S0, "through_a_temporary");
    let t = must(
        c.empty(S0, LARGE as u64),
        format!("{what}: a reservation inside the recording, from the room held"),
    );
    let t_range = range(&mut c, S0, &t);
    must(c.launch(S0, TestKernel::AddByte, 1, &[&inp], &[&t]), &what);
    must(c.launch(S0, TestKernel::AddByte, 1, &[&t], &[&out]), &what);
    drop(t);
    let graph = end(&mut c, S0, rec);
    assert_eq!(
        pages_live(&c),
        pages,
        "{what}: pages were allocated or freed while the stream recorded"
    );
    assert!(
        graph.guarded_pages() >= 1,
        "{what}: the graph guards no page"
    );
    assert_eq!(
        c.live_on(S0).0,
        base + 1,
        "{what}: the allocation freed inside the recording is not kept while the graph lives"
    );
    let mut kept = Vec::new();
    for round in 0..4 {
        let z = must(c.empty(S0, LARGE as u64), &what);
        let rz = range(&mut c, S0, &z);
        assert!(
            rz.1 <= t_range.0 || t_range.1 <= rz.0,
            "{what}: reservation {round} after the recording {rz:x?} overlaps the graph's \
             temporary {t_range:x?}"
        );
        must(c.write(S0, &z, &vec![0xA5; LARGE]), &what);
        kept.push(z);
    }
    for round in 0..3 {
        must(replay(&mut c, S0, &graph), &what);
        c.expect_read(
            S0,
            &out,
            &plus(&p, 2),
            &format!("{what}: replay {round} beside new reservations computed other bytes"),
            &[suspect::GRAPH, suspect::EARLY_FENCE],
        );
    }
    drop(kept);
    must(c.write(S0, &out, &vec![0; LARGE]), &what);
    for _ in 0..3 {
        must(replay(&mut c, S0, &graph), &what);
    }
    drop(graph);
    c.expect_read(
        S0,
        &out,
        &plus(&p, 2),
        &format!(
            "{what}: replays in flight when the graph was dropped computed other bytes: \
         what they use went too early"
        ),
        &[suspect::EARLY_FENCE, suspect::GRAPH],
    );
    // The first flush covers the replays with a fence, the second waits for it.
    for _ in 0..2 {
        must(c.flush(S0), &what);
    }
    assert_eq!(
        c.live_on(S0).0,
        base,
        "{what}: the graph's allocation is not back after the graph dropped and a fence after \
         its last replay passed"
    );
    drop((inp, out));
    c.assert_no_leak(&what);
}

/// A reservation inside the recording that needs a new page fails with `PageUpdateForbidden`
/// naming the size and the room held, and discards the recording: every later operation on the
/// stream answers `Discarded` until `end_capture` reports it; no page was allocated or freed;
/// the buffer the recording would have written carries the failure. The stream then works as
/// before, and a recording with the room held succeeds.
pub(crate) fn a_recording_that_needs_a_page_is_discarded_cleanly<H: Harness>(h: &H, mode: Mode) {
    let what = format!("[{mode}] capture: a recording that needs a page");
    let mut c = ctx(h, mode, "capture");
    let y = must(c.create(S0, &pattern(SMALL, 1)), &what);
    let pages = pages_live(&c);
    let rec = begin(&mut c, S0, "needs_a_page");
    must(c.launch(S0, TestKernel::Fill, 9, &[], &[&y]), &what);
    match c.empty(S0, NEEDS_A_PAGE) {
        Err(ServerError::Io(IoError::PageUpdateForbidden { size, room })) => {
            assert_eq!(size, NEEDS_A_PAGE, "{what}: the error names another size");
            assert!(room < size, "{what}: room {room} was held but not used");
        }
        other => panic!("{what}: expected PageUpdateForbidden, got {other:?}"),
    }
    expect_phase(
        &mut c,
        S0,
        CapturePhase::Discarded,
        &what,
        "after a reservation that needed a page",
    );
    match c.write(S0, &y, &[0; SMALL]) {
        Err(ServerError::Capture(CaptureError::Discarded { stream: 0, .. })) => {}
        other => panic!("{what}: an operation after the discard answered {other:?}"),
    }
    match c.dev.command(S0).and_then(|mut k| k.end_capture(rec)) {
        Err(ServerError::Capture(CaptureError::Discarded { reason, .. })) => assert!(
            matches!(
                *reason,
                ServerError::Io(IoError::PageUpdateForbidden { .. })
            ),
            "{what}: the discard names another reason: {reason}"
        ),
        other => panic!("{what}: end_capture of a discarded recording answered {other:?}"),
    }
    expect_phase(
        &mut c,
        S0,
        CapturePhase::Idle,
        &what,
        "after end_capture reported the discard",
    );
    assert_eq!(
        pages_live(&c),
        pages,
        "{what}: pages were allocated or freed while the stream recorded"
    );
    match c.read(S0, &y) {
        Err(ServerError::Unwritten { .. }) => {}
        other => panic!(
            "{what}: the buffer the discarded recording would have written reads as {other:?}"
        ),
    }
    let q = pattern(SMALL, 2);
    must(
        c.write(S0, &y, &q),
        format!("{what}: the stream works after"),
    );
    c.expect_read(
        S0,
        &y,
        &q,
        &format!("{what}: a write after the discarded recording"),
        &[
            suspect::COPIES,
            "end_capture (the stream was left recording after the discard)",
        ],
    );
    must(
        c.dev.command(S0).and_then(|mut k| k.hold(&[NEEDS_A_PAGE])),
        format!("{what}: hold the room"),
    );
    let rec = begin(&mut c, S0, "room_held");
    let z = must(
        c.empty(S0, NEEDS_A_PAGE),
        format!("{what}: with the room held"),
    );
    must(c.launch(S0, TestKernel::Fill, 4, &[], &[&z]), &what);
    let graph = end(&mut c, S0, rec);
    must(replay(&mut c, S0, &graph), &what);
    expect_filled(
        &mut c,
        S0,
        &z,
        4,
        &format!("{what}: a recording with the room held, replayed"),
    );
    drop((graph, y, z));
    c.assert_no_leak(&what);
}
