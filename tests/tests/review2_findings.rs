//! Findings of the second review of issue 7 (the fault ledger's latest fixes). Each test fails
//! today and names what is wrong; none changes core code.
//!
//! They run on the std shim; the first and third in lazy + poison mode, so work that runs too
//! late or memory released too early shows up deterministically.

use devcmd::{Device, DeviceConfig, Grid, Handle, Launch, ServerError, Shim, ShimOp, StreamId};
use devcmd_std::{Injection, KernelFault, POISON_BYTE, StdKernel, StdShim};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const S0: StreamId = StreamId(0);
const S1: StreamId = StreamId(1);

fn lazy_device() -> (StdShim, Device<StdShim>) {
    let shim = StdShim::builder().lazy(true).poison(true).build();
    let device = Device::new(shim.clone(), DeviceConfig::default());
    (shim, device)
}

fn failing_kernel(shim: &StdShim) -> StdKernel {
    shim.register_kernel("fail", |_ctx| Err(KernelFault::Failed))
}

fn launch<S: Shim<Args = [u8]>>(
    device: &mut Device<S>,
    stream: StreamId,
    kernel: &S::Kernel,
    name: &'static str,
    inputs: &[&Handle],
    outputs: &[&Handle],
) -> Result<(), ServerError> {
    device.command(stream)?.launch(Launch {
        kernel,
        name,
        grid: Grid::linear(1),
        inputs,
        outputs,
        args: &[][..],
    })
}

/// WRONG (core/src/stream.rs `Stream::sync`, core/src/device.rs `Drop for Device`,
/// core/src/fault.rs `FenceOutcome::and`): at teardown a stream's drain meets a fence that
/// passed over failed work (an old drop-queue fence, recorded after a kernel that failed), then
/// the final sync's fence cannot be recorded (an unknown outcome: it covers nothing). `and` ranks
/// failed work above the unknown wait, so `Stream::sync` answers `PassedOverFailedWork`, which
/// `completed()`; teardown then counts the stream as done and frees every page, while a launch
/// enqueued after the old fence has not run. Here the late kernel reads its input after
/// teardown freed it (poison bytes); on a real device it reads or writes freed memory.
///
/// Fix: decide release on "every fence completed", not on the graver outcome: e.g. `Fenced`
/// keeps `completed = a.completed() && b.completed()` beside the reported outcome, or
/// `Stream::sync` returns the final sync's outcome when it is `Unknown` (the failed work is
/// already in the ledger by then).
#[test]
fn teardown_frees_pages_under_work_when_failed_work_masks_an_unrecorded_final_fence() {
    let (shim, mut device) = lazy_device();
    let fail = failing_kernel(&shim);
    let ran = Arc::new(AtomicBool::new(false));
    let saw_poison = Arc::new(AtomicBool::new(false));
    let (r, p) = (Arc::clone(&ran), Arc::clone(&saw_poison));
    let late = shim.register_kernel("late", move |ctx| {
        r.store(true, Ordering::SeqCst);
        if ctx.buffer(0)?.contains(&POISON_BYTE) {
            p.store(true, Ordering::SeqCst);
        }
        Ok(())
    });
    let input = device.command(S0).unwrap().create(&[7; 4096]).unwrap();
    device.command(S0).unwrap().sync().unwrap().wait().unwrap();
    let out = device.command(S0).unwrap().empty(64).unwrap();
    launch(&mut device, S0, &fail, "fail", &[], &[&out]).unwrap();
    // An upload staged, then flushed: a drop-queue fence recorded after the failed kernel and
    // not waited yet (nobody has heard of the failure).
    let staged = device.command(S0).unwrap().create(&[5; 64]).unwrap();
    device.command(S0).unwrap().flush_drops().unwrap();
    // Work after that fence: only the final sync of teardown covers it.
    let out2 = device.command(S0).unwrap().empty(64).unwrap();
    launch(&mut device, S0, &late, "late", &[&input], &[&out2]).unwrap();
    // Teardown's own fence cannot be recorded (a refusal, not a lost device).
    let armed = Arc::new(AtomicBool::new(false));
    let arm = Arc::clone(&armed);
    shim.inject(Injection::when(move |op, _| {
        op == ShimOp::EventRecord && arm.load(Ordering::SeqCst)
    }));
    armed.store(true, Ordering::SeqCst);
    // Dropping the device drops its streams last, which runs the late kernel (lazy mode).
    drop(device);
    drop((input, out, out2, staged));
    assert!(ran.load(Ordering::SeqCst), "the late kernel ran");
    assert!(
        !saw_poison.load(Ordering::SeqCst),
        "teardown freed the late kernel's input before it ran: the final fence was never \
         recorded (unknown), but failed work at an earlier fence outranked it and the stream \
         was counted as done"
    );
}

/// WRONG (shim-std/src/device.rs `StdShim::enter`, `Effect::LoseDevice`): an injected
/// device-losing failure answers `DeviceLost` at once, while another stream's worker still runs
/// an operation. The shim contract (core/src/shim.rs) says a call answers `DeviceLost` only once
/// no work can touch memory, because the core then frees every page and host buffer at once
/// (e.g. a `ReadFuture` whose `event_wait` is the injected call drops its host buffers while the
/// copy into them may still run). `lost_error` waits for `busy == 0`, but this path never calls
/// it. (`Counted` does it right: `finish_queued_work`.) The conformance suite's
/// `FaultRule::LoseDevice` maps to this injection on shim-std.
///
/// Fix: after `lose_locked` in the `LoseDevice` arm, drop the state lock and answer
/// `self.inner.lost_error(op)` (or wait for `busy == 0` before returning the injected error).
#[test]
fn std_shim_answers_an_injected_device_loss_while_a_kernel_still_runs() {
    let shim = StdShim::builder().build();
    let mut device = Device::new(shim.clone(), DeviceConfig::default());
    let started = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicBool::new(false));
    let (s, d) = (Arc::clone(&started), Arc::clone(&done));
    let slow = shim.register_kernel("slow", move |ctx| {
        s.store(true, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(500));
        ctx.buffers_mut()?[0].fill(3);
        d.store(true, Ordering::SeqCst);
        Ok(())
    });
    let y = device.command(S1).unwrap().empty(64).unwrap();
    launch(&mut device, S1, &slow, "slow", &[], &[&y]).unwrap();
    let t = Instant::now();
    while !started.load(Ordering::SeqCst) {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the slow kernel never started"
        );
        std::thread::yield_now();
    }
    let z = device.command(S0).unwrap().empty(64).unwrap();
    shim.inject(
        Injection::nth(ShimOp::Launch, shim.stats().calls(ShimOp::Launch) + 1).losing_device(),
    );
    let e = launch(&mut device, S0, &slow, "slow", &[], &[&z]);
    let kernel_done = done.load(Ordering::SeqCst);
    assert!(e.as_ref().is_err_and(ServerError::is_device_lost), "{e:?}");
    assert!(
        kernel_done,
        "the shim answered DeviceLost while a kernel of another stream still ran (it writes its \
         output after this answer)"
    );
}

/// WRONG (core/src/drop_queue.rs `DropQueue::poll`): when a flush could not record its fence,
/// the batch stays pending with no fence, and `poll` answers "not yet" forever: nothing ever
/// records the fence it lacks. `poll_drops` is documented to answer `Ok(true)` once nothing is
/// pending (guide/host_loop.md), so a host loop polling until the queue empties never ends
/// (issue 7 asked that such a loop end), although the device is healthy.
///
/// Fix: `poll` records a fence (non-blocking) when pending items have none, and reports a
/// refusal as the flush does.
#[test]
fn poll_drops_never_settles_a_batch_whose_fence_could_not_be_recorded() {
    let (shim, mut device) = lazy_device();
    let _a = device.command(S0).unwrap().create(&[1; 64]).unwrap();
    shim.inject(Injection::nth(
        ShimOp::EventRecord,
        shim.stats().calls(ShimOp::EventRecord) + 1,
    ));
    let refused = device.command(S0).unwrap().flush_drops();
    assert!(
        refused.is_err(),
        "the fence's record was refused: {refused:?}"
    );
    shim.clear_injections();
    let settled = (0..1000).any(|_| device.command(S0).unwrap().poll_drops().unwrap());
    assert!(
        settled,
        "poll_drops never settles a batch whose fence could not be recorded (1000 polls, a \
         healthy device)"
    );
}
