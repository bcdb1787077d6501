//! What the kernel and trap tests share: the device under test (or a visible skip), fences,
//! compiles that skip without NVRTC, and small page helpers.
#![allow(dead_code)]

pub mod blas;

use devcmd::{CopyLayout, DeviceAddr, HostMemory, Shim};
use devcmd_cuda::{CudaDevicePage, CudaModule, CudaShim, CudaStream};
use std::io::Write;
use std::sync::Once;

/// Writes a line straight to stderr, past the test harness's capture.
pub fn say(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// The device under test (`DEVCMD_CUDA_DEVICE`, default 0), or `None` after printing why the
/// test is skipped.
pub fn gpu(test: &str) -> Option<CudaShim> {
    static FULL_REASON: Once = Once::new();
    let ordinal = std::env::var("DEVCMD_CUDA_DEVICE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    match CudaShim::new(ordinal) {
        Ok(shim) => Some(shim),
        Err(e) if e.is_no_driver() || e.is_no_device() => {
            let what = if e.is_no_driver() {
                "no CUDA driver"
            } else {
                "no CUDA device"
            };
            FULL_REASON.call_once(|| say(&format!("devcmd-cuda GPU tests: {e}")));
            say(&format!("skipped: {what} ({test})"));
            None
        }
        Err(e) => panic!("CUDA is present but the device could not be set up: {e}"),
    }
}

/// `source` compiled with NVRTC, or `None` after printing a visible skip when no NVRTC loads.
pub fn compile(shim: &CudaShim, source: &str, options: &[&str], test: &str) -> Option<CudaModule> {
    match shim.compile(source, options) {
        Ok(m) => Some(m),
        Err(e) if e.is_nvrtc_not_found() => {
            say(&format!("skipped: no NVRTC ({test}): {e}"));
            None
        }
        Err(e) => panic!("{e}"),
    }
}

/// Records an event on `stream` and waits for it.
pub fn wait(shim: &CudaShim, stream: &CudaStream) {
    let event = shim.record_event(stream).unwrap();
    shim.event_wait(&event).unwrap();
}

/// A device page of `bytes` and its address.
pub fn page(shim: &CudaShim, bytes: usize) -> (CudaDevicePage, DeviceAddr) {
    let p = shim.device_alloc(bytes as u64).unwrap();
    let a = shim.device_page_addr(&p);
    (p, a)
}

/// The bytes of `values` (native byte order).
pub fn bytes_of<T: Copy>(values: &[T]) -> &[u8] {
    // SAFETY: any initialised `Copy` value (the tests pass plain numbers) is readable as bytes;
    // the length is the slice's size.
    unsafe { std::slice::from_raw_parts(values.as_ptr().cast(), std::mem::size_of_val(values)) }
}

/// Copies `values` from pageable memory to `dst` and waits.
pub fn upload<T: Copy>(shim: &CudaShim, stream: &CudaStream, values: &[T], dst: DeviceAddr) {
    let bytes = bytes_of(values);
    // SAFETY: `values` outlives the wait below; `dst` is a page at least this large.
    unsafe {
        shim.copy_to_device(
            stream,
            bytes.as_ptr(),
            HostMemory::Pageable,
            dst,
            CopyLayout::linear(bytes.len() as u64),
        )
        .unwrap();
    }
    wait(shim, stream);
}

/// Copies `len` values of `T` at `src` back into a vector, and waits.
pub fn download<T: Copy + Default>(
    shim: &CudaShim,
    stream: &CudaStream,
    src: DeviceAddr,
    len: usize,
) -> Vec<T> {
    let mut out = vec![T::default(); len];
    let bytes = std::mem::size_of_val(out.as_slice());
    // SAFETY: `out` outlives the wait below and nothing else touches it; `src` is a page at
    // least this large.
    unsafe {
        shim.copy_to_host(
            stream,
            src,
            out.as_mut_ptr().cast(),
            HostMemory::Pageable,
            CopyLayout::linear(bytes as u64),
        )
        .unwrap();
    }
    wait(shim, stream);
    out
}

/// `len` bytes of a pattern that differs with `seed`.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

/// Spins for `ns` nanoseconds of the GPU's clock, then writes one byte.
pub const SPIN: &str = r#"
extern "C" __global__ void spin(unsigned char *out, unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
    out[0] = 1;
}
"#;
