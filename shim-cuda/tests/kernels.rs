//! GPU tests of kernels and graphs: NVRTC compiles, PTX and cubin loads, launches through
//! [`Shim::launch`], the parameter check, and graphs by stream capture. Like `gpu.rs`, they run
//! for real where a CUDA driver and device are present and print a visible `skipped: ...` line
//! (straight to stderr) and pass where none is; a compile without NVRTC skips the same way.
//!
//! A kernel that traps loses its context for the whole process, so that test has a binary of its
//! own (`trap.rs`).

mod common;

use common::{bytes_of, compile, download, gpu, page, say, upload, wait};
use devcmd::{CopyLayout, DeviceSpan, Dim3, Fault, HostMemory, KernelParam, LaunchDims, Shim};
use devcmd_cuda::{CudaKernelError, ImageFormat, PARAM_INFO_BINDINGS, status};
use std::time::Instant;

const VADD: &str = r#"
extern "C" __global__ void vadd(float* out, const float* a, const float* b,
                                unsigned long long n) {
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}
"#;

/// Hand-written PTX (no NVRTC involved): `fill(u32* out, u32 value, u64 n)`.
const FILL_PTX: &str = r#"
.version 7.4
.target sm_75
.address_size 64

.visible .entry fill(
    .param .u64 out,
    .param .u32 value,
    .param .u64 n
)
{
    .reg .pred %p;
    .reg .b32 %r<5>;
    .reg .b64 %rd<6>;

    ld.param.u64 %rd1, [out];
    ld.param.u32 %r1, [value];
    ld.param.u64 %rd2, [n];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mul.wide.u32 %rd3, %r2, %r3;
    cvt.u64.u32 %rd4, %r4;
    add.u64 %rd3, %rd3, %rd4;
    setp.ge.u64 %p, %rd3, %rd2;
    @%p bra DONE;
    cvta.to.global.u64 %rd5, %rd1;
    shl.b64 %rd4, %rd3, 2;
    add.u64 %rd5, %rd5, %rd4;
    st.global.u32 [%rd5], %r1;
DONE:
    ret;
}
"#;

/// A one-dimensional launch of `n` threads in blocks of 256.
fn linear(n: usize) -> LaunchDims {
    LaunchDims {
        grid: Dim3::linear(n.div_ceil(256) as u32),
        block: Dim3::linear(256),
        shared_bytes: 0,
    }
}

fn span(addr: devcmd::DeviceAddr, bytes: usize) -> DeviceSpan {
    DeviceSpan {
        addr,
        len: bytes as u64,
    }
}

#[test]
fn vadd_compiled_with_nvrtc_runs_on_a_million_floats() {
    let test = "vadd_compiled_with_nvrtc_runs_on_a_million_floats";
    let Some(shim) = gpu(test) else { return };
    let started = Instant::now();
    let Some(module) = compile(&shim, VADD, &[], test) else {
        return;
    };
    let compile_time = started.elapsed();
    let kernel = module.kernel("vadd").unwrap();
    say(&format!(
        "{} (compute capability {:?}), NVRTC {:?}: vadd compiled to a {} in {compile_time:?} \
         with {:?}; parameter sizes {:?}",
        shim.name(),
        shim.compute_capability(),
        devcmd_cuda::CudaShim::nvrtc().map(|n| n.1),
        module.format(),
        module.compile_options(),
        kernel.param_sizes()
    ));
    let (cc_major, cc_minor) = shim.compute_capability();
    let own = format!("--gpu-architecture=sm_{cc_major}{cc_minor}");
    if module.compile_options().contains(&own) {
        assert_eq!(module.format(), ImageFormat::Cubin);
    }
    if PARAM_INFO_BINDINGS {
        assert_eq!(kernel.param_sizes(), [8usize, 8, 8, 8]);
    }

    let n = 1_000_003usize;
    let bytes = n * 4;
    let a: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
    let b: Vec<f32> = (0..n).map(|i| 1000.0 - i as f32).collect();
    let stream = shim.create_stream().unwrap();
    let (out_page, out) = page(&shim, bytes);
    let (a_page, a_addr) = page(&shim, bytes);
    let (b_page, b_addr) = page(&shim, bytes);
    upload(&shim, &stream, &a, a_addr);
    upload(&shim, &stream, &b, b_addr);
    let buffers = [span(out, bytes), span(a_addr, bytes), span(b_addr, bytes)];
    let n64 = (n as u64).to_ne_bytes();
    let params = [
        KernelParam::Buffer(0),
        KernelParam::Buffer(1),
        KernelParam::Buffer(2),
        KernelParam::Scalar(&n64),
    ];
    // SAFETY: the spans are the three live pages; the kernel touches elements below `n` only.
    unsafe { shim.launch(&stream, &kernel, linear(n), &buffers, &params) }.unwrap();
    let got: Vec<f32> = download(&shim, &stream, out, n);
    for i in 0..n {
        assert_eq!(got[i], a[i] + b[i], "element {i}");
    }

    // The cost of a launch: many small ones, enqueue time and end to end.
    let small = 256u64.to_ne_bytes();
    let small_params = [
        KernelParam::Buffer(0),
        KernelParam::Buffer(1),
        KernelParam::Buffer(2),
        KernelParam::Scalar(&small),
    ];
    for _ in 0..100 {
        // SAFETY: as above, for the first 256 elements.
        unsafe { shim.launch(&stream, &kernel, linear(256), &buffers, &small_params) }.unwrap();
    }
    wait(&shim, &stream);
    let count = 10_000u32;
    let started = Instant::now();
    for _ in 0..count {
        // SAFETY: as above.
        unsafe { shim.launch(&stream, &kernel, linear(256), &buffers, &small_params) }.unwrap();
    }
    let enqueued = started.elapsed();
    wait(&shim, &stream);
    let done = started.elapsed();
    say(&format!(
        "launch of a 256-thread vadd: {:.2} µs to enqueue, {:.2} µs each end to end \
         ({count} back to back)",
        enqueued.as_secs_f64() * 1e6 / f64::from(count),
        done.as_secs_f64() * 1e6 / f64::from(count),
    ));
    // Enqueue cost alone, from an idle stream, in batches short of the launch queue's depth:
    // through the shim (bind, parameter check, parameter array) and the bare driver call.
    let batch = 200u32;
    let (mut shim_best, mut raw_best) = (f64::MAX, f64::MAX);
    let mut addrs = [out.0, a_addr.0, b_addr.0, 256u64];
    let mut raw_params: Vec<*mut std::ffi::c_void> =
        addrs.iter_mut().map(|a| (a as *mut u64).cast()).collect();
    for _ in 0..5 {
        let started = Instant::now();
        for _ in 0..batch {
            // SAFETY: as above.
            unsafe { shim.launch(&stream, &kernel, linear(256), &buffers, &small_params) }.unwrap();
        }
        shim_best = shim_best.min(started.elapsed().as_secs_f64() / f64::from(batch));
        wait(&shim, &stream);
        let started = Instant::now();
        for _ in 0..batch {
            // SAFETY: the same launch through the driver itself: the context is current (the
            // shim bound it on this thread), the pointers point to the four parameters.
            let r = unsafe {
                devcmd_cuda::sys::cuLaunchKernel(
                    kernel.cu_function(),
                    1,
                    1,
                    1,
                    256,
                    1,
                    1,
                    0,
                    stream.cu_stream(),
                    raw_params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            };
            assert_eq!(r, devcmd_cuda::sys::CUresult::CUDA_SUCCESS);
        }
        raw_best = raw_best.min(started.elapsed().as_secs_f64() / f64::from(batch));
        wait(&shim, &stream);
    }
    say(&format!(
        "enqueue of one launch (best of 5 batches of {batch}): {:.2} µs through Shim::launch, \
         {:.2} µs through cuLaunchKernel itself",
        shim_best * 1e6,
        raw_best * 1e6
    ));
    let started = Instant::now();
    // SAFETY: as above.
    unsafe { shim.launch(&stream, &kernel, linear(n), &buffers, &params) }.unwrap();
    wait(&shim, &stream);
    say(&format!(
        "one vadd of {n} floats, launch to fence: {:?}",
        started.elapsed()
    ));
    // SAFETY: every launch and copy using the pages has completed.
    unsafe {
        shim.device_free(out_page);
        shim.device_free(a_page);
        shim.device_free(b_page);
    }
}

const MIX: &str = r#"
struct V3 { float x, y, z; };
extern "C" __global__ void mix(float* out, char c, short s, int i, double d, V3 v,
                               unsigned long long n) {
    out[0] = c; out[1] = s; out[2] = (float)i; out[3] = (float)d;
    out[4] = v.x; out[5] = v.y; out[6] = v.z; out[7] = (float)n;
}
"#;

#[test]
fn scalars_of_every_size_pass_in_order_and_a_size_mismatch_is_refused() {
    let test = "scalars_of_every_size_pass_in_order_and_a_size_mismatch_is_refused";
    let Some(shim) = gpu(test) else { return };
    let Some(module) = compile(&shim, MIX, &[], test) else {
        return;
    };
    let kernel = module.kernel("mix").unwrap();
    let stream = shim.create_stream().unwrap();
    let (out_page, out) = page(&shim, 8 * 4);
    let buffers = [span(out, 8 * 4)];
    let one = LaunchDims {
        grid: Dim3::linear(1),
        block: Dim3::linear(1),
        shared_bytes: 0,
    };
    let c = (-3i8).to_ne_bytes();
    let s = 300i16.to_ne_bytes();
    let i = (-70_000i32).to_ne_bytes();
    let d = 2.5f64.to_ne_bytes();
    let v = [1.5f32, -2.0, 4.25];
    let n = 7u64.to_ne_bytes();
    let right = [
        KernelParam::Buffer(0),
        KernelParam::Scalar(&c),
        KernelParam::Scalar(&s),
        KernelParam::Scalar(&i),
        KernelParam::Scalar(&d),
        KernelParam::Scalar(bytes_of(&v)),
        KernelParam::Scalar(&n),
    ];
    kernel.check_params(&right).unwrap();
    // SAFETY: the span is a live page of 8 floats, all the kernel writes.
    unsafe { shim.launch(&stream, &kernel, one, &buffers, &right) }.unwrap();
    let got: Vec<f32> = download(&shim, &stream, out, 8);
    assert_eq!(got, [-3.0, 300.0, -70_000.0, 2.5, 1.5, -2.0, 4.25, 7.0]);

    // An empty scalar is refused everywhere, sizes known or not.
    let mut empty = right;
    empty[1] = KernelParam::Scalar(&[]);
    // SAFETY: refused before the driver; nothing runs.
    let e = unsafe { shim.launch(&stream, &kernel, one, &buffers, &empty) }.unwrap_err();
    assert_eq!((e.status, e.fault), (status::PARAM_MISMATCH, Fault::Failed));

    assert_eq!(kernel.param_sizes(), [8, 1, 2, 4, 8, 12, 8]);
    let wide = 5i64.to_ne_bytes();
    let mut int_as_long = right;
    int_as_long[3] = KernelParam::Scalar(&wide);
    let mut buffer_for_int = right;
    buffer_for_int[3] = KernelParam::Buffer(0);
    let cases: [(&str, &[KernelParam<'_>]); 4] = [
        ("an int passed as 8 bytes", &int_as_long),
        ("a buffer for an int", &buffer_for_int),
        ("one parameter short", &right[..6]),
        (
            "one too many",
            &[&right[..], &[KernelParam::Scalar(&n)]].concat(),
        ),
    ];
    for (what, params) in cases {
        // SAFETY: refused before the driver; nothing runs.
        let e = unsafe { shim.launch(&stream, &kernel, one, &buffers, params) }.unwrap_err();
        assert_eq!(
            (e.status, e.fault),
            (status::PARAM_MISMATCH, Fault::Failed),
            "{what}: {e}"
        );
        let detail = kernel.check_params(params).unwrap_err();
        assert!(matches!(detail, CudaKernelError::ParamMismatch { .. }));
        say(&format!("refused ({what}): {detail}"));
    }
    let msg = kernel.check_params(&int_as_long).unwrap_err().to_string();
    assert!(
        msg.contains("parameter 3 is 4 bytes in the kernel, 8 passed"),
        "{msg}"
    );
    // The stream is untouched by the refusals.
    // SAFETY: as the first launch.
    unsafe { shim.launch(&stream, &kernel, one, &buffers, &right) }.unwrap();
    wait(&shim, &stream);
    // SAFETY: every launch using the page has completed.
    unsafe { shim.device_free(out_page) };
}

#[test]
fn three_dimensional_grids_dynamic_shared_memory_and_many_parameters() {
    let test = "three_dimensional_grids_dynamic_shared_memory_and_many_parameters";
    let Some(shim) = gpu(test) else { return };
    let rev = r#"
extern "C" __global__ void rev(unsigned* out) {
    extern __shared__ unsigned s[];
    unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    unsigned nt = blockDim.x * blockDim.y * blockDim.z;
    unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    s[t] = b * 100000u + t;
    __syncthreads();
    out[b * nt + t] = s[nt - 1 - t];
}
"#;
    // 20 parameters: past the stack array, so the launch takes its heap path.
    let names: Vec<String> = (0..20).map(|k| format!("int p{k}")).collect();
    let body: Vec<String> = (0..20).map(|k| format!("out[{k}] = p{k} * 3;")).collect();
    let many = format!(
        "extern \"C\" __global__ void many(int* out, {}) {{ {} }}",
        names.join(", "),
        body.join(" ")
    );
    let source = format!("{rev}\n{many}\n");
    let Some(module) = compile(&shim, &source, &[], test) else {
        return;
    };
    let stream = shim.create_stream().unwrap();

    let (grid, block) = (Dim3 { x: 3, y: 2, z: 2 }, Dim3 { x: 8, y: 4, z: 2 });
    let nt = 64usize;
    let total = 12 * nt;
    let (rev_page, rev_out) = page(&shim, total * 4);
    let dims = LaunchDims {
        grid,
        block,
        shared_bytes: (nt * 4) as u32,
    };
    let kernel = module.kernel("rev").unwrap();
    // SAFETY: the span is a live page of `total` u32, all the kernel writes.
    unsafe {
        shim.launch(
            &stream,
            &kernel,
            dims,
            &[span(rev_out, total * 4)],
            &[KernelParam::Buffer(0)],
        )
    }
    .unwrap();
    let got: Vec<u32> = download(&shim, &stream, rev_out, total);
    for b in 0..12 {
        for t in 0..nt {
            assert_eq!(
                got[b * nt + t],
                (b * 100_000 + nt - 1 - t) as u32,
                "block {b} thread {t}"
            );
        }
    }

    let kernel = module.kernel("many").unwrap();
    let values: Vec<[u8; 4]> = (0..20).map(|k| (k * 7 - 50i32).to_ne_bytes()).collect();
    let mut params = vec![KernelParam::Buffer(0)];
    params.extend(values.iter().map(|v| KernelParam::Scalar(v)));
    assert!(params.len() > devcmd_cuda::STACK_PARAMS);
    let (many_page, many_out) = page(&shim, 20 * 4);
    let one = LaunchDims {
        grid: Dim3::linear(1),
        block: Dim3::linear(1),
        shared_bytes: 0,
    };
    // SAFETY: the span is a live page of 20 ints, all the kernel writes.
    unsafe { shim.launch(&stream, &kernel, one, &[span(many_out, 80)], &params) }.unwrap();
    let got: Vec<i32> = download(&shim, &stream, many_out, 20);
    let want: Vec<i32> = (0..20).map(|k| (k * 7 - 50) * 3).collect();
    assert_eq!(got, want);
    // SAFETY: every launch using the pages has completed.
    unsafe {
        shim.device_free(rev_page);
        shim.device_free(many_page);
    }
}

#[test]
fn a_captured_stream_replays_three_times() {
    let test = "a_captured_stream_replays_three_times";
    let Some(shim) = gpu(test) else { return };
    let Some(module) = compile(&shim, VADD, &[], test) else {
        return;
    };
    let kernel = module.kernel("vadd").unwrap();
    let n = 1_000_003usize;
    let bytes = n * 4;
    let stream = shim.create_stream().unwrap();
    let (out_page, out) = page(&shim, bytes);
    let (a_page, a_addr) = page(&shim, bytes);
    let (b_page, b_addr) = page(&shim, bytes);
    let host_a = shim.host_alloc_pinned(bytes).unwrap();
    let host_b = shim.host_alloc_pinned(bytes).unwrap();
    let host_out = shim.host_alloc_pinned(bytes).unwrap();
    let (pa, pb, pout) = (
        shim.host_page_ptr(&host_a).as_ptr(),
        shim.host_page_ptr(&host_b).as_ptr(),
        shim.host_page_ptr(&host_out).as_ptr(),
    );
    let layout = CopyLayout::linear(bytes as u64);
    let buffers = [span(out, bytes), span(a_addr, bytes), span(b_addr, bytes)];
    let n64 = (n as u64).to_ne_bytes();
    let params = [
        KernelParam::Buffer(0),
        KernelParam::Buffer(1),
        KernelParam::Buffer(2),
        KernelParam::Scalar(&n64),
    ];

    shim.begin_capture(&stream).unwrap();
    assert!(shim.is_capturing(&stream).unwrap());
    // SAFETY: recorded, not run; every page and pinned page outlives the replays below.
    unsafe {
        shim.copy_to_device(&stream, pa, HostMemory::Pinned, a_addr, layout)
            .unwrap();
        shim.copy_to_device(&stream, pb, HostMemory::Pinned, b_addr, layout)
            .unwrap();
        shim.launch(&stream, &kernel, linear(n), &buffers, &params)
            .unwrap();
        shim.copy_to_host(&stream, out, pout, HostMemory::Pinned, layout)
            .unwrap();
    }
    let graph = shim.end_capture(&stream, false).unwrap();
    assert!(!shim.is_capturing(&stream).unwrap());
    shim.graph_upload(&graph, &stream).unwrap();

    for round in 0..3u32 {
        let r = round as f32;
        // SAFETY: the pinned pages hold `n` floats each; no replay is pending (waited below).
        let (a, b, o) = unsafe {
            (
                std::slice::from_raw_parts_mut(pa.cast::<f32>(), n),
                std::slice::from_raw_parts_mut(pb.cast::<f32>(), n),
                std::slice::from_raw_parts_mut(pout.cast::<f32>(), n),
            )
        };
        for i in 0..n {
            a[i] = i as f32 * (r + 1.0);
            b[i] = r * 1000.0 - (i % 977) as f32;
        }
        o.fill(f32::NAN);
        let started = Instant::now();
        // SAFETY: everything the recording touched is alive and unmoved.
        unsafe { shim.graph_launch(&graph, &stream) }.unwrap();
        wait(&shim, &stream);
        let took = started.elapsed();
        for i in 0..n {
            assert_eq!(o[i], a[i] + b[i], "replay {round}, element {i}");
        }
        say(&format!(
            "replay {round}: copy in 2 × 4 MB, vadd, copy out 4 MB: {took:?}"
        ));
    }
    drop(graph);
    // SAFETY: every replay has completed.
    unsafe {
        shim.host_free_pinned(host_a);
        shim.host_free_pinned(host_b);
        shim.host_free_pinned(host_out);
        shim.device_free(out_page);
        shim.device_free(a_page);
        shim.device_free(b_page);
    }
}

#[test]
fn a_capture_that_ends_in_error_leaves_the_stream_not_recording() {
    let Some(shim) = gpu("a_capture_that_ends_in_error_leaves_the_stream_not_recording") else {
        return;
    };
    let stream = shim.create_stream().unwrap();
    let (p, addr) = page(&shim, 4096);
    let data = vec![7u8; 4096];
    let pinned = shim.host_alloc_pinned(4096).unwrap();
    let pinned_ptr = shim.host_page_ptr(&pinned).as_ptr();
    let copy = |memory: HostMemory| {
        let src = match memory {
            HostMemory::Pinned => pinned_ptr.cast_const(),
            _ => data.as_ptr(),
        };
        // SAFETY: `data`, the pinned page and the device page outlive every wait of this test;
        // recorded copies are discarded or run before they are freed.
        unsafe { shim.copy_to_device(&stream, src, memory, addr, CopyLayout::linear(4096)) }
    };
    let works = |what: &str| {
        assert!(
            !shim.is_capturing(&stream).unwrap(),
            "{what}: still recording"
        );
        upload(&shim, &stream, &data, addr);
        let back: Vec<u8> = download(&shim, &stream, addr, 4096);
        assert_eq!(back, data, "{what}: the stream works again");
    };

    // Doomed: discarded.
    shim.begin_capture(&stream).unwrap();
    copy(HostMemory::Pinned).unwrap();
    let e = shim.end_capture(&stream, true).unwrap_err();
    assert_eq!((e.status, e.fault), (status::CAPTURE_DOOMED, Fault::Failed));
    works("doomed");

    // What a pageable copy does while recording (for the core's staging rules): reported only.
    shim.begin_capture(&stream).unwrap();
    let recorded = copy(HostMemory::Pageable);
    let ended = shim.end_capture(&stream, false);
    say(&format!(
        "a pageable host-to-device copy while recording: {:?}; then the end: {:?}",
        recorded.map_err(|e| e.to_string()),
        ended.as_ref().map(|_| "a graph").map_err(|e| e.to_string())
    ));
    drop(ended);
    works("after a pageable copy");

    // Invalidated by a call illegal while this thread records: an allocation made straight to
    // the driver, as a library beside the shim would (the shim's own `device_alloc` refuses
    // before the driver, and the recording would stay valid).
    shim.begin_capture(&stream).unwrap();
    assert!(
        shim.device_alloc(256).is_err(),
        "the shim refuses an allocation while this thread records"
    );
    let mut raw = 0;
    // SAFETY: `raw` is valid for one write; the context is current (bound by the begin).
    let alloc = unsafe { devcmd_cuda::sys::cuMemAlloc_v2(&mut raw, 256) };
    say(&format!(
        "cuMemAlloc straight to the driver while recording (global mode): {alloc:?}"
    ));
    let refused = alloc != devcmd_cuda::sys::CUresult::CUDA_SUCCESS;
    if !refused {
        // SAFETY: nothing uses it.
        unsafe { devcmd_cuda::sys::cuMemFree_v2(raw) };
    }
    let ended = shim.end_capture(&stream, false);
    say(&format!(
        "end of a capture after that allocation: {:?}",
        ended.as_ref().map(|_| "a graph").map_err(|e| e.to_string())
    ));
    assert!(refused, "an allocation while recording must be refused");
    let e = ended.unwrap_err();
    assert_eq!(e.status, status::STREAM_CAPTURE_INVALIDATED, "{e}");
    works("invalidated");

    // Ended from another thread: refused (global mode as in thread-local), and the stream no longer records
    // either way (seen on the H200, driver 580: the refused end ends the capture too).
    shim.begin_capture(&stream).unwrap();
    copy(HostMemory::Pinned).unwrap();
    let elsewhere = std::thread::scope(|s| {
        s.spawn(|| shim.end_capture(&stream, false).map(drop))
            .join()
            .unwrap()
    });
    let e = elsewhere.unwrap_err();
    assert_eq!(e.status, status::STREAM_CAPTURE_WRONG_THREAD, "{e}");
    let still = shim.is_capturing(&stream).unwrap();
    let again = shim.end_capture(&stream, false).map(drop);
    say(&format!(
        "after an end on the wrong thread: still recording = {still}; an end on the capturing \
         thread then: {:?}",
        again.as_ref().map_err(|e| e.to_string())
    ));
    works("ended on the wrong thread");

    // Not recording at all.
    let e = shim.end_capture(&stream, false).unwrap_err();
    say(&format!("end_capture on a stream not recording: {e}"));
    works("never recording");
    // SAFETY: every copy using the pages has completed.
    unsafe {
        shim.device_free(p);
        shim.host_free_pinned(pinned);
    }
}

#[test]
fn a_compile_error_reports_nvrtcs_log() {
    let Some(shim) = gpu("a_compile_error_reports_nvrtcs_log") else {
        return;
    };
    let broken = "extern \"C\" __global__ void broken(float* x) { x[0] = undefined_name; }";
    match shim.compile(broken, &[]) {
        Err(e) if e.is_nvrtc_not_found() => say(&format!("skipped: no NVRTC: {e}")),
        Err(CudaKernelError::Compile { log, options }) => {
            say(&format!("NVRTC's log ({options:?}):\n{log}"));
            assert!(log.contains("undefined_name"), "{log}");
            assert!(log.contains("error"), "{log}");
            let msg = shim.compile(broken, &[]).unwrap_err().to_string();
            assert!(msg.contains("does not compile") && msg.contains("undefined_name"));
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
    if let Err(e) = shim.compile(VADD, &["--no-such-option"]) {
        say(&format!("an unknown option: {e}"));
        assert!(!matches!(e, CudaKernelError::Load { .. }), "{e}");
    }
    if let Ok(module) = shim.compile(VADD, &[]) {
        let e = module.kernel("vad").unwrap_err();
        assert_eq!(e, CudaKernelError::NoSuchKernel { name: "vad".into() });
        say(&format!("a kernel name the module lacks: {e}"));
    }
}

#[test]
fn ptx_and_cubins_load_without_nvrtc_and_nvrtc_can_make_ptx() {
    let test = "ptx_and_cubins_load_without_nvrtc_and_nvrtc_can_make_ptx";
    let Some(shim) = gpu(test) else { return };
    let stream = shim.create_stream().unwrap();
    let n = 100_000usize;
    let (p, out) = page(&shim, n * 4);
    let buffers = [span(out, n * 4)];

    // Hand-written PTX, without its final NUL.
    let module = shim.load_ptx(FILL_PTX).unwrap();
    assert_eq!(module.format(), ImageFormat::Ptx);
    let fill = module.kernel("fill").unwrap();
    if PARAM_INFO_BINDINGS {
        assert_eq!(fill.param_sizes(), [8usize, 4, 8]);
    }
    let value = 0x00C0_FFEEu32.to_ne_bytes();
    let n64 = (n as u64).to_ne_bytes();
    let params = [
        KernelParam::Buffer(0),
        KernelParam::Scalar(&value),
        KernelParam::Scalar(&n64),
    ];
    // SAFETY: the span is a live page of `n` u32, all the kernel writes.
    unsafe { shim.launch(&stream, &fill, linear(n), &buffers, &params) }.unwrap();
    let got: Vec<u32> = download(&shim, &stream, out, n);
    assert!(got.iter().all(|v| *v == 0x00C0_FFEE));

    // PTX that does not assemble: the driver's log.
    let bad = ".version 7.4\n.target sm_75\n.address_size 64\n.visible .entry bad() { nonsense; }";
    let e = shim.load_ptx(bad).unwrap_err();
    say(&format!("bad PTX: {e}"));
    assert!(
        matches!(
            e,
            CudaKernelError::Load {
                format: ImageFormat::Ptx,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(shim.load_ptx("").unwrap_err(), CudaKernelError::EmptyImage);
    // A truncated cubin or fatbin: its header claims more than was given, refused before the
    // driver (which takes no length) could read past the end.
    for truncated in [
        &b"\x7fELF\x02\x01\x01\x00"[..],
        &[0x50, 0xED, 0x55, 0xBA, 1, 0, 0x10, 0],
    ] {
        // SAFETY: refused from its header before the driver sees it.
        let e = unsafe { shim.load_module(truncated) }.unwrap_err();
        assert!(e.to_string().contains("truncated"), "{e}");
    }

    // NVRTC to PTX (a virtual architecture), and a cubin loaded from its bytes, misaligned too.
    let vadd_ptx = match shim.compile(VADD, &["--gpu-architecture=compute_75"]) {
        Err(e) if e.is_nvrtc_not_found() => {
            say(&format!("skipped: no NVRTC ({test}, NVRTC part): {e}"));
            // SAFETY: every launch using the page has completed.
            unsafe { shim.device_free(p) };
            return;
        }
        other => other.unwrap(),
    };
    assert_eq!(vadd_ptx.format(), ImageFormat::Ptx);
    let cubin = shim.compile_image(VADD, &[]).unwrap();
    let mut shifted = vec![0u8; cubin.len() + 1];
    shifted[1..].copy_from_slice(&cubin);
    let misaligned = &shifted[1..];
    for (what, module) in [
        ("PTX from NVRTC", vadd_ptx),
        (
            "NVRTC's image",
            // SAFETY: NVRTC's own image, whole.
            unsafe { shim.load_module(&cubin) }.unwrap(),
        ),
        (
            "the image, misaligned",
            // SAFETY: the same image, copied whole to an odd address.
            unsafe { shim.load_module(misaligned) }.unwrap(),
        ),
    ] {
        let vadd = module.kernel("vadd").unwrap();
        let m = 1000usize;
        let a: Vec<f32> = (0..m).map(|i| i as f32).collect();
        let (a_page, a_addr) = page(&shim, m * 4);
        upload(&shim, &stream, &a, a_addr);
        let m64 = (m as u64).to_ne_bytes();
        let bufs = [span(out, m * 4), span(a_addr, m * 4)];
        let params = [
            KernelParam::Buffer(0),
            KernelParam::Buffer(1),
            KernelParam::Buffer(1),
            KernelParam::Scalar(&m64),
        ];
        // SAFETY: both spans are live pages of `m` floats; the kernel reads `a` twice and writes
        // `out`.
        unsafe { shim.launch(&stream, &vadd, linear(m), &bufs, &params) }.unwrap();
        let got: Vec<f32> = download(&shim, &stream, out, m);
        assert!(
            got.iter().enumerate().all(|(i, v)| *v == 2.0 * i as f32),
            "{what}"
        );
        say(&format!("{what}: a {} that runs", module.format()));
        // SAFETY: the launch reading it has completed.
        unsafe { shim.device_free(a_page) };
    }
    // SAFETY: every launch using the page has completed.
    unsafe { shim.device_free(p) };
}

/// Review finding: a graph replayed after the module of a kernel it recorded was dropped ran
/// unloaded code. The graph now keeps the module loaded; 64 other modules are loaded and run
/// meanwhile so a freed module's memory would be reused.
#[test]
fn a_graph_keeps_the_modules_of_its_kernels() {
    let Some(shim) = gpu("a_graph_keeps_the_modules_of_its_kernels") else {
        return;
    };
    let stream = shim.create_stream().unwrap();
    let (p, out) = page(&shim, 4096);
    let buffers = [span(out, 4096)];
    let n64 = 4u64.to_ne_bytes();
    let graph = {
        let module = shim.load_ptx(FILL_PTX).unwrap();
        let fill = module.kernel_with_sizes("fill", &[8, 4, 8]).unwrap();
        let value = 0xBEEFu32.to_ne_bytes();
        let params = [
            KernelParam::Buffer(0),
            KernelParam::Scalar(&value),
            KernelParam::Scalar(&n64),
        ];
        shim.begin_capture(&stream).unwrap();
        // SAFETY: recorded, not run; the page outlives the graph's replays below.
        unsafe {
            shim.launch(
                &stream,
                &fill,
                LaunchDims::covering(4, 32),
                &buffers,
                &params,
            )
        }
        .unwrap();
        shim.end_capture(&stream, false).unwrap()
        // `fill` and `module` drop here.
    };
    let mut others = Vec::new();
    for i in 0..64u32 {
        let module = shim.load_ptx(FILL_PTX).unwrap();
        let fill = module.kernel_with_sizes("fill", &[8, 4, 8]).unwrap();
        let value = i.to_ne_bytes();
        let params = [
            KernelParam::Buffer(0),
            KernelParam::Scalar(&value),
            KernelParam::Scalar(&n64),
        ];
        // SAFETY: the page is live; the kernel writes its first 16 bytes.
        unsafe {
            shim.launch(
                &stream,
                &fill,
                LaunchDims::covering(4, 32),
                &buffers,
                &params,
            )
        }
        .unwrap();
        others.push((module, fill));
    }
    wait(&shim, &stream);
    // SAFETY: the page the recording touched is alive.
    unsafe { shim.graph_launch(&graph, &stream) }.unwrap();
    wait(&shim, &stream);
    let got: Vec<u32> = download(&shim, &stream, out, 4);
    assert_eq!(got, [0xBEEF; 4], "the recorded kernel ran");
    drop((graph, others));
    // SAFETY: idle.
    unsafe { shim.device_free(p) };
}

/// The shim launches without making its context current first on a thread whose last bind by
/// the shim was of its context (it saves a driver call per launch): a launch on a stream of the
/// shim runs in that stream's context whatever the thread has current. Checked with no context
/// current (unbound behind the shim's back) and with another context of the same GPU current
/// (a second library's, say); each launch's output read back. Where the driver does refuse
/// such a launch, the shim binds and launches again: either way the launch succeeds and writes
/// what it should. A thread that never bound binds first.
#[test]
fn a_launch_runs_in_its_streams_context_whatever_context_is_current() {
    use devcmd_cuda::sys;
    let test = "a_launch_runs_in_its_streams_context_whatever_context_is_current";
    let Some(shim) = gpu(test) else { return };
    let stream = shim.create_stream().unwrap();
    let module = shim.load_ptx(FILL_PTX).unwrap();
    let fill = module.kernel("fill").unwrap();
    let n = 4096usize;
    let (_p, out) = page(&shim, n * 4);
    let buffers = [span(out, n * 4)];
    let n64 = (n as u64).to_ne_bytes();
    let launch_with = |value: u32| {
        let value = value.to_ne_bytes();
        let params = [
            KernelParam::Buffer(0),
            KernelParam::Scalar(&value),
            KernelParam::Scalar(&n64),
        ];
        // SAFETY: the span is a live page of `n` u32, all the kernel writes.
        unsafe { shim.launch(&stream, &fill, linear(n), &buffers, &params) }
    };
    let current = || {
        let mut c = std::ptr::null_mut();
        // SAFETY: the pointer is valid for one write.
        let r = unsafe { sys::cuCtxGetCurrent(&mut c) };
        assert_eq!(r, sys::CUresult::CUDA_SUCCESS);
        c
    };
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                assert!(current().is_null(), "a new thread has no context current");
                // A thread that never bound: the launch binds first.
                launch_with(3).unwrap();
                assert!(!current().is_null(), "the first launch on a thread binds");
                // Unbound behind the shim's back: the shim does not know, and launches as is.
                // SAFETY: making no context current is always allowed.
                let r = unsafe { sys::cuCtxSetCurrent(std::ptr::null_mut()) };
                assert_eq!(r, sys::CUresult::CUDA_SUCCESS);
                launch_with(1).unwrap();
                say(&format!(
                    "{test}: with no context current the launch {}",
                    if current().is_null() {
                        "ran without binding one"
                    } else {
                        "was refused, bound and ran"
                    }
                ));
            })
            .join()
            .unwrap();
    });
    let got: Vec<u32> = download(&shim, &stream, out, n);
    assert!(
        got.iter().all(|v| *v == 1),
        "no context current: {:?}",
        &got[..4]
    );

    // Another context of the same GPU, current on this thread (`cuCtxCreate_v4`: the CUDA 13
    // bindings).
    #[cfg(feature = "cuda-13000")]
    another_context_current(&shim, &stream, out, n, &launch_with, &current, test);
}

/// The second half of the test above: a launch with another context of the GPU current.
#[cfg(feature = "cuda-13000")]
fn another_context_current(
    shim: &devcmd_cuda::CudaShim,
    stream: &devcmd_cuda::CudaStream,
    out: devcmd::DeviceAddr,
    n: usize,
    launch_with: &dyn Fn(u32) -> Result<(), devcmd::DriverError>,
    current: &dyn Fn() -> devcmd_cuda::sys::CUcontext,
    test: &str,
) {
    use devcmd_cuda::sys;
    let mut device = 0;
    // SAFETY: the shim's context is current (the download above bound it); the pointer is valid
    // for one write.
    let r = unsafe { sys::cuCtxGetDevice(&mut device) };
    assert_eq!(r, sys::CUresult::CUDA_SUCCESS);
    let mut other = std::ptr::null_mut();
    // SAFETY: the pointer is valid for one write; no creation parameters, default flags.
    let made = unsafe { sys::cuCtxCreate_v4(&mut other, std::ptr::null_mut(), 0, device) };
    assert_eq!(made, sys::CUresult::CUDA_SUCCESS, "cuCtxCreate");
    // `cuCtxCreate` makes the new context current on this thread.
    assert_eq!(current(), other);
    launch_with(2).unwrap();
    let still_other = current() == other;
    say(&format!(
        "{test}: with another context current the launch {}",
        if still_other {
            "ran in the stream's context, the other one left current"
        } else {
            "was refused, bound and ran"
        }
    ));
    // The result is read on the shim's context (the download binds it).
    let got: Vec<u32> = download(shim, stream, out, n);
    assert!(
        got.iter().all(|v| *v == 2),
        "another context current: {:?}",
        &got[..4]
    );
    // SAFETY: the context was made above, nothing of it is in use; destroying it unbinds it
    // from this thread if current.
    let r = unsafe { sys::cuCtxDestroy_v2(other) };
    assert_eq!(r, sys::CUresult::CUDA_SUCCESS);
}
