//! What the GPU test files share: the device under test, or a visible skip line without one.
#![allow(dead_code)]

use devcmd_cuda::CudaShim;
use std::io::Write;
use std::sync::Once;

/// The device under test (`DEVCMD_CUDA_DEVICE`, default 0), or `None` after printing why `test`
/// is skipped (straight to stderr, past the test harness's capture).
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
            let mut err = std::io::stderr().lock();
            FULL_REASON.call_once(|| {
                let _ = writeln!(err, "devcmd-cuda GPU tests: {e}");
            });
            let _ = writeln!(err, "skipped: {what} ({test})");
            None
        }
        Err(e) => panic!("CUDA is present but the device could not be set up: {e}"),
    }
}

/// `len` bytes of a pattern that differs with `seed`.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}
