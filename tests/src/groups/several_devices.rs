//! Several devices in one process: two devices of the harness's shim (two fresh shims), each
//! with its own memory, budget and drop queues, and copies between them
//! ([`Command::copy_from`](devcmd::Command::copy_from)): peer to peer where the shim says so
//! ([`Shim::peer_access`]), through host memory otherwise.
//!
//! Three groups: [`several_devices`] (copies both ways, order, the failure rule across the
//! pair, budgets per device, a handle used on the wrong device), [`several_devices_lost`] (a
//! device lost while a copy to it is in flight) and [`several_devices_fault`] (work that fails
//! on one device leaves the other working; it makes work fail while it runs, so on CUDA, where
//! two shims of one GPU share a context and a fault is sticky for the process, it is left out).

use crate::harness::{FaultRule, Harness, Mode, TestKernel};
use crate::util::{Ctx, expect_same, must, pattern, plus};
use devcmd::{
    CopyPath, DeviceConfig, Fault, Handle, HostReport, IoError, LaunchError, ServerError, Shim,
    ShimOp, StreamId,
};

const MIB: u64 = 1 << 20;

/// Two devices of the harness's shim in `mode`, of one process ([`Harness::beside`]), or `None`
/// (said) without the mode.
fn pair<H: Harness>(h: &H, mode: Mode, config: DeviceConfig, group: &str) -> Option<[Ctx<H>; 2]> {
    let a = Ctx::new(h, mode, config, group)?;
    let b = Ctx::beside(&a, h, config, group)?;
    Some([a, b])
}

/// Copies `src` (on `from`, stream `fs`) into `dst` (on `to`, stream `ts`).
fn copy<H: Harness>(
    to: &mut Ctx<H>,
    ts: StreamId,
    dst: &Handle,
    from: &mut Ctx<H>,
    fs: StreamId,
    src: &Handle,
) -> Result<CopyPath, ServerError> {
    let mut source = from.dev.command(fs)?;
    to.dev.command(ts)?.copy_from(dst, &mut source, src)
}

/// The path a copy from `from` to `to` must take.
fn path<H: Harness>(to: &Ctx<H>, from: &Ctx<H>) -> CopyPath {
    if to.dev.shim().peer_access(from.dev.shim()) {
        CopyPath::Peer
    } else {
        CopyPath::Staged
    }
}

/// The several-devices group:
///
/// - **copies both ways**, sizes that are multiples of nothing (1 B to 3 MiB + 13 B) between
///   views at odd offsets: the destination's view holds the source's bytes and the bytes around
///   it are untouched; the path is the one the shim's `peer_access` promises;
/// - **order**: a slow kernel on another stream of the source device writes the source, and the
///   copy (issued on the owner's stream) lands what it wrote; a kernel enqueued on the source
///   right after the copy overwrites the source without reaching the copy's bytes;
/// - **capture**: a copy while a stream of either device records is refused, and runs after;
///   while one device records, the other's host waits (a flush, a read, a sync) either pass or,
///   where the shim follows CUDA's rule for the process, are refused for now
///   ([`Fault::Busy`](devcmd::Fault::Busy)) keeping everything they cover: nothing is leaked
///   or freed early, and all of it settles after the recording;
/// - **the failure rule across the pair** (with a probe): a source whose write was refused
///   makes the copy `Skipped` and the destination's read `Unwritten`;
/// - **budgets per device**: each device holds up to its own budget, one full device refuses
///   while the other still serves, and [`HostReport`] adds the two up;
/// - **a copy whose end is unknown** (with probes: the source's wait and the host's wait both
///   refused): its source is kept (for good, or until the source device's teardown finds the
///   copy done), and `bind` refuses to hand its room over;
/// - **a handle used on the wrong device** is [`IoError::ForeignHandle`], naming both devices,
///   in a read, a launch and a copy with its sides swapped.
pub fn several_devices<H: Harness>(h: &H, mode: Mode) {
    const GROUP: &str = "several_devices";
    let Some([mut a, mut b]) = pair(h, mode, DeviceConfig::default(), GROUP) else {
        return;
    };
    let s0 = StreamId(0);
    // Copies both ways.
    for (i, n) in [1usize, 7, 4095, 65_537, 3 * MIB as usize + 13]
        .into_iter()
        .enumerate()
    {
        let seed = i as u8;
        for dir in 0..2 {
            let (to, from) = if dir == 0 {
                (&mut b, &mut a)
            } else {
                (&mut a, &mut b)
            };
            let what = format!("[{mode}] {GROUP}: {n} bytes, direction {dir}");
            let (so, dof) = (3 + i, 11 + 2 * i);
            let src_bytes = pattern(n + so + 5, seed.wrapping_add(dir as u8));
            let dst_bytes = pattern(n + dof + 9, 200u8.wrapping_sub(seed));
            let src = must(
                from.create(s0, &src_bytes),
                format!("{what}: create source"),
            );
            let dst = must(
                to.create(s0, &dst_bytes),
                format!("{what}: create destination"),
            );
            let sv = src.view(so as u64, n as u64).expect("source view");
            let dv = dst.view(dof as u64, n as u64).expect("destination view");
            let want_path = path(to, from);
            let got_path = must(copy(to, s0, &dv, from, s0, &sv), format!("{what}: copy"));
            assert_eq!(
                got_path, want_path,
                "{what}: the copy took another path than the shim's peer_access promises"
            );
            let mut want = dst_bytes.clone();
            want[dof..dof + n].copy_from_slice(&src_bytes[so..so + n]);
            to.expect_read(
                s0,
                &dst,
                &want,
                &format!("{what}: the destination after the copy"),
                &["copy_peer", "stream_wait_event"],
            );
            from.expect_read(
                s0,
                &src,
                &src_bytes,
                &format!("{what}: the source after the copy"),
                &["copy_peer"],
            );
        }
    }
    // Order: a slow write on the source's other stream, the copy from the owner's stream, held
    // back on B by a slow kernel before it, and a fill of the source right after it (which must
    // wait for the copy). The source is read first: in lazy mode that runs A's work first.
    let n = 64 * 1024 + 3;
    let p = pattern(n, 41);
    let input = must(a.create(s0, &p), "create input on A");
    let x = must(a.empty(s0, n as u64), "empty x on A");
    let y = must(b.empty(StreamId(1), n as u64), "empty y on B");
    let held_in = must(b.create(StreamId(1), &p), "create on B");
    let held_out = must(b.empty(StreamId(1), n as u64), "empty on B");
    must(
        a.launch(StreamId(1), TestKernel::SlowAdd, 1, &[&input], &[&x]),
        "slow kernel on A's stream 1 writing x",
    );
    must(
        b.launch(
            StreamId(1),
            TestKernel::SlowAdd,
            1,
            &[&held_in],
            &[&held_out],
        ),
        "slow kernel on B's stream 1 before the copy",
    );
    must(copy(&mut b, StreamId(1), &y, &mut a, s0, &x), "copy x to y");
    must(
        a.launch(s0, TestKernel::Fill, 0x5A, &[], &[&x]),
        "fill x on A right after the copy",
    );
    a.expect_read(
        s0,
        &x,
        &vec![0x5A; n],
        &format!("[{mode}] {GROUP}: the source filled after the copy"),
        &["stream_wait_event"],
    );
    b.expect_read(
        StreamId(1),
        &y,
        &plus(&p, 1),
        &format!(
            "[{mode}] {GROUP}: the copy of a buffer a slow kernel on another stream writes, \
             followed by a fill of the source (which must wait for the copy)"
        ),
        &["stream_wait_event (across devices)", "copy_peer"],
    );
    drop((input, x, y, held_in, held_out));
    // The drop queue across the pair: the copy waits behind a slow kernel on B while its source
    // is dropped and A cleans every stream up (in poison mode an early free reads poison).
    let n = 3 * MIB as usize + 5;
    let q = pattern(n, 77);
    let src = must(a.create(StreamId(1), &q), "create the source on A");
    let busy_in = must(b.create(s0, &q), "create on B");
    let busy_out = must(b.empty(s0, n as u64), "empty on B");
    let dst = must(b.empty(s0, n as u64), "empty the destination on B");
    must(
        b.launch(s0, TestKernel::SlowAdd, 1, &[&busy_in], &[&busy_out]),
        "slow kernel on B",
    );
    must(
        copy(&mut b, s0, &dst, &mut a, StreamId(1), &src),
        "copy behind it",
    );
    drop(src);
    must(a.cleanup_all(), "clean A up with the copy in flight");
    b.expect_read(
        s0,
        &dst,
        &q,
        &format!(
            "[{mode}] {GROUP}: a copy whose source was dropped and its device cleaned up while \
             the copy waited"
        ),
        &["stream_wait_event (across devices)", "event_wait"],
    );
    drop((busy_in, busy_out, dst));
    refused_while_recording(&mut a, &mut b, mode);
    other_device_while_one_records(&mut a, &mut b, mode);
    failure_across(&mut a, &mut b, mode);
    wait_after_refused(&mut a, &mut b, mode);
    source_kept_when_the_copy_end_is_unknown(h, mode);
    budgets(h, mode);
    wrong_device(&mut a, &mut b, mode);
    a.assert_no_leak(GROUP);
    b.assert_no_leak(GROUP);
}

/// The source's wait after the copy refused (with a probe on the peer path): the call fails,
/// the destination's bytes carry the failure, and the source's bytes and device are untouched.
fn wait_after_refused<H: Harness>(a: &mut Ctx<H>, b: &mut Ctx<H>, mode: Mode) {
    const GROUP: &str = "several_devices (wait after the copy refused)";
    if a.probe.is_none() || path(b, a) != CopyPath::Peer {
        crate::skip::skipped(GROUP, mode, "needs a probe and a peer copy");
        return;
    }
    let s0 = StreamId(0);
    let n = 40_003;
    let p = pattern(n, 23);
    let x = must(a.create(s0, &p), "create x on A");
    let y = must(b.create(s0, &vec![1; n]), "create y on B");
    // x lives on the stream that copies: the source's only wait is the one after the copy.
    a.probe.as_ref().expect("checked").inject(FaultRule::Once {
        op: ShimOp::StreamWaitEvent,
        skip: 0,
    });
    let copied = copy(b, s0, &y, a, s0, &x);
    a.probe.as_ref().expect("checked").clear();
    assert!(
        copied.is_err(),
        "[{mode}] {GROUP}: the copy answered {copied:?} though its wait after was refused"
    );
    assert!(
        b.read(s0, &y).is_err(),
        "[{mode}] {GROUP}: the destination read clean after a copy whose order was lost"
    );
    a.expect_read(
        s0,
        &x,
        &p,
        &format!("[{mode}] {GROUP}: the source"),
        &["copy_peer"],
    );
    drop((x, y));
}

/// The source's wait after the copy refused and the wait for the copy's end inconclusive too
/// (with probes on both devices): nothing says when the copy stops reading its source, so the
/// source's room is kept (the source device's teardown asks again, and keeps all its memory if
/// it still cannot tell); a `bind` may not hand it to another handle, which could free it under
/// the copy.
fn source_kept_when_the_copy_end_is_unknown<H: Harness>(h: &H, mode: Mode) {
    const GROUP: &str = "several_devices (the copy's end unknown)";
    let Some([mut a, mut b]) = pair(h, mode, DeviceConfig::default(), GROUP) else {
        return;
    };
    if a.probe.is_none() || b.probe.is_none() || path(&b, &a) != CopyPath::Peer {
        crate::skip::skipped(GROUP, mode, "needs probes and a peer copy");
        return;
    }
    let s0 = StreamId(0);
    let n = 40_003;
    let room = must(
        a.dev.command(s0).and_then(|mut k| k.reserve(n as u64)),
        "reserve on A",
    );
    let y = must(b.create(s0, &vec![1; n]), "create y on B");
    a.probe.as_ref().expect("checked").inject(FaultRule::Once {
        op: ShimOp::StreamWaitEvent,
        skip: 0,
    });
    b.probe.as_ref().expect("checked").inject(FaultRule::Once {
        op: ShimOp::EventWait,
        skip: 0,
    });
    let copied = copy(&mut b, s0, &y, &mut a, s0, &room);
    a.probe.as_ref().expect("checked").clear();
    b.probe.as_ref().expect("checked").clear();
    assert!(copied.is_err(), "[{mode}] {GROUP}: {copied:?}");
    let (handed, target) = {
        let mut k = must(a.dev.command(s0), "command on A");
        let target = k.lazy(n as u64);
        (k.bind(room, &target), target)
    };
    assert!(
        matches!(handed, Err(ServerError::Io(IoError::Exposed { .. }))),
        "[{mode}] {GROUP}: the room of a source a copy may still read was handed over: {handed:?}"
    );
    drop((target, y));
    must(a.cleanup_all(), "clean A up");
    assert_eq!(
        a.live(),
        (1, n as u64),
        "[{mode}] {GROUP}: the source is kept, and only it"
    );
    b.assert_no_leak(GROUP);
    // The source device's teardown waits for the copy's event again: it keeps all its device
    // memory where it still cannot tell, and frees it where the wait passes now. Its streams
    // drained either way: its pinned host pages (one holds what a staged upload left), which no
    // peer copy reads, go as usual.
    // (On a zero-copy device the device memory is pinned host pages, which go or stay with it.)
    drop(must(a.create(s0, &[2; 1000]), "a staged upload on A"));
    let zero_copy = a.dev.zero_copy();
    let probe = a.probe.take().expect("checked");
    let before = probe.counters().host_pages_live;
    assert!(
        zero_copy || before > 0,
        "[{mode}] {GROUP}: the staged upload left no pinned page to check"
    );
    drop(a);
    assert!(
        zero_copy || probe.counters().host_pages_live == 0,
        "[{mode}] {GROUP}: the teardown after a copy of unknown end leaked pinned host pages \
         ({before} live before it)"
    );
}

/// While a stream of either device records, a copy between them is refused (a recording cannot
/// wait for another device's work), and nothing is copied; after the recording, it runs.
fn refused_while_recording<H: Harness>(a: &mut Ctx<H>, b: &mut Ctx<H>, mode: Mode) {
    let s0 = StreamId(0);
    let x = must(a.create(s0, &[9; 100]), "create x on A");
    let y = must(b.create(s0, &[1; 100]), "create y on B");
    for recording_side in 0..2 {
        let rec = {
            let side = if recording_side == 0 {
                &mut *a
            } else {
                &mut *b
            };
            side.dev
                .command(StreamId(1))
                .and_then(|mut c| c.begin_capture("several_devices"))
        };
        let Ok(rec) = rec else {
            crate::skip::skipped(
                "several_devices (a copy while a device records)",
                mode,
                "the shim records no graphs",
            );
            return;
        };
        let copied = copy(b, s0, &y, a, s0, &x);
        assert!(
            matches!(
                copied,
                Err(ServerError::Validation(
                    devcmd::Validation::Recording { .. }
                ))
            ),
            "[{mode}] several_devices: a copy while device {} records answered {copied:?}, \
             not Validation::Recording (the rule is the core's)",
            ["A (the source)", "B (the destination)"][recording_side]
        );
        drop(rec);
        // The recording side's next command ends the dropped recording, before the other side
        // records (on CUDA a recording in global mode is the process's: two open at once on
        // one thread would meet).
        let side = if recording_side == 0 {
            &mut *a
        } else {
            &mut *b
        };
        must(
            side.dev.command(StreamId(1)).map(drop),
            "end the dropped recording",
        );
    }
    b.expect_read(s0, &y, &[1; 100], "y after the refused copies", &[]);
    // Views of different lengths: refused before anything moves, naming both lengths.
    let half = x.view(0, 50).expect("a view of x");
    let uneven = copy(b, s0, &y, a, s0, &half);
    assert!(
        matches!(
            uneven,
            Err(ServerError::Validation(devcmd::Validation::ViewLengths {
                dst: 100,
                src: 50
            }))
        ),
        "[{mode}] several_devices: a copy of 50 bytes into 100 answered {uneven:?}, not \
         Validation::ViewLengths (the rule is the core's)"
    );
    must(copy(b, s0, &y, a, s0, &x), "the copy once nothing records");
    b.expect_read(s0, &y, &[9; 100], "y after the copy", &[]);
}

/// While a stream of A records, B's host waits either pass (a shim whose devices share nothing)
/// or are refused for now with [`Fault::Busy`] (CUDA, where a recording is the process's; the
/// std shim's devices of one process): a flush, a sync and a read of B. A refusal keeps
/// everything the refused fences cover (B's drop queue leaks nothing, the read's buffers go to
/// it), and once the recording ended B's bytes are right and its queue empties; the group's
/// final leak check finds every page back.
fn other_device_while_one_records<H: Harness>(a: &mut Ctx<H>, b: &mut Ctx<H>, mode: Mode) {
    const WHAT: &str = "several_devices (the other device while one records)";
    let s0 = StreamId(0);
    let kept = must(
        b.create(s0, &pattern(8192, 41)),
        format!("[{mode}] {WHAT}: create"),
    );
    // Items in B's queue under a fence (a dropped allocation, a write's host bytes), more staged
    // behind it: the next flush waits for that fence.
    for round in 0..2u8 {
        let gone = must(
            b.create(s0, &[round; 4096]),
            format!("[{mode}] {WHAT}: create"),
        );
        must(
            b.write(s0, &kept, &pattern(8192, 42 + round)),
            format!("[{mode}] {WHAT}: write"),
        );
        drop(gone);
        must(b.flush(s0), format!("[{mode}] {WHAT}: flush {round}"));
    }
    let leaked_before = leaked(b);
    let rec = a
        .dev
        .command(StreamId(1))
        .and_then(|mut c| c.begin_capture("several_devices"));
    let Ok(rec) = rec else {
        crate::skip::skipped(WHAT, mode, "the shim records no graphs");
        return;
    };
    let answered = [
        ("a flush", b.flush(s0)),
        ("a sync", b.sync(s0)),
        ("a read", b.read(s0, &kept).map(drop)),
    ];
    let mut refused = 0;
    for (call, answer) in &answered {
        match answer {
            Ok(()) => {}
            Err(ServerError::Device(e)) if e.fault == Fault::Busy => refused += 1,
            Err(e) => panic!(
                "[{mode}] {WHAT}: {call} of B while A records answered {e:?}: neither Ok nor a \
                 refusal for now (ServerError::Device with Fault::Busy)"
            ),
        }
    }
    // A flush with no fence to wait for (a zero-copy device's queue may hold none) passes either
    // way; a sync and a read each wait.
    assert!(
        answered[1].1.is_ok() == answered[2].1.is_ok(),
        "[{mode}] {WHAT}: of B's sync and read while A records, {refused} (with the flush) were \
         refused: a shim refuses both or neither ({answered:?})"
    );
    assert_eq!(
        leaked(b),
        leaked_before,
        "[{mode}] {WHAT}: B's drop queues leaked items while A recorded: a wait refused for now \
         keeps what its fence covers (FenceOutcome::Refused)"
    );
    drop(rec);
    must(
        a.dev.command(StreamId(1)).map(drop),
        format!("[{mode}] {WHAT}: end the dropped recording"),
    );
    b.expect_read(
        s0,
        &kept,
        &pattern(8192, 43),
        &format!("[{mode}] {WHAT}: B's bytes after the recording"),
        &[],
    );
    must(
        b.sync(s0),
        format!("[{mode}] {WHAT}: sync after the recording"),
    );
    must(
        b.flush(s0),
        format!("[{mode}] {WHAT}: flush after the recording"),
    );
    must(
        b.flush(s0),
        format!("[{mode}] {WHAT}: flush after the recording"),
    );
    assert_eq!(
        leaked(b),
        leaked_before,
        "[{mode}] {WHAT}: leaked after the recording"
    );
}

/// Items B's drop queues leaked so far.
fn leaked<H: Harness>(ctx: &Ctx<H>) -> u64 {
    ctx.dev
        .drop_stats()
        .iter()
        .map(|(_, st)| st.items_leaked)
        .sum()
}

/// A source whose write the shim refused: the copy is skipped and the destination carries it.
fn failure_across<H: Harness>(a: &mut Ctx<H>, b: &mut Ctx<H>, mode: Mode) {
    let Some(probe) = a.probe.take() else {
        crate::skip::skipped(
            "several_devices (failure rule across devices)",
            mode,
            "the harness has no probe",
        );
        return;
    };
    let s0 = StreamId(0);
    let x = must(a.empty(s0, 100), "empty x on A");
    let y = must(b.empty(s0, 100), "empty y on B");
    probe.inject(FaultRule::Once {
        op: ShimOp::Launch,
        skip: 0,
    });
    let refused = a.launch(s0, TestKernel::Fill, 1, &[], &[&x]);
    probe.clear();
    a.probe = Some(probe);
    assert!(
        refused.is_err(),
        "[{mode}] the injected refusal did not fire"
    );
    let copied = copy(b, s0, &y, a, s0, &x);
    assert!(
        matches!(copied, Err(ServerError::Skipped { .. })),
        "[{mode}] several_devices: a copy of failed bytes to another device answered \
         {copied:?}, not Skipped (the failure rule is the core's: no shim call is involved)"
    );
    let read = b.read(s0, &y);
    assert!(
        matches!(read, Err(ServerError::Unwritten { .. })),
        "[{mode}] several_devices: the destination of a skipped copy read as {read:?}, not \
         Unwritten"
    );
}

/// Each device holds up to its own budget; the report across devices adds them up.
fn budgets<H: Harness>(h: &H, mode: Mode) {
    let config = DeviceConfig {
        memory_budget: Some(8 * MIB),
        ..DeviceConfig::default()
    };
    let Some([mut a, mut b]) = pair(h, mode, config, "several_devices") else {
        return;
    };
    let s0 = StreamId(0);
    let xa = must(a.empty(s0, 5 * MIB), "5 MiB on A under its 8 MiB budget");
    let xb = must(
        b.empty(s0, 5 * MIB),
        "5 MiB on B under its own 8 MiB budget, beside A's 5 MiB",
    );
    let over = a.empty(s0, 5 * MIB);
    assert!(
        matches!(over, Err(ServerError::Io(IoError::OutOfMemory { .. }))),
        "[{mode}] several_devices: a second 5 MiB on A (budget 8 MiB) answered {over:?}, not \
         OutOfMemory"
    );
    let small = must(b.empty(s0, 1024), "B serves while A is full");
    let report = HostReport::of([&mut a.dev, &mut b.dev]);
    let (ha, hb) = (report.devices[0].1.held, report.devices[1].1.held);
    assert!(
        ha >= 5 * MIB && hb >= 5 * MIB && ha <= 8 * MIB && hb <= 8 * MIB,
        "[{mode}] several_devices: each device must hold its 5 MiB within its own budget:\n\
         {report}"
    );
    assert_eq!(report.held(), ha + hb, "[{mode}] HostReport::held");
    assert_eq!(
        report.budget(),
        Some(16 * MIB),
        "[{mode}] HostReport::budget"
    );
    drop((xa, xb, small));
    a.assert_no_leak("several_devices (budgets)");
    b.assert_no_leak("several_devices (budgets)");
}

/// A handle of A used on B: refused, naming both devices.
fn wrong_device<H: Harness>(a: &mut Ctx<H>, b: &mut Ctx<H>, mode: Mode) {
    let s0 = StreamId(0);
    let (ida, idb) = (a.dev.id(), b.dev.id());
    let x = must(a.create(s0, &[1; 64]), "create x on A");
    let y = must(b.create(s0, &[2; 64]), "create y on B");
    let names_both = |e: &dyn std::fmt::Display, what: &str| {
        let msg = e.to_string();
        assert!(
            msg.contains(&format!("device {ida}")) && msg.contains(&format!("device {idb}")),
            "[{mode}] several_devices: {what}: the error does not name both devices {ida} and \
             {idb}: {msg}"
        );
    };
    match b.read(s0, &x) {
        Err(e @ ServerError::Io(IoError::ForeignHandle { .. })) => names_both(&e, "a read"),
        other => panic!("[{mode}] several_devices: A's handle read on B answered {other:?}"),
    }
    match b.launch(s0, TestKernel::AddByte, 1, &[&x], &[&y]) {
        Err(
            ref e @ ServerError::Launch(LaunchError::Buffer {
                cause: IoError::ForeignHandle { .. },
                ..
            }),
        ) => names_both(e, "a launch"),
        other => panic!("[{mode}] several_devices: A's handle launched on B answered {other:?}"),
    }
    // The sides swapped: B's handle as the source on A, A's as the destination on B.
    match copy(b, s0, &x, a, s0, &y) {
        Err(e @ ServerError::Io(IoError::ForeignHandle { .. })) => names_both(&e, "a copy"),
        other => {
            panic!("[{mode}] several_devices: a copy with its sides swapped answered {other:?}")
        }
    }
    b.expect_read(s0, &y, &[2; 64], "y after the refusals", &[]);
    a.expect_read(s0, &x, &[1; 64], "x after the refusals", &[]);
}

/// A device lost while a copy to it is in flight (queued behind a slow kernel): the source
/// device goes on (its stream waited on the lost device's event: that wait completes once the
/// lost device runs nothing), its bytes intact, and new work on it runs. Needs a probe.
pub fn several_devices_lost<H: Harness>(h: &H, mode: Mode) {
    const GROUP: &str = "several_devices_lost";
    let Some([mut a, mut b]) = pair(h, mode, DeviceConfig::default(), GROUP) else {
        return;
    };
    if b.probe.is_none() {
        crate::skip::skipped(GROUP, mode, "the harness has no probe");
        return;
    }
    let s0 = StreamId(0);
    let n = 300_001;
    let p = pattern(n, 9);
    let x = must(a.create(s0, &p), "create x on A");
    let slow_in = must(b.create(s0, &p), "create on B");
    let slow_out = must(b.empty(s0, n as u64), "empty on B");
    let y = must(b.empty(s0, n as u64), "empty y on B");
    must(
        b.launch(s0, TestKernel::SlowAdd, 1, &[&slow_in], &[&slow_out]),
        "slow kernel on B",
    );
    must(
        copy(&mut b, s0, &y, &mut a, s0, &x),
        "copy x to y behind it",
    );
    lose(&mut b, &slow_out, mode, GROUP);
    assert!(
        b.read(s0, &y).is_err(),
        "[{mode}] {GROUP}: a read on the lost device succeeded"
    );
    a.expect_read(
        s0,
        &x,
        &p,
        &format!("[{mode}] {GROUP}: the source after its destination's device was lost"),
        &["stream_wait_event (an event of a lost device)"],
    );
    let z = must(a.empty(s0, n as u64), "new work on A");
    must(
        a.launch(s0, TestKernel::AddByte, 2, &[&x], &[&z]),
        "launch on A after B was lost",
    );
    a.expect_read(
        s0,
        &z,
        &plus(&p, 2),
        &format!("[{mode}] {GROUP}: work on A after B was lost"),
        &[],
    );
    drop((x, z, slow_in, slow_out, y));
    drop(b);
    a.assert_no_leak(GROUP);
    source_lost(h, mode);
}

/// The source device lost while a copy out of it waits for its slow kernel: the destination's
/// bytes are never a silent mix. Its read either fails or, where the copy ran before the loss,
/// holds what the kernel wrote.
fn source_lost<H: Harness>(h: &H, mode: Mode) {
    const GROUP: &str = "several_devices_lost (source)";
    let Some([mut a, mut b]) = pair(h, mode, DeviceConfig::default(), GROUP) else {
        return;
    };
    if a.probe.is_none() {
        crate::skip::skipped(GROUP, mode, "the harness has no probe");
        return;
    }
    let s0 = StreamId(0);
    let n = 300_001;
    let p = pattern(n, 5);
    let input = must(a.create(s0, &p), "create the input on A");
    let x = must(a.empty(s0, n as u64), "empty x on A");
    let y = must(b.create(s0, &vec![0xee; n]), "create y on B");
    must(
        a.launch(s0, TestKernel::SlowAdd, 1, &[&input], &[&x]),
        "slow kernel writing x on A",
    );
    must(
        copy(&mut b, s0, &y, &mut a, s0, &x),
        "copy x to y behind it",
    );
    lose(&mut a, &input, mode, GROUP);
    match b.read(s0, &y) {
        Err(_) => {}
        Ok(bytes) => expect_same(
            &bytes,
            &plus(&p, 1),
            &format!("[{mode}] {GROUP}: a destination read that succeeded"),
            &["copy_peer (a source device lost before its work ran)"],
        ),
    }
    // B goes on: its stream that copied is faulted (where the copy met the loss), its other
    // streams run new work.
    let s1 = StreamId(1);
    let z = must(b.create(s1, &p), "new work on B");
    b.expect_read(
        s1,
        &z,
        &p,
        &format!("[{mode}] {GROUP}: B after A was lost"),
        &[],
    );
    drop((input, x, y, z));
    drop(a);
}

/// Loses `ctx`'s device through its probe: the next launch (a fill of `out` on stream 0) loses
/// it, and must say so.
fn lose<H: Harness>(ctx: &mut Ctx<H>, out: &Handle, mode: Mode, group: &str) {
    ctx.probe
        .as_ref()
        .expect("checked")
        .inject(FaultRule::LoseDevice { op: ShimOp::Launch });
    let lost = ctx.launch(StreamId(0), TestKernel::Fill, 1, &[], &[out]);
    assert!(
        matches!(lost, Err(ref e) if e.is_device_lost()),
        "[{mode}] {group}: the injected loss answered {lost:?}"
    );
}

/// Work that fails while it runs on A faults A's stream; B keeps working (its own work, and a
/// copy between two of its buffers through a third device is not needed: B alone), and a copy
/// out of A's faulted stream is refused without touching B. Needs a probe that makes work fail.
pub fn several_devices_fault<H: Harness>(h: &H, mode: Mode) {
    const GROUP: &str = "several_devices_fault";
    let Some([mut a, mut b]) = pair(h, mode, DeviceConfig::default(), GROUP) else {
        return;
    };
    if a.probe.is_none() {
        crate::skip::skipped(GROUP, mode, "the harness has no probe");
        return;
    }
    let s0 = StreamId(0);
    let x = must(a.create(s0, &[3; 4096]), "create x on A");
    let y = must(b.create(s0, &[4; 4096]), "create y on B");
    a.probe
        .as_ref()
        .expect("checked")
        .inject(FaultRule::WorkFails {
            op: ShimOp::Launch,
            skip: 0,
        });
    must(
        a.launch(s0, TestKernel::Fill, 1, &[], &[&x]),
        "the launch on A whose work fails",
    );
    let synced = a.sync(s0);
    assert!(
        synced.is_err(),
        "[{mode}] {GROUP}: A's fence after failed work passed"
    );
    let refused = copy(&mut b, s0, &y, &mut a, s0, &x);
    assert!(
        refused.is_err(),
        "[{mode}] {GROUP}: a copy out of A's faulted stream was accepted"
    );
    b.expect_read(
        s0,
        &y,
        &[4; 4096],
        &format!("[{mode}] {GROUP}: B's bytes after A's fault and the refused copy"),
        &[],
    );
    let z = must(b.empty(s0, 4096), "new memory on B");
    must(
        b.launch(s0, TestKernel::AddByte, 1, &[&y], &[&z]),
        "a launch on B after A's fault",
    );
    b.expect_read(
        s0,
        &z,
        &[5; 4096],
        &format!("[{mode}] {GROUP}: B's work after A's fault"),
        &[],
    );
    let w = must(b.empty(StreamId(1), 4096), "memory on B's second stream");
    must(
        b.launch(StreamId(1), TestKernel::AddByte, 1, &[&z], &[&w]),
        "B's second stream",
    );
    expect_same(
        &must(b.read(StreamId(1), &w), "read w"),
        &[6; 4096],
        &format!("[{mode}] {GROUP}: B's second stream after A's fault"),
        &[],
    );
    drop((y, z, w, x));
    drop(a);
    b.assert_no_leak(GROUP);
}
