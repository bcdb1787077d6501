//! Regression tests for defects a second review of the fault ledger found (issue 7): teardown
//! after an unrecorded fence, a lost device reported while work still runs, and polling a batch
//! whose fence could not be recorded.
//!
//! They run on the std shim; the first and third in lazy + poison mode, so work that runs too
//! late or memory released too early shows up deterministically.

mod common;
use common::*;

use devcmd::{Device, DeviceConfig, ServerError, ShimOp};
use devcmd_std::{Injection, POISON_BYTE, StdShim};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Teardown frees pages only when every fence of the final sync completed: failed work met on
/// the way does not hide a final fence that could not be recorded (an unknown wait outranks
/// failed work in `FenceOutcome::and`).
#[test]
fn teardown_keeps_pages_when_failed_work_precedes_an_unrecorded_final_fence() {
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
    launch(&mut device, S0, &fail, &[], &[&out]).unwrap();
    // An upload staged, then flushed: a drop-queue fence recorded after the failed kernel and
    // not waited yet (nobody has heard of the failure).
    let staged = device.command(S0).unwrap().create(&[5; 64]).unwrap();
    device.command(S0).unwrap().flush_drops().unwrap();
    // Work after that fence: only the final sync of teardown covers it.
    let out2 = device.command(S0).unwrap().empty(64).unwrap();
    launch(&mut device, S0, &late, &[&input], &[&out2]).unwrap();
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

/// The std shim answers an injected device loss only once no worker runs an operation, as the
/// contract asks of every `DeviceLost` answer (the core then frees everything).
#[test]
fn std_shim_answers_an_injected_device_loss_only_once_no_kernel_runs() {
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
    launch(&mut device, S1, &slow, &[], &[&y]).unwrap();
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
    let e = launch(&mut device, S0, &slow, &[], &[&z]);
    let kernel_done = done.load(Ordering::SeqCst);
    assert!(e.as_ref().is_err_and(ServerError::is_device_lost), "{e:?}");
    assert!(
        kernel_done,
        "the shim answered DeviceLost while a kernel of another stream still ran (it writes its \
         output after this answer)"
    );
}

/// `poll_drops` settles a batch whose fence could not be recorded: the poll records the fence it
/// lacks, so a host loop polling until the queue is empty ends.
#[test]
fn poll_drops_settles_a_batch_whose_fence_could_not_be_recorded() {
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
    // Polled as a host loop would, with a pause between polls: the stream's worker needs time to
    // run; ten seconds is far more than it takes on a loaded machine.
    let settled = (0..10_000).any(|_| {
        let done = device.command(S0).unwrap().poll_drops().unwrap();
        if !done {
            std::thread::sleep(Duration::from_millis(1));
        }
        done
    });
    assert!(
        settled,
        "poll_drops did not settle a batch whose fence could not be recorded (10 s of polls, a \
         healthy device)"
    );
}
