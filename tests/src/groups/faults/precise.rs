//! The fault-injection group's precise half: one fault at a time, each with the error it must
//! give and the state the device must be left in.

use super::{READ_SUSPECTS, expect_read};
use crate::harness::{FaultRule, Harness, Mode, TestKernel};
use crate::util::{Ctx, must, small_pages};
use devcmd::{HostOrigin, IoError, LaunchError, ReadRequest, ServerError, ShimOp, StreamId};

/// Precise expectations for one fault at a time.
pub(super) fn precise<H: Harness>(h: &H, mode: Mode) {
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
    expect_read(
        &mut c,
        s0,
        &x,
        &[7; 100],
        "after a refused device_alloc",
        READ_SUSPECTS,
    );
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
    expect_read(
        &mut c,
        s0,
        &x,
        &[8; 100],
        "with host_alloc_pinned refused (copies from the heap)",
        "copy_to_device / copy_to_host with HostMemory::Pageable",
    );
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
    expect_read(
        &mut c,
        s0,
        &x,
        &[3; 256],
        "a rewrite after a refused copy_to_device",
        READ_SUSPECTS,
    );
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
    for (h, byte, stream) in [(&x, 4, "stream 0"), (&y, 5, "stream 1")] {
        let scenario = format!("a read of a buffer of {stream} after refused copy_to_host calls");
        expect_read(&mut c, s0, h, &[byte; 64], &scenario, READ_SUSPECTS);
    }
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
    expect_read(
        &mut c,
        s0,
        &y,
        &[2; 64],
        "a relaunch after a refused launch",
        "launch (the kernel ran wrong or not at all), or event_wait (it returned before the \
         kernel finished)",
    );
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
    expect_read(
        &mut c,
        s0,
        &x,
        &[2; 64],
        "a read after refused record_event, event_wait and event_query",
        READ_SUSPECTS,
    );
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
    expect_read(
        &mut c,
        StreamId(5),
        &y,
        &[6; 32],
        "a read on stream 5 after a refused stream_wait_event and create_stream",
        "stream_wait_event (stream 5 did not wait for stream 1's upload), or copy_to_host",
    );

    // A launch that loses the device: everything fails fast afterwards.
    c.probe
        .as_ref()
        .unwrap()
        .inject(FaultRule::LoseDevice { op: ShimOp::Launch });
    let z = must(c.empty(s0, 32), "empty");
    let err = c
        .launch(s0, TestKernel::AddByte, 1, &[&y], &[&z])
        .expect_err("a launch that loses the device must fail");
    assert!(
        err.is_device_lost(),
        "[{mode}] a launch whose shim answered Fault::DeviceLost: {err}"
    );
    for r in [
        c.create(s0, &[1]).map(drop),
        c.read(s1, &y).map(drop),
        c.sync(s0),
        c.dev.command(s1).map(drop),
    ] {
        assert!(
            matches!(r, Err(ServerError::DeviceLost { .. })),
            "[{mode}] after the device was lost every operation fails fast, got {r:?}"
        );
    }
    let probe = c.probe.take().unwrap();
    drop((y, z, c));
    let live = probe.counters().device_pages_live;
    assert!(
        live == 0,
        "[{mode}] a lost device kept {live} pages after teardown (device_free not called for \
         every page the core held)"
    );
}
