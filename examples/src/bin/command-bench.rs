//! Benchmark of the command layer on the std shim: per-operation CPU cost of `Command`
//! (reserve, reserve + bind, write, launch, read) against the raw shim call or the system
//! allocator measured in the same run, and staged upload / readback bandwidth for 4 KiB to
//! 256 MiB against a plain `memcpy` of the same bytes, and copies between two std devices
//! (`Command::copy_from`) against `memcpy`.
//!
//! Run: `cargo run --release -p devcmd-examples --bin command-bench` (`--quick` for fewer sizes,
//! `--drop-mib N` for the drop queue's byte threshold, `--peer` for the copies between devices
//! only).

use devcmd::{
    CopyLayout, Device, DeviceConfig, HostMemory, Launch, LaunchDims, ReadRequest, Shim, StreamId,
};
use devcmd_std::StdShim;
use std::hint::black_box;
use std::time::Instant;

const S: StreamId = StreamId(0);

fn per_op(iters: u32, f: impl FnMut()) -> f64 {
    per_op_then(iters, f, || {})
}

/// ns per call of `f`, counting `finish` (a wait for asynchronous work) once at the end.
fn per_op_then(iters: u32, mut f: impl FnMut(), mut finish: impl FnMut()) -> f64 {
    for _ in 0..iters / 10 {
        f();
    }
    finish();
    let t = Instant::now();
    for _ in 0..iters {
        f();
    }
    finish();
    t.elapsed().as_nanos() as f64 / f64::from(iters)
}

/// `--help`.
const USAGE: &str = "\
command-bench: the command layer on the std shim: enqueue costs and staging bandwidth

usage: command-bench [--quick] [--drop-mib N]
  --quick        fewer rounds
  --drop-mib N   the drop queue's byte threshold in MiB [default: 64]";

fn main() -> std::process::ExitCode {
    devcmd_examples::exit::quiet_on_closed_output();
    if devcmd_examples::exit::help_asked(USAGE) {
        return std::process::ExitCode::from(devcmd_examples::exit::OK);
    }
    match run() {
        Ok(()) => std::process::ExitCode::from(devcmd_examples::exit::OK),
        Err(e) => devcmd_examples::exit::report("command-bench", &*e),
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let quick = std::env::args().any(|a| a == "--quick");
    if std::env::args().any(|a| a == "--peer") {
        return peer_copies(quick);
    }
    let shim = StdShim::builder().total_memory(4 << 30).build();
    let noop = shim.register_kernel("noop", |_| Ok(()));
    let raw = shim.clone();
    // `--drop-mib N`: the drop queue's byte threshold (default 64 MiB, the design's).
    let args: Vec<String> = std::env::args().collect();
    let drop_mib: u64 = match args.iter().position(|a| a == "--drop-mib") {
        Some(i) => args
            .get(i + 1)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| {
                devcmd_examples::exit::BadInput::boxed("--drop-mib needs a whole number of MiB")
            })?,
        None => 64,
    };
    let drops = devcmd::DropPolicy {
        max_bytes: drop_mib << 20,
        ..devcmd::DropPolicy::default()
    };
    let config = DeviceConfig {
        drops,
        ..DeviceConfig::default()
    };
    println!(
        "drop queue: flush at {} items or {drop_mib} MiB\n",
        drops.max_items
    );
    let mut device = Device::new(shim, config);
    let iters = if quick { 20_000 } else { 200_000 };

    println!("## Command per-operation CPU cost (std shim)\n");
    println!("| operation | ns/op | anchor | anchor ns/op | ratio |");
    println!("|---|---:|---|---:|---:|");

    // reserve + drop, 4 KiB, against malloc/free of the same size.
    let layout = std::alloc::Layout::from_size_align(4096, 64)?;
    let anchor = per_op(iters, || {
        // SAFETY: a non-zero layout; the block is freed right after.
        unsafe {
            let p = std::alloc::alloc(layout);
            black_box(p);
            std::alloc::dealloc(p, layout);
        }
    });
    let mut cmd = device.command(S)?;
    let ours = per_op(iters, || {
        black_box(cmd.reserve(4096).expect("reserve"));
    });
    println!(
        "| reserve + drop 4 KiB | {ours:.1} | malloc + free | {anchor:.1} | {:.2} |",
        ours / anchor
    );
    let ours_1m = per_op(iters, || {
        black_box(cmd.reserve(1 << 20).expect("reserve"));
    });
    println!(
        "| reserve + drop 1 MiB | {ours_1m:.1} | malloc + free 4 KiB | {anchor:.1} | {:.2} |",
        ours_1m / anchor
    );
    let bind = per_op(iters, || {
        let lazy = cmd.lazy(4096);
        let r = cmd.reserve(4096).expect("reserve");
        cmd.bind(r, &lazy).expect("bind");
        black_box(lazy);
    });
    println!(
        "| lazy + reserve + bind + drop 4 KiB | {bind:.1} | malloc + free | {anchor:.1} | {:.2} |",
        bind / anchor
    );

    // launch: Command (resolve 2 buffers, failure check, enqueue) against the raw shim call.
    let a = cmd.empty(4096)?;
    let b = cmd.empty(4096)?;
    let stream = raw.create_stream()?;
    let pa = raw.device_alloc(4096)?;
    let pb = raw.device_alloc(4096)?;
    let spans = [
        devcmd::DeviceSpan {
            addr: raw.device_page_addr(&pa),
            len: 4096,
        },
        devcmd::DeviceSpan {
            addr: raw.device_page_addr(&pb),
            len: 4096,
        },
    ];
    let launches = iters / 4;
    let raw_sync = || {
        raw.event_wait(&raw.record_event(&stream).expect("record"))
            .expect("wait")
    };
    let anchor_launch = per_op_then(
        launches,
        || {
            // SAFETY: both spans are live pages of this shim; the noop kernel touches nothing.
            unsafe {
                raw.launch(&stream, &noop, LaunchDims::SINGLE, &spans, &[])
                    .expect("launch")
            };
        },
        raw_sync,
    );
    let cmd_cell = std::cell::RefCell::new(cmd);
    let ours_launch = per_op_then(
        launches,
        || {
            let launch = Launch {
                kernel: &noop,
                dims: LaunchDims::SINGLE,
                inputs: &[&a],
                outputs: &[&b],
                params: &[],
            };
            cmd_cell.borrow_mut().launch(launch).expect("launch");
        },
        || {
            cmd_cell
                .borrow_mut()
                .sync()
                .expect("sync")
                .wait()
                .expect("wait")
        },
    );
    println!(
        "| launch, 2 buffers | {ours_launch:.1} | raw shim launch | {anchor_launch:.1} | {:.2} |",
        ours_launch / anchor_launch
    );

    // write 4 KiB (staged through pinned, drop queue) against a raw shim copy from a fixed buffer.
    let src = vec![7u8; 4096];
    let anchor_copy = per_op_then(
        launches,
        || {
            // SAFETY: `src` outlives the wait at the end; the page holds 4096 bytes.
            unsafe {
                raw.copy_to_device(
                    &stream,
                    src.as_ptr(),
                    HostMemory::Pageable,
                    spans[0].addr,
                    CopyLayout::linear(4096),
                )
                .expect("copy")
            };
        },
        raw_sync,
    );
    let ours_write = per_op_then(
        launches,
        || cmd_cell.borrow_mut().write_from(&a, &src).expect("write"),
        || {
            cmd_cell
                .borrow_mut()
                .sync()
                .expect("sync")
                .wait()
                .expect("wait")
        },
    );
    let mut cmd = cmd_cell.into_inner();
    println!(
        "| write 4 KiB (staged from a borrowed slice) | {ours_write:.1} | raw shim copy | {anchor_copy:.1} | {:.2} |",
        ours_write / anchor_copy
    );

    // read 4 KiB round trip (enqueue, fence, wait) against raw copy + event + wait.
    let mut dst = vec![0u8; 4096];
    let reads = launches / 10;
    let anchor_read = per_op(reads, || {
        // SAFETY: `dst` outlives the wait in this closure.
        unsafe {
            raw.copy_to_host(
                &stream,
                spans[0].addr,
                dst.as_mut_ptr(),
                HostMemory::Pageable,
                CopyLayout::linear(4096),
            )
            .expect("copy")
        };
        raw.event_wait(&raw.record_event(&stream).expect("record"))
            .expect("wait");
    });
    let ours_read = per_op(reads, || {
        let got = cmd
            .read_async(&[ReadRequest::whole(&a)])
            .expect("read")
            .wait()
            .expect("wait");
        black_box(got);
    });
    println!(
        "| read 4 KiB round trip | {ours_read:.1} | raw copy + event wait | {anchor_read:.1} | {:.2} |",
        ours_read / anchor_read
    );
    // SAFETY: the stream was waited on after the last use of both pages.
    unsafe {
        raw.device_free(pa);
        raw.device_free(pb);
    }

    println!("\n## Staged bandwidth (std shim) against memcpy of the same bytes\n");
    let policy = devcmd::staging::StagingPolicy::default();
    println!(
        "Upload: `write_from` of heap bytes, pipelined (the default: from {} KiB, pieces of {} MiB \
         through a ring of {} pinned buffers, the host copy on {} helper threads) and with the \
         pipeline off (one staging copy, then the shim's copy). Readback: `read_async` (into \
         pinned memory the pool hands out) and `read_to` into a kept heap buffer (pipelined). \
         The std shim's device copy is itself a memcpy on the stream's worker thread, so a \
         staged upload moves every byte twice: 0.5 of memcpy is the most a serial one reaches.\n",
        policy.pipeline_from >> 10,
        policy.chunk >> 20,
        policy.depth,
        devcmd::workers::CopyWorkers::default_threads()
    );
    println!(
        "| size | upload GB/s | upload, pipeline off | readback GB/s | readback into heap (read_to) | memcpy GB/s | upload / memcpy | pipeline off / memcpy | readback / memcpy | read_to / memcpy |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let sizes: &[usize] = if quick {
        &[4 << 10, 1 << 20, 16 << 20]
    } else {
        &[4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20, 256 << 20]
    };
    let mut serial = Device::new(
        raw.clone(),
        DeviceConfig {
            drops,
            staging: devcmd::staging::StagingPolicy {
                pipeline_from: u64::MAX,
                ..policy
            },
            ..DeviceConfig::default()
        },
    );
    for &size in sizes {
        let reps = ((256usize << 20) / size).clamp(3, 2000);
        let data = vec![0x5Au8; size];
        let memcpy = best_memcpy(&data, reps);
        let mut rates = [0f64; 2];
        for (dev, rate) in [&mut device, &mut serial].into_iter().zip(rates.iter_mut()) {
            let mut cmd = dev.command(S)?;
            let h = cmd.empty(size as u64)?;
            // Warm-up: the pinned pool and the pages reach their working set (first touches
            // fault).
            for _ in 0..reps.min(64) {
                cmd.write_from(&h, &data)?;
            }
            cmd.sync()?.wait()?;
            let t = Instant::now();
            for _ in 0..reps {
                cmd.write_from(&h, &data)?;
            }
            cmd.sync()?.wait()?;
            *rate = (size * reps) as f64 / t.elapsed().as_secs_f64() / 1e9;
        }
        let [upload, upload_serial] = rates;
        let mut cmd = device.command(S)?;
        let h = cmd.empty(size as u64)?;
        cmd.write_from(&h, &data)?;
        for _ in 0..reps.min(64) {
            black_box(cmd.read_async(&[ReadRequest::whole(&h)])?.wait()?);
        }
        let t = Instant::now();
        for _ in 0..reps {
            let got = cmd.read_async(&[ReadRequest::whole(&h)])?.wait()?;
            assert_eq!(got[0].len(), size);
            black_box(got);
        }
        let readback = (size * reps) as f64 / t.elapsed().as_secs_f64() / 1e9;
        let mut kept = Some(devcmd::HostBuffer::try_zeroed(size)?);
        let mut read_to = || -> Result<(), devcmd::ServerError> {
            let buffer = kept.take().expect("kept between reads");
            kept = Some(cmd.read_to(ReadRequest::whole(&h), buffer)?.wait()?);
            Ok(())
        };
        for _ in 0..reps.min(64) {
            read_to()?;
        }
        let t = Instant::now();
        for _ in 0..reps {
            read_to()?;
        }
        let read_heap = (size * reps) as f64 / t.elapsed().as_secs_f64() / 1e9;
        assert!(kept.as_ref().is_some_and(|k| k.as_slice() == &data[..]));
        drop(h);
        println!(
            "| {} | {upload:.2} | {upload_serial:.2} | {readback:.2} | {read_heap:.2} | {memcpy:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
            human(size),
            upload / memcpy,
            upload_serial / memcpy,
            readback / memcpy,
            read_heap / memcpy
        );
    }
    peer_copies(quick)
}

/// Copies between two std devices ([`devcmd::Command::copy_from`], the peer path: one memcpy
/// between the two shims' address spaces on the destination stream's worker, ordered by a wait
/// each way) against the best memcpy of the same bytes.
fn peer_copies(quick: bool) -> Result<(), Box<dyn std::error::Error>> {
    println!("\n## Copies between two std devices against memcpy\n");
    println!(
        "`copy_from` of a whole allocation of device A into one of device B, back to back, \
         then a sync of both; the std shim's peer copy is one memcpy on B's stream worker.\n"
    );
    println!("| size | copy_from GB/s | memcpy GB/s | copy_from / memcpy |");
    println!("|---:|---:|---:|---:|");
    let device = || {
        let shim = StdShim::builder().total_memory(4 << 30).build();
        Device::new(shim, DeviceConfig::default())
    };
    let (mut a, mut b) = (device(), device());
    let sizes: &[usize] = if quick {
        &[1 << 20, 64 << 20]
    } else {
        &[64 << 10, 1 << 20, 16 << 20, 64 << 20, 256 << 20]
    };
    for &size in sizes {
        let data: Vec<u8> = (0..size).map(|i| i as u8).collect();
        let src = a.command(S)?.create(&data)?;
        let dst = b.command(S)?.empty(size as u64)?;
        let reps = ((2usize << 30) / size).clamp(4, 2000);
        let mut copy = || -> Result<(), devcmd::ServerError> {
            let mut source = a.command(S)?;
            b.command(S)?.copy_from(&dst, &mut source, &src)?;
            Ok(())
        };
        for _ in 0..reps.min(8) {
            copy()?;
        }
        let t = Instant::now();
        for _ in 0..reps {
            copy()?;
        }
        b.command(S)?.sync()?.wait()?;
        let rate = (size * reps) as f64 / t.elapsed().as_secs_f64() / 1e9;
        a.command(S)?.sync()?.wait()?;
        let got = b
            .command(S)?
            .read_async(&[ReadRequest::whole(&dst)])?
            .wait()?;
        assert!(got[0].as_slice() == &data[..], "the copied bytes differ");
        let memcpy = best_memcpy(&data, reps);
        println!(
            "| {} | {rate:.2} | {memcpy:.2} | {:.2} |",
            human(size),
            rate / memcpy
        );
    }
    Ok(())
}

/// GB/s of the fastest plain copy of `src` this machine does: two destinations at different
/// offsets, because a destination 4 KiB-aliased with the source runs many times slower, and the
/// anchor is the limit, not an unlucky placement.
fn best_memcpy(src: &[u8], reps: usize) -> f64 {
    let size = src.len();
    let mut best = 0.0f64;
    for offset in [0usize, 2048 + 64] {
        let mut dst = vec![0u8; size + offset];
        dst[offset..].copy_from_slice(src); // first touch faults the pages in
        let t = Instant::now();
        for _ in 0..reps {
            dst[offset..].copy_from_slice(black_box(src));
            black_box(&mut dst);
        }
        best = best.max((size * reps) as f64 / t.elapsed().as_secs_f64() / 1e9);
    }
    best
}

fn human(n: usize) -> String {
    match n {
        _ if n >= 1 << 20 => format!("{} MiB", n >> 20),
        _ => format!("{} KiB", n >> 10),
    }
}
