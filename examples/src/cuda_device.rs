//! The model on an NVIDIA GPU: the device opened through devcmd-cuda, the kernels compiled once
//! from [`crate::model::CUDA_SOURCE`] with NVRTC for the device's architecture, and what the host
//! says about both on start (the device, its facts, the copy path it uses).
//!
//! Owns the GPU's set-up and its description. Does not own the serving loop ([`crate::serve`]),
//! which is the same for every device; nor the kernels' launches, which use the same geometry
//! and parameters as on the std shim ([`crate::model`]).

use crate::model::{CUDA_OPTIONS, CUDA_SOURCE, Kernels};
use crate::serve::WeightsPath;
use devcmd::{Device, Shim};
use devcmd_cuda::{CudaKernel, CudaModule, CudaShim};
use std::error::Error;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

/// An opened GPU with the model's kernels loaded.
#[derive(Debug)]
pub struct Gpu {
    /// The device.
    pub shim: CudaShim,
    /// The module the kernels live in (kept loaded by them, too).
    pub module: CudaModule,
    /// The model's kernels.
    pub kernels: Kernels<CudaKernel>,
    /// How long NVRTC and the load took.
    pub compile_time: Duration,
}

/// Opens GPU `ordinal` and compiles the model's kernels for it.
///
/// # Errors
///
/// The shim's [`devcmd_cuda::CudaInitError`] (on a machine without the NVIDIA driver: "no CUDA
/// driver found: ...", never a panic); as [`open_on`].
pub fn open(ordinal: u32) -> Result<Gpu, Box<dyn Error>> {
    open_on(CudaShim::new(ordinal)?)
}

/// Compiles the model's kernels for the opened `shim`.
///
/// # Errors
///
/// NVRTC's absence or a compile error ([`devcmd_cuda::CudaKernelError`]).
pub fn open_on(shim: CudaShim) -> Result<Gpu, Box<dyn Error>> {
    let started = Instant::now();
    let module = shim.compile(CUDA_SOURCE, CUDA_OPTIONS)?;
    // The signatures in model.rs: matmul(out, a, b, m, k, n), bias_*(out, x, bias, m, n).
    // Declared, so bindings that cannot read them (JetPack 5 and 6.0) still check every launch.
    let kernel = |name: &str| {
        let scalars = if name == "matmul" { 3 } else { 2 };
        let sizes: Vec<usize> = [8, 8, 8]
            .into_iter()
            .chain([4; 3].into_iter().take(scalars))
            .collect();
        module.kernel_with_sizes(name, &sizes)
    };
    let kernels = Kernels {
        matmul: kernel("matmul")?,
        bias_relu: kernel("bias_relu")?,
        bias_softmax: kernel("bias_softmax")?,
    };
    let compile_time = started.elapsed();
    Ok(Gpu {
        shim,
        module,
        kernels,
        compile_time,
    })
}

/// `13000` as `13.0`.
fn version(v: i32) -> String {
    format!("{}.{}", v / 1000, v % 1000 / 10)
}

fn yes_no(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

/// What the host prints on start: the device, its facts, the kernels' compile.
pub fn describe(gpu: &Gpu) -> String {
    let s = &gpu.shim;
    let f = s.facts();
    let (major, minor) = s.compute_capability();
    let mut out = format!(
        "device: {} (CUDA device {}, compute capability {major}.{minor}; driver CUDA {}, \
         bindings CUDA {})\n",
        s.name(),
        s.ordinal(),
        version(s.driver_version()),
        version(s.binding_version())
    );
    let _ = writeln!(
        out,
        "facts: total memory {:.1} GiB ({} bytes), integrated: {}, can_map_host: {}",
        f.total_memory as f64 / f64::from(1u32 << 30),
        f.total_memory,
        yes_no(f.integrated),
        yes_no(f.can_map_host)
    );
    let nvrtc = match CudaShim::nvrtc() {
        Ok((lib, (major, minor))) => format!("NVRTC {major}.{minor} ({lib})"),
        Err(e) => format!("NVRTC ({e})"),
    };
    let _ = write!(
        out,
        "kernels: matmul, bias_relu, bias_softmax compiled once by {nvrtc} with [{}] in {:.0} ms",
        gpu.module.compile_options().join(" "),
        gpu.compile_time.as_secs_f64() * 1e3
    );
    out
}

/// The copy path of inputs and results on `device` (see [`devcmd::DeviceConfig::zero_copy`]).
pub fn copy_path<S: Shim>(device: &Device<S>) -> &'static str {
    if device.zero_copy() {
        "zero copy: device pages are pinned host memory the GPU maps (an integrated GPU), so \
         each batch's input is written by the host in place and results are read in place \
         (`Command::read_owned`), with no DMA copy"
    } else {
        "pinned staging: each batch's input is written into a pinned page and copied by DMA \
         (cuMemcpyHtoDAsync); results are read back into pinned pages (cuMemcpyDtoHAsync)"
    }
}

/// What became of the weights, in words.
pub fn weights_path(path: &WeightsPath) -> String {
    match path {
        WeightsPath::Heap => {
            "seeded in memory and staged through a pinned page (pass --weights FILE to \
             register a mapped file in place)"
                .to_owned()
        }
        WeightsPath::FileStaged => "mapped from the file and staged through a pinned page".into(),
        WeightsPath::Registered => {
            "registered in place: the mapped file was page-locked (cuMemHostRegister) and \
             copied by DMA, with no staging copy"
                .to_owned()
        }
        WeightsPath::NotRegistered(why) => format!(
            "NOT registered (the device refused to page-lock the mapped file: {why}); staged \
             through a pinned page instead"
        ),
    }
}
