//! The engine's own cost per operation: `Command::launch` and `Command::library` on a shim whose
//! calls do nothing, against that shim's bare `launch` in the same run. What is left is the
//! core's work (bookkeeping, resolve, order, capture stance, failure rule, drop-queue policy):
//! the part a real driver call (≈ 2.7–3.7 µs for `cuLaunchKernel` on the H200's host) does not
//! hide.
//!
//! Run: `cargo run --release -p devcmd-examples --bin engine-bench` (`--iters N`).
//!
//! With `ENGINE_BENCH_COLD=1` it also times up to 2000 bare shim calls and 2000 launches, each
//! after a walk over 4 MiB that empties the data caches, as a driver call between two operations
//! does on a GPU host; under `valgrind --tool=cachegrind --cache-sim=yes` the data lines each
//! function of the core misses per operation are its misses over 2000 (BENCHMARKS.md, issue 16).

use devcmd::address_shim::AddressShim;
use devcmd::{
    Device, DeviceAddr, DeviceConfig, DeviceSpan, KernelParam, Launch, LaunchDims, LibraryWork,
    Shim, StreamId,
};
use std::hint::black_box;
use std::time::Instant;

/// The null device: the core's address-only shim, whose calls succeed and do nothing (pages are
/// address ranges).
fn null_shim() -> AddressShim {
    AddressShim::new(1 << 40, 256, 1 << 34)
}

/// ns per run of `f`: the median of 15 timed batches of `iters` after one warm-up batch.
fn per_op(iters: u32, mut f: impl FnMut()) -> f64 {
    let mut batches = Vec::new();
    for round in 0..16 {
        let t = Instant::now();
        for _ in 0..iters {
            f();
        }
        if round > 0 {
            batches.push(t.elapsed().as_nanos() as f64 / f64::from(iters));
        }
    }
    batches.sort_by(f64::total_cmp);
    batches[batches.len() / 2]
}

/// ns of one run of `f` after a walk over `thrash` (4 MiB: past the data caches), the median
/// of `rounds`. Under `valgrind --tool=cachegrind --cache-sim=yes` the lines each function
/// misses per call are its misses over `rounds`.
fn cold_ns(thrash: &mut [u8], rounds: u32, mut f: impl FnMut()) -> f64 {
    let mut times = Vec::with_capacity(rounds as usize);
    for round in 0..rounds {
        for line in thrash.chunks_mut(64) {
            line[0] = line[0].wrapping_add(round as u8);
        }
        black_box(&*thrash);
        let t = Instant::now();
        f();
        times.push(t.elapsed().as_nanos() as f64);
    }
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// One `Command::launch` of two buffers (the warm and the cold rows), not inlined, so a cache
/// profile names it.
#[inline(never)]
fn launch_two(
    cmd: &mut devcmd::Command<'_, AddressShim>,
    kernel: &&'static str,
    a: &devcmd::Handle,
    b: &devcmd::Handle,
    params: &[KernelParam<'_>],
) {
    cmd.launch(Launch {
        kernel,
        dims: LaunchDims::SINGLE,
        inputs: &[a],
        outputs: &[b],
        params,
    })
    .expect("launch");
}

/// One `Command::launch` of no buffer (the engine's fixed cost per operation), not inlined.
#[inline(never)]
fn launch_none(
    cmd: &mut devcmd::Command<'_, AddressShim>,
    kernel: &&'static str,
    params: &[KernelParam<'_>],
) {
    cmd.launch(Launch {
        kernel,
        dims: LaunchDims::SINGLE,
        inputs: &[],
        outputs: &[],
        params,
    })
    .expect("launch");
}

/// One `Command::library` reading two buffers and writing a third, whose call enqueues nothing,
/// not inlined.
#[inline(never)]
fn library_three(
    cmd: &mut devcmd::Command<'_, AddressShim>,
    reads: &[&devcmd::Handle],
    writes: &[&devcmd::Handle],
) {
    let work = LibraryWork::new("gemm", reads, writes);
    // SAFETY: the call enqueues nothing.
    unsafe {
        cmd.library(work, |_, spans| {
            black_box(spans);
            Ok(())
        })
    }
    .expect("library");
}

/// One `Command::empty` of 4 KiB and the handle's drop (issue 19's row), not inlined.
#[inline(never)]
fn empty_drop(cmd: &mut devcmd::Command<'_, AddressShim>) {
    drop(black_box(cmd.empty(4096).expect("empty")));
}

/// [`empty_drop`] on a device with granules of virtual memory, not inlined.
#[inline(never)]
fn empty_drop_granules(cmd: &mut devcmd::Command<'_, AddressShim>) {
    drop(black_box(cmd.empty(4096).expect("empty")));
}

/// `--help`.
const USAGE: &str = "\
engine-bench: the engine's own cost per operation, on a shim whose calls do nothing

usage: engine-bench [--iters N]
  --iters N  operations per timed round [default: 200000]";

fn main() -> std::process::ExitCode {
    devcmd_examples::exit::quiet_on_closed_output();
    if devcmd_examples::exit::help_asked(USAGE) {
        return std::process::ExitCode::from(devcmd_examples::exit::OK);
    }
    match run() {
        Ok(()) => std::process::ExitCode::from(devcmd_examples::exit::OK),
        Err(e) => devcmd_examples::exit::report("engine-bench", &*e),
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let iters = match args.iter().position(|a| a == "--iters") {
        Some(i) => args
            .get(i + 1)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| {
                devcmd_examples::exit::BadInput::boxed("--iters needs a whole number")
            })?,
        None => 200_000,
    };
    let mut device = Device::new(null_shim(), DeviceConfig::default());
    let mut cmd = device.command(StreamId(0))?;
    let (a, b, c) = (cmd.empty(128)?, cmd.empty(128)?, cmd.empty(128)?);
    let raw_spans = [
        DeviceSpan {
            addr: DeviceAddr(1 << 20),
            len: 128,
        },
        DeviceSpan {
            addr: DeviceAddr(2 << 20),
            len: 128,
        },
    ];
    let n = 32u32.to_ne_bytes();
    let params = [
        KernelParam::Buffer(1),
        KernelParam::Buffer(0),
        KernelParam::Scalar(&n),
    ];
    let kernel = "tiny";
    let raw = null_shim();
    let bare_call = || {
        // SAFETY: the null shim touches nothing. `black_box` keeps the call and its arguments
        // from being optimised away, as the core's call through the engine is not.
        unsafe {
            black_box(&raw).launch(
                &(),
                black_box(&kernel),
                LaunchDims::SINGLE,
                black_box(&raw_spans),
                black_box(&params),
            )
        }
        .expect("launch");
    };
    let bare = per_op(iters, bare_call);
    let launch = per_op(iters, || launch_two(&mut cmd, &kernel, &a, &b, &params));
    let scalar_only = [KernelParam::Scalar(&n)];
    let launch_none = per_op(iters, || launch_none(&mut cmd, &kernel, &scalar_only));
    let (reads, writes) = ([&a, &b], [&c]);
    let library = per_op(iters, || library_three(&mut cmd, &reads, &writes));
    // A reservation and its drop (issue 19's `Command::empty` + drop): the handle's identity
    // comes back through the return queue at the next reservation.
    let reserve_drop = per_op(iters, || empty_drop(&mut cmd));
    // The same on a device with 2 MiB granules of virtual memory (as the H200 has): the 4 KiB
    // reservation lands in a granule pool.
    let mut vm_device = Device::new(
        AddressShim::with_vm(1 << 40, 256, 1 << 34, 2 << 20),
        DeviceConfig::default(),
    );
    let mut vm_cmd = vm_device.command(StreamId(0))?;
    let reserve_drop_vm = per_op(iters, || empty_drop_granules(&mut vm_cmd));
    // With ENGINE_BENCH_COLD: the same calls, each after a walk that empties the caches.
    let cold = std::env::var_os("ENGINE_BENCH_COLD").map(|_| {
        let mut thrash = vec![0u8; 4 << 20];
        let rounds = iters.min(2000);
        let bare = cold_ns(&mut thrash, rounds, bare_call);
        let launch = cold_ns(&mut thrash, rounds, || {
            launch_two(&mut cmd, &kernel, &a, &b, &params)
        });
        (bare, launch)
    });
    println!("## The engine's own cost per operation (a shim whose calls do nothing)\n");
    println!("{iters} operations per batch, median of 15 batches.\n");
    println!("| operation | ns/op | over the bare shim call, ns |");
    println!("|---|---:|---:|");
    println!("| bare `Shim::launch` (null shim) | {bare:.1} | — |");
    println!(
        "| `Command::launch`, 2 buffers, 3 parameters | {launch:.1} | {:.1} |",
        launch - bare
    );
    println!(
        "| `Command::launch`, no buffer, 1 parameter | {launch_none:.1} | {:.1} |",
        launch_none - bare
    );
    println!(
        "| `Command::library`, 3 buffers | {library:.1} | {:.1} |",
        library - bare
    );
    println!("| `Command::empty` (4 KiB) + drop | {reserve_drop:.1} | — |");
    println!("| `Command::empty` (4 KiB) + drop, 2 MiB granules | {reserve_drop_vm:.1} | — |");
    if let Some((bare, launch)) = cold {
        println!(
            "\n## After a walk over 4 MiB (the caches emptied, as a driver call leaves them)\n"
        );
        println!("Median of {} calls, each timed alone.\n", iters.min(2000));
        println!("| operation | ns/op | over the bare shim call, ns |");
        println!("|---|---:|---:|");
        println!("| bare `Shim::launch`, cold | {bare:.1} | — |");
        println!(
            "| `Command::launch`, 2 buffers, cold | {launch:.1} | {:.1} |",
            launch - bare
        );
    }
    Ok(())
}
