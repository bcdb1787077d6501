//! The serving loop with graphs (`edge-host --graph`): one batch's work recorded into a few
//! graphs ([`GRAPHS`]: one more than batches in flight), then, per batch, the input written into
//! a graph's input buffer and the graph replayed; results are read back and checked as in
//! [`crate::serve`].
//!
//! Owns the recording of the batch graphs (room held ahead with `Command::hold`, the six
//! reservations made inside the recording, exactly as the eager loop makes them) and the loop
//! that replays them. Does not own the model, the launches ([`serve::enqueue_layers`]) nor the
//! check of results.

use crate::model::{INPUT, Inputs, Kernels, put_floats};
use crate::serve::{
    self, COMPUTE, COPY, DeviceWeights, IN_FLIGHT, Pending, Plan, Served, enqueue_layers,
    layer_buffers,
};
use devcmd::{Device, Graph, Handle, ReadRequest, Shim, StreamId};
use std::collections::VecDeque;
use std::error::Error;
use std::time::Instant;

/// One batch's graph: its input buffer, its output buffer, the graph.
#[derive(Debug)]
pub struct BatchGraph<S: Shim> {
    /// The stream that owns the input buffer and writes each batch's input into it.
    pub upload: StreamId,
    /// Where a batch's input is written before a replay.
    pub input: Handle,
    /// Where a replay leaves the class probabilities.
    pub output: Handle,
    /// The six launches of a batch, recorded on the compute stream.
    pub graph: Graph<S>,
}

/// Records `count` batch graphs for batches of `m` requests: for each, an input buffer on the
/// `upload` stream ([`COPY`], overlapping uploads with compute at the price of a cross-stream
/// wait each way per batch, or [`COMPUTE`], in order with the replays and waiting for nothing),
/// room held on the compute stream for the six outputs, then the six launches recorded with
/// their reservations inside the recording (the graph keeps the intermediates).
///
/// # Errors
///
/// The device's refusal to reserve, record or seal.
pub fn record<S: Shim>(
    device: &mut Device<S>,
    k: &Kernels<S::Kernel>,
    w: &DeviceWeights,
    m: usize,
    count: usize,
    upload: StreamId,
) -> Result<Vec<BatchGraph<S>>, Box<dyn Error>> {
    let mut graphs = Vec::with_capacity(count);
    for _ in 0..count {
        let input = device.command(upload)?.empty((m * INPUT * 4) as u64)?;
        let mut cmd = device.command(COMPUTE)?;
        // A sealed graph guards its pages: each recording holds room of its own.
        cmd.hold(&layer_buffers(m))?;
        let recording = cmd.begin_capture("mlp_batch")?;
        let output = enqueue_layers(&mut cmd, k, w, m, input.clone(), |cmd, bytes| {
            cmd.empty(bytes)
        })?;
        let graph = cmd.end_capture(recording)?;
        graphs.push(BatchGraph {
            upload,
            input,
            output,
            graph,
        });
    }
    Ok(graphs)
}

/// Serves `plan` with graphs recorded by [`record`], used in turn: each batch writes
/// its input into the next graph's input buffer on the graph's upload stream (staged through
/// pinned memory), replays that graph on the compute stream (ordered after the write on the
/// device), and reads the output back. The same inputs as [`serve::serve`], the same checks.
///
/// # Errors
///
/// The first error of the device, or a reference nothing can be verified against.
pub fn serve_graphs<S: Shim>(
    plan: &Plan,
    device: &mut Device<S>,
    graphs: &[BatchGraph<S>],
    w: &DeviceWeights,
) -> Result<Served, Box<dyn Error>> {
    let m = plan.batch_size;
    if graphs.is_empty() {
        return Err("no graph was recorded".into());
    }
    let progress = serve::progress_bar(plan);
    let mut inputs = Inputs::new(plan.seed, m);
    let mut in_flight: VecDeque<Pending<S>> = VecDeque::new();
    let mut mismatches = 0usize;
    let started = Instant::now();
    for batch in 0..plan.batches {
        let g = &graphs[batch % graphs.len()];
        let input = inputs.next_batch();
        let mut cmd = device.command(g.upload)?;
        let mut staged = cmd.reserve_host(m * INPUT * 4, true)?;
        put_floats(staged.as_mut_slice(), &input);
        cmd.write(&g.input, staged)?;
        let mut cmd = device.command(COMPUTE)?;
        cmd.replay(&g.graph)?;
        let read = cmd.read_async(&[ReadRequest::whole(&g.output)])?;
        in_flight.push_back(Pending { batch, input, read });
        if in_flight.len() >= IN_FLIGHT {
            let p = in_flight.pop_front().expect("non-empty");
            mismatches += serve::check(p, plan.verify, &w.reference, m)?;
        }
        if let Some(bar) = &progress {
            bar.inc(1);
        }
    }
    while let Some(p) = in_flight.pop_front() {
        mismatches += serve::check(p, plan.verify, &w.reference, m)?;
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

/// Graphs [`serve()`] records: one more than batches in flight. A batch's read is fenced in the
/// same command as its replay, and a fence the loop waited for vouches only for the commands
/// before the one that recorded it (`FaultLedger::answer`). When batch `b` writes its input,
/// the loop has waited for the read of batch `b - 4` (it keeps [`IN_FLIGHT`] reads out), which
/// vouches for the replays up to batch `b - 5`. With 5 graphs, the graph `b` writes was last
/// replayed for batch `b - 5`: that work is known done, and the copy stream's write waits for
/// nothing. With 4 it was replayed for batch `b - 4`, not vouched for, and the core orders the
/// write after everything the compute stream was given so far (a cross-stream wait is an event
/// recorded at that stream's tail), which puts every upload behind the replays before it: on the
/// H200 that cost 59.7 µs a batch at 32 requests against the eager loop's 55.2, and the spare
/// graph brought it to 51.4 (BENCHMARKS.md, `graph-bench`).
pub const GRAPHS: usize = IN_FLIGHT + 1;

/// [`record`]s [`GRAPHS`] graphs, inputs written on the copy stream (overlapping the replays),
/// then [`serve_graphs`].
///
/// # Errors
///
/// As both.
pub fn serve<S: Shim>(
    plan: &Plan,
    device: &mut Device<S>,
    k: &Kernels<S::Kernel>,
    w: &DeviceWeights,
) -> Result<Served, Box<dyn Error>> {
    let graphs = record(device, k, w, plan.batch_size, GRAPHS, COPY)?;
    serve_graphs(plan, device, &graphs, w)
}
