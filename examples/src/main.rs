//! The edge-inference host: a small MLP served through devcmd on the std shim.
//!
//! Weights are loaded once in the persistent mode (seeded, or memory-mapped from a file so the
//! file-backed staging path is real). Then each batch is uploaded on a copy stream, run through
//! the layers (matmul, bias + ReLU, bias + softmax kernels) on a compute stream ordered after the
//! upload on the device, and read back asynchronously while the next batches are enqueued.
//! Every result is checked against a reference computed on the host without the layer; any
//! mismatch exits non-zero.
//!
//! This file owns the model (layer shapes, seeded weights and inputs, kernels, reference) and the
//! serving loop. The flags, their defaults and the refusal of bad values live in [`cli`]; the
//! weights file (format, writing, mapping, refusing non-finite values) in [`weights`]; the
//! NaN-safe comparison with the reference in [`verify`].

mod cli;
mod verify;
mod weights;

use cli::{Options, Parsed};
use devcmd::memory::AllocationMode;
use devcmd::{
    Device, DeviceConfig, Handle, HostBuffer, KernelParam, Launch, LaunchDims, ReadFuture,
    ReadRequest, StreamId,
};
use devcmd_std::{KernelCtx, KernelFault, StdKernel, StdShim, as_f32, as_f32_mut};
use std::collections::VecDeque;
use std::process::ExitCode;
use std::time::Instant;
use weights::{MappedTensor, from_bytes, to_bytes};

const INPUT: usize = 256;
const HIDDEN1: usize = 512;
const HIDDEN2: usize = 128;
const CLASSES: usize = 10;
/// Layer shapes: (inputs, outputs).
const LAYERS: [(usize, usize); 3] = [(INPUT, HIDDEN1), (HIDDEN1, HIDDEN2), (HIDDEN2, CLASSES)];
/// Reads kept in flight before the oldest is awaited.
const IN_FLIGHT: usize = 4;

const COMPUTE: StreamId = StreamId(0);
const COPY: StreamId = StreamId(1);

/// SplitMix64: a small seeded generator for weights and inputs.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-scale, scale).
    fn f32(&mut self, scale: f32) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
    }
}

/// The weights as host floats, in file order: W1 b1 W2 b2 W3 b3 (W is inputs × outputs).
fn seeded_weights(seed: u64) -> Vec<Vec<f32>> {
    let mut rng = Rng(seed);
    let mut out = Vec::new();
    for (i, o) in LAYERS {
        let scale = 1.0 / (i as f32).sqrt();
        out.push((0..i * o).map(|_| rng.f32(scale)).collect());
        out.push((0..o).map(|_| rng.f32(0.1)).collect());
    }
    out
}

// ---- kernels: plain Rust over device addresses, with the parameters of CUDA C kernels ----
//
// matmul(float *out, const float *a, const float *b, unsigned m, unsigned k, unsigned n)
// bias_relu(float *out, const float *x, const float *bias, unsigned m, unsigned n)
// bias_softmax(float *out, const float *x, const float *bias, unsigned m, unsigned n)
//
// Every launch passes its two inputs then its output, so the buffer slots are a/x = 0,
// b/bias = 1, out = 2, and the first three parameters are Buffer(2), Buffer(0), Buffer(1).

/// The parameters of a kernel above: the three pointers, then the `unsigned` scalars.
fn params(scalars: &[[u8; 4]]) -> Vec<KernelParam<'_>> {
    let mut p = vec![
        KernelParam::Buffer(2),
        KernelParam::Buffer(0),
        KernelParam::Buffer(1),
    ];
    p.extend(scalars.iter().map(|s| KernelParam::Scalar(s)));
    p
}

/// out[m×n] = a[m×k] · b[k×n].
fn matmul_kernel(ctx: &mut KernelCtx<'_>) -> Result<(), KernelFault> {
    let (m, k, n) = (
        ctx.scalar_u32(3)? as usize,
        ctx.scalar_u32(4)? as usize,
        ctx.scalar_u32(5)? as usize,
    );
    let mut bufs = ctx.buffers_mut()?;
    let [a, b, out] = bufs.as_mut_slice() else {
        return Err(KernelFault::Failed);
    };
    let (a, b, out) = (as_f32(a)?, as_f32(b)?, as_f32_mut(out)?);
    if a.len() < m * k || b.len() < k * n || out.len() < m * n {
        return Err(KernelFault::Failed);
    }
    for row in 0..m {
        let o = &mut out[row * n..(row + 1) * n];
        o.fill(0.0);
        for (kk, &av) in a[row * k..(row + 1) * k].iter().enumerate() {
            for (ov, &bv) in o.iter_mut().zip(&b[kk * n..(kk + 1) * n]) {
                *ov += av * bv;
            }
        }
    }
    Ok(())
}

/// Runs `body(m, n, x, bias, out)` over the kernel's three buffers (x and out m×n, bias n),
/// checked against the parameters m and n.
fn bias_kernel(
    ctx: &mut KernelCtx<'_>,
    body: impl FnOnce(usize, usize, &[f32], &[f32], &mut [f32]),
) -> Result<(), KernelFault> {
    let (m, n) = (ctx.scalar_u32(3)? as usize, ctx.scalar_u32(4)? as usize);
    let mut bufs = ctx.buffers_mut()?;
    let [x, bias, out] = bufs.as_mut_slice() else {
        return Err(KernelFault::Failed);
    };
    let (x, bias, out) = (as_f32(x)?, as_f32(bias)?, as_f32_mut(out)?);
    if x.len() < m * n || bias.len() < n || out.len() < m * n {
        return Err(KernelFault::Failed);
    }
    body(m, n, x, bias, out);
    Ok(())
}

/// out = relu(x + bias) row by row.
fn bias_relu_kernel(ctx: &mut KernelCtx<'_>) -> Result<(), KernelFault> {
    bias_kernel(ctx, |m, n, x, bias, out| {
        for (i, o) in out[..m * n].iter_mut().enumerate() {
            *o = (x[i] + bias[i % n]).max(0.0);
        }
    })
}

/// out = softmax(x + bias) row by row.
fn bias_softmax_kernel(ctx: &mut KernelCtx<'_>) -> Result<(), KernelFault> {
    bias_kernel(ctx, |m, n, x, bias, out| {
        for row in 0..m {
            let logits: Vec<f32> = (0..n).map(|j| x[row * n + j] + bias[j]).collect();
            softmax_into(&logits, &mut out[row * n..(row + 1) * n]);
        }
    })
}

/// `out = softmax(logits)`, max-subtracted.
fn softmax_into(logits: &[f32], out: &mut [f32]) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f32 = logits.iter().map(|l| (l - max).exp()).sum();
    for (o, l) in out.iter_mut().zip(logits) {
        *o = (l - max).exp() / sum;
    }
}

// ---- the reference, computed on the host without the layer ----

fn reference(weights: &[Vec<f32>], input: &[f32], m: usize) -> Vec<f32> {
    let mut act = input.to_vec();
    for (l, &(k, n)) in LAYERS.iter().enumerate() {
        let (w, b) = (&weights[2 * l], &weights[2 * l + 1]);
        let mut next = vec![0.0f32; m * n];
        for row in 0..m {
            for kk in 0..k {
                let av = act[row * k + kk];
                for j in 0..n {
                    next[row * n + j] += av * w[kk * n + j];
                }
            }
        }
        if l + 1 < LAYERS.len() {
            for (i, v) in next.iter_mut().enumerate() {
                *v = (*v + b[i % n]).max(0.0);
            }
        } else {
            for row in 0..m {
                let logits: Vec<f32> = (0..n).map(|j| next[row * n + j] + b[j]).collect();
                softmax_into(&logits, &mut next[row * n..(row + 1) * n]);
            }
        }
        act = next;
    }
    act
}

struct Kernels {
    matmul: StdKernel,
    bias_relu: StdKernel,
    bias_softmax: StdKernel,
}

struct Pending {
    batch: usize,
    input: Vec<f32>,
    read: ReadFuture<StdShim>,
}

/// The weights to serve: seeded (and saved if asked), or mapped from a file and checked. Runs
/// before the device exists, so a bad file or path never reaches it.
fn host_weights(o: &Options) -> Result<Vec<HostWeights>, weights::WeightsError> {
    match &o.weights {
        Some(path) => Ok(weights::load(path)?
            .into_iter()
            .map(|(m, floats)| HostWeights::Mapped(m, floats))
            .collect()),
        None => {
            let seeded = seeded_weights(o.seed);
            if let Some(path) = &o.save_weights {
                weights::save(path, &seeded)?;
                println!("wrote seeded weights to {}", path.display());
            }
            Ok(seeded.into_iter().map(HostWeights::Owned).collect())
        }
    }
}

fn run(o: &Options) -> Result<usize, Box<dyn std::error::Error>> {
    let weights = host_weights(o)?;
    let shim = StdShim::builder()
        .total_memory(2 << 30)
        .lazy(o.lazy)
        .build();
    let kernels = Kernels {
        matmul: shim.register_kernel("matmul", matmul_kernel),
        bias_relu: shim.register_kernel("bias_relu", bias_relu_kernel),
        bias_softmax: shim.register_kernel("bias_softmax", bias_softmax_kernel),
    };
    serve(
        o,
        Device::new(shim, DeviceConfig::default()),
        &kernels,
        weights,
    )
}

enum HostWeights {
    Owned(Vec<f32>),
    Mapped(MappedTensor, Vec<f32>),
}

impl HostWeights {
    fn floats(&self) -> &[f32] {
        match self {
            Self::Owned(v) | Self::Mapped(_, v) => v,
        }
    }
}

fn serve(
    o: &Options,
    mut device: Device<StdShim>,
    k: &Kernels,
    weights: Vec<HostWeights>,
) -> Result<usize, Box<dyn std::error::Error>> {
    let reference_weights: Vec<Vec<f32>> = weights.iter().map(|w| w.floats().to_vec()).collect();
    let mut file_backed = 0usize;
    let device_weights: Vec<Handle> = {
        let mut cmd = device.command(COMPUTE)?;
        cmd.allocation_mode(AllocationMode::Persistent);
        let mut handles = Vec::new();
        for w in weights {
            let (bytes, data) = match w {
                HostWeights::Owned(v) => (v.len() * 4, HostBuffer::from_vec(to_bytes(&v))),
                HostWeights::Mapped(m, _) => {
                    file_backed += m.len();
                    (m.len(), HostBuffer::external(Box::new(m)))
                }
            };
            let h = cmd.empty(bytes as u64)?;
            cmd.write(&h, data)?;
            handles.push(h);
        }
        cmd.allocation_mode(AllocationMode::Auto);
        handles
    };
    println!(
        "loaded {} weight tensors ({} bytes, {} from a mapped file) in the persistent pool",
        device_weights.len(),
        reference_weights.iter().map(|w| w.len() * 4).sum::<usize>(),
        file_backed
    );

    let m = o.batch_size;
    let progress = if o.batches >= 200 {
        let bar = indicatif::ProgressBar::new(o.batches as u64);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{bar:40} {pos}/{len} batches {per_sec} eta {eta}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        Some(bar)
    } else {
        None
    };
    let mut rng = Rng(o.seed ^ 0xA5A5);
    let mut in_flight: VecDeque<Pending> = VecDeque::new();
    let mut mismatches = 0usize;
    let started = Instant::now();
    for batch in 0..o.batches {
        let input: Vec<f32> = (0..m * INPUT).map(|_| rng.f32(1.0)).collect();
        // Upload on the copy stream, through pinned staging.
        let x = {
            let mut cmd = device.command(COPY)?;
            let x = cmd.empty((m * INPUT * 4) as u64)?;
            let mut staged = cmd.reserve_host(m * INPUT * 4, true)?;
            staged.as_mut_slice().copy_from_slice(&to_bytes(&input));
            cmd.write(&x, staged)?;
            x
        };
        // Compute, ordered after the upload on the device (no host sync).
        let mut cmd = device.command(COMPUTE)?;
        let mut act = x;
        for (l, &(kin, kout)) in LAYERS.iter().enumerate() {
            let pre = cmd.empty((m * kout * 4) as u64)?;
            let shape = [m as u32, kin as u32, kout as u32].map(u32::to_ne_bytes);
            cmd.launch(Launch {
                kernel: &k.matmul,
                name: "matmul",
                dims: LaunchDims::covering((m * kout) as u64, 128),
                inputs: &[&act, &device_weights[2 * l]],
                outputs: &[&pre],
                params: &params(&shape),
            })?;
            let out = cmd.empty((m * kout * 4) as u64)?;
            let last = l + 1 == LAYERS.len();
            let shape = [m as u32, kout as u32].map(u32::to_ne_bytes);
            cmd.launch(Launch {
                kernel: if last { &k.bias_softmax } else { &k.bias_relu },
                name: if last { "bias_softmax" } else { "bias_relu" },
                dims: LaunchDims::covering(m as u64, 128),
                inputs: &[&pre, &device_weights[2 * l + 1]],
                outputs: &[&out],
                params: &params(&shape),
            })?;
            act = out;
        }
        let read = cmd.read_async(&[ReadRequest::whole(&act)])?;
        in_flight.push_back(Pending { batch, input, read });
        if in_flight.len() >= IN_FLIGHT {
            mismatches += check(
                in_flight.pop_front().expect("non-empty"),
                &reference_weights,
                m,
            )?;
        }
        if let Some(bar) = &progress {
            bar.inc(1);
        }
    }
    while let Some(p) = in_flight.pop_front() {
        mismatches += check(p, &reference_weights, m)?;
    }
    let elapsed = started.elapsed();
    if let Some(bar) = progress {
        bar.finish_and_clear();
    }
    let requests = o.batches as u128 * m as u128; // no overflow, whatever was asked
    println!(
        "served {} batches x {} = {} requests in {:.3} s: {:.0} requests/s, {:.3} ms per batch; {} mismatches",
        o.batches,
        m,
        requests,
        elapsed.as_secs_f64(),
        requests as f64 / elapsed.as_secs_f64(),
        elapsed.as_secs_f64() * 1e3 / o.batches.max(1) as f64,
        mismatches
    );

    // Two flushes per stream: everything pushed so far passes its fence and is released.
    for _ in 0..2 {
        for s in [COMPUTE, COPY] {
            device.command(s)?.flush_drops()?;
        }
    }
    println!("\nmemory report:\n{}", device.memory_report());
    println!("\ndrop queues:");
    for (id, st) in device.drop_stats() {
        println!(
            "  stream {}: {} flushes, {} fences waited, {} polled, {} items / {} bytes released, {} leaked",
            id.0,
            st.flushes,
            st.fences_waited,
            st.fences_polled,
            st.items_released,
            st.bytes_released,
            st.items_leaked
        );
    }
    Ok(mismatches)
}

/// Waits for a batch's result and counts the outputs that differ from the host reference.
fn check(p: Pending, weights: &[Vec<f32>], m: usize) -> Result<usize, Box<dyn std::error::Error>> {
    let got = from_bytes(p.read.wait()?[0].as_slice());
    let want = reference(weights, &p.input, m);
    let bad = verify::compare(&got, &want).map_err(|e| format!("batch {}: {e}", p.batch))?;
    if let Some((i, g, w)) = bad.first {
        let side = |v: Option<f32>| v.map_or_else(|| "nothing".to_owned(), |v| v.to_string());
        eprintln!(
            "batch {}: {} of {} outputs differ from the reference (first: output {i}, got {}, \
             want {})",
            p.batch,
            bad.count,
            want.len(),
            side(g),
            side(w)
        );
    }
    Ok(bad.count)
}

fn main() -> ExitCode {
    let options = match cli::parse(std::env::args_os().skip(1)) {
        Ok(Parsed::Run(o)) => o,
        Ok(Parsed::Help) => {
            println!("{}", cli::usage(weights::file_len()));
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("edge-host: {e} (try --help)");
            return ExitCode::from(2);
        }
    };
    match run(&options) {
        Ok(0) => {
            println!("all results verified against the host reference");
            ExitCode::SUCCESS
        }
        Ok(n) => {
            eprintln!("edge-host: {n} outputs did not match the reference");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("edge-host: {e}");
            ExitCode::FAILURE
        }
    }
}
