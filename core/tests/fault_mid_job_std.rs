//! The bare-metal hosts' fault scenario on the std shim (issue 11): the upload of a layer's input
//! fails while it runs, mid-job. The firmware hosts (`examples/firmware`, run with `fault`) check
//! the same outcome on their DMA engine: the read of the bytes the failed work touched reports
//! `StreamFaulted` (a `WorkFailed` fence, naming the last kernel launched before it), every read
//! on the stream is refused, another stream runs on, what the failed work used is released only
//! once a fence after it completed, and teardown frees every page.

use devcmd::{
    Device, DeviceConfig, Fault, KernelParam, Launch, LaunchDims, ReadRequest, ServerError, ShimOp,
    StreamId,
};
use devcmd_std::{Injection, KernelFault, StdShim};

const S0: StreamId = StreamId(0);
const S1: StreamId = StreamId(1);

#[test]
fn an_upload_that_fails_mid_job_is_reported_as_on_the_bare_metal_hosts() {
    let shim = StdShim::builder().lazy(true).build();
    let probe = shim.clone();
    let kernel = shim.register_kernel("layer", |ctx| {
        let (y, x) = (ctx.slot(0)?, ctx.slot(1)?);
        let mut tmp = [0u8; 64];
        tmp.copy_from_slice(ctx.buffer(x)?);
        ctx.buffer_mut(y)?.copy_from_slice(&tmp);
        Ok::<(), KernelFault>(())
    });
    let mut device = Device::new(shim, DeviceConfig::default());
    let weights = device.command(S0).unwrap().create(&[1u8; 64]).unwrap();

    // The next upload's work fails while it runs (a DMA descriptor that fails).
    let uploads = probe.stats().calls(ShimOp::CopyHostToDevice);
    probe.inject(Injection::nth(ShimOp::CopyHostToDevice, uploads + 1).while_running());
    let mut cmd = device.command(S0).unwrap();
    let x = cmd.empty(64).unwrap();
    cmd.write_from(&x, &[2u8; 64])
        .expect("the upload is accepted");
    let y = cmd.empty(64).unwrap();
    cmd.launch(Launch {
        kernel: &kernel,
        dims: LaunchDims::linear(1, 1),
        inputs: &[&x],
        outputs: &[&y],
        params: &[KernelParam::Buffer(1), KernelParam::Buffer(0)],
    })
    .expect("the launch is accepted");
    let read = cmd.read_async(&[ReadRequest::whole(&y)]).unwrap();
    // Lazy: nothing ran yet, no fence passed, nothing was released.
    let released = device.drop_stats()[0].1.items_released;
    let err = read.wait().unwrap_err();
    assert!(
        matches!(
            &err,
            ServerError::StreamFaulted { stream: 0, cause, kernel: Some("layer") }
                if cause.fault == Fault::WorkFailed
        ),
        "{err:?}"
    );
    assert_eq!(
        device.drop_stats()[0].1.items_released,
        released,
        "a read's fence releases nothing of the drop queue"
    );
    for h in [&x, &weights] {
        let refused = device
            .command(S0)
            .unwrap()
            .read_async(&[ReadRequest::whole(h)]);
        assert!(
            matches!(refused, Err(ServerError::StreamFaulted { stream: 0, .. })),
            "{refused:?}"
        );
    }
    let mut other = device.command(S1).unwrap();
    let z = other.create(&[7u8; 64]).unwrap();
    let back = other
        .read_async(&[ReadRequest::whole(&z)])
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(back[0].as_slice(), &[7u8; 64]);
    for _ in 0..2 {
        let flushed = device.command(S0).unwrap().flush_drops();
        assert!(
            matches!(flushed, Err(ServerError::StreamFaulted { .. })),
            "{flushed:?}"
        );
    }
    assert!(
        device.drop_stats()[0].1.items_released > released,
        "the completed fence after the failure released what it covered"
    );
    drop((weights, x, y, z));
    drop(device);
    assert_eq!(
        probe.stats().device_pages_live,
        0,
        "teardown freed every page"
    );
}
