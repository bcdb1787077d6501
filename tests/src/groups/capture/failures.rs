//! Failures follow the data through replays: a replay whose input carries a failure is skipped
//! and passes it on (named after the graph); a fault while a replay runs is a fault of the
//! replaying stream's work, named after the graph, and other streams keep working.

use super::{S0, S1, SMALL, begin, ctx, end, replay};
use crate::harness::{Harness, Mode, TestKernel};
use crate::util::{must, pattern, plus, suspect};
use devcmd::{CaptureError, ServerError};

/// A graph reads `inp`. A recording that writes `inp` and is then discarded (it needs a page)
/// leaves `inp` carrying that failure: the replay is skipped (`Skipped`, named after the graph),
/// its output reads as `Unwritten` with the graph in the chain, and a launch reading the output
/// is skipped in turn. Once `inp` is written again, the replay runs and computes right.
pub(crate) fn a_replay_whose_input_failed_is_skipped<H: Harness>(h: &H, mode: Mode) {
    let what = format!("[{mode}] capture: a replay whose input failed");
    let mut c = ctx(h, mode, "capture");
    let p = pattern(SMALL, 61);
    let inp = must(c.create(S0, &p), &what);
    let out = must(c.empty(S0, SMALL as u64), &what);
    let next = must(c.empty(S0, SMALL as u64), &what);
    let rec = begin(&mut c, S0, "reads_inp");
    must(
        c.launch(S0, TestKernel::AddByte, 1, &[&inp], &[&out]),
        &what,
    );
    let graph = end(&mut c, S0, rec);
    must(replay(&mut c, S0, &graph), &what);
    c.expect_read(
        S0,
        &out,
        &plus(&p, 1),
        &format!("{what}: the first replay, before the input failed"),
        &[suspect::GRAPH],
    );

    let doomed = begin(&mut c, S0, "doomed");
    must(c.launch(S0, TestKernel::Fill, 3, &[], &[&inp]), &what);
    assert!(
        c.empty(S0, 1 << 20).is_err(),
        "{what}: a page was allocated"
    );
    match c.dev.command(S0).and_then(|mut k| k.end_capture(doomed)) {
        Err(ServerError::Capture(CaptureError::Discarded { .. })) => {}
        other => panic!("{what}: the doomed recording ended with {other:?}"),
    }
    match replay(&mut c, S0, &graph) {
        Err(ServerError::Skipped { kernel, .. }) => assert_eq!(
            kernel, "reads_inp",
            "{what}: a skipped replay must be named after its graph (the core's failure rule)"
        ),
        other => panic!("{what}: a replay whose input failed answered {other:?}"),
    }
    match c.read(S0, &out) {
        Err(ServerError::Unwritten { chain, .. }) => assert!(
            chain.contains(&"reads_inp"),
            "{what}: the failure's chain {chain:?} does not name the skipped replay"
        ),
        other => panic!("{what}: the skipped replay's output reads as {other:?}"),
    }
    match c.launch(S0, TestKernel::AddByte, 1, &[&out], &[&next]) {
        Err(ServerError::Skipped { .. }) => {}
        other => panic!("{what}: a launch reading the skipped output answered {other:?}"),
    }
    let q = pattern(SMALL, 62);
    must(
        c.write(S0, &inp, &q),
        format!("{what}: write the input again"),
    );
    must(
        replay(&mut c, S0, &graph),
        format!("{what}: replay after the rewrite"),
    );
    c.expect_read(
        S0,
        &out,
        &plus(&q, 1),
        &format!("{what}: the replay after the rewrite computed other bytes"),
        &[suspect::GRAPH, suspect::COPIES],
    );
    drop((graph, inp, out, next));
    c.assert_no_leak(&what);
}

/// A graph whose kernel fails while it runs replays without an error; the fence after it reports
/// a fault of S0's work naming the graph (or the device lost, where a failed kernel loses it),
/// and S1 keeps working when the device survives.
pub(crate) fn a_fault_while_a_replay_runs_is_the_streams<H: Harness>(h: &H, mode: Mode) {
    let what = format!("[{mode}] capture: a fault while a replay runs");
    let mut c = ctx(h, mode, "capture");
    let z = must(c.empty(S0, SMALL as u64), &what);
    let rec = begin(&mut c, S0, "faulty");
    must(
        c.launch(S0, TestKernel::WriteThenFail, 5, &[], &[&z]),
        &what,
    );
    let graph = end(&mut c, S0, rec);
    must(
        replay(&mut c, S0, &graph),
        format!("{what}: the replay is enqueued"),
    );
    match c.sync(S0) {
        Err(ServerError::StreamFaulted { stream, kernel, .. }) => {
            assert_eq!(
                stream, 0,
                "{what}: the fault must be S0's, the stream that replayed the failing graph: \
                 the core's fault ledger, or the shim reported it on another stream's fence \
                 (event_query / event_wait)"
            );
            assert_eq!(
                kernel,
                Some("faulty"),
                "{what}: the fault names another suspect"
            );
            let p = pattern(SMALL, 71);
            let o = must(c.create(S1, &p), format!("{what}: S1 after S0's fault"));
            c.expect_read(
                S1,
                &o,
                &p,
                &format!("{what}: S1's own round trip after S0's fault"),
                &[suspect::COPIES, suspect::EARLY_WAIT],
            );
            assert!(
                c.read(S0, &z).is_err(),
                "{what}: S0's output reads after the fault"
            );
        }
        Err(ServerError::DeviceLost { .. }) => {}
        other => panic!("{what}: the fence after the failing replay answered {other:?}"),
    }
    drop((graph, z));
}
