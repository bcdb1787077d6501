//! Benchmark of devcmd on an NVIDIA GPU: every figure is a ratio against the raw driver call
//! (cudarc's `sys` layer, with the shim's context current) measured in the same run, printed as
//! markdown tables.
//!
//! - launch: enqueue cost of one tiny kernel through `Command::launch` (and of a kernel of no
//!   buffer, the core's fixed part) and `Shim::launch` against
//!   `cuLaunchKernel`;
//! - fence: `Shim::record_event` (and `Command::sync`'s enqueue) against `cuEventRecord` on a
//!   `CU_EVENT_DISABLE_TIMING` event;
//! - bandwidth, 4 KiB to 1 GiB (`bandwidth.rs`): `Command::write_from` of pageable bytes and
//!   `Command::read_to` into a heap buffer (the pipeline) against `cuMemcpyHtoDAsync` /
//!   `cuMemcpyDtoHAsync` from and to pinned memory and the driver's pageable path, a kept
//!   registration, the upload again with its source cached and evicted from the host's
//!   last-level cache (from 16 MiB: why the main table's large uploads trail the sweep's,
//!   BENCHMARKS.md's issue 18 section), and a sweep of the pipeline's settings;
//! - reserve + drop: `Command::empty` then drop, in steady state, against `cuMemAllocAsync` +
//!   `cuMemFreeAsync` on a stream and `cuMemAlloc` + `cuMemFree`;
//! - the edge host's serving loop ([`devcmd_examples::serve`]) against a plain driver program
//!   doing the same work (the same kernels and sizes: upload, 6 launches, readback per batch), on
//!   one stream and on two (the upload on its own stream, as devcmd does it);
//! - library work: host time of a small cuBLAS GEMM (64 x 64 x 64, f32 and f16) through
//!   `Cublas::gemm` (and through `Command::library` with the bare cuBLAS call) against the same
//!   cuBLAS call made directly on the same stream (a stream the benchmark created and devcmd
//!   borrowed), with its own handle and workspace;
//! - copies between two devices, 16 MiB to 1 GiB (`peer.rs`): `Command::copy_from` against
//!   `cuMemcpyPeerAsync` (two GPUs) or `cuMemcpyDtoDAsync` (two shims of one GPU).
//!
//! Timing: host clocks around enqueue loops (the device work is synchronised outside the timed
//! region for enqueue costs, inside it for bandwidth and serving), warm-up rounds first, then the
//! median of several rounds, the raw and the layer's rounds interleaved.
//!
//! Owns the measurements and the plain driver program the serving loop is compared with; the
//! model, its kernels and the loop itself come from the library ([`devcmd_examples`]).
//!
//! Run: `cargo run --release -p devcmd-examples --bin cuda-bench` (`--quick`: fewer rounds;
//! `--only launch,library`: those sections alone, of launch, bandwidth, reserve, edge, library,
//! peer; `CUDA_BENCH_SIZES=256,1024` in the environment: the bandwidth table at those sizes in
//! KiB alone, without its sweep; `CUDA_BENCH_COPY_THREADS=7,11,15`: also the evicted upload and
//! the readback from 16 MiB on a device of each of those helper thread counts);
//! `examples/gpu-run.sh` says how it ran on the H200 (BENCHMARKS.md).
//! Without a GPU or driver it prints the shim's "no CUDA driver found: ..." and exits with 3
//! ([`devcmd_examples::exit`]'s codes, which `--help` lists).

use devcmd::{
    Device, DeviceConfig, Gemm, GemmType, KernelParam, Launch, LaunchDims, LibraryWork,
    ReadRequest, Shim, StreamId,
};
use devcmd_cuda::{Cublas, CudaKernel, CudaShim, CudaStream, cublas_sys, sys};
use devcmd_examples::cuda_device;
use devcmd_examples::exit;
use devcmd_examples::model::{
    self, CLASSES, INPUT, Inputs, LAYERS, bias_relu_dims, bias_softmax_dims, matmul_dims,
    put_floats,
};
use devcmd_examples::serve::{self, HostWeights, IN_FLIGHT, Plan, Served};
use devcmd_examples::verify;
use devcmd_examples::weights::{from_bytes, to_bytes};
use std::error::Error;
use std::ffi::c_void;
use std::hint::black_box;
use std::process::ExitCode;
use std::ptr;
use std::time::{Duration, Instant};

mod bandwidth;
mod peer;

use bandwidth::bandwidth;

type Res<T> = Result<T, Box<dyn Error>>;

const S: StreamId = StreamId(0);

/// The tiny kernel of the launch and fence rows.
const TINY: &str = r#"
extern "C" __global__ void tiny(float *out, const float *in, unsigned n) {
    unsigned i = threadIdx.x;
    if (i < n) out[i] = in[i] + 1.0f;
}
extern "C" __global__ void bare(unsigned n) {
    if (threadIdx.x > n) __trap();
}
"#;

/// How many rounds each figure's median is taken over, and the warm-up rounds before them.
#[derive(Clone, Copy)]
struct Rounds {
    warm: usize,
    timed: usize,
}

impl Rounds {
    fn all(self) -> usize {
        self.warm + self.timed
    }
}

/// The raw call's status as a result naming the call.
fn cu(call: &'static str, r: sys::CUresult) -> Res<()> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(format!("{call} failed: {r:?}").into())
    }
}

/// The median (the mean of the middle two for an even count).
fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The 25th and 75th percentiles, as "p25–p75" (nearest rank).
fn spread(v: &[f64]) -> String {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return "—".to_owned();
    }
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    format!("{:.3}–{:.3}", at(0.25), at(0.75))
}

fn micros(t: Instant, ops: usize) -> f64 {
    t.elapsed().as_secs_f64() * 1e6 / ops as f64
}

fn gbps(bytes: usize, t: Duration) -> f64 {
    bytes as f64 / t.as_secs_f64() / 1e9
}

fn human(n: usize) -> String {
    if n >= 1 << 20 {
        format!("{} MiB", n >> 20)
    } else {
        format!("{} KiB", n >> 10)
    }
}

/// Whether the driver has `symbol` (cudarc panics when a missing one is called).
fn driver_has(symbol: &str) -> bool {
    // SAFETY: the shim was set up, so cudarc's library is loaded and `culib` returns it without
    // panicking; the symbol is only looked up, never called through this type.
    unsafe { sys::culib().get::<unsafe extern "C" fn()>(symbol) }.is_ok()
}

/// Makes the shim's context current on this thread, for raw calls.
fn bind(shim: &CudaShim) -> Res<()> {
    // SAFETY: the context is the shim's primary context, retained while the shim lives.
    cu("cuCtxSetCurrent", unsafe {
        sys::cuCtxSetCurrent(shim.cu_context())
    })
}

fn sync(stream: &CudaStream) -> Res<()> {
    // SAFETY: the stream is alive (held by the caller).
    cu("cuStreamSynchronize", unsafe {
        sys::cuStreamSynchronize(stream.cu_stream())
    })
}

/// `cuLaunchKernel` of `f` with `dims` and the parameter pointers `args` on `stream`.
///
/// # Safety
///
/// `args` holds one pointer per parameter of `f`, each to a value of the parameter's size; the
/// buffers they name are live device memory the kernel may touch.
unsafe fn launch_raw(
    f: sys::CUfunction,
    dims: LaunchDims,
    stream: sys::CUstream,
    args: &mut [*mut c_void],
) -> Res<()> {
    let LaunchDims {
        grid,
        block,
        shared_bytes,
    } = dims;
    // SAFETY: the caller's promise; the driver copies the parameters before returning.
    cu("cuLaunchKernel", unsafe {
        sys::cuLaunchKernel(
            f,
            grid.x,
            grid.y,
            grid.z,
            block.x,
            block.y,
            block.z,
            shared_bytes,
            stream,
            args.as_mut_ptr(),
            ptr::null_mut(),
        )
    })
}

/// The sections to run: `--only a,b` names them (launch, bandwidth, reserve, edge, library);
/// without it, all.
fn sections_asked() -> Result<Option<Vec<String>>, String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(i) = args.iter().position(|a| a == "--only") else {
        return Ok(None);
    };
    let list = args
        .get(i + 1)
        .ok_or("--only needs a list: --only launch,library")?;
    let names: Vec<String> = list.split(',').map(str::to_owned).collect();
    for n in &names {
        if !SECTIONS.contains(&n.as_str()) {
            return Err(format!(
                "--only {list}: no section `{n}`; the sections are {}",
                SECTIONS.join(", ")
            ));
        }
    }
    Ok(Some(names))
}

/// A section of the benchmark: prints its tables.
type Section<'a> = dyn Fn() -> Res<()> + 'a;

/// The sections' keys for `--only`, in the order they run.
const SECTIONS: [&str; 6] = ["launch", "bandwidth", "reserve", "edge", "library", "peer"];

/// `--help`.
const USAGE: &str = "\
cuda-bench: devcmd on the first NVIDIA GPU against raw driver calls, as markdown tables

usage: cuda-bench [--quick] [--only SECTIONS]
  --quick          fewer rounds
  --only SECTIONS  a comma-separated list of launch, bandwidth, reserve, edge, library, peer
environment: CUDA_BENCH_SIZES=256,1024  the bandwidth table at these sizes (KiB) alone, no sweep
             CUDA_BENCH_COPY_THREADS=7,11,15  also the evicted upload and the readback from
                                              16 MiB with these helper thread counts";

fn main() -> ExitCode {
    devcmd_examples::exit::quiet_on_closed_output();
    if exit::help_asked(USAGE) {
        return ExitCode::from(exit::OK);
    }
    let quick = std::env::args().any(|a| a == "--quick");
    let only = match sections_asked() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("cuda-bench: {e}");
            return ExitCode::from(exit::BAD_INPUT);
        }
    };
    let shim = match CudaShim::new(0) {
        Ok(s) => s,
        Err(e) => return exit::report("cuda-bench", &e),
    };
    match run(shim, quick, only) {
        Ok(()) => ExitCode::from(exit::OK),
        Err(e) => exit::report("cuda-bench", &*e),
    }
}

fn run(shim: CudaShim, quick: bool, only: Option<Vec<String>>) -> Res<()> {
    let rounds = if quick {
        Rounds { warm: 1, timed: 5 }
    } else {
        Rounds { warm: 2, timed: 15 }
    };
    let gpu = cuda_device::open_on(shim)?;
    println!("# devcmd on {} (cuda-bench)\n", gpu.shim.name());
    println!("```\n{}", cuda_device::describe(&gpu));
    let device = Device::new(gpu.shim.clone(), DeviceConfig::default());
    println!("copy path: {}\n```\n", cuda_device::copy_path(&device));
    drop(device);
    println!(
        "Medians of rounds after warm-up rounds (each section says how many); raw and devcmd rounds interleaved.\n"
    );
    // Fewer rounds for the bandwidth: each one moves about 7 GiB.
    let bw_rounds = Rounds {
        warm: 1,
        timed: rounds.timed.min(7),
    };
    // Each section stands alone: one that fails says so and the others still run.
    let sections: [(&str, &str, &Section); 6] = [
        ("launch", "launch and fence", &|| {
            launch_and_fence(&gpu.shim, rounds)
        }),
        ("bandwidth", "bandwidth", &|| {
            bandwidth(&gpu.shim, bw_rounds, quick)
        }),
        ("reserve", "reserve + drop", &|| reserve(&gpu.shim, rounds)),
        ("edge", "edge host", &|| edge_host(&gpu, rounds, quick)),
        ("library", "library work (cuBLAS)", &|| {
            library(&gpu.shim, rounds)
        }),
        ("peer", "copies between two devices", &|| {
            peer::peer(&gpu.shim, bw_rounds, quick)
        }),
    ];
    let mut failed = Vec::new();
    for (key, name, section) in sections {
        if only.as_ref().is_some_and(|o| !o.iter().any(|k| k == key)) {
            continue;
        }
        if let Err(e) = section() {
            println!("\n**{name}: failed: {e}**\n");
            failed.push(name);
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("sections failed: {}", failed.join(", ")).into())
    }
}

/// Launch rounds per round of the other rows (a launch round is cheap).
const LAUNCH_ROUNDS_PER: usize = 8;

/// Library rounds per round of the other sections (a library round is ~10 ms).
const LIBRARY_ROUNDS_PER: usize = 4;

/// Launch and fence enqueue costs.
fn launch_and_fence(shim: &CudaShim, rounds: Rounds) -> Res<()> {
    const BATCH: usize = 256;
    let module = shim.compile(TINY, &[])?;
    let tiny = module.kernel("tiny")?;
    // A kernel of no buffer: `Command::launch` of it is the core's fixed cost per operation.
    let bare = module.kernel("bare")?;
    let mut device = Device::new(shim.clone(), DeviceConfig::default());
    let floats: Vec<u8> = to_bytes(&[0.5f32; 32]);
    let mut cmd = device.command(S)?;
    let a = cmd.create(&floats)?;
    let b = cmd.empty(128)?;
    cmd.sync()?.wait()?;

    let stream = shim.create_stream()?;
    let pa = shim.device_alloc(128)?;
    let pb = shim.device_alloc(128)?;
    let spans = [
        devcmd::DeviceSpan {
            addr: shim.device_page_addr(&pa),
            len: 128,
        },
        devcmd::DeviceSpan {
            addr: shim.device_page_addr(&pb),
            len: 128,
        },
    ];
    let n = 32u32.to_ne_bytes();
    let kparams = [
        KernelParam::Buffer(1),
        KernelParam::Buffer(0),
        KernelParam::Scalar(&n),
    ];
    let dims = LaunchDims::linear(1, 32);
    let (mut p_out, mut p_in, mut p_n) = (spans[1].addr.0, spans[0].addr.0, 32u32);
    let mut args: [*mut c_void; 3] = [
        (&raw mut p_out).cast(),
        (&raw mut p_in).cast(),
        (&raw mut p_n).cast(),
    ];
    let mut event = ptr::null_mut();
    bind(shim)?;
    // SAFETY: the pointer is valid for one write; the context is current.
    cu("cuEventCreate", unsafe {
        sys::cuEventCreate(
            &mut event,
            sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32,
        )
    })?;

    let (mut raw_l, mut shim_l, mut ours_l) = (Vec::new(), Vec::new(), Vec::new());
    let (mut raw_f, mut shim_f, mut ours_f) = (Vec::new(), Vec::new(), Vec::new());
    // Each round's ratio of the core's loop to the raw loop: paired in time, so the host's
    // drift between rounds (clocks, other tenants) cancels; the headline is their median.
    let mut ratio_l = Vec::new();
    let (mut bare_l, mut bare_ratio) = (Vec::new(), Vec::new());
    let bare_params = [KernelParam::Scalar(&n)];
    // The launch rows are cheap (a round is ~3 ms): LAUNCH_ROUNDS_PER times the other
    // sections' rounds of them.
    let launch_rounds = rounds.warm + rounds.timed * LAUNCH_ROUNDS_PER;
    for round in 0..launch_rounds {
        let keep = round >= rounds.warm;
        let mut times = [0.0; 4];
        // The four paths in a rotating order, so none always runs first after the sync.
        for i in 0..4 {
            let path = (round + i) % 4;
            bind(shim)?;
            let t = Instant::now();
            match path {
                0 => {
                    for _ in 0..BATCH {
                        // SAFETY: `args` points to the kernel's three parameters (two addresses
                        // of live 128-byte pages, one u32); the kernel touches 32 floats of each.
                        unsafe {
                            launch_raw(tiny.cu_function(), dims, stream.cu_stream(), &mut args)?
                        };
                    }
                }
                1 => {
                    for _ in 0..BATCH {
                        // SAFETY: both spans are live pages of this shim, of the sizes given;
                        // the kernel touches 32 floats of each.
                        unsafe { shim.launch(&stream, &tiny, dims, &spans, &kparams)? };
                    }
                }
                2 => {
                    for _ in 0..BATCH {
                        cmd.launch(Launch {
                            kernel: &tiny,
                            dims,
                            inputs: &[&a],
                            outputs: &[&b],
                            params: &kparams,
                        })?;
                    }
                }
                _ => {
                    for _ in 0..BATCH {
                        cmd.launch(Launch {
                            kernel: &bare,
                            dims,
                            inputs: &[],
                            outputs: &[],
                            params: &bare_params,
                        })?;
                    }
                }
            }
            times[path] = micros(t, BATCH);
            if path >= 2 {
                cmd.sync()?.wait()?;
            } else {
                sync(&stream)?;
            }
        }
        if keep {
            raw_l.push(times[0]);
            shim_l.push(times[1]);
            ours_l.push(times[2]);
            bare_l.push(times[3]);
            ratio_l.push(times[2] / times[0]);
            bare_ratio.push(times[3] / times[0]);
        }
        // The fence rows every LAUNCH_ROUNDS_PER-th round (so their warm-up is the first such
        // round among the launch rows' warm-up rounds).
        if round % LAUNCH_ROUNDS_PER != 0 {
            continue;
        }
        // Fences on idle streams.
        bind(shim)?;
        let t = Instant::now();
        for _ in 0..BATCH {
            // SAFETY: both handles are alive.
            cu("cuEventRecord", unsafe {
                sys::cuEventRecord(event, stream.cu_stream())
            })?;
        }
        let rf = micros(t, BATCH);
        sync(&stream)?;
        let t = Instant::now();
        for _ in 0..BATCH {
            black_box(shim.record_event(&stream)?);
        }
        let sf = micros(t, BATCH);
        sync(&stream)?;
        let t = Instant::now();
        for _ in 0..BATCH {
            black_box(cmd.sync()?);
        }
        let of = micros(t, BATCH);
        cmd.sync()?.wait()?;
        if keep {
            raw_f.push(rf);
            shim_f.push(sf);
            ours_f.push(of);
        }
    }
    // SAFETY: the event was created above and no stream waits on it.
    cu("cuEventDestroy", unsafe { sys::cuEventDestroy_v2(event) })?;
    sync(&stream)?;
    // SAFETY: the stream was synchronised after the last launch that used the pages.
    unsafe {
        shim.device_free(pa);
        shim.device_free(pb);
    }

    let (r, s, o) = (median(&raw_l), median(&shim_l), median(&ours_l));
    let paired = median(&ratio_l);
    println!("## Launch enqueue: one tiny kernel (1 block x 32 threads, 3 parameters)\n");
    println!(
        "{BATCH} launches per round and path, host time of the enqueue loop (synchronised after \
         it), the four paths in a rotating order; median of {} rounds after {} warm-up rounds. \
         The target's ratio is the median of each round's `Command::launch` / raw (paired in \
         time: {paired:.3}, p25–p75 {}); the ratio of the medians is beside it.\n",
        raw_l.len(),
        rounds.warm,
        spread(&ratio_l)
    );
    println!("| path | µs per launch | p25–p75 of rounds | vs raw cuLaunchKernel | target |");
    println!("|---|---:|---:|---:|---|");
    println!(
        "| raw `cuLaunchKernel` | {r:.3} | {} | 1.00 | |",
        spread(&raw_l)
    );
    println!(
        "| `Shim::launch` (CudaShim) | {s:.3} | {} | {:.2} | |",
        spread(&shim_l),
        s / r
    );
    println!(
        "| `Command::launch` (2 buffers) | {o:.3} | {} | {paired:.3} paired ({:.3} of medians) | ≤ 1.03 (issue 16; 1.10 before): {} |",
        spread(&ours_l),
        o / r,
        met(paired <= 1.03)
    );
    println!(
        "| `Command::launch` (no buffer: the fixed part) | {:.3} | {} | {:.3} paired | |",
        median(&bare_l),
        spread(&bare_l),
        median(&bare_ratio)
    );
    let (r, s, o) = (median(&raw_f), median(&shim_f), median(&ours_f));
    println!(
        "\n## Fence: recording an event on an idle stream (median of {} rounds after {})\n",
        raw_f.len(),
        (0..rounds.warm)
            .filter(|r| r % LAUNCH_ROUNDS_PER == 0)
            .count()
    );
    println!("| path | µs per fence | p25–p75 of rounds | over raw, µs | vs raw | target |");
    println!("|---|---:|---:|---:|---:|---|");
    println!(
        "| raw `cuEventRecord` (one `CU_EVENT_DISABLE_TIMING` event) | {r:.3} | {} | 0 | 1.00 | |",
        spread(&raw_f)
    );
    println!(
        "| `Shim::record_event` (pooled event, dropped) | {s:.3} | {} | {:.3} | {:.2} | ≤ 0.25 µs over raw: {} |",
        spread(&shim_f),
        s - r,
        s / r,
        met(s - r <= 0.25)
    );
    println!(
        "| `Command::sync` enqueue (future dropped) | {o:.3} | {} | {:.3} | {:.2} | |",
        spread(&ours_f),
        o - r,
        o / r
    );
    println!();
    Ok(())
}

/// The cuBLAS status as a result naming the call.
fn blas_ok(call: &'static str, s: cublas_sys::cublasStatus_t) -> Res<()> {
    if s == cublas_sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(format!("{call} failed: {s:?}").into())
    }
}

/// A raw cuBLAS handle of the benchmark's own, destroyed when dropped.
struct RawBlas(cublas_sys::cublasHandle_t);

impl Drop for RawBlas {
    fn drop(&mut self) {
        // SAFETY: created by `cublasCreate` below and destroyed once, here.
        let _ = unsafe { cublas_sys::cublasDestroy_v2(self.0) };
    }
}

/// The direct cuBLAS call of `g` (f32: `cublasSgemm`; f16: `cublasGemmEx` with fp32 compute)
/// on `h` with A, B and C at those addresses.
///
/// # Safety
///
/// The handle is alive with its stream and workspace set; A, B and C are live device memory
/// holding the matrices `g` describes.
unsafe fn gemm_direct(
    h: cublas_sys::cublasHandle_t,
    g: &Gemm,
    a: u64,
    b: u64,
    c: u64,
) -> cublas_sys::cublasStatus_t {
    let n = cublas_sys::cublasOperation_t::CUBLAS_OP_N;
    let (m, nn, k) = (g.m as i32, g.n as i32, g.k as i32);
    let (alpha, beta) = (g.alpha, g.beta);
    match g.dtype {
        // SAFETY: the caller's contract.
        GemmType::F32 => unsafe {
            cublas_sys::cublasSgemm_v2(
                h,
                n,
                n,
                m,
                nn,
                k,
                &alpha,
                a as *const f32,
                g.lda as i32,
                b as *const f32,
                g.ldb as i32,
                &beta,
                c as *mut f32,
                g.ldc as i32,
            )
        },
        // SAFETY: the caller's contract; with fp32 compute alpha and beta are floats.
        GemmType::F16 => unsafe {
            let f16 = cublas_sys::cudaDataType::CUDA_R_16F;
            cublas_sys::cublasGemmEx(
                h,
                n,
                n,
                m,
                nn,
                k,
                (&raw const alpha).cast(),
                a as *const c_void,
                f16,
                g.lda as i32,
                b as *const c_void,
                f16,
                g.ldb as i32,
                (&raw const beta).cast(),
                c as *mut c_void,
                f16,
                g.ldc as i32,
                cublas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        },
    }
}

/// Host time of a small cuBLAS GEMM through library work against the direct cuBLAS call, on
/// the same CUDA stream (created here, borrowed by the devcmd device), in the same rounds.
fn library(shim: &CudaShim, rounds: Rounds) -> Res<()> {
    const BATCH: usize = 256;
    const N: u32 = 64;
    let blas = match Cublas::new(shim) {
        Ok(b) => b,
        Err(e) => {
            println!("## Library work: cuBLAS GEMM enqueue\n\nnot run: {e}\n");
            return Ok(());
        }
    };
    bind(shim)?;
    let mut raw = ptr::null_mut();
    // SAFETY: the pointer is valid for one write; the context is current.
    cu("cuStreamCreate", unsafe {
        sys::cuStreamCreate(&mut raw, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
    })?;
    // More rounds than the other sections: the difference sought (0.2 µs) is a few percent of a
    // call, about the rounds' spread.
    let rounds = Rounds {
        warm: 3,
        timed: rounds.timed * 3,
    };
    let result = library_on(shim, &blas, raw, rounds, BATCH, N);
    bind(shim)?;
    // SAFETY: the device that borrowed the stream was dropped inside `library_on`, and the
    // stream was synchronised there; nothing else uses it.
    unsafe {
        sys::cuStreamSynchronize(raw);
        sys::cuStreamDestroy_v2(raw);
    }
    result
}

fn library_on(
    shim: &CudaShim,
    blas: &Cublas,
    raw: sys::CUstream,
    rounds: Rounds,
    batch: usize,
    n: u32,
) -> Res<()> {
    let mut device = Device::new(shim.clone(), DeviceConfig::default());
    // SAFETY: `raw` is a live stream of the shim's context, destroyed by the caller after this
    // device is dropped.
    unsafe { device.borrow_stream(S, &raw)? };
    // The direct path's handle, stream and workspace (the size Cublas gives its own).
    let mut h = ptr::null_mut();
    bind(shim)?;
    // SAFETY: `Cublas::new` loaded and checked the library; the pointer is valid for one write.
    blas_ok("cublasCreate", unsafe {
        cublas_sys::cublasCreate_v2(&mut h)
    })?;
    let direct = RawBlas(h);
    let ws = shim.device_alloc(blas.workspace_bytes())?;
    // SAFETY: the handle and the stream are alive; the workspace is a live page of that size.
    unsafe {
        blas_ok(
            "cublasSetStream",
            cublas_sys::cublasSetStream_v2(direct.0, raw.cast()),
        )?;
        blas_ok(
            "cublasSetWorkspace",
            cublas_sys::cublasSetWorkspace_v2(
                direct.0,
                shim.device_page_addr(&ws).0 as *mut c_void,
                blas.workspace_bytes() as usize,
            ),
        )?;
    }
    println!(
        "## Library work: cuBLAS GEMM enqueue ({n} x {n} x {n}, {})\n",
        blas.library()
    );
    println!(
        "{batch} GEMMs per round on one CUDA stream (created here; the devcmd device borrows it), \
         host time of the enqueue loop (synchronised after it); median of {} rounds after {} \
         warm-up rounds, the four paths in each round, in a rotating order. Direct: the benchmark's own cuBLAS \
         handle (stream and {} MiB workspace set once). `Command::library`: the same direct call \
         made inside library work (reads A and B, writes C): the core's cost alone. \
         `Command::library`, 4 buffers: the same with a fourth buffer written (as `Cublas::gemm` \
         declares its workspace). `Cublas::gemm`: devcmd-cuda's wrapper (shape check, the \
         stream's handle, its workspace declared as a fourth buffer). \"Over direct\": the \
         median of each round's difference to the direct loop of the same round.\n",
        rounds.timed * LIBRARY_ROUNDS_PER,
        rounds.warm,
        blas.workspace_bytes() >> 20
    );
    println!(
        "| GEMM | direct cuBLAS µs | p25–p75 | `Command::library`, 3 buffers, µs | over direct | `Command::library`, 4 buffers, µs | over direct | `Cublas::gemm` µs | p25–p75 | over direct, µs | ratio | target |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    for dtype in [GemmType::F32, GemmType::F16] {
        let g = Gemm::packed(dtype, n, n, n);
        let elems = (n * n) as usize;
        let bytes = |v: f32| -> Vec<u8> {
            match dtype {
                GemmType::F32 => (0..elems).flat_map(|_| v.to_ne_bytes()).collect(),
                // 0.5 and 0.25 in f16.
                GemmType::F16 => (0..elems)
                    .flat_map(|_| if v == 0.5 { 0x3800u16 } else { 0x3400 }.to_ne_bytes())
                    .collect(),
            }
        };
        let mut cmd = device.command(S)?;
        let a = cmd.create(&bytes(0.5))?;
        let b = cmd.create(&bytes(0.25))?;
        let c = cmd.empty(u64::from(n * n) * dtype.bytes())?;
        let pa = cmd.managed_resource(&a)?;
        let pb = cmd.managed_resource(&b)?;
        let pc = cmd.managed_resource(&c)?;
        let (ra, rb, rc) = (pa.resource.addr.0, pb.resource.addr.0, pc.resource.addr.0);
        blas.prepare(&mut cmd)?;
        cmd.sync()?.wait()?;
        let extra = cmd.empty(blas.workspace_bytes())?;
        let mut times = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
        // Each round's difference to the direct call, per path: paired in time, so the host's
        // drift between rounds cancels; the targets read their medians.
        let mut over = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
        let library_rounds = rounds.warm + rounds.timed * LIBRARY_ROUNDS_PER;
        for round in 0..library_rounds {
            // The paths in a rotating order, so none always runs first.
            for i in 0..4 {
                let path = (round + i) % 4;
                let t = Instant::now();
                match path {
                    0 => {
                        bind(shim)?;
                        let t = Instant::now();
                        for _ in 0..batch {
                            // SAFETY: the handle's stream and workspace are set; A, B and C are
                            // live allocations of the device, n x n each.
                            blas_ok("gemm", unsafe { gemm_direct(direct.0, &g, ra, rb, rc) })?;
                        }
                        times[0].push(micros(t, batch));
                    }
                    1 | 3 => {
                        let three: [&devcmd::Handle; 1] = [&c];
                        let four: [&devcmd::Handle; 2] = [&c, &extra];
                        let writes: &[&devcmd::Handle] = if path == 1 { &three } else { &four };
                        for _ in 0..batch {
                            let ab = [&a, &b];
                            let work = LibraryWork::new("gemm", &ab, writes);
                            // SAFETY: the call enqueues one GEMM on the stream it is given (the
                            // same CUDA stream as the handle's), reading A and B and writing C,
                            // the declared ranges.
                            unsafe {
                                cmd.library(work, |_, spans| {
                                    let s = gemm_direct(
                                        direct.0,
                                        &g,
                                        spans[0].addr.0,
                                        spans[1].addr.0,
                                        spans[2].addr.0,
                                    );
                                    if s == cublas_sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
                                        Ok(())
                                    } else {
                                        Err(devcmd::LibraryError::new(s as i64, format!("{s:?}")))
                                    }
                                })?
                            };
                        }
                        times[path].push(micros(t, batch));
                    }
                    _ => {
                        for _ in 0..batch {
                            blas.gemm(&mut cmd, g, &a, &b, &c)?;
                        }
                        times[2].push(micros(t, batch));
                    }
                }
                cmd.sync()?.wait()?;
            }
            if round < rounds.warm {
                times.iter_mut().for_each(Vec::clear);
            } else {
                let direct = times[0][times[0].len() - 1];
                for (path, t) in times.iter().enumerate() {
                    over[path].push(t[t.len() - 1] - direct);
                }
            }
        }
        let [dir, lib, ours, lib4] = times;
        let [_, lib_over, ours_over, lib4_over] = over.map(|v| median(&v));
        // Every element of C is 64 * 0.5 * 0.25 = 8.
        let back = cmd.read_async(&[ReadRequest::whole(&c)])?.wait()?;
        let eight = match dtype {
            GemmType::F32 => 8f32.to_ne_bytes().to_vec(),
            GemmType::F16 => 0x4800u16.to_ne_bytes().to_vec(),
        };
        if back[0]
            .as_slice()
            .chunks_exact(eight.len())
            .any(|e| e != eight.as_slice())
        {
            return Err(format!("{dtype:?} GEMM: C is not all 8.0").into());
        }
        let (d, l, l4, o) = (median(&dir), median(&lib), median(&lib4), median(&ours));
        println!(
            "| {dtype:?} | {d:.3} | {} | {l:.3} | {lib_over:+.3} | {l4:.3} | {lib4_over:+.3} | {o:.3} | {} | {ours_over:+.3} | {:.3} | ≤ 0.2 µs over direct: library work {}, `Cublas::gemm` {} |",
            spread(&dir),
            spread(&ours),
            o / d,
            met(lib_over <= 0.2),
            met(ours_over <= 0.2)
        );
        drop((pa, pb, pc));
    }
    println!();
    device.command(S)?.sync()?.wait()?;
    drop(device);
    bind(shim)?;
    // SAFETY: the stream is synchronised: nothing uses the workspace any more.
    unsafe {
        sys::cuStreamSynchronize(raw);
        shim.device_free(ws);
    }
    Ok(())
}

fn met(yes: bool) -> &'static str {
    if yes { "met" } else { "**missed**" }
}

/// Reserve + drop against the driver's allocators.
fn reserve(shim: &CudaShim, rounds: Rounds) -> Res<()> {
    const OPS: usize = 20_000;
    const SYNC_OPS: usize = 500;
    let mut device = Device::new(shim.clone(), DeviceConfig::default());
    let stream = shim.create_stream()?;
    let has_async = driver_has("cuMemAllocAsync") && driver_has("cuMemFreeAsync");
    println!(
        "## Reserve + drop, ns per pair (steady state; median of {} rounds after {})\n",
        rounds.timed, rounds.warm
    );
    println!(
        "| size | `Command::empty` + drop | `cuMemAllocAsync` + `cuMemFreeAsync` (stream) | ratio | `cuMemAlloc` + `cuMemFree` | ratio |"
    );
    println!("|---:|---:|---:|---:|---:|---:|");
    for size in [4usize << 10, 1 << 20] {
        let (mut ours, mut asy, mut syn) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..rounds.all() {
            let mut cmd = device.command(S)?;
            let t = Instant::now();
            for _ in 0..OPS {
                black_box(cmd.empty(size as u64)?);
            }
            let o = micros(t, OPS) * 1e3;
            let a = if has_async {
                bind(shim)?;
                let t = Instant::now();
                for _ in 0..OPS {
                    let mut p = 0;
                    // SAFETY: the symbols exist (checked above); the pointer is valid for one
                    // write; the allocation is freed on the same stream right after.
                    unsafe {
                        cu(
                            "cuMemAllocAsync",
                            sys::cuMemAllocAsync(&mut p, size, stream.cu_stream()),
                        )?;
                        cu(
                            "cuMemFreeAsync",
                            sys::cuMemFreeAsync(black_box(p), stream.cu_stream()),
                        )?;
                    }
                }
                let a = micros(t, OPS) * 1e3;
                sync(&stream)?;
                a
            } else {
                f64::NAN
            };
            bind(shim)?;
            let t = Instant::now();
            for _ in 0..SYNC_OPS {
                let mut p = 0;
                // SAFETY: the pointer is valid for one write; the allocation is freed right
                // after and never used.
                unsafe {
                    cu("cuMemAlloc", sys::cuMemAlloc_v2(&mut p, size))?;
                    cu("cuMemFree", sys::cuMemFree_v2(black_box(p)))?;
                }
            }
            let s = micros(t, SYNC_OPS) * 1e3;
            if round >= rounds.warm {
                ours.push(o);
                asy.push(a);
                syn.push(s);
            }
        }
        let (o, a, s) = (median(&ours), median(&asy), median(&syn));
        let async_cells = if has_async {
            format!("{a:.1} | {:.2}", o / a)
        } else {
            "n/a: the driver lacks cuMemAllocAsync | —".to_owned()
        };
        println!(
            "| {} | {o:.1} | {async_cells} | {s:.1} | {:.3} |",
            human(size),
            o / s
        );
    }
    println!();
    Ok(())
}

/// The edge host's serving loop against a plain driver program doing the same work.
fn edge_host(gpu: &cuda_device::Gpu, rounds: Rounds, quick: bool) -> Res<()> {
    const SEED: u64 = 7;
    const BATCH_SIZE: usize = 32;
    let batches = if quick { 500 } else { 2000 };
    let weights = model::seeded_weights(SEED);
    let mut device = Device::new(gpu.shim.clone(), DeviceConfig::default());
    let w = serve::load_weights(&mut device, HostWeights::Seeded(weights.clone()), false)?;
    let mut one = RawHost::new(&gpu.shim, &gpu.kernels, &weights, BATCH_SIZE, false)?;
    let mut two = RawHost::new(&gpu.shim, &gpu.kernels, &weights, BATCH_SIZE, true)?;
    let warm = Plan {
        batches: 64,
        batch_size: BATCH_SIZE,
        seed: SEED,
        verify: true,
        progress: false,
    };
    let timed = Plan {
        batches,
        verify: false,
        ..warm
    };
    let (mut ours, mut plain1, mut plain2) = (Vec::new(), Vec::new(), Vec::new());
    let mut mismatches = [0; 3];
    let warm_rounds = rounds.warm.max(1);
    for round in 0..warm_rounds + rounds.timed.min(7) {
        if round < warm_rounds {
            mismatches[0] += serve::serve(&warm, &mut device, &gpu.kernels, &w)?.mismatches;
            mismatches[1] += one.serve(&warm)?.mismatches;
            mismatches[2] += two.serve(&warm)?.mismatches;
            continue;
        }
        ours.push(serve::serve(&timed, &mut device, &gpu.kernels, &w)?.per_second());
        plain1.push(one.serve(&timed)?.per_second());
        plain2.push(two.serve(&timed)?.per_second());
    }
    if mismatches != [0; 3] {
        return Err(format!(
            "results differ from the host reference: {} outputs through devcmd, {} and {} through \
             the plain driver programs (one stream, two streams)",
            mismatches[0], mismatches[1], mismatches[2]
        )
        .into());
    }
    let (o, p1, p2) = (median(&ours), median(&plain1), median(&plain2));
    println!(
        "## Edge host: requests/s on the GPU (median of {} runs after {} verified warm-up runs)\n",
        plain1.len(),
        warm_rounds
    );
    println!(
        "{batches} batches x {BATCH_SIZE} requests of the 3-layer MLP ({}-{}-{}-{}), {IN_FLIGHT} \
         batches in flight, results not verified in the timed runs (every result of the {} \
         warm-up runs of 64 batches was, in all three programs: 0 mismatches). devcmd: the edge \
         host's loop (upload on a copy stream, 6 launches on a compute stream ordered after it \
         on the device, `read_owned`; 7 reservations and a pinned staging buffer per batch). \
         Plain: the same kernels, sizes and launch geometry with raw calls (input written into \
         a pinned page, `cuMemcpyHtoDAsync`, 6 `cuLaunchKernel`, `cuMemcpyDtoHAsync`, \
         `cuEventRecord`), buffers allocated once; on one stream, or with the upload on a \
         second stream and `cuEventRecord` + `cuStreamWaitEvent` as devcmd does.\n",
        INPUT, LAYERS[0].1, LAYERS[1].1, CLASSES, warm_rounds
    );
    println!(
        "| program | requests/s | p25–p75 | µs per batch | vs plain, two streams | vs plain, one stream |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    let per_batch = |rps: f64| BATCH_SIZE as f64 / rps * 1e6;
    let thousands = |v: &[f64]| {
        let k: Vec<f64> = v.iter().map(|x| x / 1e3).collect();
        format!("{} k", spread(&k))
    };
    for (name, v, x) in [
        ("plain driver program, two streams", &plain2, p2),
        ("plain driver program, one stream", &plain1, p1),
        ("devcmd edge host loop", &ours, o),
    ] {
        println!(
            "| {name} | {x:.0} | {} | {:.1} | {:.2} | {:.2} |",
            thousands(v),
            per_batch(x),
            x / p2,
            x / p1
        );
    }
    println!();
    Ok(())
}

/// One batch's buffers of the plain driver program.
struct Slot {
    input: devcmd_cuda::CudaHostPage,
    output: devcmd_cuda::CudaHostPage,
    /// The input, then each layer's pre-activation and output.
    bufs: Vec<devcmd_cuda::CudaDevicePage>,
    /// Recorded after the batch's readback (on the compute stream).
    event: sys::CUevent,
    /// Recorded after the batch's upload (on the copy stream, with two streams).
    uploaded: sys::CUevent,
    pending: Option<(usize, Vec<f32>)>,
}

/// The serving loop written directly against the driver: the comparison for the edge host.
struct RawHost<'a> {
    shim: &'a CudaShim,
    kernels: &'a model::Kernels<CudaKernel>,
    reference: &'a [Vec<f32>],
    stream: CudaStream,
    /// The stream uploads run on, when not `stream`.
    copy: Option<CudaStream>,
    /// The weights' page (taken by `Drop`) and its address.
    weights: Option<devcmd_cuda::CudaDevicePage>,
    base: u64,
    offsets: Vec<u64>,
    slots: Vec<Slot>,
    m: usize,
}

impl<'a> RawHost<'a> {
    fn new(
        shim: &'a CudaShim,
        kernels: &'a model::Kernels<CudaKernel>,
        reference: &'a [Vec<f32>],
        m: usize,
        two_streams: bool,
    ) -> Res<Self> {
        let stream = shim.create_stream()?;
        let copy = if two_streams {
            Some(shim.create_stream()?)
        } else {
            None
        };
        let bytes: Vec<u8> = reference.iter().flat_map(|w| to_bytes(w)).collect();
        let weights = shim.device_alloc(bytes.len() as u64)?;
        bind(shim)?;
        // SAFETY: the page holds `bytes.len()` bytes; the copy is synchronous.
        cu("cuMemcpyHtoD", unsafe {
            sys::cuMemcpyHtoD_v2(
                shim.device_page_addr(&weights).0,
                bytes.as_ptr().cast(),
                bytes.len(),
            )
        })?;
        let mut offsets = Vec::new();
        let mut at = 0u64;
        for t in reference {
            offsets.push(at);
            at += (t.len() * 4) as u64;
        }
        let mut slots = Vec::new();
        for _ in 0..IN_FLIGHT {
            let mut bufs = vec![shim.device_alloc((m * INPUT * 4) as u64)?];
            for &(_, n) in &LAYERS {
                bufs.push(shim.device_alloc((m * n * 4) as u64)?);
                bufs.push(shim.device_alloc((m * n * 4) as u64)?);
            }
            let (mut event, mut uploaded) = (ptr::null_mut(), ptr::null_mut());
            bind(shim)?;
            for e in [&mut event, &mut uploaded] {
                // SAFETY: the pointer is valid for one write; the context is current.
                cu("cuEventCreate", unsafe {
                    sys::cuEventCreate(e, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32)
                })?;
            }
            slots.push(Slot {
                input: shim.host_alloc_pinned(m * INPUT * 4)?,
                output: shim.host_alloc_pinned(m * CLASSES * 4)?,
                bufs,
                event,
                uploaded,
                pending: None,
            });
        }
        let base = shim.device_page_addr(&weights).0;
        Ok(Self {
            shim,
            kernels,
            reference,
            stream,
            copy,
            weights: Some(weights),
            base,
            offsets,
            slots,
            m,
        })
    }

    fn serve(&mut self, plan: &Plan) -> Res<Served> {
        let m = self.m;
        let mut inputs = Inputs::new(plan.seed, m);
        let mut mismatches = 0;
        let started = Instant::now();
        bind(self.shim)?;
        for batch in 0..plan.batches {
            let input = inputs.next_batch();
            self.enqueue(batch % IN_FLIGHT, &input)?;
            self.slots[batch % IN_FLIGHT].pending = Some((batch, input));
            if batch + 1 >= IN_FLIGHT {
                mismatches += self.finish((batch + 1) % IN_FLIGHT, plan.verify)?;
            }
        }
        for i in 0..IN_FLIGHT {
            mismatches += self.finish((plan.batches + i) % IN_FLIGHT, plan.verify)?;
        }
        Ok(Served {
            requests: (plan.batches * m) as u128,
            elapsed: started.elapsed(),
            mismatches,
        })
    }

    /// Upload, 6 launches, readback and a fence for one batch in `slot`.
    fn enqueue(&mut self, slot: usize, input: &[f32]) -> Res<()> {
        let m = self.m;
        let s = &self.slots[slot];
        let shim = self.shim;
        let stream = self.stream.cu_stream();
        let pin_in = shim.host_page_ptr(&s.input).as_ptr();
        // SAFETY: the pinned page holds `m * INPUT * 4` bytes, and no copy reads it now (its
        // last batch finished before the slot was reused).
        put_floats(
            unsafe { std::slice::from_raw_parts_mut(pin_in, m * INPUT * 4) },
            input,
        );
        let addr = |i: usize| shim.device_page_addr(&s.bufs[i]).0;
        let base = self.base;
        let upload = self.copy.as_ref().map_or(stream, CudaStream::cu_stream);
        // SAFETY: the ranges hold the bytes copied; the page stays untouched until the fence.
        cu("cuMemcpyHtoDAsync", unsafe {
            sys::cuMemcpyHtoDAsync_v2(addr(0), pin_in.cast(), m * INPUT * 4, upload)
        })?;
        if upload != stream {
            // SAFETY: the handles are alive; flags 0 is `CU_EVENT_WAIT_DEFAULT`.
            unsafe {
                cu("cuEventRecord", sys::cuEventRecord(s.uploaded, upload))?;
                cu(
                    "cuStreamWaitEvent",
                    sys::cuStreamWaitEvent(stream, s.uploaded, 0),
                )?;
            }
        }
        let mut act = addr(0);
        for (l, &(k, n)) in LAYERS.iter().enumerate() {
            let (pre, out) = (addr(1 + 2 * l), addr(2 + 2 * l));
            let (mut p_out, mut p_a, mut p_b) = (pre, act, base + self.offsets[2 * l]);
            let (mut sm, mut sk, mut sn) = (m as u32, k as u32, n as u32);
            let mut args: [*mut c_void; 6] = [
                (&raw mut p_out).cast(),
                (&raw mut p_a).cast(),
                (&raw mut p_b).cast(),
                (&raw mut sm).cast(),
                (&raw mut sk).cast(),
                (&raw mut sn).cast(),
            ];
            // SAFETY: the kernel's six parameters, its buffers live pages of the sizes it
            // reads and writes (m×k, k×n, m×n floats).
            unsafe {
                launch_raw(
                    self.kernels.matmul.cu_function(),
                    matmul_dims(m, n),
                    stream,
                    &mut args,
                )?
            };
            let last = l + 1 == LAYERS.len();
            let (mut q_out, mut q_x, mut q_b) = (out, pre, base + self.offsets[2 * l + 1]);
            let (mut qm, mut qn) = (m as u32, n as u32);
            let mut args: [*mut c_void; 5] = [
                (&raw mut q_out).cast(),
                (&raw mut q_x).cast(),
                (&raw mut q_b).cast(),
                (&raw mut qm).cast(),
                (&raw mut qn).cast(),
            ];
            let (f, dims) = if last {
                (
                    self.kernels.bias_softmax.cu_function(),
                    bias_softmax_dims(m),
                )
            } else {
                (self.kernels.bias_relu.cu_function(), bias_relu_dims(m, n))
            };
            // SAFETY: the kernel's five parameters, its buffers live pages of m×n and n floats.
            unsafe { launch_raw(f, dims, stream, &mut args)? };
            act = out;
        }
        let pin_out = shim.host_page_ptr(&s.output).as_ptr();
        // SAFETY: the pinned page holds `m * CLASSES * 4` bytes, read only after the fence.
        cu("cuMemcpyDtoHAsync", unsafe {
            sys::cuMemcpyDtoHAsync_v2(pin_out.cast(), act, m * CLASSES * 4, stream)
        })?;
        // SAFETY: both handles are alive.
        cu("cuEventRecord", unsafe {
            sys::cuEventRecord(s.event, stream)
        })
    }

    /// Waits for the batch in `slot`, if any, and counts its mismatches when `verify`.
    fn finish(&mut self, slot: usize, verify: bool) -> Res<usize> {
        let s = &mut self.slots[slot];
        let Some((batch, input)) = s.pending.take() else {
            return Ok(0);
        };
        // SAFETY: the event is alive (destroyed only in `Drop`).
        cu("cuEventSynchronize", unsafe {
            sys::cuEventSynchronize(s.event)
        })?;
        if !verify {
            return Ok(0);
        }
        let m = self.m;
        // SAFETY: the copy into the page completed (the fence above); nothing writes it now.
        let out = unsafe {
            std::slice::from_raw_parts(self.shim.host_page_ptr(&s.output).as_ptr(), m * CLASSES * 4)
        };
        let want = model::reference(self.reference, &input, m);
        let bad = verify::compare(&from_bytes(out), &want)
            .map_err(|e| format!("plain program, batch {batch}: {e}"))?;
        Ok(bad.count)
    }
}

impl Drop for RawHost<'_> {
    fn drop(&mut self) {
        let _ = sync(&self.stream);
        if let Some(copy) = &self.copy {
            let _ = sync(copy);
        }
        let _ = bind(self.shim);
        for s in self.slots.drain(..) {
            // SAFETY: the stream was synchronised: no copy or kernel uses the slot any more.
            unsafe {
                let _ = sys::cuEventDestroy_v2(s.event);
                let _ = sys::cuEventDestroy_v2(s.uploaded);
                self.shim.host_free_pinned(s.input);
                self.shim.host_free_pinned(s.output);
                for b in s.bufs {
                    self.shim.device_free(b);
                }
            }
        }
        if let Some(weights) = self.weights.take() {
            // SAFETY: as above.
            unsafe { self.shim.device_free(weights) };
        }
    }
}
