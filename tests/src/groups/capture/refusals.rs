//! What is refused while a stream records, each with its error, and what still works: the
//! recording survives every refusal and its graph replays right; other streams keep enqueueing
//! work on their own memory and on the recording stream's memory the recording does not use
//! (no stream waits for the device meanwhile); a recording whose token is dropped (or whose
//! device is dropped) ends cleanly.

use super::{S0, S1, SMALL, begin, ctx, end, expect_filled, expect_phase, pages_live, replay};
use crate::harness::{Harness, Mode, TestKernel};
use crate::util::{Ctx, must, pattern, plus, suspect};
use devcmd::{CaptureError, CapturePhase, IoError, ReadRequest, ServerError, StreamId, Validation};
use std::fmt::Debug;

fn phase<H: Harness>(c: &mut Ctx<H>, s: StreamId) -> CapturePhase {
    must(c.dev.command(s).map(|k| k.capture_phase()), "capture_phase")
}

#[track_caller]
fn refused_as<T: Debug>(what: &str, op: &'static str, r: Result<T, ServerError>) {
    match r {
        Err(ServerError::Validation(Validation::Recording { op: named })) if named == op => {}
        other => panic!("{what}: `{op}` while recording answered {other:?}, not a refusal"),
    }
}

#[track_caller]
fn recorded_elsewhere<T: Debug>(what: &str, step: &str, r: Result<T, ServerError>) {
    match r {
        Err(ServerError::Capture(CaptureError::RecordedElsewhere {
            stream: 1,
            recording: 0,
            ..
        })) => {}
        other => panic!("{what}: {step} answered {other:?}, not RecordedElsewhere"),
    }
}

/// While S0 records: reads (`read_async`, `read_owned`), `sync`, `flush_drops`, `poll_drops`,
/// `memory_cleanup` (on any stream), `hold`, a replay on S0, and a second `begin_capture` (on
/// either stream) are refused with their errors; the recording goes on and its graph replays
/// right.
pub(crate) fn what_waits_on_the_recording_is_refused<H: Harness>(h: &H, mode: Mode) {
    let what = format!("[{mode}] capture: refusals while recording");
    let mut c = ctx(h, mode, "capture");
    let p = pattern(SMALL, 31);
    let x = must(c.create(S0, &p), &what);
    let y = must(c.empty(S0, SMALL as u64), &what);
    let rec = begin(&mut c, S0, "earlier");
    must(c.launch(S0, TestKernel::Fill, 1, &[], &[&y]), &what);
    let earlier = end(&mut c, S0, rec);
    let rec = begin(&mut c, S0, "plus_one");
    must(c.launch(S0, TestKernel::AddByte, 1, &[&x], &[&y]), &what);
    refused_as(&what, "read_async", c.read(S0, &y));
    refused_as(
        &what,
        "read_owned",
        c.dev
            .command(S0)
            .and_then(|mut k| k.read_owned(y.clone()).map(drop)),
    );
    refused_as(&what, "sync", c.sync(S0));
    refused_as(&what, "flush_drops", c.flush(S0));
    refused_as(&what, "poll_drops", c.poll(S0));
    for s in [S0, S1] {
        refused_as(
            &what,
            "memory_cleanup",
            c.dev.command(s).and_then(|mut k| k.memory_cleanup()),
        );
    }
    refused_as(
        &what,
        "hold",
        c.dev.command(S0).and_then(|mut k| k.hold(&[64])),
    );
    refused_as(&what, "replay", replay(&mut c, S0, &earlier));
    for s in [S0, S1] {
        match c.dev.command(s).and_then(|mut k| k.begin_capture("second")) {
            Err(ServerError::Capture(CaptureError::AnotherRecords { recording: 0, .. })) => {}
            other => panic!("{what}: a second begin_capture answered {other:?}"),
        }
    }
    assert_eq!(
        phase(&mut c, S0),
        CapturePhase::Recording,
        "{what}: a refusal ended the recording"
    );
    let graph = end(&mut c, S0, rec);
    must(replay(&mut c, S0, &graph), &what);
    c.expect_read(
        S0,
        &y,
        &plus(&p, 1),
        &format!("{what}: the graph recorded around refusals computed other bytes"),
        &[suspect::GRAPH],
    );
    drop((graph, earlier, x, y));
    c.assert_no_leak(&what);
}

/// While S0 records, no stream may wait for the device (a host wait is illegal during a
/// recording on CUDA, on any stream): reads, syncs and flushes on S1 are refused, and so is the
/// wait of a read enqueued before the recording (its buffers go back after the end, as `Ctx`'s
/// leak check shows). S1 still enqueues its own work and work on S0's memory the recording does
/// not use (ordered after S0's work from before the recording: a slow kernel); it is refused
/// the memory the recording uses (`RecordedElsewhere`); a reservation on S1 that needs a page is
/// refused (`PageUpdateForbidden`) and the recording goes on. No page is allocated or freed
/// meanwhile. After the end every result reads right, on either stream.
pub(crate) fn other_streams_keep_working_apart_from_its_memory<H: Harness>(h: &H, mode: Mode) {
    let what = format!("[{mode}] capture: other streams while recording");
    let mut c = ctx(h, mode, "capture");
    let (p, q, r) = (pattern(SMALL, 41), pattern(SMALL, 42), pattern(SMALL, 43));
    let x = must(c.create(S0, &p), &what);
    let y = must(c.empty(S0, SMALL as u64), &what);
    let u = must(c.create(S0, &q), &what);
    let u2 = must(c.empty(S0, SMALL as u64), &what);
    let o = must(c.create(S1, &r), &what);
    let w = must(c.empty(S1, SMALL as u64), &what);
    let w2 = must(c.empty(S1, SMALL as u64), &what);
    let early = must(
        c.dev
            .command(S1)
            .and_then(|mut k| k.read_async(&[ReadRequest::whole(&o)])),
        &what,
    );
    must(
        c.launch(S0, TestKernel::SlowAdd, 1, &[&u], &[&u2]),
        format!("{what}: slow work on S0 before the recording"),
    );
    let pages = pages_live(&c);
    let rec = begin(&mut c, S0, "plus_one");
    must(c.launch(S0, TestKernel::AddByte, 1, &[&x], &[&y]), &what);
    must(
        c.launch(S1, TestKernel::AddByte, 1, &[&o], &[&w]),
        format!("{what}: S1's own work"),
    );
    must(
        c.launch(S1, TestKernel::AddByte, 1, &[&u2], &[&w2]),
        format!("{what}: S1 reads S0's memory the recording does not use"),
    );
    refused_as(&what, "read_async", c.read(S1, &w));
    refused_as(&what, "sync", c.sync(S1));
    refused_as(&what, "flush_drops", c.flush(S1));
    refused_as(&what, "ReadFuture::wait", early.wait());
    recorded_elsewhere(
        &what,
        "S1 launching on the recording's output",
        c.launch(S1, TestKernel::AddByte, 1, &[&y], &[&w]),
    );
    recorded_elsewhere(
        &what,
        "S1 launching on the recording's input",
        c.launch(S1, TestKernel::AddByte, 1, &[&x], &[&w]),
    );
    recorded_elsewhere(
        &what,
        "S1 writing the recording's input",
        c.write(S1, &x, &[0; SMALL]),
    );
    match c.empty(S1, 1 << 20) {
        Err(ServerError::Io(IoError::PageUpdateForbidden { .. })) => {}
        other => panic!("{what}: a reservation on S1 needing a page answered {other:?}"),
    }
    expect_phase(
        &mut c,
        S0,
        CapturePhase::Recording,
        &what,
        "after the refusals on S1",
    );
    assert_eq!(
        pages_live(&c),
        pages,
        "{what}: pages were allocated or freed while S0 recorded"
    );
    let graph = end(&mut c, S0, rec);
    must(replay(&mut c, S0, &graph), &what);
    for (buffer, expected, step) in [
        (&w, plus(&r, 1), "S1's own work"),
        (
            &w2,
            plus(&q, 2),
            "S1's work on S0's memory written before the recording",
        ),
        (&y, plus(&p, 1), "the replay's output"),
    ] {
        c.expect_read(
            S1,
            buffer,
            &expected,
            &format!("{what}: {step} reads other bytes"),
            &[suspect::STREAM_WAIT, suspect::GRAPH],
        );
    }
    drop((graph, x, y, u, u2, o, w, w2));
    c.assert_no_leak(&what);
}

/// Dropping the `Recording` ends it cleanly: the next command finds the stream idle, the
/// recorded fill never ran and marked nothing, eager work runs, and a new recording works. A
/// device dropped while a recording is open gives every page back.
pub(crate) fn an_abandoned_recording_ends_cleanly<H: Harness>(h: &H, mode: Mode) {
    let what = format!("[{mode}] capture: an abandoned recording");
    let mut c = ctx(h, mode, "capture");
    let p = pattern(SMALL, 51);
    let y = must(c.create(S0, &p), &what);
    let rec = begin(&mut c, S0, "abandoned");
    must(c.launch(S0, TestKernel::Fill, 7, &[], &[&y]), &what);
    drop(rec);
    expect_phase(
        &mut c,
        S0,
        CapturePhase::Idle,
        &what,
        "after the Recording was dropped",
    );
    c.expect_read(S0, &y, &p, &what, &[suspect::GRAPH]);
    must(c.launch(S0, TestKernel::Fill, 7, &[], &[&y]), &what);
    expect_filled(
        &mut c,
        S0,
        &y,
        7,
        &format!("{what}: an eager fill after abandoning"),
    );
    let rec = begin(&mut c, S0, "again");
    must(c.launch(S0, TestKernel::Fill, 8, &[], &[&y]), &what);
    let graph = end(&mut c, S0, rec);
    must(replay(&mut c, S0, &graph), &what);
    expect_filled(
        &mut c,
        S0,
        &y,
        8,
        &format!("{what}: a new recording after abandoning, replayed"),
    );
    drop(graph);
    let open = begin(&mut c, S0, "open_at_teardown");
    must(c.launch(S0, TestKernel::Fill, 9, &[], &[&y]), &what);
    drop(y);
    let probe = c.probe.take();
    drop(c);
    drop(open);
    if let Some(probe) = probe {
        let counters = probe.counters();
        assert_eq!(
            (counters.device_pages_live, counters.host_pages_live),
            (0, 0),
            "{what}: a device dropped while recording kept pages"
        );
    }
}

/// Dropping the `Recording` ends the recording for the command that began it too: its next
/// operation runs at once (it is not recorded into a recording no one can end, which would
/// report success for work that never runs).
pub(crate) fn work_on_the_same_command_after_the_token_is_dropped_runs<H: Harness>(
    h: &H,
    mode: Mode,
) {
    let what = format!("[{mode}] capture: the same command after its Recording was dropped");
    let mut c = ctx(h, mode, "capture");
    let (p, q) = (pattern(SMALL, 53), pattern(SMALL, 54));
    let y = must(c.create(S0, &p), &what);
    {
        let mut cmd = must(c.dev.command(S0), &what);
        let rec = must(cmd.begin_capture("dropped"), &what);
        drop(rec);
        must(cmd.write_from(&y, &q), &what);
        assert_eq!(
            cmd.capture_phase(),
            CapturePhase::Idle,
            "{what}: the write ended the abandoned recording"
        );
    }
    c.expect_read(S0, &y, &q, &what, &[suspect::GRAPH]);
    // The operations that do not begin (the drop queue's poll and flush, a host buffer's
    // reservation) end an abandoned recording too, instead of refusing as if it still ran.
    for op in ["poll_drops", "flush_drops", "reserve_host"] {
        let mut cmd = must(c.dev.command(S0), &what);
        let rec = must(cmd.begin_capture("dropped again"), &what);
        drop(rec);
        let answer = match op {
            "poll_drops" => cmd.poll_drops().map(drop),
            "flush_drops" => cmd.flush_drops(),
            _ => cmd.reserve_host(64, true).map(drop),
        };
        assert!(
            answer.is_ok(),
            "{what}: {op} after the Recording was dropped answered {answer:?}"
        );
        assert_eq!(
            cmd.capture_phase(),
            CapturePhase::Idle,
            "{what}: {op} ended the abandoned recording"
        );
    }
}

/// A bind inside a recording hands the room's uses by other streams to the handle it binds to,
/// and the replays wait for them: S1's slow write of S0's room is still running when S0 records
/// `bind(room, t)` (`t` had memory of its own, which the bind frees) and a launch that reads `t`;
/// the replay reads what S1 wrote. (The memory the bind freed once made the next operation's
/// bookkeeping drop the handed-over use, and the replay raced S1's write.)
pub(crate) fn a_bind_inside_a_recording_keeps_other_streams_uses<H: Harness>(h: &H, mode: Mode) {
    let what = format!("[{mode}] capture: a bind inside a recording");
    let mut c = ctx(h, mode, "capture");
    let (p, q) = (pattern(SMALL, 51), pattern(SMALL, 52));
    let src = must(c.create(S1, &p), &what);
    let room = must(c.empty(S0, SMALL as u64), &what);
    let t = must(c.create(S0, &q), &what);
    let out = must(c.empty(S0, SMALL as u64), &what);
    must(
        c.launch(S1, TestKernel::SlowAdd, 1, &[&src], &[&room]),
        format!("{what}: S1's slow write of S0's room"),
    );
    let rec = begin(&mut c, S0, "bound");
    must(
        c.dev.command(S0).and_then(|mut k| k.bind(room, &t)),
        format!("{what}: bind inside the recording"),
    );
    must(
        c.launch(S0, TestKernel::AddByte, 1, &[&t], &[&out]),
        format!("{what}: a launch that reads the bound handle"),
    );
    let graph = end(&mut c, S0, rec);
    must(replay(&mut c, S0, &graph), &what);
    c.expect_read(
        S0,
        &out,
        &plus(&p, 2),
        &format!("{what}: the replay read the room before S1's write ended"),
        &[suspect::STREAM_WAIT, suspect::GRAPH],
    );
    drop((graph, src, t, out));
    c.assert_no_leak(&what);
}

/// A handle given room inside a recording and dropped before any replay: the room's use by
/// another stream's work still running is not forgotten with it, so memory reserved later on the
/// stream cannot be overwritten by that work.
pub(crate) fn a_handle_bound_inside_a_recording_and_dropped_keeps_other_streams_uses<H: Harness>(
    h: &H,
    mode: Mode,
) {
    let what = format!("[{mode}] capture: a handle bound inside a recording, then dropped");
    let mut c = ctx(h, mode, "capture");
    let (p, q, r) = (pattern(SMALL, 53), pattern(SMALL, 54), pattern(SMALL, 55));
    let src = must(c.create(S1, &p), &what);
    let room = must(c.empty(S0, SMALL as u64), &what);
    let t = must(c.create(S0, &q), &what);
    must(
        c.launch(S1, TestKernel::SlowAdd, 1, &[&src], &[&room]),
        format!("{what}: S1's slow write of S0's room"),
    );
    let rec = begin(&mut c, S0, "bound then dropped");
    must(
        c.dev.command(S0).and_then(|mut k| k.bind(room, &t)),
        format!("{what}: bind inside the recording"),
    );
    let graph = end(&mut c, S0, rec);
    drop((graph, t));
    // Reserved and written on S0 at once: the room, if it came back already.
    let fresh = must(c.create(S0, &r), &what);
    must(c.sync(S1), &what);
    c.expect_read(
        S0,
        &fresh,
        &r,
        &format!("{what}: S1's write of the room landed in memory reserved after the drop"),
        &[suspect::STREAM_WAIT, suspect::EARLY_FENCE],
    );
    drop((src, fresh));
    c.assert_no_leak(&what);
}
