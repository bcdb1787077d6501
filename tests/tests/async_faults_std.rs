//! Work that fails while it runs (not when it is enqueued): the std shim reports it at the next
//! fence as `Fault::WorkFailed`. The shim cannot say which work failed, so the core stops
//! trusting the stream: no read returns bytes the failed work may have left unwritten, on that
//! stream or on one ordered after it, whichever fence (a read's, or an internal drop-queue flush's)
//! happened to reveal the fault. Other streams keep working, and teardown frees everything.

use devcmd::{
    Device, DeviceConfig, DropPolicy, Launch, LaunchDims, ReadRequest, ServerError, StreamId,
};
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
    let (probe, kernel, mut device) = setup();
    let (x, y) = {
        let mut cmd = device.command(StreamId(0)).unwrap();
        let (x, y) = (
            cmd.create(&[1u8; 64]).unwrap(),
            cmd.create(&[2u8; 64]).unwrap(),
        );
        launch_failing(&mut device, StreamId(0), &kernel, &x, &y);
        let mut cmd = device.command(StreamId(0)).unwrap();
        let err = cmd
            .read_async(&[ReadRequest::whole(&y)])
            .unwrap()
            .wait()
            .unwrap_err();
        assert!(faulted(&err), "the read's fence reveals the fault: {err}");
        (x, y)
    };
    // Everything on stream 0 now fails, and so does work ordered after it.
    let mut cmd = device.command(StreamId(0)).unwrap();
    let err = cmd.read_async(&[ReadRequest::whole(&x)]).unwrap_err();
    assert!(faulted(&err), "{err}");
    let mut dependent = device.command(StreamId(1)).unwrap();
    let err = dependent.read_async(&[ReadRequest::whole(&y)]).unwrap_err();
    assert!(
        faulted(&err),
        "a use ordered after the faulted stream: {err}"
    );
    // An unrelated stream keeps working.
    let mut other = device.command(StreamId(1)).unwrap();
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
            fill_released: None,
        },
        ..DeviceConfig::default()
    };
    let mut device = Device::new(shim, config);
    let mut cmd = device.command(StreamId(0)).unwrap();
    let (x, y) = (
        cmd.create(&[1u8; 64]).unwrap(),
        cmd.create(&[2u8; 64]).unwrap(),
    );
    launch_failing(&mut device, StreamId(0), &kernel, &x, &y);
    let mut cmd = device.command(StreamId(0)).unwrap();
    // Two uploads: the second one's flush waits for the fence recorded after the launch and
    // meets the fault; the uploads themselves succeed.
    cmd.write_from(&x, &[4u8; 64]).expect("first upload");
    cmd.write_from(&x, &[4u8; 64])
        .expect("second upload: its flush meets the fault");
    let err = cmd.read_async(&[ReadRequest::whole(&y)]).unwrap_err();
    assert!(
        faulted(&err),
        "the read is refused before it is enqueued: {err}"
    );
    drop((x, y));
    drop(device);
    assert_eq!(
        probe.stats().device_pages_live,
        0,
        "teardown freed every page"
    );
}

fn setup() -> (StdShim, StdKernel, Device<StdShim>) {
    let shim = StdShim::new();
    let kernel = failing_kernel(&shim);
    let device = Device::new(shim.clone(), DeviceConfig::default());
    (shim, kernel, device)
}

/// Two buffers of stream 0: 64 bytes of 1 and 64 bytes of 2.
fn two_buffers(device: &mut Device<StdShim>) -> (devcmd::Handle, devcmd::Handle) {
    let mut cmd = device.command(StreamId(0)).unwrap();
    (
        cmd.create(&[1u8; 64]).unwrap(),
        cmd.create(&[2u8; 64]).unwrap(),
    )
}

fn launch_failing(
    device: &mut Device<StdShim>,
    stream: StreamId,
    kernel: &StdKernel,
    input: &devcmd::Handle,
    output: &devcmd::Handle,
) {
    let mut cmd = device.command(stream).unwrap();
    let launch = Launch {
        kernel,
        dims: LaunchDims::SINGLE,
        inputs: &[input],
        outputs: &[output],
        params: &[],
    };
    cmd.launch(launch).unwrap();
}

#[test]
fn a_read_that_completed_before_the_fault_was_heard_of_is_still_refused() {
    let (probe, kernel, mut device) = setup();
    let (x, y) = two_buffers(&mut device);
    launch_failing(&mut device, StreamId(0), &kernel, &x, &y);
    let mut cmd = device.command(StreamId(0)).unwrap();
    let first = cmd.read_async(&[ReadRequest::whole(&y)]).unwrap();
    let second = cmd.read_async(&[ReadRequest::whole(&x)]).unwrap();
    // The later read's fence hears of the fault first; the earlier one completed cleanly.
    assert!(faulted(&second.wait().unwrap_err()));
    let err = first.wait().unwrap_err();
    assert!(faulted(&err), "the garbage must not come back: {err}");
    drop((x, y));
    drop(device);
    assert_eq!(probe.stats().device_pages_live, 0);
}

#[test]
fn a_fault_on_a_foreign_writer_reaches_the_owner_that_waited_for_it() {
    let (probe, kernel, mut device) = setup();
    let (x, h) = two_buffers(&mut device);
    // Stream 1 writes stream 0's buffer and fails; nobody has asked stream 1 yet.
    launch_failing(&mut device, StreamId(1), &kernel, &x, &h);
    let mut cmd = device.command(StreamId(0)).unwrap();
    match cmd.read_async(&[ReadRequest::whole(&h)]).map(|r| r.wait()) {
        Err(e) | Ok(Err(e)) => assert!(matches!(e, ServerError::StreamFaulted { .. }), "{e}"),
        Ok(Ok(bytes)) => panic!(
            "the owner read the failed writer's output: {:?}",
            &bytes[0].as_slice()[..4]
        ),
    }
    drop((x, h));
    drop(device);
    assert_eq!(probe.stats().device_pages_live, 0);
}

#[test]
fn a_device_dropped_without_hearing_of_the_fault_still_frees_everything() {
    let (probe, kernel, mut device) = setup();
    let (x, y) = two_buffers(&mut device);
    launch_failing(&mut device, StreamId(0), &kernel, &x, &y);
    drop((x, y));
    drop(device);
    assert_eq!(
        probe.stats().device_pages_live,
        0,
        "a fault of run work does not leak the device"
    );
    assert_eq!(probe.stats().host_pages_live, 0, "nor its pinned pages");
}
