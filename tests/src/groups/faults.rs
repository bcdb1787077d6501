//! Fault injection: every shim call failing under every operation gives a clear error, leaks
//! nothing the design does not leak on purpose, and frees nothing early.

use crate::harness::{FaultRule, Harness, Mode, TestKernel};
use crate::util::{Ctx, first_diff, must, pattern, plus, small_pages};
use devcmd::{HostOrigin, IoError, LaunchError, ReadRequest, ServerError, ShimOp, StreamId};
use std::panic::{AssertUnwindSafe, catch_unwind};

/// The shim calls the core makes outside graph capture. (`CopyDeviceToDevice` is left out: the
/// core makes no device-to-device copy outside relocation, which it does not run yet.)
fn calls() -> impl Iterator<Item = ShimOp> {
    ShimOp::ALL.into_iter().filter(|op| {
        !matches!(
            op,
            ShimOp::CopyDeviceToDevice
                | ShimOp::GraphBegin
                | ShimOp::GraphEnd
                | ShimOp::GraphUpload
                | ShimOp::GraphLaunch
        )
    })
}

/// The operations run while a call fails.
#[derive(Debug, Clone, Copy)]
enum Op {
    Create,
    Write,
    Read,
    Launch,
    CrossStream,
    Sync,
    Flush,
    Poll,
    Cleanup,
}

const OPS: [Op; 9] = [
    Op::Create,
    Op::Write,
    Op::Read,
    Op::Launch,
    Op::CrossStream,
    Op::Sync,
    Op::Flush,
    Op::Poll,
    Op::Cleanup,
];

fn run_op<H: Harness>(
    c: &mut Ctx<H>,
    op: Op,
    e: &devcmd::Handle,
    f: &devcmd::Handle,
) -> Result<(), ServerError> {
    let (s0, s1) = (StreamId(0), StreamId(1));
    match op {
        Op::Create => {
            let a = c.create(s0, &pattern(100, 1))?;
            let b = c.create(s0, &pattern(200_000, 2))?;
            drop((a, b));
        }
        Op::Write => c.write(s0, e, &pattern(4096, 3))?,
        Op::Read => {
            c.read(s0, e)?;
            c.read(s1, e)?;
        }
        Op::Launch => c.launch(s0, TestKernel::AddByte, 1, &[e], &[f])?,
        Op::CrossStream => {
            c.dev.command(StreamId(2))?;
            c.launch(StreamId(2), TestKernel::AddByte, 2, &[e], &[f])?;
        }
        Op::Sync => c.sync(s0)?,
        Op::Flush => {
            c.write(s0, e, &pattern(4096, 4))?;
            c.flush(s0)?;
            c.write(s0, e, &pattern(4096, 5))?;
            c.flush(s0)?;
        }
        Op::Poll => {
            c.write(s0, e, &pattern(4096, 6))?;
            c.flush(s0)?;
            c.poll(s0)?;
        }
        Op::Cleanup => c.dev.command(s0)?.memory_cleanup()?,
    }
    Ok(())
}

/// Inconclusive fences: the design leaks what they covered on purpose.
fn leaks_on_purpose(call: ShimOp) -> bool {
    matches!(
        call,
        ShimOp::EventRecord | ShimOp::EventWait | ShimOp::EventQuery
    )
}

fn scenario<H: Harness>(h: &H, mode: Mode, call: ShimOp, op: Op, poisons: bool) {
    let what = format!(
        "[{mode}] {op:?} while every {call} fails{}",
        if poisons { " (poisoning)" } else { "" }
    );
    let Some(mut c) = Ctx::new(h, mode, small_pages(), "fault_injection") else {
        return;
    };
    let (s0, s1) = (StreamId(0), StreamId(1));
    // A witness of early frees: `w` is dropped while a launch on stream 0 still has to read it.
    let wdata = pattern(8192, 50);
    let w = must(c.create(s1, &wdata), format!("{what}: setup"));
    let r = must(c.empty(s0, 8192), format!("{what}: setup"));
    must(
        c.launch(s0, TestKernel::AddByte, 9, &[&w], &[&r]),
        format!("{what}: setup"),
    );
    drop(w);
    let e = must(c.create(s1, &pattern(4096, 60)), format!("{what}: setup"));
    let f = must(c.empty(s0, 4096), format!("{what}: setup"));

    let probe = c.probe.as_ref().expect("checked by the caller");
    probe.inject(if poisons {
        FaultRule::LoseDevice { op: call }
    } else {
        FaultRule::Always { op: call }
    });
    let result = catch_unwind(AssertUnwindSafe(|| run_op(&mut c, op, &e, &f)))
        .unwrap_or_else(|_| panic!("{what}: the operation panicked instead of returning an error"));
    c.probe.as_ref().unwrap().clear();
    if let Err(err) = &result {
        assert!(
            !err.to_string().is_empty(),
            "{what}: an error without a message"
        );
    }
    if call == ShimOp::HostAlloc && !poisons {
        assert!(
            result.is_ok(),
            "{what}: a refused pinned allocation must fall back to the heap, got {result:?}"
        );
    }
    let poisoned = result.as_ref().is_err_and(ServerError::is_device_lost);
    if poisoned {
        match c.create(s0, &[1, 2, 3]) {
            Err(ServerError::DeviceLost { .. }) => {}
            other => panic!("{what}: after a poisoning fault, create gave {other:?}"),
        }
        assert!(
            matches!(c.dev.command(s1), Err(ServerError::DeviceLost { .. })),
            "{what}: after a poisoning fault, a new command must fail fast"
        );
    }
    if poisons {
        // Nothing runs again; teardown must still give every page back.
        let probe = c.probe.take().unwrap();
        drop((e, f, r));
        drop(c);
        let counters = probe.counters();
        assert_eq!(
            counters.device_pages_live, 0,
            "{what}: a poisoned device kept pages after teardown"
        );
        return;
    }
    // The device recovers: the witness shows no early free, a round trip works.
    let got = must(c.read(s0, &r), format!("{what}: read the witness"));
    let expected = plus(&wdata, 9);
    assert!(
        got == expected,
        "{what}: a buffer dropped while a launch still had to read it was freed or reused early \
         ({})",
        first_diff(&got, &expected)
    );
    let data = pattern(3000, 70);
    let x = must(
        c.create(s1, &data),
        format!("{what}: create after the fault"),
    );
    let back = must(c.read(s0, &x), format!("{what}: read after the fault"));
    assert!(back == data, "{what}: round trip after the fault");
    drop((e, f, r, x));
    if leaks_on_purpose(call) {
        must(c.cleanup_all(), format!("{what}: cleanup"));
        let probe = c.probe.take().unwrap();
        drop(c);
        assert_eq!(
            probe.counters().device_pages_live,
            0,
            "{what}: device pages kept after teardown"
        );
    } else {
        c.assert_no_leak(&what);
    }
}

/// Precise expectations for one fault at a time.
fn precise<H: Harness>(h: &H, mode: Mode) {
    let (s0, s1) = (StreamId(0), StreamId(1));
    let fresh = || Ctx::new(h, mode, small_pages(), "fault_injection").unwrap();
    let device_err = |r: Result<(), ServerError>, op: ShimOp, what: &str| match r {
        Err(ServerError::Device(e)) if e.op == op => {}
        other => panic!("[{mode}] {what}: expected a failed {op}, got {other:?}"),
    };

    // Device allocation: OutOfMemory naming the device's refusal.
    let mut c = fresh();
    // Memory comes from pages, or from granules mapped into a reserved range where the device
    // has virtual memory: both refused.
    for op in [ShimOp::DeviceAlloc, ShimOp::VmMap] {
        c.probe.as_ref().unwrap().inject(FaultRule::Always { op });
    }
    match c.empty(s0, 1 << 20) {
        Err(ServerError::Io(IoError::OutOfMemory {
            source: Some(src), ..
        })) if matches!(src.op, ShimOp::DeviceAlloc | ShimOp::VmMap) => {}
        other => panic!("[{mode}] a refused page: expected OutOfMemory, got {other:?}"),
    }
    c.probe.as_ref().unwrap().clear();
    let x = must(c.create(s0, &[7; 100]), "create after a refused page");
    assert_eq!(must(c.read(s0, &x), "read"), vec![7; 100]);
    drop(x);
    c.assert_no_leak("refused page");

    // Pinned allocation refused: the heap serves.
    let mut c = fresh();
    c.probe.as_ref().unwrap().inject(FaultRule::Always {
        op: ShimOp::HostAlloc,
    });
    let buf = must(
        must(c.dev.command(s0), "command").reserve_host(64, true),
        "reserve_host",
    );
    assert_eq!(
        buf.origin(),
        HostOrigin::Heap,
        "[{mode}] pinned refused: heap"
    );
    drop(buf);
    let x = must(c.create(s0, &[8; 100]), "create without pinned memory");
    assert_eq!(must(c.read(s0, &x), "read"), vec![8; 100]);
    c.probe.as_ref().unwrap().clear();
    drop(x);
    c.assert_no_leak("pinned refused");

    // Upload refused: the range is failed until rewritten.
    let mut c = fresh();
    let x = must(c.create(s0, &[1; 256]), "create");
    c.probe.as_ref().unwrap().inject(FaultRule::Once {
        op: ShimOp::CopyHostToDevice,
        skip: 0,
    });
    device_err(
        c.write(s0, &x, &[2; 256]),
        ShimOp::CopyHostToDevice,
        "upload",
    );
    match c.read(s0, &x) {
        Err(ServerError::Unwritten { root, .. }) => assert!(
            matches!(*root, ServerError::Device(e) if e.op == ShimOp::CopyHostToDevice),
            "[{mode}] the failure's root is the refused upload, got {root}"
        ),
        other => panic!("[{mode}] read after a refused upload: expected Unwritten, got {other:?}"),
    }
    must(c.write(s0, &x, &[3; 256]), "rewrite");
    assert_eq!(must(c.read(s0, &x), "read"), vec![3; 256]);
    drop(x);
    c.assert_no_leak("refused upload");

    // Readback refused, also as the second copy of a two-request read.
    let mut c = fresh();
    let (x, y) = (
        must(c.create(s0, &[4; 64]), "create"),
        must(c.create(s1, &[5; 64]), "create"),
    );
    let probe = c.probe.as_ref().unwrap();
    probe.inject(FaultRule::Once {
        op: ShimOp::CopyDeviceToHost,
        skip: 0,
    });
    device_err(
        c.read(s0, &x).map(drop),
        ShimOp::CopyDeviceToHost,
        "readback",
    );
    c.probe.as_ref().unwrap().inject(FaultRule::Once {
        op: ShimOp::CopyDeviceToHost,
        skip: 1,
    });
    let two = c.dev.command(s0).and_then(|mut k| {
        k.read_async(&[ReadRequest::whole(&x), ReadRequest::whole(&y)])
            .map(drop)
    });
    device_err(two, ShimOp::CopyDeviceToHost, "second readback");
    assert_eq!(must(c.read(s0, &x), "read"), vec![4; 64]);
    assert_eq!(must(c.read(s0, &y), "read"), vec![5; 64]);
    drop((x, y));
    c.assert_no_leak("refused readback");

    // Launch refused: outputs failed; a rewrite clears them.
    let mut c = fresh();
    let (x, y) = (
        must(c.create(s0, &[1; 64]), "create"),
        must(c.empty(s0, 64), "empty"),
    );
    c.probe.as_ref().unwrap().inject(FaultRule::Once {
        op: ShimOp::Launch,
        skip: 0,
    });
    match c.launch(s0, TestKernel::AddByte, 1, &[&x], &[&y]) {
        Err(ServerError::Launch(LaunchError::Refused { cause, .. }))
            if cause.op == ShimOp::Launch => {}
        other => panic!("[{mode}] refused launch: got {other:?}"),
    }
    assert!(
        matches!(c.read(s0, &y), Err(ServerError::Unwritten { .. })),
        "[{mode}] the output of a refused launch must not read"
    );
    must(
        c.launch(s0, TestKernel::AddByte, 1, &[&x], &[&y]),
        "relaunch",
    );
    assert_eq!(must(c.read(s0, &y), "read"), vec![2; 64]);
    drop((x, y));
    c.assert_no_leak("refused launch");

    // Fences: record refused, wait refused, query refused.
    let mut c = fresh();
    let x = must(c.create(s0, &[1; 64]), "create");
    c.probe.as_ref().unwrap().inject(FaultRule::Once {
        op: ShimOp::EventRecord,
        skip: 0,
    });
    device_err(
        c.dev.command(s0).and_then(|mut k| k.sync().map(drop)),
        ShimOp::EventRecord,
        "sync with a refused fence",
    );
    let fut = must(c.dev.command(s0).and_then(|mut k| k.sync()), "sync");
    c.probe.as_ref().unwrap().inject(FaultRule::Once {
        op: ShimOp::EventWait,
        skip: 0,
    });
    device_err(fut.wait(), ShimOp::EventWait, "sync wait");
    must(c.write(s0, &x, &[2; 64]), "write");
    must(c.flush(s0), "flush");
    c.probe.as_ref().unwrap().inject(FaultRule::Once {
        op: ShimOp::EventQuery,
        skip: 0,
    });
    device_err(c.poll(s0).map(drop), ShimOp::EventQuery, "poll");
    assert_eq!(must(c.read(s0, &x), "read"), vec![2; 64]);
    drop(x);

    // Cross-stream order refused; stream creation refused.
    let y = must(c.create(s1, &[6; 32]), "create");
    c.probe.as_ref().unwrap().inject(FaultRule::Once {
        op: ShimOp::StreamWaitEvent,
        skip: 0,
    });
    device_err(
        c.read(s0, &y).map(drop),
        ShimOp::StreamWaitEvent,
        "cross-stream order",
    );
    c.probe.as_ref().unwrap().inject(FaultRule::Once {
        op: ShimOp::StreamCreate,
        skip: 0,
    });
    device_err(
        c.dev.command(StreamId(5)).map(drop),
        ShimOp::StreamCreate,
        "stream creation",
    );
    assert_eq!(
        must(c.read(StreamId(5), &y), "read on stream 5"),
        vec![6; 32]
    );

    // A poisoning launch: everything fails fast afterwards.
    c.probe
        .as_ref()
        .unwrap()
        .inject(FaultRule::LoseDevice { op: ShimOp::Launch });
    let z = must(c.empty(s0, 32), "empty");
    let err = c
        .launch(s0, TestKernel::AddByte, 1, &[&y], &[&z])
        .expect_err("a poisoning launch must fail");
    assert!(err.is_device_lost(), "[{mode}] poisoning launch: {err}");
    for r in [
        c.create(s0, &[1]).map(drop),
        c.read(s1, &y).map(drop),
        c.sync(s0),
        c.dev.command(s1).map(drop),
    ] {
        assert!(
            matches!(r, Err(ServerError::DeviceLost { .. })),
            "[{mode}] after poisoning every operation fails fast, got {r:?}"
        );
    }
    let probe = c.probe.take().unwrap();
    drop((y, z, c));
    assert_eq!(
        probe.counters().device_pages_live,
        0,
        "[{mode}] a poisoned device kept pages after teardown"
    );
}

/// The fault-injection group (needs a probe; skipped without one). Checks:
///
/// - precisely, one fault at a time: a refused page is `OutOfMemory` naming the device's
///   refusal; a refused pinned page falls back to the heap; a refused upload or launch marks its
///   range failed until rewritten (with the refusal as the root); a refused readback (also the
///   second of two) is an error and later reads work; a refused fence record, wait or query is
///   an error; a refused cross-stream wait or stream creation is an error; a poisoning fault
///   makes every later operation fail fast with `DevicePoisoned`;
/// - as a sweep: every shim call the core makes (stream create, stream wait, event record,
///   query and wait, device and pinned allocation, both copies, launch), failing always or
///   poisoning, under every operation (create, write, read, launch, cross-stream command, sync,
///   flush, poll, cleanup): no panic, an error with a message (or success where the call was
///   not needed, and always for a refused pinned page), then, once the faults are lifted, a
///   buffer dropped before the fault while a launch still had to read it reads back exactly
///   (no early free; lazy + poison modes make this strict), a new round trip works, and after
///   cleanup nothing is in use and no page is held (fence faults may leak host buffers on
///   purpose; device pages still go back at teardown). Poisoned devices give every page back
///   at teardown.
pub fn fault_injection<H: Harness>(h: &H, mode: Mode) {
    let Some(c) = Ctx::new(h, mode, small_pages(), "fault_injection") else {
        return;
    };
    if c.probe.is_none() {
        eprintln!("devcmd conformance: fault_injection skipped: the harness has no probe");
        return;
    }
    drop(c);
    let only = std::env::var("DEVCMD_FAULTS_ONLY").unwrap_or_default();
    if only.is_empty() || only == "precise" {
        precise(h, mode);
    }
    for call in calls() {
        for op in OPS {
            for poisons in [false, true] {
                let tag = format!("{call:?}/{op:?}/{poisons}");
                if !only.is_empty() && !tag.contains(&only) {
                    continue;
                }
                scenario(h, mode, call, op, poisons);
            }
        }
    }
}
