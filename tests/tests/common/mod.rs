//! Helpers shared by the std-shim regression tests (`*_regressions_std.rs`): a lazy + poison
//! device, a few kernels, a launch and a read. Each test file uses some of them.
#![allow(dead_code)]

use devcmd::{
    Device, DeviceConfig, Handle, Launch, LaunchDims, ReadRequest, ServerError, Shim, StreamId,
};
use devcmd_std::{KernelFault, StdKernel, StdShim};

pub const S0: StreamId = StreamId(0);
pub const S1: StreamId = StreamId(1);

/// A std shim in lazy + poison mode (a stream runs nothing until one of its fences is waited on,
/// freed memory is poisoned), so work that runs too late or memory released too early shows up
/// deterministically, and a device over it.
pub fn lazy_device() -> (StdShim, Device<StdShim>) {
    let shim = StdShim::builder().lazy(true).poison(true).build();
    let device = Device::new(shim.clone(), DeviceConfig::default());
    (shim, device)
}

/// Copies buffer 0 into buffer 1.
pub fn copy_kernel(shim: &StdShim) -> StdKernel {
    shim.register_kernel("copy", |ctx| {
        let src = ctx.buffer(0)?.to_vec();
        ctx.buffers_mut()?[1].copy_from_slice(&src);
        Ok(())
    })
}

/// Fails while it runs, touching nothing.
pub fn failing_kernel(shim: &StdShim) -> StdKernel {
    shim.register_kernel("fail", |_ctx| Err(KernelFault::Failed))
}

/// Launches `kernel` over one block of one thread with no parameters.
pub fn launch<S: Shim>(
    device: &mut Device<S>,
    stream: StreamId,
    kernel: &S::Kernel,
    inputs: &[&Handle],
    outputs: &[&Handle],
) -> Result<(), ServerError> {
    device.command(stream)?.launch(Launch {
        kernel,
        dims: LaunchDims::SINGLE,
        inputs,
        outputs,
        params: &[],
    })
}

/// Reads the whole view of `h` on `stream`, waiting for it.
pub fn read<S: Shim>(
    device: &mut Device<S>,
    stream: StreamId,
    h: &Handle,
) -> Result<Vec<u8>, ServerError> {
    let mut bytes = device
        .command(stream)?
        .read_async(&[ReadRequest::whole(h)])?
        .wait()?;
    Ok(bytes.pop().expect("one request").into_vec())
}
