//! Library work: work the core does not launch itself, enqueued on the stream's native handle by
//! a library ([`devcmd::Command::library`]), treated exactly like a launch. The library here is
//! the harness's stand-in ([`Harness::library_copy`]: a device-to-device copy enqueued the way a
//! vendor library enqueues its kernels); a harness without one is skipped with a visible line.
//!
//! Checks, byte-exactly and with no timing: the work is ordered after another stream's upload of
//! its input; the failure rule in both directions (an input that failed skips the work and its
//! output carries the failure; an error the library returns fails the output, with the library's
//! message kept, and a launch reading it is skipped); an input handle dropped right after the
//! work was enqueued stays alive until the work ran, on its own stream and when another stream
//! owns it and goes on (poison and lazy modes show an early free as wrong bytes); the work recorded into a graph and replayed with new inputs, on its own stream
//! and another; a library call that panics while recording leaves a graph that keeps its input
//! alive.

use crate::harness::{Harness, Mode, TestKernel};
use crate::util::{Ctx, must, pattern, small_pages, suspect};
use devcmd::{
    Command, DeviceConfig, Handle, LaunchError, LibraryError, LibraryWork, ServerError, Shim,
    StreamId,
};

/// The harness's library call, the suspect when its output is wrong.
const LIBRARY: &str = "Harness::library_copy (the stand-in library copied other bytes, or to \
                       other spans)";
/// The stream the library enqueues on, the suspect when the work runs out of order.
const NATIVE: &str = "native_stream (the library enqueued on a stream other than the one the \
                      core orders and fences, so the work ran outside that order)";

const S0: StreamId = StreamId(0);
const S1: StreamId = StreamId(1);

/// Enqueues the harness's library copy of `src` into `dst` as library work named `name` on
/// `cmd`'s stream; `Ok(false)` when the harness has no library.
fn copy<H: Harness>(
    h: &H,
    cmd: &mut Command<'_, H::S>,
    name: &'static str,
    src: &Handle,
    dst: &Handle,
) -> Result<bool, ServerError> {
    let mut offered = true;
    let (reads, writes) = ([src], [dst]);
    let work = LibraryWork::new(name, &reads, &writes);
    let call = |native: &<H::S as Shim>::NativeStream, spans: &[devcmd::DeviceSpan]| {
        // SAFETY: the core resolved both spans just now and keeps them alive until the stream
        // passed the work.
        match unsafe { h.library_copy(native, spans[0], spans[1]) } {
            Some(result) => result,
            None => {
                offered = false;
                Ok(())
            }
        }
    };
    // SAFETY: the library copies `spans[0]` into `spans[1]` (the declared read and write) on the
    // stream it is given and returns without waiting.
    unsafe { cmd.library(work, call) }?;
    Ok(offered)
}

/// A library call that refuses, as a library answers bad arguments, enqueuing nothing.
fn refuse<S: Shim>(cmd: &mut Command<'_, S>, src: &Handle, dst: &Handle) -> ServerError {
    let (reads, writes) = ([src], [dst]);
    let work = LibraryWork::new("refusing_library", &reads, &writes);
    // SAFETY: the call enqueues nothing.
    let refused = unsafe {
        cmd.library(work, |_, _| {
            Err(LibraryError::new(
                7,
                "LIBRARY_STATUS_INVALID_VALUE: ldb < k",
            ))
        })
    };
    refused.expect_err("a refusing library call must fail")
}

/// The library-work group in `mode`.
pub fn library_work<H: Harness>(h: &H, mode: Mode) {
    let Some(mut c) = Ctx::new(h, mode, DeviceConfig::default(), "library_work") else {
        return;
    };
    let size = 70_000;
    let data = pattern(size, 11);
    // Ordered after another stream's upload: no host synchronisation in between.
    let x = must(c.create(S1, &data), "create on stream 1");
    let y = must(c.empty(S0, size as u64), "empty on stream 0");
    let offered = must(
        c.dev
            .command(S0)
            .and_then(|mut cmd| copy(h, &mut cmd, "library_copy", &x, &y)),
        "library work on stream 0",
    );
    if !offered {
        crate::skip::skipped("library_work", mode, "the harness offers no library");
        return;
    }
    let what =
        format!("[{mode}] library_work: library work on stream 0 after an upload on stream 1");
    c.expect_read(
        S0,
        &y,
        &data,
        &what,
        &[LIBRARY, suspect::STREAM_WAIT, NATIVE],
    );

    // An input dropped right after the work was enqueued stays alive until the work ran.
    let fresh = pattern(size, 77);
    let z = must(c.create(S1, &fresh), "create");
    let w = must(c.empty(S1, size as u64), "empty");
    must(
        c.dev
            .command(S1)
            .and_then(|mut cmd| copy(h, &mut cmd, "library_copy", &z, &w)),
        "library work",
    );
    drop(z);
    // Reuse of the freed room, which must wait for the work.
    let reuse = must(
        c.create(S1, &pattern(size, 200)),
        "create over the freed room",
    );
    let what = format!(
        "[{mode}] library_work: an input dropped right after library work was enqueued, its \
         room reserved again and written on the same stream"
    );
    c.expect_read(
        S1,
        &w,
        &fresh,
        &what,
        &[NATIVE, suspect::EARLY_FENCE, LIBRARY],
    );
    drop(reuse);

    // The same across streams: an input stream 0 owns, read by library work on stream 1 and
    // dropped at once, must stay alive (and unreused by stream 0) until the work ran, though
    // stream 0 goes on and syncs without waiting for stream 1.
    let owned = pattern(size, 123);
    let input = must(c.create(S0, &owned), "create on stream 0");
    let out = must(c.empty(S1, size as u64), "empty on stream 1");
    must(
        c.dev
            .command(S1)
            .and_then(|mut cmd| copy(h, &mut cmd, "library_copy", &input, &out)),
        "library work on stream 1 reading stream 0's memory",
    );
    drop(input);
    let over = must(
        c.create(S0, &pattern(size, 201)),
        "create over the freed room",
    );
    must(c.sync(S0), "sync stream 0");
    let what = format!(
        "[{mode}] library_work: stream 0's input read by library work on stream 1, dropped \
         at once, its room reserved again on stream 0"
    );
    c.expect_read(
        S1,
        &out,
        &owned,
        &what,
        &[suspect::STREAM_WAIT, suspect::EARLY_FENCE, NATIVE],
    );
    drop((over, out));

    failure_rule(h, &mut c, mode);
    drop((x, y, w));
    c.assert_no_leak("library_work");
    captured(h, mode);
}

/// The failure rule both ways: a library error fails the output (the message kept), and library
/// work whose input failed is skipped.
fn failure_rule<H: Harness>(h: &H, c: &mut Ctx<H>, mode: Mode) {
    let size = 4096;
    let a = must(c.create(S0, &pattern(size, 1)), "create");
    let b = must(c.empty(S0, size as u64), "empty");
    let refused = refuse(&mut must(c.dev.command(S0), "command"), &a, &b);
    match &refused {
        ServerError::Launch(LaunchError::Library { work, error }) => {
            assert!(
                *work == "refusing_library" && error.code == 7 && error.message.contains("ldb < k"),
                "[{mode}] library_work: a library call that refused with code 7 \
                 \"LIBRARY_STATUS_INVALID_VALUE: ldb < k\" must be reported naming the work \
                 `refusing_library` with that code and message (the core's Command::library), \
                 got work `{work}`: {error}"
            );
        }
        other => panic!(
            "[{mode}] library_work: a library error must be LaunchError::Library (the core's \
             Command::library), got {other:?}"
        ),
    }
    // A launch reading the failed output is skipped, and its output carries the failure.
    let out = must(c.empty(S0, size as u64), "empty");
    let skipped = c.launch(S0, TestKernel::AddByte, 1, &[&b], &[&out]);
    assert!(
        matches!(skipped, Err(ServerError::Skipped { kernel: "add", .. })),
        "[{mode}] library_work: a launch reading what failed library work left unwritten must be \
         skipped (the failure rule, in the core), got {skipped:?}"
    );
    match c.read(S0, &out) {
        Err(ServerError::Unwritten { root, .. }) => assert!(
            root.to_string().contains("ldb < k"),
            "[{mode}] library_work: the root of the skipped launch's failure must be the \
             library's error (ldb < k), got: {root}"
        ),
        other => panic!(
            "[{mode}] library_work: the skipped launch's output must read as Unwritten (the \
             failure rule, in the core), got {other:?}"
        ),
    }
    // Library work whose input failed is skipped, and its output carries the failure.
    let out2 = must(c.empty(S0, size as u64), "empty");
    let skipped = c
        .dev
        .command(S0)
        .and_then(|mut cmd| copy(h, &mut cmd, "library_copy", &out, &out2));
    assert!(
        matches!(
            skipped,
            Err(ServerError::Skipped {
                kernel: "library_copy",
                ..
            })
        ),
        "[{mode}] library_work: library work whose input failed must be skipped (the failure \
         rule, in the core), got {skipped:?}"
    );
    match c.read(S0, &out2) {
        Err(ServerError::Unwritten { chain, .. }) => assert!(
            chain.contains(&"library_copy"),
            "[{mode}] library_work: the failure's chain must name the skipped library work \
             `library_copy`, got {chain:?}"
        ),
        other => panic!(
            "[{mode}] library_work: the skipped work's output must read as Unwritten (the \
             failure rule, in the core), got {other:?}"
        ),
    }
    // Rewriting the input clears the failure: the work runs again.
    let again = pattern(size, 9);
    must(c.write(S0, &out, &again), "rewrite");
    must(
        c.dev
            .command(S0)
            .and_then(|mut cmd| copy(h, &mut cmd, "library_copy", &out, &out2)),
        "library work after the input was rewritten",
    );
    let what = format!("[{mode}] library_work: library work after its failed input was rewritten");
    c.expect_read(S0, &out2, &again, &what, &[LIBRARY, suspect::COPIES]);
}

/// Library work recorded into a graph, replayed with new inputs on its stream and on another.
fn captured<H: Harness>(h: &H, mode: Mode) {
    let Some(mut c) = Ctx::new(h, mode, small_pages(), "library_work") else {
        return;
    };
    let size = 3000;
    let x = must(c.create(S0, &pattern(size, 3)), "create");
    let y = must(c.empty(S0, size as u64), "empty");
    let recording = match c
        .dev
        .command(S0)
        .and_then(|mut cmd| cmd.begin_capture("lib"))
    {
        Ok(r) => r,
        Err(ServerError::Capture(devcmd::CaptureError::Refused { cause, .. }))
            if cause.fault == devcmd::Fault::Unsupported =>
        {
            crate::skip::skipped("library_work capture", mode, "no graphs");
            return;
        }
        Err(e) => panic!(
            "[{mode}] library_work: begin_capture refused with another fault than Unsupported \
             (the shim call at fault: begin_capture): {e}"
        ),
    };
    must(
        c.dev
            .command(S0)
            .and_then(|mut cmd| copy(h, &mut cmd, "library_copy", &x, &y)),
        "library work while recording",
    );
    let graph = must(
        c.dev
            .command(S0)
            .and_then(|mut cmd| cmd.end_capture(recording)),
        "end_capture",
    );
    for (round, stream) in [(0u8, S0), (1, S1), (2, S0)] {
        let input = pattern(size, 50 + round);
        must(c.write(S0, &x, &input), "write new inputs");
        must(
            c.dev.command(stream).and_then(|mut cmd| cmd.replay(&graph)),
            "replay",
        );
        let what = format!(
            "[{mode}] library_work: replay {round} of recorded library work on stream {}, with \
             new inputs written on stream 0",
            stream.0
        );
        c.expect_read(
            S0,
            &y,
            &input,
            &what,
            &[suspect::GRAPH, NATIVE, suspect::STREAM_WAIT],
        );
    }
    drop(graph);
    drop((x, y));
    panicked_while_recording(h, &mut c, mode, size);
    c.assert_no_leak("library_work (capture)");
}

/// A library call that panics while its stream records, after enqueuing its copy: the graph
/// keeps its input alive and each replay copies it, and the work's reads and writes joined the
/// recording before the call, so a replay after its input failed is skipped.
fn panicked_while_recording<H: Harness>(h: &H, c: &mut Ctx<H>, mode: Mode, size: usize) {
    let data = pattern(size, 90);
    let x = must(c.create(S0, &data), "create");
    let y = must(c.empty(S0, size as u64), "empty");
    let recording = must(
        c.dev
            .command(S0)
            .and_then(|mut cmd| cmd.begin_capture("lib-panic")),
        "begin_capture",
    );
    const PANIC: &str = "the stand-in library panics after enqueuing its copy";
    let mut cmd = must(c.dev.command(S0), "command");
    let mut copied = None;
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let (reads, writes) = ([&x], [&y]);
        let work = LibraryWork::new("panicking_library", &reads, &writes);
        // SAFETY: the library copies `spans[0]` into `spans[1]` (the declared read and write)
        // on the stream it is given, then panics without waiting.
        let _ = unsafe {
            cmd.library(work, |native, spans| {
                copied = Some(
                    h.library_copy(native, spans[0], spans[1])
                        .map(|r| r.is_ok()),
                );
                std::panic::panic_any(PANIC);
            })
        };
    }));
    let payload = panicked.expect_err("the library's panic must reach its caller");
    assert_eq!(
        payload.downcast_ref::<&str>(),
        Some(&PANIC),
        "[{mode}] library_work: another panic than the library's reached its caller"
    );
    assert_eq!(
        copied,
        Some(Some(true)),
        "[{mode}] library_work: the stand-in library's copy before its panic (the suspect: {LIBRARY})"
    );
    let graph = must(
        c.dev
            .command(S0)
            .and_then(|mut cmd| cmd.end_capture(recording)),
        "end_capture after a library call panicked while recording",
    );
    assert!(
        x.is_kept_by_graph(),
        "[{mode}] library_work: the input of library work that panicked while recording is not \
         kept by the graph"
    );
    must(
        c.dev.command(S0).and_then(|mut cmd| cmd.replay(&graph)),
        "replay",
    );
    let what =
        format!("[{mode}] library_work: replay of library work that panicked while recording");
    c.expect_read(S0, &y, &data, &what, &[suspect::GRAPH, LIBRARY]);
    // Its input fails: the replay is skipped and its output carries the failure (the work's
    // reads and writes joined the recording before the call, not after it returned).
    let other = must(c.create(S0, &data), "create");
    let mut cmd = must(c.dev.command(S0), "command");
    refuse(&mut cmd, &other, &x);
    let replayed = cmd.replay(&graph);
    assert!(
        matches!(replayed, Err(ServerError::Skipped { .. })),
        "[{mode}] library_work: a replay of library work that panicked while recording, whose \
         input failed since, must be skipped (the suspect: the engine, which must note recorded \
         work's ranges before the call), got {replayed:?}"
    );
    assert!(
        cmd.read_owned(y.clone()).is_err(),
        "[{mode}] library_work: the output of a skipped replay must carry the failure"
    );
    drop((graph, x, y, other));
}
