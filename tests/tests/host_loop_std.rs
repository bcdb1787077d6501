//! The guide's host loop (`devcmd::guide`, section 1) run as a steady loop on the std shim: many
//! batches under a tight memory budget, released by polling alone.
//!
//! The loop is the guide's: weights uploaded once in the persistent window, per batch an input
//! uploaded on the copy stream through a pinned staging buffer, a kernel on the compute stream,
//! an asynchronous read, and `poll_drops` on both streams between batches. Nothing in it flushes
//! or cleans up: what it frees, it frees because a poll recorded a fence and a later poll found
//! it passed.

use devcmd::memory::ReadableBytes;
use devcmd::{Device, DeviceConfig, KernelParam, Launch, LaunchDims, ReadRequest, StreamId};
use devcmd_std::StdShim;
use std::collections::VecDeque;

const COMPUTE: StreamId = StreamId(0);
const COPY: StreamId = StreamId(1);
const MIB: u64 = 1 << 20;
/// 3 MiB of f32 per input, output and weights.
const N: usize = (3 << 20) / 4;
const BATCHES: usize = 48;

/// Held device memory stays near what is live. At a batch's poll, live is the weights, the batch
/// just enqueued (input and output) and the batch before it, whose output its read holds and
/// whose input the compute stream's work held until then: 3 + 4 × 3 = 15 MiB, and the loop
/// holds exactly that on the std shim. A poll may find the fence of the batch before not passed
/// yet (the host can look between the read's fence and the poll's); the next poll finds it
/// passed, because the read waited in between comes later on the same stream. So at most one
/// more input (3 MiB, 4 MiB in 2 MiB granules) is held: the bound is 20 MiB under a 24 MiB
/// budget, and no fence may have been waited on (a flush by the drop policy, or the reclaim a
/// reservation that met the budget runs, would hide a loop that holds too much).
#[test]
fn the_guides_loop_holds_near_live_memory_by_polling_alone() {
    let shim = StdShim::new();
    let scale = shim.register_kernel("scale_add", |ctx| {
        let bias = ctx.scalar_f32(3)?;
        let ([w, x], [out]) = ctx.io::<f32, 2, 1>()?;
        for ((o, w), x) in out.iter_mut().zip(w).zip(x) {
            *o = w * x + bias;
        }
        Ok(())
    });
    let config = DeviceConfig {
        memory_budget: Some(24 * MIB),
        ..DeviceConfig::default()
    };
    let mut device = Device::new(shim, config);

    let w_host: Vec<f32> = (0..N).map(|i| (i % 7) as f32).collect();
    let weights = device
        .command(COMPUTE)
        .unwrap()
        .persistent(|c| c.create_typed(&w_host))
        .unwrap();

    let bias = 0.5f32;
    let mut in_flight = VecDeque::new();
    let mut peak = 0;
    for batch in 0..BATCHES {
        let x_host: Vec<f32> = (0..N).map(|i| ((i + batch) % 5) as f32).collect();
        let x = {
            let mut cmd = device.command(COPY).unwrap();
            let x = cmd.empty((N * 4) as u64).unwrap();
            let mut staged = cmd.reserve_host(N * 4, true).unwrap();
            staged.copy_from(&x_host).unwrap();
            cmd.write(&x, staged).unwrap();
            x
        };
        let mut cmd = device.command(COMPUTE).unwrap();
        let out = cmd.empty((N * 4) as u64).unwrap();
        cmd.launch(Launch {
            kernel: &scale,
            dims: LaunchDims::covering(N as u64, 256),
            inputs: &[&weights, &x],
            outputs: &[&out],
            params: &[
                KernelParam::Buffer(0),
                KernelParam::Buffer(1),
                KernelParam::Buffer(2),
                KernelParam::Scalar(&bias.to_ne_bytes()),
            ],
        })
        .unwrap();
        let read = cmd.read_async(&[ReadRequest::whole(&out)]).unwrap();
        in_flight.push_back((x_host, read));
        // A steady loop consumes its results: one batch stays in flight.
        if in_flight.len() > 1 {
            let (x_host, read) = in_flight.pop_front().unwrap();
            check(&read.wait().unwrap()[0], &w_host, &x_host, bias);
        }
        for stream in [COPY, COMPUTE] {
            device.command(stream).unwrap().poll_drops().unwrap();
        }
        let report = device.memory_report();
        // The report adds up: held is what the pools hold plus what awaits a fence.
        assert_eq!(
            report.in_pools() + report.awaiting_fence().pages,
            report.held,
            "batch {batch}:\n{report}"
        );
        peak = peak.max(report.held);
    }
    for (x_host, read) in in_flight {
        check(&read.wait().unwrap()[0], &w_host, &x_host, bias);
    }
    // Polling until every queue is empty ends, with everything back but the weights' page.
    let settled = (0..10_000).any(|_| {
        let copy = device.command(COPY).unwrap().poll_drops().unwrap();
        let compute = device.command(COMPUTE).unwrap().poll_drops().unwrap();
        if !(copy && compute) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        copy && compute
    });
    assert!(settled, "10 s of polls did not empty the drop queues");
    let awaiting = device.memory_report().awaiting_fence();
    assert_eq!(
        awaiting,
        devcmd::Awaiting::default(),
        "the queues say empty"
    );
    let stats = device.drop_stats();
    let flushes_by_policy: u64 = stats.iter().map(|(_, s)| s.fences_waited).sum();
    let report = device.memory_report();
    assert!(
        peak <= 20 * MIB,
        "the guide's loop held {} of device pages at its peak over {BATCHES} batches of 3 MiB \
         inputs (bound 20 MiB under a 24 MiB budget); the report at the end:\n{report}",
        ReadableBytes(peak)
    );
    assert_eq!(
        flushes_by_policy, 0,
        "a fence was waited on (a flush by the drop policy or a reclaim): polling alone should \
         have released the loop's memory; {stats:?}"
    );
}

fn check(got: &devcmd::HostBuffer, w: &[f32], x: &[f32], bias: f32) {
    let got: Vec<f32> = got.to_vec_of().unwrap();
    assert_eq!(got.len(), w.len());
    for (i, y) in got.iter().enumerate() {
        assert_eq!(*y, w[i] * x[i] + bias, "element {i}");
    }
}
