//! Prints what devcmd-cuda sees of the first CUDA device: its name, the driver's and the
//! bindings' CUDA versions, and the facts the core is given.
//!
//! ```sh
//! cargo run -p devcmd-cuda --example cuda-facts
//! ```
//!
//! Exit code 0 when the device was set up; 3 ("no device", the code every devcmd program uses:
//! `devcmd_examples::exit`), with the error on stderr, when it could not be (on a machine
//! without the NVIDIA driver: "no CUDA driver found: ..."). It never panics: a
//! closed stdout or stderr is ignored rather than unwound through `println!`.
//!
//! CI cross-builds it for Jetson (`scripts/jetson-cross`) and runs it under `qemu-aarch64`,
//! where no driver exists, to check that the aarch64 binary starts and fails cleanly.

use devcmd::Shim;
use devcmd_cuda::{BINDING_FEATURE, CudaShim};
use std::io::Write;
use std::process::ExitCode;

/// The exit code without a usable device (devcmd_examples::exit::NO_DEVICE).
const NO_DEVICE: u8 = 3;

/// `12060` as `12.6`.
fn version(v: i32) -> String {
    format!("{}.{}", v / 1000, v % 1000 / 10)
}

fn main() -> ExitCode {
    match CudaShim::new(0) {
        Ok(gpu) => {
            let f = gpu.facts();
            let budget = match f.memory_budget {
                Some(b) => format!("{b} bytes"),
                None => "none beyond the device's".to_owned(),
            };
            // Errors writing to stdout (a closed pipe) are ignored: nothing else to report to.
            let _ = writeln!(
                std::io::stdout().lock(),
                "device 0: {name}\n\
                 driver: CUDA {driver} ({driver_raw})\n\
                 bindings: CUDA {bindings} ({bindings_raw}, feature {BINDING_FEATURE})\n\
                 total memory: {total} bytes\n\
                 memory budget: {budget}\n\
                 page alignment: {align} bytes\n\
                 largest page: {max_page} bytes\n\
                 integrated: {integrated}\n\
                 can map host memory: {map}\n\
                 zero copy by default (integrated and maps host memory): {zero_copy}",
                name = gpu.name(),
                driver = version(gpu.driver_version()),
                driver_raw = gpu.driver_version(),
                bindings = version(gpu.binding_version()),
                bindings_raw = gpu.binding_version(),
                total = f.total_memory,
                align = f.page_alignment,
                max_page = f.max_page_size,
                integrated = f.integrated,
                map = f.can_map_host,
                zero_copy = f.integrated && f.can_map_host,
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            let _ = writeln!(std::io::stderr().lock(), "cuda-facts: {e}");
            ExitCode::from(NO_DEVICE)
        }
    }
}
