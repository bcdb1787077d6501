//! Fault injection: every shim call failing under every operation gives a clear error, leaks
//! nothing the design does not leak on purpose, and frees nothing early.

use crate::harness::{FaultRule, Harness, Mode, TestKernel};
use crate::util::{Ctx, first_diff, must, pattern, plus, small_pages};
use devcmd::{Handle, ServerError, ShimOp, StreamId};
use std::panic::{AssertUnwindSafe, catch_unwind};

mod precise;

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

/// The shim calls most likely at fault when bytes read back wrong after a fault was lifted: the
/// copies themselves, or a fence (`event_wait`) that returned before the copy it covers landed.
const READ_SUSPECTS: &str = "copy_to_device / copy_to_host (the bytes moved wrong), or \
                             event_wait (it returned before the copy it covers landed)";

/// Reads `x` on `stream` and checks it holds `want`; a failure names the mode, the scenario and
/// the shim calls most likely at fault (`suspects`), never a bare dump of bytes.
fn expect_read<H: Harness>(
    c: &mut Ctx<H>,
    stream: StreamId,
    x: &Handle,
    want: &[u8],
    scenario: &str,
    suspects: &str,
) {
    let what = format!("[{}] {scenario}", c.mode);
    c.expect_read(stream, x, want, &what, &[suspects]);
}

fn scenario<H: Harness>(h: &H, mode: Mode, call: ShimOp, op: Op, loses_device: bool) {
    let what = format!(
        "[{mode}] {op:?} while every {call} fails{}",
        if loses_device {
            " (and loses the device)"
        } else {
            ""
        }
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
    probe.inject(if loses_device {
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
    if call == ShimOp::HostAlloc && !loses_device {
        assert!(
            result.is_ok(),
            "{what}: a refused pinned allocation must fall back to the heap, got {result:?}"
        );
    }
    let lost = result.as_ref().is_err_and(ServerError::is_device_lost);
    if lost {
        match c.create(s0, &[1, 2, 3]) {
            Err(ServerError::DeviceLost { .. }) => {}
            other => panic!("{what}: after the device was lost, create gave {other:?}"),
        }
        assert!(
            matches!(c.dev.command(s1), Err(ServerError::DeviceLost { .. })),
            "{what}: after the device was lost, a new command must fail fast"
        );
    }
    if loses_device {
        // Nothing runs again; teardown must still give every page back.
        let probe = c.probe.take().unwrap();
        drop((e, f, r));
        drop(c);
        let counters = probe.counters();
        assert_eq!(
            counters.device_pages_live, 0,
            "{what}: a lost device kept pages after teardown (device_free not called for \
             every page the core held)"
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
    c.expect_read(
        s0,
        &x,
        &data,
        &format!("{what}: the round trip after the fault"),
        &[READ_SUSPECTS],
    );
    drop((e, f, r, x));
    if leaks_on_purpose(call) {
        must(c.cleanup_all(), format!("{what}: cleanup"));
        let probe = c.probe.take().unwrap();
        drop(c);
        assert_eq!(
            probe.counters().device_pages_live,
            0,
            "{what}: device pages kept after teardown (device_free not called for every page)"
        );
    } else {
        c.assert_no_leak(&what);
    }
}

/// The fault-injection group (needs a probe; skipped without one). Checks:
///
/// - precisely, one fault at a time: a refused page is `OutOfMemory` naming the device's
///   refusal; a refused pinned page falls back to the heap; a refused upload or launch marks its
///   range failed until rewritten (with the refusal as the root); a refused readback (also the
///   second of two) is an error and later reads work; a refused fence record, wait or query is
///   an error; a refused cross-stream wait or stream creation is an error; a fault that loses
///   the device ([`FaultRule::LoseDevice`]) makes every later operation fail fast with
///   [`ServerError::DeviceLost`];
/// - as a sweep: every shim call the core makes (stream create, stream wait, event record,
///   query and wait, device and pinned allocation, both copies, launch), failing always or
///   losing the device, under every operation (create, write, read, launch, cross-stream command, sync,
///   flush, poll, cleanup): no panic, an error with a message (or success where the call was
///   not needed, and always for a refused pinned page), then, once the faults are lifted, a
///   buffer dropped before the fault while a launch still had to read it reads back exactly
///   (no early free; lazy + poison modes make this strict), a new round trip works, and after
///   cleanup nothing is in use and no page is held (fence faults may leak host buffers on
///   purpose; device pages still go back at teardown). Lost devices give every page back at
///   teardown. Every failure names the mode, the scenario and the shim call most likely at
///   fault.
pub fn fault_injection<H: Harness>(h: &H, mode: Mode) {
    let Some(c) = Ctx::new(h, mode, small_pages(), "fault_injection") else {
        return;
    };
    if c.probe.is_none() {
        crate::skip::skipped("fault_injection", mode, "the harness has no probe");
        return;
    }
    drop(c);
    let only = std::env::var("DEVCMD_FAULTS_ONLY").unwrap_or_default();
    if only.is_empty() || only == "precise" {
        precise::precise(h, mode);
    }
    for call in calls() {
        for op in OPS {
            for loses_device in [false, true] {
                let tag = format!("{call:?}/{op:?}/{loses_device}");
                if !only.is_empty() && !tag.contains(&only) {
                    continue;
                }
                scenario(h, mode, call, op, loses_device);
            }
        }
    }
}
