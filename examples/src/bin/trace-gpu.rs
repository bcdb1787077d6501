//! Replays allocation traces through devcmd on a real GPU and reads what the driver holds.
//!
//! `devcmd-trace` replays a trace on an address-only device and counts what the manager holds;
//! the anchors (`scripts/traces/anchors.py`) report their own pools' counters. This program
//! measures devcmd the way any allocator can be measured from outside: the driver's used memory
//! (`cuMemGetInfo`: total less free), read after every allocation, less what it was before the
//! replay. Run `anchors.py` with `DRIVER_HELD=1` in the same session for the anchors' figure of
//! the same kind.
//!
//! Each trace is replayed on a fresh device over GPU 0 (`CudaShim`, `DeviceConfig::default()`),
//! one stream, `Command::empty` for an allocation and the handle's drop for a free. After the
//! replay every handle is dropped and `memory_cleanup` runs; the driver's used memory must then
//! be back at its starting value (the last column).

use devcmd::{Device, DeviceConfig, Handle, StreamId};
use devcmd_cuda::{CudaShim, sys};
use devcmd_examples::exit;
use devcmd_trace::input::{self, Action, ReadOptions};
use devcmd_trace::progress::Progress;
use std::error::Error;
use std::process::ExitCode;

const USAGE: &str = "\
trace-gpu: replays allocation traces through devcmd on GPU 0 and reads what the driver holds

usage: trace-gpu TRACE [TRACE..]
  TRACE  a trace devcmd-trace reads (CSV, CSV.GZ or a PyTorch snapshot)

Prints one table row per trace: live peak, the driver's used memory at its peak over the
replay less its value before (sampled after every allocation), held/live, what devcmd's report
says it held at the end of the replay, and the driver's used memory after every handle is
dropped and memory_cleanup ran, less its value before (0 when everything went back).";

const S0: StreamId = StreamId(0);

fn main() -> ExitCode {
    exit::quiet_on_closed_output();
    if exit::help_asked(USAGE) {
        return ExitCode::from(exit::OK);
    }
    let paths: Vec<String> = std::env::args().skip(1).collect();
    if paths.is_empty() {
        eprintln!("trace-gpu: no trace given; name at least one (see --help)");
        return ExitCode::from(exit::BAD_INPUT);
    }
    match run(&paths) {
        Ok(()) => ExitCode::from(exit::OK),
        Err(e) => exit::report("trace-gpu", &*e),
    }
}

/// The driver's used device memory (total less free), with the shim's context current.
fn used_bytes(shim: &CudaShim) -> Result<u64, Box<dyn Error>> {
    // SAFETY: the context is the shim's retained primary context, alive while `shim` is.
    let r = unsafe { sys::cuCtxSetCurrent(shim.cu_context()) };
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(format!("cuCtxSetCurrent failed: {r:?}; is the GPU still usable?").into());
    }
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: a context is current on this thread (above); both pointers are valid for one
    // write.
    let r = unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) };
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(format!("cuMemGetInfo failed: {r:?}; is the GPU still usable?").into());
    }
    Ok((total - free) as u64)
}

fn run(paths: &[String]) -> Result<(), Box<dyn Error>> {
    // No GPU: say so before the table's head.
    drop(CudaShim::new(0)?);
    println!(
        "| trace | ops | live peak MiB | driver-held peak MiB | held/live | devcmd held at end MiB | driver after cleanup, bytes over start |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for path in paths {
        let trace = input::read(
            path,
            ReadOptions::default(),
            &mut Progress::new(Some(false)),
        )?;
        let shim = CudaShim::new(0)?;
        let mut device = Device::new(shim.clone(), DeviceConfig::default());
        // The stream and its context exist before the baseline (as in the GPU test of
        // `memory_returned.rs`): their own reservations are not the allocator's.
        device.command(S0)?.sync()?;
        let start = used_bytes(&shim)?;
        let mut peak = 0u64;
        let mut live: Vec<Option<Handle>> = (0..trace.slots).map(|_| None).collect();
        {
            let mut cmd = device.command(S0)?;
            for op in &trace.ops {
                let slot = &mut live[op.slot as usize];
                match op.action {
                    Action::Alloc => {
                        *slot = Some(cmd.empty(op.size).map_err(|e| {
                            format!(
                                "{path}: allocation of {} bytes (trace id {}) failed: {e}",
                                op.size, op.id
                            )
                        })?);
                        peak = peak.max(used_bytes(&shim)?.saturating_sub(start));
                    }
                    Action::Free => *slot = None,
                }
            }
        }
        let held_at_end = device.memory_report().held;
        live.clear();
        device.command(S0)?.sync()?;
        device.command(S0)?.memory_cleanup()?;
        device.command(S0)?.sync()?;
        let after = used_bytes(&shim)?;
        let name = path.rsplit('/').next().unwrap_or(path);
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        println!(
            "| {name} | {} | {:.1} | {:.1} | {:.3} | {:.1} | {} |",
            trace.ops.len(),
            mib(trace.live_peak),
            mib(peak),
            peak as f64 / trace.live_peak.max(1) as f64,
            mib(held_at_end),
            after as i128 - start as i128,
        );
        drop(device);
    }
    Ok(())
}
