//! The edge-inference host: a small MLP served through devcmd on the std shim (the default) or on
//! an NVIDIA GPU (`--device cuda`).
//!
//! Weights are loaded once in the persistent mode (seeded, or memory-mapped from a file so the
//! file-backed staging path is real; on a GPU the mapped file is page-locked in place). Then each
//! batch is uploaded on a copy stream, run through the layers (matmul, bias + ReLU, bias +
//! softmax kernels) on a compute stream ordered after the upload on the device, and read back
//! asynchronously while the next batches are enqueued. With `--graph` one batch's work is
//! recorded into graphs once and replayed per batch ([`devcmd_examples::replay`]). Every result
//! is checked against a reference computed on the host without the layer; any mismatch exits
//! non-zero.
//!
//! This file owns the choice of device and what the host prints; the loop is
//! [`devcmd_examples::serve`], the same for every device, and each device brings its kernels
//! ([`devcmd_examples::std_device`], [`devcmd_examples::cuda_device`]).

use devcmd::{Device, DeviceConfig, Shim};
use devcmd_examples::cli::{self, DeviceKind, Options, Parsed};
use devcmd_examples::model::{Kernels, seeded_weights};
use devcmd_examples::replay;
use devcmd_examples::serve::{self, HostWeights, Plan, WeightsPath};
use devcmd_examples::weights::{self, Mapping};
use devcmd_examples::{cuda_device, std_device};
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
            "graphs: one batch's 6 launches recorded once per batch in flight ({}), replayed per \
             batch",
            serve::IN_FLIGHT
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
            eprintln!("edge-host: {}", devcmd_examples::error_chain(&*e));
            ExitCode::FAILURE
        }
    }
}
