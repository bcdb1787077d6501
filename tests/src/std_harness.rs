//! The harness of `devcmd-std`: the reference implementation of [`Harness`] and [`Probe`].

use crate::harness::{Counters, FaultRule, Harness, Mode, Probe, SLOW_KERNEL_MS, TestKernel};
use devcmd::{DeviceSpan, LibraryError, ShimOp};
use devcmd_std::{Injection, KernelCtx, KernelFault, Process, StdKernel, StdShim, StdStream};
use std::time::Duration;

/// Runs the suite against [`StdShim`]: every mode, with counters and fault injection.
#[derive(Debug, Clone, Copy, Default)]
pub struct StdHarness;

/// Runs the suite against an integrated [`StdShim`] (`StdShim::builder().integrated(true)`):
/// its pinned host pages are device memory, so every device the suite builds runs **zero copy**
/// (the core's default on integrated devices): uploads are written by the host into mapped
/// pages, reads copy from them. Same kernels and probe as [`StdHarness`].
#[derive(Debug, Clone, Copy, Default)]
pub struct IntegratedStdHarness;

impl Harness for IntegratedStdHarness {
    type S = StdShim;

    fn shim(&self, mode: Mode) -> Option<StdShim> {
        Some(std_shim(mode, true))
    }

    fn beside(&self, first: &StdShim, mode: Mode) -> Option<StdShim> {
        Some(std_shim_in(mode, true, &first.process()))
    }

    fn kernel(&self, shim: &StdShim, kernel: TestKernel) -> StdKernel {
        StdHarness.kernel(shim, kernel)
    }

    fn probe(&self, shim: &StdShim) -> Option<Box<dyn Probe>> {
        StdHarness.probe(shim)
    }

    unsafe fn library_copy(
        &self,
        native: &StdStream,
        src: DeviceSpan,
        dst: DeviceSpan,
    ) -> Option<Result<(), LibraryError>> {
        // SAFETY: the caller's contract is the same.
        unsafe { StdHarness.library_copy(native, src, dst) }
    }
}

/// The suite's byte `value`: the last parameter ([`crate::TestArgs`]).
fn value(ctx: &KernelCtx<'_>) -> Result<u8, KernelFault> {
    let last = ctx
        .param_count()
        .checked_sub(1)
        .ok_or(KernelFault::Failed)?;
    Ok(ctx.scalar_u32(last)? as u8)
}

fn add(ctx: &mut KernelCtx<'_>) -> Result<(), KernelFault> {
    let value = value(ctx)?;
    let mut bufs = ctx.buffers_mut()?;
    let [input, output] = bufs.as_mut_slice() else {
        return Err(KernelFault::Failed);
    };
    for (o, i) in output.iter_mut().zip(input.iter()) {
        *o = i.wrapping_add(value);
    }
    Ok(())
}

/// A std shim in `mode`, integrated (zero copy) or not.
fn std_shim(mode: Mode, integrated: bool) -> StdShim {
    std_shim_in(mode, integrated, &Process::new())
}

/// [`std_shim`], a device of `process`.
fn std_shim_in(mode: Mode, integrated: bool, process: &Process) -> StdShim {
    StdShim::builder()
        .lazy(mode.lazy)
        .poison(mode.poison)
        .integrated(integrated)
        .process(process)
        .build()
}

impl Harness for StdHarness {
    type S = StdShim;

    fn shim(&self, mode: Mode) -> Option<StdShim> {
        Some(std_shim(mode, false))
    }

    fn beside(&self, first: &StdShim, mode: Mode) -> Option<StdShim> {
        Some(std_shim_in(mode, false, &first.process()))
    }

    fn kernel(&self, shim: &StdShim, kernel: TestKernel) -> StdKernel {
        match kernel {
            TestKernel::Fill => shim.register_kernel("fill", |ctx| {
                let value = value(ctx)?;
                ctx.buffers_mut()?.into_iter().for_each(|b| b.fill(value));
                Ok(())
            }),
            TestKernel::AddByte => shim.register_kernel("add", add),
            TestKernel::SlowAdd => shim.register_kernel("slow_add", |ctx| {
                std::thread::sleep(Duration::from_millis(SLOW_KERNEL_MS));
                add(ctx)
            }),
            TestKernel::WriteThenFail => shim.register_kernel("write_then_fail", |ctx| {
                let value = value(ctx)?;
                ctx.buffers_mut()?.into_iter().for_each(|b| b.fill(value));
                Err(KernelFault::Failed)
            }),
        }
    }

    fn probe(&self, shim: &StdShim) -> Option<Box<dyn Probe>> {
        Some(Box::new(StdProbe(shim.clone())))
    }

    unsafe fn library_copy(
        &self,
        native: &StdStream,
        src: DeviceSpan,
        dst: DeviceSpan,
    ) -> Option<Result<(), LibraryError>> {
        if src.len != dst.len {
            return Some(Err(LibraryError::new(
                1,
                format!("copy of {} bytes into {}: lengths differ", src.len, dst.len),
            )));
        }
        let (from, to, len) = (src.addr.0 as usize, dst.addr.0 as usize, src.len as usize);
        native.enqueue_host(move || {
            // SAFETY: a std device address is the host address of its bytes; the caller keeps
            // both ranges alive until the stream passed this work, which runs in stream order.
            unsafe {
                std::ptr::copy(
                    std::ptr::with_exposed_provenance::<u8>(from),
                    std::ptr::with_exposed_provenance_mut::<u8>(to),
                    len,
                )
            };
            Ok(())
        });
        Some(Ok(()))
    }
}

/// [`Probe`] over a clone of a [`StdShim`] (clones share the device, so it outlives the
/// [`devcmd::Device`] that owns the original).
#[derive(Debug, Clone)]
pub struct StdProbe(pub StdShim);

impl Probe for StdProbe {
    fn counters(&self) -> Counters {
        let s = self.0.stats();
        Counters {
            event_records: s.calls(ShimOp::EventRecord),
            event_waits: s.calls(ShimOp::EventWait),
            event_queries: s.calls(ShimOp::EventQuery),
            device_pages_live: s.device_pages_live,
            device_bytes_live: s.device_bytes_live,
            host_pages_live: s.host_pages_live,
            vm_reserved_live: s.vm_reserved_live,
        }
    }

    fn inject(&self, rule: FaultRule) {
        let calls = |op| self.0.stats().calls(op);
        let injection = match rule {
            FaultRule::Once { op, skip } => Injection::nth(op, calls(op) + skip + 1),
            FaultRule::Always { op } => Injection::after(op, calls(op)),
            FaultRule::LoseDevice { op } => Injection::nth(op, calls(op) + 1).losing_device(),
            FaultRule::WorkFails { op, skip } => {
                Injection::nth(op, calls(op) + skip + 1).while_running()
            }
        };
        self.0.inject(injection);
    }

    fn clear(&self) {
        self.0.clear_injections();
    }
}
