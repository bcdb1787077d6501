//! Benchmark of capture on an NVIDIA GPU, printed as markdown tables:
//!
//! - replay: a graph of 1, 10, 100 and 1000 tiny kernels recorded through devcmd
//!   (`Command::begin_capture` … `end_capture`), replayed through `Command::replay` against
//!   `cuGraphLaunch` of the very same executable graph (`Graph::shim_graph`), each round a batch
//!   of back-to-back replays then a synchronisation; per replay, enqueue plus run, and the
//!   enqueue alone;
//! - the edge host: requests/s of the eager loop ([`devcmd_examples::serve`]) against the loop
//!   with graphs ([`devcmd_examples::replay`], graphs recorded once outside the timed runs), at
//!   32 and 256 requests per batch.
//!
//! Timing: host clocks, warm-up rounds first, then the median of rounds with the raw and the
//! layer's rounds interleaved. Run: `cargo run --release -p devcmd-examples --bin graph-bench`
//! (`--quick`: fewer rounds). Without a GPU or driver it prints the shim's error and exits with 3
//! ([`devcmd_examples::exit`]'s codes, which `--help` lists).

use devcmd::{Device, DeviceConfig, KernelParam, Launch, LaunchDims, Shim, StreamId};
use devcmd_cuda::{CudaShim, sys};
use devcmd_examples::cuda_device;
use devcmd_examples::exit;
use devcmd_examples::model::{self, CLASSES, INPUT, LAYERS};
use devcmd_examples::replay;
use devcmd_examples::serve::{self, COMPUTE, COPY, HostWeights, IN_FLIGHT, Plan};
use devcmd_examples::weights::{from_bytes, to_bytes};
use std::error::Error;
use std::process::ExitCode;
use std::time::Instant;

type Res<T> = Result<T, Box<dyn Error>>;

const S: StreamId = StreamId(0);

/// The tiny kernel the replayed graphs chain.
const TINY: &str = r#"
extern "C" __global__ void tiny(float *out, const float *in, unsigned n) {
    unsigned i = threadIdx.x;
    if (i < n) out[i] = in[i] + 1.0f;
}
"#;

/// The seed of the weights both edge-host sections serve.
const SEED: u64 = 7;

/// A fresh device on the GPU with the edge host's seeded weights uploaded.
fn seeded_device(gpu: &cuda_device::Gpu) -> Res<(Device<CudaShim>, serve::DeviceWeights)> {
    let mut device = Device::new(gpu.shim.clone(), DeviceConfig::default());
    let weights = HostWeights::Seeded(model::seeded_weights(SEED));
    let w = serve::load_weights(&mut device, weights, false)?;
    Ok((device, w))
}

/// Where a batch's time goes in the edge host, eager against graphs: each part alone, `BATCHES`
/// batches enqueued back to back on the compute stream and one synchronisation (so µs per batch
/// is the device's throughput for that part, not the host's): the six launches (and seven
/// reservations) of the eager loop, one replay of the graph of the same launches, then each
/// with the batch's input written before it (on the compute stream) and its output read after.
fn edge_parts(gpu: &cuda_device::Gpu, warm: usize, timed: usize) -> Res<()> {
    const BATCHES: usize = 1000;
    println!("## Edge host: where a batch's time goes (µs per batch)\n");
    println!(
        "Each part alone: {BATCHES} batches enqueued back to back on the compute stream, then one \
         synchronisation; median of {timed} rounds after {warm}. Launches: the eager loop's 6 \
         launches and 7 reservations on a fixed input. Replay: one replay of a graph of the same \
         6 launches (graphs used in turn, {IN_FLIGHT} of them). + write: the batch's input \
         written (staged through pinned memory) before, on the compute stream. + read: its output \
         read after (`read_async`, not waited for in the loop).\n"
    );
    println!(
        "| batch size | launches | replay | launches + write | replay + write | launches + write + read | replay + write + read |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for batch_size in [32usize, 256] {
        let (mut device, w) = seeded_device(gpu)?;
        let graphs = replay::record(
            &mut device,
            &gpu.kernels,
            &w,
            batch_size,
            IN_FLIGHT,
            COMPUTE,
        )?;
        let bytes = batch_size * INPUT * 4;
        let x = device.command(COMPUTE)?.create(&vec![0u8; bytes])?;
        let mut times: [Vec<f64>; 6] = Default::default();
        for round in 0..warm.max(1) + timed {
            for (part, t) in times.iter_mut().enumerate() {
                let (graph, write, read) = (part % 2 == 1, part >= 2, part >= 4);
                let started = Instant::now();
                let mut reads = Vec::new();
                for batch in 0..BATCHES {
                    let g = &graphs[batch % graphs.len()];
                    let mut cmd = device.command(COMPUTE)?;
                    let input = if graph { g.input.clone() } else { x.clone() };
                    if write {
                        let staged = cmd.reserve_host(bytes, true)?;
                        cmd.write(&input, staged)?;
                    }
                    let out = if graph {
                        cmd.replay(&g.graph)?;
                        g.output.clone()
                    } else {
                        serve::enqueue_layers(
                            &mut cmd,
                            &gpu.kernels,
                            &w,
                            batch_size,
                            input,
                            |c, b| c.empty(b),
                        )?
                    };
                    if read {
                        reads.push(cmd.read_async(&[devcmd::ReadRequest::whole(&out)])?);
                    }
                }
                device.command(COMPUTE)?.sync()?.wait()?;
                for r in reads {
                    r.wait()?;
                }
                if round >= warm.max(1) {
                    t.push(started.elapsed().as_secs_f64() * 1e6 / BATCHES as f64);
                }
            }
        }
        let m: Vec<String> = times.iter().map(|t| format!("{:.1}", median(t))).collect();
        println!("| {batch_size} | {} |", m.join(" | "));
    }
    println!();
    Ok(())
}

fn cu(call: &'static str, r: sys::CUresult) -> Res<()> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(format!("{call} failed: {r:?}").into())
    }
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The 25th and 75th percentiles, as "p25–p75" (nearest rank), with `digits` decimals.
fn spread(v: &[f64], digits: usize) -> String {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return "—".to_owned();
    }
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    format!("{:.digits$}–{:.digits$}", at(0.25), at(0.75))
}

/// `--help`.
const USAGE: &str = "\
graph-bench: graph replay through devcmd against cuGraphLaunch, and the edge host eager against
graphs, on the first NVIDIA GPU

usage: graph-bench [--quick]
  --quick  fewer rounds";

fn main() -> ExitCode {
    devcmd_examples::exit::quiet_on_closed_output();
    if exit::help_asked(USAGE) {
        return ExitCode::from(exit::OK);
    }
    let quick = std::env::args().any(|a| a == "--quick");
    let shim = match CudaShim::new(0) {
        Ok(s) => s,
        Err(e) => return exit::report("graph-bench", &e),
    };
    match run(shim, quick) {
        Ok(()) => ExitCode::from(exit::OK),
        Err(e) => exit::report("graph-bench", &*e),
    }
}

fn run(shim: CudaShim, quick: bool) -> Res<()> {
    let (warm, timed) = if quick { (1, 5) } else { (2, 15) };
    let gpu = cuda_device::open_on(shim)?;
    println!("# devcmd graphs on {} (graph-bench)\n", gpu.shim.name());
    println!("```\n{}\n```\n", cuda_device::describe(&gpu));
    let replay_ok = replays(&gpu.shim, warm, timed);
    if let Err(e) = &replay_ok {
        println!("\n**replay: failed: {e}**\n");
    }
    let edge_ok = edge_host(&gpu, warm, timed.min(7), quick);
    let parts_ok = edge_parts(&gpu, warm, timed.min(7));
    if let Err(e) = &parts_ok {
        println!("\n**edge host parts: failed: {e}**\n");
    }
    let edge_ok = edge_ok.and(parts_ok);
    if let Err(e) = &edge_ok {
        println!("\n**edge host: failed: {e}**\n");
    }
    replay_ok.and(edge_ok)
}

/// Graph replay through devcmd against `cuGraphLaunch` of the same executable graph.
fn replays(shim: &CudaShim, warm: usize, timed: usize) -> Res<()> {
    let tiny = shim.compile(TINY, &[])?.kernel("tiny")?;
    let raw_stream = shim.create_stream()?;
    println!("## Graph replay: devcmd against cuGraphLaunch of the same graph\n");
    println!(
        "A chain of K launches of a one-block kernel (32 threads) between two 128-byte buffers, \
         recorded once through devcmd. Each round: R replays back to back on one stream, then a \
         synchronisation; per replay = the round's time / R (enqueue and run), enqueue = the \
         enqueue loop alone. Raw: `cuGraphLaunch` of `Graph::shim_graph()` on a stream of its \
         own, then `cuStreamSynchronize`; devcmd: `Device::command(s).replay(&graph)`, then \
         `Command::sync().wait()`; shim: `Shim::graph_launch` alone (binds the context, then \
         `cuGraphLaunch`). Median of {timed} rounds after {warm}, interleaved.\n"
    );
    println!(
        "| kernels | replays a round | raw µs per replay | devcmd µs per replay | ratio | target | raw enqueue µs | shim enqueue µs | devcmd enqueue µs |"
    );
    println!("|---:|---:|---:|---:|---:|---|---:|---:|---:|");
    let mut raw_per = Vec::new();
    let mut worst: f64 = 0.0;
    for kernels in [1usize, 10, 100, 1000] {
        let replays_per_round = (20_000 / kernels).clamp(20, 2000);
        let mut device = Device::new(shim.clone(), DeviceConfig::default());
        let mut cmd = device.command(S)?;
        let a = cmd.create(&to_bytes(&[0.5f32; 32]))?;
        let b = cmd.empty(128)?;
        cmd.sync()?.wait()?;
        let n = 32u32.to_ne_bytes();
        let params = [
            KernelParam::Buffer(1),
            KernelParam::Buffer(0),
            KernelParam::Scalar(&n),
        ];
        let recording = cmd.begin_capture("tiny_chain")?;
        for i in 0..kernels {
            let (from, to) = if i % 2 == 0 { (&a, &b) } else { (&b, &a) };
            cmd.launch(Launch {
                kernel: &tiny,
                dims: LaunchDims::linear(1, 32),
                inputs: &[from],
                outputs: &[to],
                params: &params,
            })?;
        }
        let graph = cmd.end_capture(recording)?;
        let exec = graph.shim_graph().cu_graph_exec();
        let (mut raw, mut ours, mut raw_enq, mut ours_enq, mut shim_enq) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for round in 0..warm + timed {
            // SAFETY: the context is the shim's primary context, retained while it lives.
            cu("cuCtxSetCurrent", unsafe {
                sys::cuCtxSetCurrent(shim.cu_context())
            })?;
            let t = Instant::now();
            for _ in 0..replays_per_round {
                // SAFETY: the graph (and every buffer it touches) lives until after the
                // synchronisation below; the stream is alive.
                cu("cuGraphLaunch", unsafe {
                    sys::cuGraphLaunch(exec, raw_stream.cu_stream())
                })?;
            }
            let enq = t.elapsed();
            // SAFETY: the stream is alive.
            cu("cuStreamSynchronize", unsafe {
                sys::cuStreamSynchronize(raw_stream.cu_stream())
            })?;
            let all = t.elapsed();
            let t3 = Instant::now();
            for _ in 0..replays_per_round {
                // SAFETY: as above.
                unsafe { shim.graph_launch(graph.shim_graph(), &raw_stream)? };
            }
            let enq3 = t3.elapsed();
            // SAFETY: the stream is alive.
            cu("cuStreamSynchronize", unsafe {
                sys::cuStreamSynchronize(raw_stream.cu_stream())
            })?;
            let t2 = Instant::now();
            for _ in 0..replays_per_round {
                device.command(S)?.replay(&graph)?;
            }
            let enq2 = t2.elapsed();
            device.command(S)?.sync()?.wait()?;
            let all2 = t2.elapsed();
            if round >= warm {
                let per = |d: std::time::Duration| d.as_secs_f64() * 1e6 / replays_per_round as f64;
                raw.push(per(all));
                ours.push(per(all2));
                raw_enq.push(per(enq));
                ours_enq.push(per(enq2));
                shim_enq.push(per(enq3));
            }
        }
        let got = device
            .command(S)?
            .read_async(&[devcmd::ReadRequest::whole(&a)])?;
        let got = from_bytes(got.wait()?[0].as_slice());
        // An even chain adds `kernels` to `a` at every replay; an odd one leaves `a` as it was.
        let moved = got[0] > 0.5;
        if moved != (kernels % 2 == 0) {
            return Err(format!("the chain of {kernels} kernels left {} in `a`", got[0]).into());
        }
        let (r, o) = (median(&raw), median(&ours));
        let ratio = o / r;
        worst = worst.max(ratio);
        raw_per.push((kernels, r));
        println!(
            "| {kernels} | {replays_per_round} | {r:.2} ({}) | {o:.2} ({}) | {ratio:.3} | ≤ 1.05: {} | {:.2} | {:.2} | {:.2} |",
            spread(&raw, 2),
            spread(&ours, 2),
            if ratio <= 1.05 { "met" } else { "**missed**" },
            median(&raw_enq),
            median(&shim_enq),
            median(&ours_enq),
        );
    }
    if let (Some(&(k0, r0)), Some(&(k1, r1))) = (raw_per.first(), raw_per.last()) {
        let slope = (r1 - r0) / (k1 - k0) as f64;
        println!(
            "\nRaw replay time fits {:.2} µs + {slope:.3} µs per kernel (from {k0} and {k1} \
             kernels); worst devcmd ratio {worst:.3}.\n",
            r0 - slope * k0 as f64
        );
    }
    Ok(())
}

/// Requests/s of the edge host's eager loop against its loop with graphs.
fn edge_host(gpu: &cuda_device::Gpu, warm: usize, timed: usize, quick: bool) -> Res<()> {
    let batches = if quick { 500 } else { 2000 };
    println!("## Edge host: eager against graphs (requests/s)\n");
    println!(
        "{batches} batches of the 3-layer MLP ({INPUT}-{}-{}-{CLASSES}), {IN_FLIGHT} batches in \
         flight, results not verified in the timed runs (every result of {warm} warm-up runs of \
         64 batches was, in every loop). Eager: the edge host's loop (upload on a copy stream, 7 \
         reservations and 6 launches on a compute stream, `read_owned`). Graphs \
         ({IN_FLIGHT} graphs of the 6 launches recorded once, outside the timed runs; per batch \
         the input written into a graph's input buffer, on the copy stream (a cross-stream wait \
         each way) or on the compute stream (in order with the replays), one replay on the \
         compute stream, `read_async` of its output); and {} graphs with inputs on the copy \
         stream, one more than batches in flight, as `edge-host --graph` runs: the graph a batch \
         writes was last replayed for a batch that a fence the loop waited for vouches for, so \
         no cross-stream wait holds the upload back. Median of {timed} runs, interleaved.\n",
        replay::GRAPHS,
        LAYERS[0].1,
        LAYERS[1].1,
    );
    println!(
        "| batch size | eager requests/s | graphs, inputs on the copy stream | graphs, inputs on the compute stream | graphs, copy stream, one graph spare (`edge-host --graph`) | eager µs per batch | graphs (copy) µs | graphs (compute) µs | graphs (spare) µs | `--graph` / eager |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for batch_size in [32usize, 256] {
        let (mut device, w) = seeded_device(gpu)?;
        let on_copy = replay::record(&mut device, &gpu.kernels, &w, batch_size, IN_FLIGHT, COPY)?;
        let on_compute = replay::record(
            &mut device,
            &gpu.kernels,
            &w,
            batch_size,
            IN_FLIGHT,
            COMPUTE,
        )?;
        let check = Plan {
            batches: 64,
            batch_size,
            seed: SEED,
            verify: true,
            progress: false,
        };
        let run = Plan {
            batches,
            verify: false,
            ..check
        };
        // One graph more than batches in flight, as `edge-host --graph` runs (`replay::GRAPHS`
        // says why the copy stream's write then waits for nothing and overlaps the replays).
        let spare = replay::record(
            &mut device,
            &gpu.kernels,
            &w,
            batch_size,
            replay::GRAPHS,
            COPY,
        )?;
        let (mut eager, mut copy, mut compute) = (Vec::new(), Vec::new(), Vec::new());
        let mut spared = Vec::new();
        let mut mismatches = 0;
        for round in 0..warm.max(1) + timed {
            if round < warm.max(1) {
                mismatches += serve::serve(&check, &mut device, &gpu.kernels, &w)?.mismatches;
                for graphs in [&on_copy, &on_compute, &spare] {
                    mismatches += replay::serve_graphs(&check, &mut device, graphs, &w)?.mismatches;
                }
                continue;
            }
            eager.push(serve::serve(&run, &mut device, &gpu.kernels, &w)?.per_second());
            copy.push(replay::serve_graphs(&run, &mut device, &on_copy, &w)?.per_second());
            compute.push(replay::serve_graphs(&run, &mut device, &on_compute, &w)?.per_second());
            spared.push(replay::serve_graphs(&run, &mut device, &spare, &w)?.per_second());
        }
        if mismatches != 0 {
            return Err(format!("{mismatches} outputs differ from the host reference").into());
        }
        let (e, c, g, p) = (
            median(&eager),
            median(&copy),
            median(&compute),
            median(&spared),
        );
        let per_batch = |rps: f64| batch_size as f64 / rps * 1e6;
        let k = |v: &[f64]| spread(&v.iter().map(|x| x / 1e3).collect::<Vec<_>>(), 1);
        println!(
            "| {batch_size} | {e:.0} ({} k) | {c:.0} ({} k) | {g:.0} ({} k) | {p:.0} ({} k) | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} |",
            k(&eager),
            k(&copy),
            k(&compute),
            k(&spared),
            per_batch(e),
            per_batch(c),
            per_batch(g),
            per_batch(p),
            p / e
        );
    }
    println!();
    Ok(())
}
