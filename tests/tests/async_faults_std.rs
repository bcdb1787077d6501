//! Work that fails while it runs (not when it is enqueued): the std shim reports it at the next
//! fence as `Fault::WorkFailed`. The shim cannot say which work failed, so the core stops
//! trusting the stream: no read returns bytes the failed work may have left unwritten, on that
//! stream or on one ordered after it, whichever fence (a read's, or an internal drop-queue flush's)
//! happened to reveal the fault. Other streams keep working, and teardown frees everything.

use devcmd::{Device, DeviceConfig, DropPolicy, Grid, Launch, ReadRequest, ServerError, StreamId};
use devcmd_std::{KernelFault, StdKernel, StdShim};

fn failing_kernel(shim: &StdShim) -> StdKernel {
    // Writes garbage into its output, then reports the failure: a read must never see it.
    shim.register_kernel("write_then_fail", |ctx| {
        let mut bufs = ctx.buffers_mut()?;
        if let Some(out) = bufs.last_mut() {
            out.fill(0xEE);
        }
        Err(KernelFault::Failed)
    })
}

fn faulted(e: &ServerError) -> bool {
    matches!(e, ServerError::StreamFaulted { stream: 0, .. })
}

#[test]
fn a_fault_found_by_a_read_taints_the_stream_and_what_depends_on_it() {
    let shim = StdShim::new();
    let kernel = failing_kernel(&shim);
    let probe = shim.clone();
    let mut device = Device::new(shim, DeviceConfig::default());
    let (x, y) = {
        let mut cmd = device.command(StreamId(0), &[]).unwrap();
        let x = cmd.create(&[1u8; 64]).unwrap();
        let y = cmd.create(&[2u8; 64]).unwrap();
        let launch = Launch {
            kernel: &kernel,
            name: "write_then_fail",
            grid: Grid::linear(1),
            inputs: &[&x],
            outputs: &[&y],
            args: &[][..],
        };
        cmd.launch(launch).expect("the enqueue itself succeeds");
        let err = cmd
            .read_async(&[ReadRequest::whole(&y)])
            .unwrap()
            .wait()
            .unwrap_err();
        assert!(faulted(&err), "the read's fence reveals the fault: {err}");
        (x, y)
    };
    // Everything on stream 0 now fails, and so does work ordered after it.
    let mut cmd = device.command(StreamId(0), &[]).unwrap();
    let err = cmd.read_async(&[ReadRequest::whole(&x)]).unwrap_err();
    assert!(faulted(&err), "{err}");
    assert!(faulted(&device.command(StreamId(1), &[&y]).unwrap_err()));
    // An unrelated stream keeps working.
    let mut other = device.command(StreamId(1), &[]).unwrap();
    let z = other.create(&[3u8; 32]).unwrap();
    let got = other
        .read_async(&[ReadRequest::whole(&z)])
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(got[0].as_slice(), &[3u8; 32]);
    drop((x, y, z));
    drop(device);
    assert_eq!(
        probe.stats().device_pages_live,
        0,
        "teardown freed every page"
    );
}

#[test]
fn a_fault_found_by_an_internal_flush_still_stops_the_read() {
    let shim = StdShim::new();
    let kernel = failing_kernel(&shim);
    let probe = shim.clone();
    // Flush the drop queue after every upload, so an upload's flush meets the fault first.
    let config = DeviceConfig {
        drops: DropPolicy {
            max_items: 1,
            max_bytes: 1 << 20,
        },
        ..DeviceConfig::default()
    };
    let mut device = Device::new(shim, config);
    let mut cmd = device.command(StreamId(0), &[]).unwrap();
    let x = cmd.create(&[1u8; 64]).unwrap();
    let y = cmd.create(&[2u8; 64]).unwrap();
    let launch = Launch {
        kernel: &kernel,
        name: "write_then_fail",
        grid: Grid::linear(1),
        inputs: &[&x],
        outputs: &[&y],
        args: &[][..],
    };
    cmd.launch(launch).unwrap();
    // Two uploads: the second one's flush waits for the fence recorded after the launch.
    let mut tainted = false;
    for _ in 0..2 {
        match cmd.write_from(&x, &[4u8; 64]) {
            Ok(()) => {}
            Err(e) => {
                assert!(faulted(&e), "{e}");
                tainted = true;
            }
        }
    }
    let err = cmd.read_async(&[ReadRequest::whole(&y)]).map(|r| r.wait());
    match err {
        Err(e) | Ok(Err(e)) => assert!(faulted(&e), "{e}"),
        Ok(Ok(bytes)) => panic!(
            "a read returned bytes after failed work (tainted during uploads: {tainted}): {:?}",
            &bytes[0].as_slice()[..4]
        ),
    }
    drop((x, y));
    drop(device);
    assert_eq!(
        probe.stats().device_pages_live,
        0,
        "teardown freed every page"
    );
}
