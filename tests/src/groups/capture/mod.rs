//! The capture group: recording a stream into a graph and replaying it, on any shim with graphs
//! (a shim without them must refuse `begin_capture` with `Fault::Unsupported`, and the group
//! says it skipped).
//!
//! Each check makes its own device. No check depends on timing; lazy mode and poisoned frees
//! show memory a graph still uses being freed, reused or released too early as wrong bytes.
//! Owns the group and its plumbing; `replay.rs` checks that replays compute what the recorded
//! work computes (inputs updated between replays, host bytes owned by the graph, other streams,
//! exec update); `memory.rs` what a graph keeps and gives back, and a recording that needs a page;
//! `refusals.rs` what is refused while recording and what still works; `failures.rs` the failure
//! rule through replays and a fault while a replay runs.

mod failures;
mod memory;
mod refusals;
mod replay;

use crate::harness::{Harness, Mode};
use crate::util::{Ctx, must, small_pages, suspect};
use devcmd::{CaptureError, CapturePhase, Fault, Graph, Recording, ServerError, StreamId};

/// The recording stream of every check.
pub(super) const S0: StreamId = StreamId(0);
/// Another stream.
pub(super) const S1: StreamId = StreamId(1);
/// A buffer size the small pool serves.
pub(super) const SMALL: usize = 3000;
/// A buffer size the arena serves (pages of 512 KiB with [`small_pages`]).
pub(super) const LARGE: usize = 200_000;

/// The suspect when a buffer a recording writes changed before any replay.
pub(super) const RAN_WHEN_RECORDED: &str =
    "begin_capture (the stream ran the work it should only have recorded)";
/// The suspect when a replay's uploads send other bytes than were recorded.
pub(super) const HOST_NODES: &str = "end_capture / graph_launch (the graph's uploads read the \
                                     caller's buffer, not the bytes the graph owns)";

/// Reads `buffer` on `stream` and checks every byte is `byte` (what a recorded fill leaves); a
/// failure names `what` and the graph calls.
#[track_caller]
pub(super) fn expect_filled<H: Harness>(
    c: &mut Ctx<H>,
    stream: StreamId,
    buffer: &devcmd::Handle,
    byte: u8,
    what: &str,
) {
    c.expect_read(
        stream,
        buffer,
        &vec![byte; buffer.len() as usize],
        what,
        &[suspect::GRAPH],
    );
}

/// Checks the stream's capture phase is `want` (the core's capture state); a failure names
/// `what` and `step`.
#[track_caller]
pub(super) fn expect_phase<H: Harness>(
    c: &mut Ctx<H>,
    stream: StreamId,
    want: CapturePhase,
    what: &str,
    step: &str,
) {
    let got = must(
        c.dev.command(stream).map(|k| k.capture_phase()),
        "capture_phase",
    );
    assert_eq!(
        got, want,
        "{what}: {step}: the stream's capture phase is {got:?}, expected {want:?} (the core's \
         capture state, not a shim call)"
    );
}

/// The capture group: every check in `mode` but the fault of a replay
/// ([`capture_replay_fault`]), or the line `capture: skipped (no graphs)` ([`crate::skip`]) when
/// the shim has no graphs.
pub fn capture<H: Harness>(h: &H, mode: Mode) {
    if !has_graphs(h, mode, "capture") {
        return;
    }
    replay::replays_compute_the_recorded_work(h, mode);
    replay::host_bytes_belong_to_the_graph(h, mode);
    replay::other_streams_replay_in_order(h, mode);
    replay::a_graph_updates_in_place_or_anew(h, mode);
    memory::memory_stays_under_a_live_graph(h, mode);
    memory::a_recording_that_needs_a_page_is_discarded_cleanly(h, mode);
    refusals::what_waits_on_the_recording_is_refused(h, mode);
    refusals::other_streams_keep_working_apart_from_its_memory(h, mode);
    refusals::an_abandoned_recording_ends_cleanly(h, mode);
    refusals::work_on_the_same_command_after_the_token_is_dropped_runs(h, mode);
    refusals::a_bind_inside_a_recording_keeps_other_streams_uses(h, mode);
    refusals::a_handle_bound_inside_a_recording_and_dropped_keeps_other_streams_uses(h, mode);
    failures::a_replay_whose_input_failed_is_skipped(h, mode);
}

/// A fault while a replay runs (`failures.rs`): a group of its own, because on a device whose
/// failed kernel loses it for the whole process (CUDA), nothing can run after it.
pub fn capture_replay_fault<H: Harness>(h: &H, mode: Mode) {
    if has_graphs(h, mode, "capture_replay_fault") {
        failures::a_fault_while_a_replay_runs_is_the_streams(h, mode);
    }
}

/// Whether the shim records graphs; a shim that refuses with `Fault::Unsupported` skips `group`
/// (saying so), any other refusal fails the group.
fn has_graphs<H: Harness>(h: &H, mode: Mode, group: &str) -> bool {
    let Some(mut c) = Ctx::new(h, mode, small_pages(), group) else {
        return false;
    };
    let begun = c.dev.command(S0).and_then(|mut k| k.begin_capture("probe"));
    match begun {
        Ok(rec) => {
            must(
                c.dev.command(S0).and_then(|mut k| k.end_capture(rec)),
                format!("[{mode}] capture: ending an empty recording"),
            );
            true
        }
        Err(ServerError::Capture(CaptureError::Refused { cause, .. }))
            if cause.fault == Fault::Unsupported =>
        {
            // `cause` is the shim's Unsupported answer: it says nothing more than "no graphs".
            let _ = cause;
            crate::skip::skipped(group, mode, "no graphs");
            false
        }
        Err(e) => panic!("[{mode}] capture: begin_capture refused: {e}"),
    }
}

/// A fresh device for `check` with small pages.
pub(super) fn ctx<H: Harness>(h: &H, mode: Mode, check: &str) -> Ctx<H> {
    Ctx::new(h, mode, small_pages(), check).expect("the mode was offered a moment ago")
}

/// Begins recording `stream` into a graph named `name`.
#[track_caller]
pub(super) fn begin<H: Harness>(c: &mut Ctx<H>, stream: StreamId, name: &'static str) -> Recording {
    let mode = c.mode;
    must(
        c.dev
            .command(stream)
            .and_then(|mut k| k.begin_capture(name)),
        format!("[{mode}] begin_capture `{name}`"),
    )
}

/// Ends the recording `rec` of `stream` into a graph.
#[track_caller]
pub(super) fn end<H: Harness>(c: &mut Ctx<H>, stream: StreamId, rec: Recording) -> Graph<H::S> {
    let mode = c.mode;
    must(
        c.dev.command(stream).and_then(|mut k| k.end_capture(rec)),
        format!("[{mode}] end_capture"),
    )
}

/// Replays `graph` on `stream`.
pub(super) fn replay<H: Harness>(
    c: &mut Ctx<H>,
    stream: StreamId,
    graph: &Graph<H::S>,
) -> Result<(), ServerError> {
    c.dev.command(stream)?.replay(graph)
}

/// Device pages the probe counts live (0 without a probe: checks on it then pass trivially).
pub(super) fn pages_live<H: Harness>(c: &Ctx<H>) -> u64 {
    c.counters().device_pages_live + c.counters().host_pages_live
}
