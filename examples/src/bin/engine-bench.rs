//! The engine's own cost per operation: `Command::launch` and `Command::library` on a shim whose
//! calls do nothing, against that shim's bare `launch` in the same run. What is left is the
//! core's work (bookkeeping, resolve, order, capture stance, failure rule, drop-queue policy):
//! the part a real driver call (≈ 2.7–3.7 µs for `cuLaunchKernel` on the H200's host) does not
//! hide.
//!
//! Run: `cargo run --release -p devcmd-examples --bin engine-bench` (`--iters N`).

use devcmd::{
    Device, DeviceAddr, DeviceConfig, DeviceFacts, DeviceSpan, DriverError, Fault, HostMemory,
    KernelParam, Launch, LaunchDims, LibraryWork, Shim, ShimOp, StreamId,
};
use std::convert::Infallible;
use std::hint::black_box;
use std::ptr::NonNull;
use std::time::Instant;

/// A device whose calls succeed and do nothing: pages are address ranges, kernels a name.
#[derive(Debug, Default)]
struct NullShim {
    next: std::cell::Cell<u64>,
}

#[derive(Debug)]
struct NullPage(u64);

impl Shim for NullShim {
    type Stream = ();
    type Event = ();
    type DevicePage = NullPage;
    type HostPage = Infallible;
    type Kernel = &'static str;
    type Registration = Infallible;
    type Graph = Infallible;
    type NativeStream = ();

    fn facts(&self) -> DeviceFacts {
        DeviceFacts::new(1 << 40, 256).with_max_page_size(1 << 34)
    }

    fn classify(&self, op: ShimOp, status: i32) -> DriverError {
        DriverError::new(op, status, Fault::Failed)
    }

    fn create_stream(&self) -> Result<(), DriverError> {
        Ok(())
    }

    fn native_stream<'a>(&self, stream: &'a ()) -> &'a () {
        stream
    }

    fn stream_wait_event(&self, _: &(), _: &()) -> Result<(), DriverError> {
        Ok(())
    }

    fn record_event(&self, _: &()) -> Result<(), DriverError> {
        Ok(())
    }

    fn event_query(&self, _: &()) -> Result<bool, DriverError> {
        Ok(true)
    }

    fn event_wait(&self, _: &()) -> Result<(), DriverError> {
        Ok(())
    }

    fn device_alloc(&self, size: u64) -> Result<NullPage, DriverError> {
        let addr = self.next.get().max(1 << 20);
        self.next.set(addr + size.next_multiple_of(256));
        Ok(NullPage(addr))
    }

    fn device_page_addr(&self, page: &NullPage) -> DeviceAddr {
        DeviceAddr(page.0)
    }

    unsafe fn device_free(&self, _: NullPage) {}

    fn host_page_ptr(&self, page: &Infallible) -> NonNull<u8> {
        match *page {}
    }

    unsafe fn host_free_pinned(&self, page: Infallible) {
        match page {}
    }

    unsafe fn copy_to_device(
        &self,
        _: &(),
        _: *const u8,
        _: HostMemory,
        _: DeviceAddr,
        _: devcmd::CopyLayout,
    ) -> Result<(), DriverError> {
        Ok(())
    }

    unsafe fn copy_to_host(
        &self,
        _: &(),
        _: DeviceAddr,
        _: *mut u8,
        _: HostMemory,
        _: devcmd::CopyLayout,
    ) -> Result<(), DriverError> {
        Ok(())
    }

    unsafe fn launch(
        &self,
        _: &(),
        kernel: &&'static str,
        _: LaunchDims,
        buffers: &[DeviceSpan],
        _: &[KernelParam<'_>],
    ) -> Result<(), DriverError> {
        black_box((kernel, buffers));
        Ok(())
    }
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

/// `--help`.
const USAGE: &str = "\
engine-bench: the engine's own cost per operation, on a shim whose calls do nothing

usage: engine-bench [--iters N]
  --iters N  operations per timed round [default: 200000]";

fn main() -> std::process::ExitCode {
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
    let mut device = Device::new(NullShim::default(), DeviceConfig::default());
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
    let kernel: &'static str = "tiny";
    let raw = NullShim::default();
    let bare = per_op(iters, || {
        // SAFETY: the null shim touches nothing.
        unsafe { raw.launch(&(), &kernel, LaunchDims::SINGLE, &raw_spans, &params) }
            .expect("launch");
    });
    let launch = per_op(iters, || {
        cmd.launch(Launch {
            kernel: &kernel,
            name: "tiny",
            dims: LaunchDims::SINGLE,
            inputs: &[&a],
            outputs: &[&b],
            params: &params,
        })
        .expect("launch");
    });
    let (reads, writes) = ([&a, &b], [&c]);
    let library = per_op(iters, || {
        let work = LibraryWork::new("gemm", &reads, &writes);
        // SAFETY: the call enqueues nothing.
        unsafe {
            cmd.library(work, |_, spans| {
                black_box(spans);
                Ok(())
            })
        }
        .expect("library");
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
        "| `Command::library`, 3 buffers | {library:.1} | {:.1} |",
        library - bare
    );
    Ok(())
}
