//! The edge-inference host: a small MLP served through devcmd on the std shim (the default) or on
//! an NVIDIA GPU (`--device cuda`).
//!
//! Weights are loaded once in the persistent mode (seeded, or memory-mapped from a file so the
//! file-backed staging path is real; on a GPU the mapped file is page-locked in place). Then each
//! batch is uploaded on a copy stream, run through the layers (matmul, bias + ReLU, bias +
//! softmax kernels) on a compute stream ordered after the upload on the device, and read back
//! asynchronously while the next batches are enqueued. With `--graph` one batch's work is
//! recorded into graphs once and replayed per batch ([`devcmd_examples::replay`]). Every result
//! is checked against a reference computed on the host without the layer. Exit codes are
//! [`devcmd_examples::exit`]'s: 1 for a mismatch, 2 for bad flags or weights (or weights whose
//! reference overflows), 3 without a CUDA driver or GPU, 4 for an error while serving.
//!
//! With `--devices N` it serves across N devices ([`devcmd_examples::several`]): the weights
//! uploaded to the first and copied device to device to the others, batches dealt round-robin.
//!
//! This file owns the choice of device and what the host prints; the loop is
//! [`devcmd_examples::serve`], the same for every device, and each device brings its kernels
//! ([`devcmd_examples::std_device`], [`devcmd_examples::cuda_device`]).

use devcmd::{CopyPath, Device, DeviceConfig, Shim};
use devcmd_examples::cli::{self, DeviceKind, Devices, Options, Parsed};
use devcmd_examples::exit;
use devcmd_examples::model::{Kernels, seeded_weights};
use devcmd_examples::replay;
use devcmd_examples::serve::{self, HostWeights, Plan, WeightsPath};
use devcmd_examples::weights::{self, Mapping};
use devcmd_examples::{cuda_device, several, std_device};
use std::error::Error;
use std::process::ExitCode;

/// The weights to serve: seeded (and saved if asked), or mapped from a file and checked. Runs
/// before the device exists, so a bad file or path never reaches it. Every device gets a
/// read-only mapping: devcmd-cuda page-locks it in place read-only (a private copy-on-write
/// mapping makes the driver copy every page as it locks them).
fn host_weights(o: &Options) -> Result<HostWeights, weights::WeightsError> {
    match &o.weights {
        Some(path) => Ok(HostWeights::Mapped(weights::load(path, Mapping::ReadOnly)?)),
        None => {
            let seeded = seeded_weights(o.seed);
            if let Some(path) = &o.save_weights {
                weights::save(path, &seeded)?;
                println!("wrote seeded weights to {}", path.display());
            }
            Ok(HostWeights::Seeded(seeded))
        }
    }
}

fn run(o: &Options) -> Result<usize, Box<dyn Error>> {
    let weights = host_weights(o)?;
    if o.devices != Devices::Count(1) {
        return run_several(o, weights);
    }
    match o.device {
        DeviceKind::Std => {
            let shim = std_device::shim(o.lazy);
            let kernels = std_device::kernels(&shim);
            let device = Device::new(shim, DeviceConfig::default());
            serve_on(o, device, &kernels, weights, false, |_| {})
        }
        DeviceKind::Cuda => {
            let gpu = cuda_device::open(0)?;
            println!("{}", cuda_device::describe(&gpu));
            let device = Device::new(gpu.shim.clone(), DeviceConfig::default());
            println!("copy path: {}", cuda_device::copy_path(&device));
            serve_on(o, device, &gpu.kernels, weights, true, |path| {
                println!("weights: {}", cuda_device::weights_path(path));
            })
        }
    }
}

/// `--devices N`: N std shims, or GPUs 0 to N-1 (taken in turn when there are fewer).
fn run_several(o: &Options, weights: HostWeights) -> Result<usize, Box<dyn Error>> {
    match o.device {
        DeviceKind::Std => {
            let Devices::Count(n) = o.devices else {
                unreachable!("the command line refuses --devices all with --device std")
            };
            let shims: Vec<_> = (0..n).map(|_| std_device::shim(o.lazy)).collect();
            let kernels: Vec<_> = shims.iter().map(std_device::kernels).collect();
            let devices = shims
                .into_iter()
                .map(|s| Device::new(s, DeviceConfig::default()))
                .collect();
            serve_several(
                o,
                devices,
                &kernels.iter().collect::<Vec<_>>(),
                weights,
                false,
            )
        }
        DeviceKind::Cuda => {
            let gpus = devcmd_cuda::CudaShim::device_count()?.max(1);
            let n = match o.devices {
                Devices::Count(n) => n,
                Devices::All => gpus as usize,
            };
            if (n as u32) > gpus {
                println!(
                    "{n} devices over {gpus} GPU(s): devices share GPUs in turn (several devcmd \
                     devices over one GPU share its primary context)"
                );
            }
            let mut opened = Vec::with_capacity(n);
            for i in 0..n {
                let gpu = cuda_device::open(i as u32 % gpus)?;
                println!("device {i}: {}", cuda_device::describe(&gpu));
                opened.push(gpu);
            }
            let devices = opened
                .iter()
                .map(|g| Device::new(g.shim.clone(), DeviceConfig::default()))
                .collect();
            let kernels: Vec<_> = opened.iter().map(|g| &g.kernels).collect();
            serve_several(o, devices, &kernels, weights, true)
        }
    }
}

/// Loads the weights on the first device, copies them to the others, serves across all,
/// reports. The same for every kind of device.
fn serve_several<S>(
    o: &Options,
    mut devices: Vec<Device<S>>,
    kernels: &[&Kernels<S::Kernel>],
    weights: HostWeights,
    register: bool,
) -> Result<usize, Box<dyn Error>>
where
    S: Shim + Send + Sync + 'static,
    S::Registration: 'static,
{
    let first = serve::load_weights(&mut devices[0], weights, register)?;
    println!(
        "loaded {} weight tensors ({} bytes) on device 0",
        first.tensors.len(),
        first.bytes
    );
    let mut all = vec![first];
    for i in 1..devices.len() {
        let (done, rest) = devices.split_at_mut(i);
        let started = std::time::Instant::now();
        let (copy, path) = several::copy_weights(&mut rest[0], &mut done[0], &all[0])?;
        let secs = started.elapsed().as_secs_f64();
        let how = match path {
            CopyPath::Peer => "device to device",
            CopyPath::Staged => "through host memory",
            CopyPath::Empty => "nothing to copy",
        };
        println!(
            "copied the weights to device {i} ({how}, {:.3} ms including the reservation and the wait)",
            secs * 1e3
        );
        all.push(copy);
    }
    let plan = Plan {
        batches: o.batches,
        batch_size: o.batch_size,
        seed: o.seed,
        verify: true,
        progress: true,
    };
    let served = several::serve_across(&plan, &mut devices, kernels, &all)?;
    let secs = served.elapsed.as_secs_f64();
    println!(
        "served {} batches x {} = {} requests across {} devices in {:.3} s: {:.0} requests/s, \
         {:.3} ms per batch; {} mismatches",
        o.batches,
        o.batch_size,
        served.requests,
        devices.len(),
        secs,
        served.per_second(),
        secs * 1e3 / o.batches.max(1) as f64,
        served.mismatches
    );
    drop(all);
    several::report(&mut devices)?;
    Ok(served.mismatches)
}

/// Loads the weights (page-locked in place first when `register`), serves, reports. The same for
/// every device.
fn serve_on<S>(
    o: &Options,
    mut device: Device<S>,
    kernels: &Kernels<S::Kernel>,
    weights: HostWeights,
    register: bool,
    say_weights: impl FnOnce(&WeightsPath),
) -> Result<usize, Box<dyn Error>>
where
    S: Shim + Send + Sync + 'static,
    S::Registration: 'static,
{
    let w = serve::load_weights(&mut device, weights, register)?;
    let from_file = match w.path {
        WeightsPath::Heap => 0,
        _ => w.bytes,
    };
    println!(
        "loaded {} weight tensors ({} bytes, {} from a mapped file) in the persistent pool",
        w.tensors.len(),
        w.bytes,
        from_file
    );
    say_weights(&w.path);
    let plan = Plan {
        batches: o.batches,
        batch_size: o.batch_size,
        seed: o.seed,
        verify: true,
        progress: true,
    };
    let served = if o.graph {
        let served = replay::serve(&plan, &mut device, kernels, &w)?;
        println!(
            "graphs: one batch's 6 launches recorded {} times (one more than batches in \
             flight), replayed per batch",
            replay::GRAPHS
        );
        served
    } else {
        serve::serve(&plan, &mut device, kernels, &w)?
    };
    let secs = served.elapsed.as_secs_f64();
    println!(
        "served {} batches x {} = {} requests in {:.3} s: {:.0} requests/s, {:.3} ms per batch; {} mismatches",
        o.batches,
        o.batch_size,
        served.requests,
        secs,
        served.per_second(),
        secs * 1e3 / o.batches.max(1) as f64,
        served.mismatches
    );
    serve::report(&mut device)?;
    Ok(served.mismatches)
}

fn main() -> ExitCode {
    devcmd_examples::exit::quiet_on_closed_output();
    let options = match cli::parse(std::env::args_os().skip(1)) {
        Ok(Parsed::Run(o)) => o,
        Ok(Parsed::Help) => {
            println!("{}", cli::usage(weights::file_len()));
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("edge-host: {e} (try --help)");
            return ExitCode::from(exit::BAD_INPUT);
        }
    };
    match run(&options) {
        Ok(0) => {
            println!("all results verified against the host reference");
            ExitCode::SUCCESS
        }
        Ok(n) => {
            eprintln!("edge-host: {n} outputs did not match the reference");
            ExitCode::from(exit::MISMATCH)
        }
        Err(e) => exit::report("edge-host", &*e),
    }
}
