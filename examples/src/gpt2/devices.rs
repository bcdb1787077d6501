//! The two devices of the decoding host: the std shim (the step's Rust kernels, f32) and an
//! NVIDIA GPU (the same kernels in CUDA C compiled once with NVRTC for the device and the element
//! type, as the edge host compiles its own).
//!
//! GEMMs are library work ([`devcmd::Command::library`]): on std `devcmd_std::blas::gemm` (the
//! `matrixmultiply` crate on the stream's worker), on the GPU devcmd-cuda's [`Cublas::gemm`]
//! (`cublasSgemm`, or `cublasGemmEx` with f16 operands and f32 compute). Where cuBLAS does not
//! load, the GPU runs a plain `gemm` kernel instead and the host says so.

use super::decode::Backend;
use super::kernels::{CUDA_SOURCE, Kernels, SIGNATURES, elem_dims, gemm_scalars, launch, u32s};
use super::split::{gemm_parts, split_k_from_env};
use super::weights::DType;
use devcmd::{Command, Gemm, Handle, LaunchError, ServerError};
use devcmd_cuda::{Cublas, CudaKernel, CudaModule, CudaShim, LT_SETUP};
use devcmd_std::{StdKernel, StdShim};
use std::error::Error;
use std::time::{Duration, Instant};

/// The std device: 8 GiB of memory (GPT-2 small's weights, cache and buffers fit many times),
/// lazy streams when asked.
pub fn std_shim(lazy: bool) -> StdShim {
    StdShim::builder().total_memory(8 << 30).lazy(lazy).build()
}

/// The std device's share: its kernels.
#[derive(Debug)]
pub struct StdBackend {
    /// The step's kernels, registered on the shim.
    pub kernels: Kernels<StdKernel>,
}

impl StdBackend {
    /// The kernels registered on `shim`.
    pub fn new(shim: &StdShim) -> Self {
        Self {
            kernels: super::std_kernels::kernels(shim),
        }
    }
}

impl Backend<StdShim> for StdBackend {
    fn kernels(&self) -> &Kernels<StdKernel> {
        &self.kernels
    }

    fn dtype(&self) -> DType {
        DType::F32
    }

    fn gemm(
        &self,
        cmd: &mut Command<'_, StdShim>,
        _name: &'static str,
        g: Gemm,
        a: &Handle,
        b: &Handle,
        c: &Handle,
    ) -> Result<(), ServerError> {
        devcmd_std::blas::gemm(cmd, g, a, b, c)
    }
}

/// An opened GPU with the step's kernels compiled for one element type.
#[derive(Debug)]
pub struct CudaBackend {
    /// The device.
    pub shim: CudaShim,
    /// The module the kernels live in.
    pub module: CudaModule,
    /// The step's kernels.
    pub kernels: Kernels<CudaKernel>,
    /// `cast_f16`: f32 weights to half on the device.
    pub cast: CudaKernel,
    /// cuBLAS, or why it did not load (GEMMs then run [`Self::gemm`]).
    pub cublas: Result<Cublas, String>,
    /// The plain GEMM kernel, for a machine without cuBLAS.
    pub gemm: CudaKernel,
    /// The element type the kernels were compiled for.
    pub dtype: DType,
    /// Whether the MLP's first GEMM takes its bias and GELU in cuBLASLt's epilogue (where
    /// cuBLASLt loaded); `GPT2_SEPARATE_GELU=1` in the environment runs them as a separate
    /// kernel instead, to measure the difference (a shape cuBLASLt cannot set up runs them apart
    /// too).
    pub fused: bool,
    /// How long NVRTC and the load took.
    pub compile_time: Duration,
}

impl CudaBackend {
    /// Opens GPU `ordinal` and compiles the kernels for `dtype`.
    ///
    /// # Errors
    ///
    /// No driver ("no CUDA driver found: ..."), no NVRTC, a compile error.
    pub fn open(ordinal: u32, dtype: DType) -> Result<Self, Box<dyn Error>> {
        let shim = CudaShim::new(ordinal)?;
        let started = Instant::now();
        let options: &[&str] = match dtype {
            DType::F32 => &[],
            DType::F16 => &["-DGPT2_HALF"],
        };
        let module = shim.compile(CUDA_SOURCE, options)?;
        // Sizes read from the driver, or declared where the bindings cannot read them.
        let kernel = |name: &str| -> Result<CudaKernel, Box<dyn Error>> {
            let sizes = SIGNATURES
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, s)| *s)
                .ok_or_else(|| format!("no signature for {name}"))?;
            Ok(module
                .kernel(name)
                .or_else(|_| module.kernel_with_sizes(name, sizes))?)
        };
        let kernels = Kernels {
            embed: kernel("embed")?,
            attention: kernel("attention")?,
            residual_ln: kernel("residual_ln")?,
            bias_gelu: kernel("bias_gelu")?,
            argmax: kernel("argmax")?,
            copy_cache: kernel("copy_cache")?,
        };
        let cast = kernel("cast_f16")?;
        let gemm = kernel("gemm")?;
        // `GPT2_CUBLAS_WORKSPACE_MIB=N` gives each stream's cuBLAS handle N MiB of workspace;
        // unset, [`workspace_mib_for`] decides.
        let workspace = std::env::var("GPT2_CUBLAS_WORKSPACE_MIB")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .or(workspace_mib_for(dtype));
        let cublas = Cublas::new(&shim)
            .map(|c| match workspace {
                Some(mib) => c.with_workspace(mib << 20),
                None => c,
            })
            .map_err(|e| e.to_string());
        Ok(Self {
            shim,
            module,
            kernels,
            cast,
            cublas,
            gemm,
            dtype,
            fused: std::env::var("GPT2_SEPARATE_GELU").map_or(true, |v| v.is_empty() || v == "0"),
            compile_time: started.elapsed(),
        })
    }

    /// What the host prints about the GPU, its kernels and its GEMMs.
    pub fn describe(&self) -> String {
        let (major, minor) = self.shim.compute_capability();
        let gemms = match &self.cublas {
            Ok(c) => format!(
                "GEMMs: cuBLAS {} ({}) as library work, {} bytes of workspace per stream; \
                 the MLP's bias and GELU {}",
                c.version(),
                c.library(),
                c.workspace_bytes(),
                match c.lt() {
                    Ok(lt) if self.fused => format!("in cuBLASLt's epilogue ({lt})"),
                    Ok(_) => "in a separate kernel (GPT2_SEPARATE_GELU)".to_owned(),
                    Err(why) => format!("in a separate kernel ({why})"),
                }
            ),
            Err(why) => format!("GEMMs: a plain kernel, NOT cuBLAS ({why})"),
        };
        format!(
            "device: {} (compute capability {major}.{minor}); kernels compiled by NVRTC with \
             [{}] in {:.0} ms\n{gemms}",
            self.shim.name(),
            self.module.compile_options().join(" "),
            self.compile_time.as_secs_f64() * 1e3
        )
    }
}

/// The cuBLAS workspace per stream, in MiB, by element type; `None`: cuBLAS's advice (32 MiB on
/// Hopper). None in either type, measured on the H200 (GPT-2 small, 32 + 128 tokens, graphs,
/// BENCHMARKS.md): in f16 the step takes the same time without one (360.5 against 360.8 µs at
/// batch 1, 390.4 against 389.2 at batch 8); in f32 batch 1 is faster without (446 against
/// 515 µs) and batch 8 slower (933 against 796), still faster than eager. Either way the host
/// then holds what the model needs and nothing beside it.
pub fn workspace_mib_for(dtype: DType) -> Option<u64> {
    match dtype {
        DType::F16 | DType::F32 => Some(0),
    }
}

/// Parts the output projections' k is cut into with cuBLAS, by element type (`GPT2_SPLIT_K`
/// overrides): chosen by measurement on the H200 (BENCHMARKS.md, GPT-2 small: f16 8 parts
/// 346.7-349.0 µs a step against 353.6-353.7 with 4; f32 4 parts 515.4-516.5 against
/// 521.7-523.7 with 8).
pub fn split_k_for(dtype: DType) -> usize {
    match dtype {
        DType::F16 => 8,
        DType::F32 => 4,
    }
}

impl Backend<CudaShim> for CudaBackend {
    fn kernels(&self) -> &Kernels<CudaKernel> {
        &self.kernels
    }

    fn dtype(&self) -> DType {
        self.dtype
    }

    fn gemm(
        &self,
        cmd: &mut Command<'_, CudaShim>,
        name: &'static str,
        g: Gemm,
        a: &Handle,
        b: &Handle,
        c: &Handle,
    ) -> Result<(), ServerError> {
        if let Ok(cublas) = &self.cublas {
            return cublas.gemm(cmd, g, a, b, c);
        }
        g.check_handles(name, a, b, c)?;
        let (m, n) = (g.m as usize, g.n as usize);
        launch(
            cmd,
            &self.gemm,
            elem_dims(m * n),
            &[a, b],
            &[c],
            &gemm_scalars(&g),
        )
    }

    fn gemm_bias_gelu(
        &self,
        cmd: &mut Command<'_, CudaShim>,
        g: Gemm,
        [a, b, bias]: [&Handle; 3],
        c: &Handle,
    ) -> Result<(), ServerError> {
        if let Ok(cublas) = &self.cublas
            && self.fuses_bias_gelu()
        {
            // cuBLASLt's GELU-and-bias epilogue: one launch instead of two. A set-up failure
            // (an unaligned bias, no algorithm for the shape) enqueued nothing: run them apart.
            match cublas.gemm_bias_gelu(cmd, g, a, b, bias, c) {
                Err(ServerError::Launch(LaunchError::Library { work, .. })) if work == LT_SETUP => {
                }
                done => return done,
            }
        }
        self.gemm(cmd, "c_fc", g, a, b, c)?;
        let (outputs, rows) = (g.m as usize, g.n as usize);
        launch(
            cmd,
            &self.kernels.bias_gelu,
            elem_dims(rows * outputs),
            &[bias],
            &[c],
            &[u32s(rows), u32s(outputs)],
        )
    }

    fn fuses_bias_gelu(&self) -> bool {
        self.fused && self.cublas.as_ref().is_ok_and(|c| c.lt().is_ok())
    }

    /// [`split_k_for`] parts with cuBLAS (one strided-batched call fills the GPU better than
    /// cuBLAS's own choice for a decode step's thin products); none with the plain kernel.
    fn split_k(&self) -> usize {
        split_k_from_env().unwrap_or(if self.cublas.is_ok() {
            split_k_for(self.dtype)
        } else {
            1
        })
    }

    fn gemm_split_k(
        &self,
        cmd: &mut Command<'_, CudaShim>,
        name: &'static str,
        g: Gemm,
        parts: usize,
        operands: [&Handle; 2],
        partials: &Handle,
    ) -> Result<(), ServerError> {
        match (&self.cublas, u32::try_from(parts)) {
            (Ok(cublas), Ok(p)) => {
                cublas.gemm_split_k(cmd, g, p, operands[0], operands[1], partials)
            }
            _ => gemm_parts(self, cmd, name, g, parts, operands, partials),
        }
    }

    fn library_scratch_bytes(&self) -> u64 {
        self.cublas.as_ref().map_or(0, Cublas::workspace_bytes)
    }

    fn prepare(&self, cmd: &mut Command<'_, CudaShim>) -> Result<(), ServerError> {
        match &self.cublas {
            Ok(c) => c.prepare(cmd),
            Err(_) => Ok(()),
        }
    }

    fn convert(
        &self,
        cmd: &mut Command<'_, CudaShim>,
        from: &Handle,
        to: &Handle,
        elements: usize,
    ) -> Option<Result<(), ServerError>> {
        if self.dtype != DType::F16 {
            return None;
        }
        Some(launch(
            cmd,
            &self.cast,
            elem_dims(elements),
            &[from],
            &[to],
            &[u32s(elements)],
        ))
    }
}
