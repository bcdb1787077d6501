//! A kernel that traps: its fault surfaces as [`Fault::DeviceLost`] at the next fence; then what
//! recovers in the same process. One test, in a binary of its own: CUDA's sticky errors poison
//! the context of the whole process, so no other test may share it.
//!
//! Lines starting with `FINDING:` say what the driver did (printed straight to stderr). On the
//! H200 (driver 580.159.04, CUDA 13.0): the launch succeeds; the next fence's wait is 719
//! (`CUDA_ERROR_LAUNCH_FAILED`, `DeviceLost`), and so is every later call; a second shim beside
//! the first sets up (the same primary context) but its work fails with 719; with every handle
//! dropped (primary context inactive), `cuDevicePrimaryCtxRetain` fails with 719, as do
//! `cuCtxCreate` and a retain after a successful `cuDevicePrimaryCtxReset`. Only a new process
//! recovers (the other test binaries ran fine right after this one).

mod common;

use common::{compile, gpu, say};
use devcmd::{CopyLayout, DeviceSpan, Dim3, Fault, HostMemory, KernelParam, LaunchDims, Shim};
use devcmd_cuda::CudaShim;
use std::time::{Duration, Instant};

const SOURCE: &str = r#"
extern "C" __global__ void boom(unsigned* out) {
    if (threadIdx.x == 0) __trap();
    out[threadIdx.x] = 1;
}
extern "C" __global__ void vadd(float* out, const float* a, const float* b,
                                unsigned long long n) {
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}
"#;

/// Compiles and runs a vadd of `n` floats on `shim` end to end, every step's error as text.
fn try_vadd(shim: &CudaShim, n: usize) -> Result<Duration, String> {
    let started = Instant::now();
    let module = shim
        .compile(SOURCE, &[])
        .map_err(|e| format!("compile: {e}"))?;
    let vadd = module.kernel("vadd").map_err(|e| format!("kernel: {e}"))?;
    let stream = shim
        .create_stream()
        .map_err(|e| format!("create_stream: {e}"))?;
    let bytes = n * 4;
    let mut pages = Vec::new();
    for _ in 0..3 {
        pages.push(
            shim.device_alloc(bytes as u64)
                .map_err(|e| format!("device_alloc: {e}"))?,
        );
    }
    let addrs: Vec<_> = pages.iter().map(|p| shim.device_page_addr(p)).collect();
    let a: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let b: Vec<f32> = (0..n).map(|i| 3.0 * i as f32).collect();
    let mut out = vec![0f32; n];
    let layout = CopyLayout::linear(bytes as u64);
    let n64 = (n as u64).to_ne_bytes();
    let spans: Vec<DeviceSpan> = addrs
        .iter()
        .map(|a| DeviceSpan {
            addr: *a,
            len: bytes as u64,
        })
        .collect();
    let params = [
        KernelParam::Buffer(0),
        KernelParam::Buffer(1),
        KernelParam::Buffer(2),
        KernelParam::Scalar(&n64),
    ];
    let dims = LaunchDims {
        grid: Dim3::linear(n.div_ceil(256) as u32),
        block: Dim3::linear(256),
        shared_bytes: 0,
    };
    // SAFETY: the host vectors and the pages outlive the fence waited below (or, on an error,
    // the device is lost and nothing runs).
    let result = unsafe {
        shim.copy_to_device(
            &stream,
            a.as_ptr().cast(),
            HostMemory::Pageable,
            addrs[1],
            layout,
        )
        .map_err(|e| format!("copy_to_device: {e}"))
        .and_then(|()| {
            shim.copy_to_device(
                &stream,
                b.as_ptr().cast(),
                HostMemory::Pageable,
                addrs[2],
                layout,
            )
            .map_err(|e| format!("copy_to_device: {e}"))
        })
        .and_then(|()| {
            shim.launch(&stream, &vadd, dims, &spans, &params)
                .map_err(|e| format!("launch: {e}"))
        })
        .and_then(|()| {
            shim.copy_to_host(
                &stream,
                addrs[0],
                out.as_mut_ptr().cast(),
                HostMemory::Pageable,
                layout,
            )
            .map_err(|e| format!("copy_to_host: {e}"))
        })
        .and_then(|()| {
            let fence = shim
                .record_event(&stream)
                .map_err(|e| format!("record_event: {e}"))?;
            shim.event_wait(&fence)
                .map_err(|e| format!("event_wait: {e}"))
        })
    };
    for page in pages {
        // SAFETY: the fence above completed, or the device is lost.
        unsafe { shim.device_free(page) };
    }
    result?;
    if let Some(i) = (0..n).find(|&i| out[i] != 4.0 * i as f32) {
        return Err(format!("wrong result at {i}: {}", out[i]));
    }
    Ok(started.elapsed())
}

#[test]
fn a_trap_is_device_lost_at_the_next_fence_and_a_fresh_context_recovers() {
    let test = "a_trap_is_device_lost_at_the_next_fence_and_a_fresh_context_recovers";
    let Some(shim) = gpu(test) else { return };
    let Some(module) = compile(&shim, SOURCE, &[], test) else {
        return;
    };
    try_vadd(&shim, 1_000_003).expect("the device works before the trap");
    let boom = module.kernel("boom").unwrap();
    let stream = shim.create_stream().unwrap();
    let page = shim.device_alloc(32 * 4).unwrap();
    let spans = [DeviceSpan {
        addr: shim.device_page_addr(&page),
        len: 32 * 4,
    }];
    let first_context = shim.cu_context();
    let dims = LaunchDims {
        grid: Dim3::linear(1),
        block: Dim3::linear(32),
        shared_bytes: 0,
    };
    // SAFETY: the span is a live page of 32 u32; the kernel writes no more (it traps first).
    let launched = unsafe { shim.launch(&stream, &boom, dims, &spans, &[KernelParam::Buffer(0)]) };
    say(&format!(
        "FINDING: the launch of a trapping kernel returns {launched:?}"
    ));
    launched.expect("a launch is asynchronous: the trap is not known yet");
    let fence = shim.record_event(&stream);
    let lost = match &fence {
        Ok(event) => {
            let e = shim.event_wait(event).unwrap_err();
            say(&format!("FINDING: the next fence's wait: {e}"));
            e
        }
        Err(e) => {
            say(&format!("FINDING: the fence's record already failed: {e}"));
            *e
        }
    };
    assert_eq!(lost.fault, Fault::DeviceLost, "{lost}");
    if let Ok(event) = &fence {
        say(&format!(
            "FINDING: a query of that fence afterwards: {:?}",
            shim.event_query(event)
        ));
    }

    // The old shim, after the loss.
    say(&format!(
        "FINDING: the old shim after the trap: create_stream {:?}; device_alloc {:?}; \
         record_event {:?}",
        shim.create_stream().map(drop).map_err(|e| e.to_string()),
        shim.device_alloc(256)
            .map(|_| "a page (leaked)")
            .map_err(|e| e.to_string()),
        shim.record_event(&stream)
            .map(drop)
            .map_err(|e| e.to_string()),
    ));

    // A new shim while the old one (and its streams, events, module) still holds the context.
    let second = CudaShim::new(0);
    let second_run = second.as_ref().ok().map(|s| try_vadd(s, 1_000_003));
    match &second {
        Ok(s) => say(&format!(
            "FINDING: CudaShim::new while the old shim lives: Ok, {} context as before; a \
             vadd on it: {:?}",
            if s.cu_context() == first_context {
                "the same"
            } else {
                "another"
            },
            second_run
        )),
        Err(e) => say(&format!(
            "FINDING: CudaShim::new while the old shim lives: Err({e})"
        )),
    }
    let second_works = second_run.map(|r| r.is_ok());

    // Everything of the old context dropped: the primary context's last retain is released.
    drop(second);
    drop(fence);
    drop(stream);
    drop(boom);
    drop(module);
    // SAFETY: the device is lost; nothing runs.
    unsafe { shim.device_free(page) };
    drop(shim);
    let third = CudaShim::new(0);
    if let Err(e) = &third {
        say(&format!(
            "FINDING: CudaShim::new after every handle of the old one dropped: Err({e})"
        ));
        raw_driver_probes();
    }
    let third = match third {
        Ok(s) => Ok(s),
        Err(_) => CudaShim::new(0),
    };
    let outcome = match &third {
        Ok(s) => {
            let run = try_vadd(s, 1_000_003);
            say(&format!(
                "FINDING: CudaShim::new after every handle of the old one dropped (and the \
                 probes above, if any): Ok ({} CUcontext value as before); compile + vadd of \
                 1,000,003 floats on it: {:?}",
                if s.cu_context() == first_context {
                    "the same"
                } else {
                    "another"
                },
                run
            ));
            run.map(drop)
        }
        Err(e) => {
            say(&format!("FINDING: CudaShim::new once more: Err({e})"));
            Err(e.to_string())
        }
    };
    say(&format!(
        "FINDING: summary: new shim beside the old = {}, new shim after dropping the old = {}",
        match second_works {
            Some(true) => "works",
            Some(false) => "set up, but its work fails",
            None => "refused",
        },
        if outcome.is_ok() { "works" } else { "fails" }
    ));
    // Either the process recovers, or the error says that only a new process does.
    if let Err(e) = outcome {
        assert!(e.contains("restart the process"), "{e}");
    }
}

/// What the driver itself says after the loss, with every handle of the shim dropped: the
/// primary context's state, a reset of it, and a context of its own.
fn raw_driver_probes() {
    use devcmd_cuda::sys;
    let lib = {
        // SAFETY: a `CudaShim` was set up earlier in this process, so the driver library is
        // loaded and `culib` returns it without panicking.
        unsafe { sys::culib() }
    };
    // SAFETY: looked up only, never called through this type.
    let has = |name: &str| unsafe { lib.get::<unsafe extern "C" fn()>(name) }.is_ok();
    let mut dev = 0;
    // SAFETY: `cuDeviceGet` is among the functions the shim checked; the pointer is valid.
    let r = unsafe { sys::cuDeviceGet(&mut dev, 0) };
    assert_eq!(r, sys::CUresult::CUDA_SUCCESS);
    let (mut flags, mut active) = (0u32, 0i32);
    if has("cuDevicePrimaryCtxGetState") {
        // SAFETY: the function exists; both pointers are valid for one write.
        let r = unsafe { sys::cuDevicePrimaryCtxGetState(dev, &mut flags, &mut active) };
        say(&format!(
            "FINDING: cuDevicePrimaryCtxGetState after every release: {r:?}, active = {active}"
        ));
    }
    #[cfg(feature = "cuda-13000")]
    if has("cuCtxCreate_v4") && has("cuCtxDestroy_v2") && has("cuMemAlloc_v2") {
        let mut ctx = std::ptr::null_mut();
        // SAFETY: the function exists; null parameters ask for an ordinary context.
        let r = unsafe { sys::cuCtxCreate_v4(&mut ctx, std::ptr::null_mut(), 0, dev) };
        let alloc = if r == sys::CUresult::CUDA_SUCCESS {
            let mut p = 0;
            // SAFETY: the new context is current (cuCtxCreate makes it so); one write.
            let a = unsafe { sys::cuMemAlloc_v2(&mut p, 4096) };
            if a == sys::CUresult::CUDA_SUCCESS {
                // SAFETY: allocated just above, freed once.
                let _ = unsafe { sys::cuMemFree_v2(p) };
            }
            // SAFETY: created above, destroyed once.
            let _ = unsafe { sys::cuCtxDestroy_v2(ctx) };
            format!("{a:?}")
        } else {
            "-".into()
        };
        say(&format!(
            "FINDING: a context of its own (cuCtxCreate): {r:?}; cuMemAlloc in it: {alloc}"
        ));
    }
    if has("cuDevicePrimaryCtxReset_v2") {
        // SAFETY: the function exists; nothing of this process uses the primary context now.
        let r = unsafe { sys::cuDevicePrimaryCtxReset_v2(dev) };
        say(&format!("FINDING: cuDevicePrimaryCtxReset: {r:?}"));
    }
}
