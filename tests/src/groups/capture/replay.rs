//! Replays compute what the recorded work computes: inputs written between replays, host bytes
//! owned by the graph, replays on other streams ordered like any work, a graph updated in place.

use super::{
    HOST_NODES, LARGE, RAN_WHEN_RECORDED, S0, S1, SMALL, begin, ctx, end, expect_filled, replay,
};
use crate::harness::{Harness, Mode, TestKernel};
use crate::util::{expect_same, must, pattern, plus, suspect};
use devcmd::HostBuffer;

/// Record `out = (inp + 1) + 2` through an intermediate buffer, once; then, five times, write a
/// new input eagerly and replay: every result is the new input plus three. A buffer the
/// recording fills is unchanged until the first replay (recorded work does not run), and three
/// replays enqueued back to back leave the same result. For a small-pool and an arena size.
pub(crate) fn replays_compute_the_recorded_work<H: Harness>(h: &H, mode: Mode) {
    for size in [SMALL, LARGE] {
        let what = format!("[{mode}] capture: replays of {size} bytes");
        let mut c = ctx(h, mode, "capture");
        let p = pattern(size, 3);
        let inp = must(c.create(S0, &p), format!("{what}: create the input"));
        let mid = must(c.empty(S0, size as u64), &what);
        let out = must(c.empty(S0, size as u64), &what);
        let marker = must(c.create(S0, &p), &what);
        let rec = begin(&mut c, S0, "plus_three");
        must(
            c.launch(S0, TestKernel::AddByte, 1, &[&inp], &[&mid]),
            format!("{what}: record add 1"),
        );
        must(
            c.launch(S0, TestKernel::AddByte, 2, &[&mid], &[&out]),
            format!("{what}: record add 2"),
        );
        must(
            c.launch(S0, TestKernel::Fill, 0xEE, &[], &[&marker]),
            format!("{what}: record a fill"),
        );
        let graph = end(&mut c, S0, rec);
        assert_eq!(
            graph.name(),
            "plus_three",
            "{what}: the graph must keep the name begin_capture was given (the core's Graph)"
        );
        c.expect_read(
            S0,
            &marker,
            &p,
            &format!(
                "{what}: a buffer the recording fills changed before any replay: recorded work \
             ran when it was recorded"
            ),
            &[RAN_WHEN_RECORDED],
        );
        for round in 0..5u8 {
            let data = pattern(size, 40 + round);
            must(
                c.write(S0, &inp, &data),
                format!("{what}: write the input before replay {round}"),
            );
            must(
                replay(&mut c, S0, &graph),
                format!("{what}: replay {round}"),
            );
            let got = must(
                c.read(S0, &out),
                format!("{what}: read after replay {round}"),
            );
            let expected = plus(&data, 3);
            expect_same(
                &got,
                &expected,
                &format!("{what}: replay {round} after a new input computed other bytes"),
                &[suspect::GRAPH],
            );
        }
        for _ in 0..3 {
            must(
                replay(&mut c, S0, &graph),
                format!("{what}: replays back to back"),
            );
        }
        let got = must(c.read(S0, &out), &what);
        let data = pattern(size, 44);
        expect_same(
            &got,
            &plus(&data, 3),
            &format!("{what}: three replays back to back left other bytes"),
            &[suspect::GRAPH],
        );
        expect_filled(
            &mut c,
            S0,
            &marker,
            0xEE,
            &format!("{what}: the recorded fill, after the replays"),
        );
        drop((graph, inp, mid, out, marker));
        c.assert_no_leak(&what);
    }
}

/// A recorded upload sends bytes the graph owns: the caller's buffers (one moved in, one
/// borrowed) are gone right after the calls, the input is overwritten eagerly between replays,
/// and the drop queues are flushed (in poison mode released host buffers are overwritten), yet
/// every replay re-sends the recorded bytes.
pub(crate) fn host_bytes_belong_to_the_graph<H: Harness>(h: &H, mode: Mode) {
    let what = format!("[{mode}] capture: host bytes of a graph");
    let mut c = ctx(h, mode, "capture");
    let (p1, p2) = (pattern(LARGE, 7), pattern(SMALL, 8));
    let x = must(c.empty(S0, LARGE as u64), &what);
    let y = must(c.empty(S0, LARGE as u64), &what);
    let small = must(c.empty(S0, SMALL as u64), &what);
    let rec = begin(&mut c, S0, "upload_then_add");
    must(
        c.dev
            .command(S0)
            .and_then(|mut k| k.write(&x, HostBuffer::from_vec(p1.clone()))),
        format!("{what}: record an upload of a moved buffer"),
    );
    {
        let borrowed = p2.clone();
        must(
            c.dev
                .command(S0)
                .and_then(|mut k| k.write_from(&small, &borrowed)),
            format!("{what}: record an upload of a borrowed slice"),
        );
    }
    must(
        c.launch(S0, TestKernel::AddByte, 1, &[&x], &[&y]),
        format!("{what}: record add"),
    );
    let graph = end(&mut c, S0, rec);
    assert!(
        graph.host_bytes() >= LARGE + SMALL,
        "{what}: the graph owns {} host bytes, fewer than its uploads",
        graph.host_bytes()
    );
    for round in 0..3 {
        must(c.write(S0, &x, &vec![0x11; LARGE]), &what);
        must(c.write(S0, &small, &vec![0x22; SMALL]), &what);
        for _ in 0..2 {
            must(c.flush(S0), format!("{what}: flush between replays"));
        }
        must(
            replay(&mut c, S0, &graph),
            format!("{what}: replay {round}"),
        );
        c.expect_read(
            S0,
            &y,
            &plus(&p1, 1),
            &format!(
                "{what}: replay {round} did not re-send the recorded bytes: the graph's host \
             bytes were released or changed"
            ),
            &[suspect::GRAPH, HOST_NODES],
        );
        c.expect_read(
            S0,
            &small,
            &p2,
            &format!("{what}: replay {round}: the borrowed upload was not re-sent"),
            &[suspect::GRAPH, HOST_NODES],
        );
    }
    drop((graph, x, y, small));
    c.assert_no_leak(&what);
}

/// A graph recorded on one stream replays on another, ordered after other streams' work on its
/// memory and before later work: a slow recorded kernel reads `inp` on S1 while S0 overwrites
/// `inp` right after; the replay sees the old bytes and S0's write lands after it. Then the
/// graph replays on S0 again, its result read on S1.
pub(crate) fn other_streams_replay_in_order<H: Harness>(h: &H, mode: Mode) {
    let what = format!("[{mode}] capture: replays on another stream");
    let mut c = ctx(h, mode, "capture");
    let p = pattern(SMALL, 21);
    let inp = must(c.create(S0, &p), &what);
    let out = must(c.empty(S0, SMALL as u64), &what);
    let rec = begin(&mut c, S0, "slow_plus_one");
    must(
        c.launch(S0, TestKernel::SlowAdd, 1, &[&inp], &[&out]),
        format!("{what}: record a slow add"),
    );
    let graph = end(&mut c, S0, rec);
    must(replay(&mut c, S1, &graph), format!("{what}: replay on S1"));
    let q = pattern(SMALL, 22);
    must(
        c.write(S0, &inp, &q),
        format!("{what}: overwrite the input on S0 right after"),
    );
    c.expect_read(S1, &out, &plus(&p, 1), &format!(
            "{what}: the replay on S1 read other bytes than the input had when it was enqueued: S0's write overtook it"
        ), &[suspect::STREAM_WAIT, suspect::GRAPH]);
    must(replay(&mut c, S0, &graph), format!("{what}: replay on S0"));
    c.expect_read(
        S1,
        &out,
        &plus(&q, 1),
        &format!("{what}: S1 read the output before S0's replay wrote it"),
        &[suspect::STREAM_WAIT, suspect::GRAPH],
    );
    drop((graph, inp, out));
    c.assert_no_leak(&what);
}

/// Recording again into an existing graph ([`devcmd::Command::end_capture_update`]): the same
/// work with a new value updates it, other work instantiates it anew; a replay enqueued before an
/// update runs what it was enqueued with.
pub(crate) fn a_graph_updates_in_place_or_anew<H: Harness>(h: &H, mode: Mode) {
    let what = format!("[{mode}] capture: recording again into a graph");
    let mut c = ctx(h, mode, "capture");
    let x = must(c.create(S0, &pattern(SMALL, 5)), &what);
    let y = must(c.empty(S0, SMALL as u64), &what);
    let rec = begin(&mut c, S0, "fill");
    must(c.launch(S0, TestKernel::Fill, 1, &[], &[&y]), &what);
    let mut graph = end(&mut c, S0, rec);
    let check = |c: &mut crate::util::Ctx<H>, expected: &[u8], step: &str| {
        c.expect_read(
            S0,
            &y,
            expected,
            &format!("{what}: {step}"),
            &[suspect::GRAPH],
        );
    };
    must(replay(&mut c, S0, &graph), &what);
    check(&mut c, &[1; SMALL], "first recording");
    for (value, step) in [(2u8, "same work, new value"), (3, "again")] {
        must(replay(&mut c, S0, &graph), &what);
        let rec = begin(&mut c, S0, "fill");
        must(c.launch(S0, TestKernel::Fill, value, &[], &[&y]), &what);
        must(
            c.dev
                .command(S0)
                .and_then(|mut k| k.end_capture_update(rec, &mut graph)),
            format!("{what}: update ({step})"),
        );
        check(
            &mut c,
            &[value - 1; SMALL],
            "a replay enqueued before the update runs the old recording",
        );
        must(replay(&mut c, S0, &graph), &what);
        check(&mut c, &[value; SMALL], step);
    }
    let rec = begin(&mut c, S0, "add");
    must(c.launch(S0, TestKernel::AddByte, 9, &[&x], &[&y]), &what);
    must(
        c.dev
            .command(S0)
            .and_then(|mut k| k.end_capture_update(rec, &mut graph)),
        format!("{what}: update with other work"),
    );
    must(replay(&mut c, S0, &graph), &what);
    check(&mut c, &plus(&pattern(SMALL, 5), 9), "other work");
    drop((graph, x, y));
    c.assert_no_leak(&what);
}
