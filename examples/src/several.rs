//! The edge host on several devices (`--devices N`): the weights uploaded once, to the first
//! device, then copied device to device to each other one ([`devcmd::Command::copy_from`]: peer
//! to peer where the shims allow it, through host memory otherwise); batches dealt round-robin
//! across the devices, each device running the same loop as on one ([`crate::serve`]) with its
//! own streams, memory and weights; every result checked against the host reference.
//!
//! Owns the weights' copy and the dealing of batches. Does not own a batch's work
//! ([`crate::serve`]) nor a device's set-up ([`crate::std_device`], [`crate::cuda_device`]).

use crate::model::{Inputs, Kernels};
use crate::serve::{
    COMPUTE, COPY, DeviceWeights, IN_FLIGHT, Pending, Plan, Served, check, enqueue_batch,
    progress_bar,
};
use devcmd::memory::AllocationMode;
use devcmd::{CopyPath, Device, HostReport, Shim};
use std::collections::VecDeque;
use std::error::Error;
use std::time::Instant;

/// A copy of `w` (on `from`) on `to`, in `to`'s persistent pool, copied device to device on both
/// devices' compute streams. Returns it with the path the copy took.
///
/// # Errors
///
/// Either device's refusal to reserve or copy.
pub fn copy_weights<S: Shim>(
    to: &mut Device<S>,
    from: &mut Device<S>,
    w: &DeviceWeights,
) -> Result<(DeviceWeights, CopyPath), Box<dyn Error>> {
    let mut source = from.command(COMPUTE)?;
    let mut cmd = to.command(COMPUTE)?;
    cmd.allocation_mode(AllocationMode::Persistent);
    let all = cmd.empty(w.all.len())?;
    cmd.allocation_mode(AllocationMode::Auto);
    let path = cmd.copy_from(&all, &mut source, &w.all)?;
    // Waited for, so the time the host prints is the copy's on either path (a peer copy only
    // enqueues).
    cmd.sync()?.wait()?;
    let mut tensors = Vec::with_capacity(w.tensors.len());
    for t in &w.tensors {
        tensors.push(all.view(t.offset() - w.all.offset(), t.len())?);
    }
    let copy = DeviceWeights {
        all,
        tensors,
        reference: w.reference.clone(),
        // How the weights reached the first device; the copy's own path is returned.
        path: w.path.clone(),
        bytes: w.bytes,
    };
    Ok((copy, path))
}

/// Serves `plan` across `devices`, batch `b` on device `b % devices.len()`, each with its
/// kernels and weights (same index). At most [`IN_FLIGHT`] reads per device are in flight before
/// the oldest of that device is awaited.
///
/// # Errors
///
/// The first error of any device, or a reference nothing can be verified against.
pub fn serve_across<S: Shim>(
    plan: &Plan,
    devices: &mut [Device<S>],
    kernels: &[&Kernels<S::Kernel>],
    weights: &[DeviceWeights],
) -> Result<Served, Box<dyn Error>> {
    let n = devices.len();
    assert!(
        n > 0 && kernels.len() == n && weights.len() == n,
        "serve_across: one kernel set and one weights copy per device"
    );
    let m = plan.batch_size;
    let progress = progress_bar(plan);
    let mut inputs = Inputs::new(plan.seed, m);
    let mut in_flight: Vec<VecDeque<Pending<S>>> = (0..n).map(|_| VecDeque::new()).collect();
    let mut mismatches = 0usize;
    let started = Instant::now();
    for batch in 0..plan.batches {
        let d = batch % n;
        let input = inputs.next_batch();
        let read = enqueue_batch(&mut devices[d], kernels[d], &weights[d], m, &input)?;
        in_flight[d].push_back(Pending { batch, input, read });
        if in_flight[d].len() >= IN_FLIGHT {
            let p = in_flight[d].pop_front().expect("non-empty");
            mismatches += check(p, plan.verify, &weights[d].reference, m)?;
        }
        if let Some(bar) = &progress {
            bar.inc(1);
        }
    }
    for (d, queue) in in_flight.iter_mut().enumerate() {
        while let Some(p) = queue.pop_front() {
            mismatches += check(p, plan.verify, &weights[d].reference, m)?;
        }
    }
    let elapsed = started.elapsed();
    if let Some(bar) = progress {
        bar.finish_and_clear();
    }
    Ok(Served {
        requests: plan.batches as u128 * m as u128,
        elapsed,
        mismatches,
    })
}

/// Prints the memory report across `devices` (after two flushes per stream, so everything
/// pushed so far is released).
///
/// # Errors
///
/// A flush's failure.
pub fn report<S: Shim>(devices: &mut [Device<S>]) -> Result<(), Box<dyn Error>> {
    for _ in 0..2 {
        for device in devices.iter_mut() {
            for s in [COMPUTE, COPY] {
                device.command(s)?.flush_drops()?;
            }
        }
    }
    println!("\nmemory report:\n{}", HostReport::of(devices.iter_mut()));
    Ok(())
}
