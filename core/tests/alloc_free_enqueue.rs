//! The enqueue path makes no heap allocation once the pools are warm (issue 11): a counting
//! global allocator pins the allocations of each operation on the std shim.
//!
//! One test function on purpose: the counter is process-wide (shim-std's stream workers run on
//! their own threads and count too), so nothing else may run while it measures.

use devcmd::memory::MemoryConfig;
use devcmd::{
    Command, Device, DeviceConfig, DropPolicy, Handle, HostBuffer, KernelParam, Launch, LaunchDims,
    ReadRequest, StreamId,
};
use devcmd_std::{KernelFault, StdKernel, StdShim};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The system allocator, counting the calls that hand out memory while `COUNTING` is on.
struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static CALLS: AtomicU64 = AtomicU64::new(0);
/// Calls for at least [`BIG_BYTES`] bytes (a staging buffer of a large upload).
static BIG: AtomicU64 = AtomicU64::new(0);
const BIG_BYTES: usize = 1 << 19;

// SAFETY: every call is forwarded unchanged to the system allocator; only a counter is added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: the caller's contract is passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: the caller's contract is passed on.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size);
        // SAFETY: the caller's contract is passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract is passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
}

fn count(size: usize) {
    if COUNTING.load(Ordering::Relaxed) {
        CALLS.fetch_add(1, Ordering::Relaxed);
        if size >= BIG_BYTES {
            BIG.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Held by each test for its whole run: the count is process-wide, so tests take turns.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Allocator calls per run of `op`, averaged over `RUNS` runs after `WARM` warm-up runs.
fn per_op(mut op: impl FnMut()) -> f64 {
    const WARM: usize = 200;
    const RUNS: u64 = 1000;
    for _ in 0..WARM {
        op();
    }
    CALLS.store(0, Ordering::SeqCst);
    BIG.store(0, Ordering::SeqCst);
    COUNTING.store(true, Ordering::SeqCst);
    for _ in 0..RUNS {
        op();
    }
    COUNTING.store(false, Ordering::SeqCst);
    CALLS.load(Ordering::SeqCst) as f64 / RUNS as f64
}

const S0: StreamId = StreamId(0);
const N: usize = 256;

fn scale_kernel(shim: &StdShim) -> StdKernel {
    // scale(float *y, const float *x, float a): y = a * x, one buffer view at a time (no
    // allocation in the kernel either: it runs on the stream's worker while the count is on).
    shim.register_kernel("scale", |ctx| {
        let (y, x, a) = (ctx.slot(0)?, ctx.slot(1)?, ctx.scalar_f32(2)?);
        let mut tmp = [0f32; N];
        for (t, v) in tmp.iter_mut().zip(devcmd_std::as_f32(ctx.buffer(x)?)?) {
            *t = v * a;
        }
        let out = devcmd_std::as_f32_mut(ctx.buffer_mut(y)?)?;
        out.copy_from_slice(&tmp[..out.len()]);
        Ok::<(), KernelFault>(())
    })
}

fn cmd(device: &mut Device<StdShim>) -> Command<'_, StdShim> {
    device.command(S0).expect("stream 0")
}

/// Reads `h` into the buffer `kept` holds (`read_to` + wait) and puts it back, filled.
fn read_kept(device: &mut Device<StdShim>, h: &Handle, kept: &mut Option<HostBuffer>) {
    let buffer = kept.take().expect("the buffer is kept");
    let back = cmd(device)
        .read_to(ReadRequest::whole(h), buffer)
        .unwrap()
        .wait()
        .unwrap();
    *kept = Some(back);
}

#[test]
fn warm_enqueue_operations_do_not_allocate() {
    let _turn = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let shim = StdShim::new();
    let kernel = scale_kernel(&shim);
    let config = DeviceConfig {
        memory: MemoryConfig::default(),
        // Small batches: the warm-up runs through many flushes, so the figure covers them.
        drops: DropPolicy {
            max_items: 16,
            ..DropPolicy::default()
        },
        // Pieces of 256 KiB: a 1 MiB pipelined copy runs in four of them.
        staging: devcmd::staging::StagingPolicy {
            chunk: 256 << 10,
            ..devcmd::staging::StagingPolicy::default()
        },
        ..DeviceConfig::default()
    };
    let mut device = Device::new(shim, config);
    let bytes = (N * 4) as u64;
    let x = cmd(&mut device).reserve(bytes).unwrap();
    let y = cmd(&mut device).reserve(bytes).unwrap();
    let input: Vec<u8> = (0..N).flat_map(|i| (i as f32).to_le_bytes()).collect();
    cmd(&mut device).write_from(&x, &input).unwrap();
    let a = 2f32.to_ne_bytes();

    let mut figures: Vec<(&str, f64)> = Vec::new();

    let launch = per_op(|| {
        cmd(&mut device)
            .launch(Launch {
                kernel: &kernel,
                dims: LaunchDims::linear(1, 1),
                inputs: &[&x],
                outputs: &[&y],
                params: &[
                    KernelParam::Buffer(1),
                    KernelParam::Buffer(0),
                    KernelParam::Scalar(&a),
                ],
            })
            .unwrap();
        // Waited for, so the queue never runs deeper than the warm-up took it: an asynchronous
        // queue run ahead without bound grows (its storage is reused, but only up to its peak).
        cmd(&mut device).sync().unwrap().wait().unwrap();
    });
    figures.push(("launch (1 in, 1 out, 3 params) + sync", launch));

    // Each write waited for, as the launches are: an asynchronous queue run ahead without bound
    // (a loaded machine's worker falling behind) grows to a new peak once in a while.
    let staged_write = per_op(|| {
        let mut c = cmd(&mut device);
        c.write_from(&x, &input).unwrap();
        c.sync().unwrap().wait().unwrap();
    });
    figures.push(("staged write (write_from, 1 KiB) + sync", staged_write));

    let pinned_write = per_op(|| {
        let mut c = cmd(&mut device);
        let mut staged = c.reserve_host(N * 4, true).unwrap();
        staged.as_mut_slice().copy_from_slice(&input);
        c.write(&x, staged).unwrap();
        c.sync().unwrap().wait().unwrap();
    });
    figures.push((
        "write of a pinned buffer (reserve_host + write) + sync",
        pinned_write,
    ));

    let read_async = per_op(|| {
        let out = cmd(&mut device)
            .read_async(&[ReadRequest::whole(&y)])
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(out[0].len(), N * 4);
    });
    figures.push(("read (read_async + wait, 1 request)", read_async));

    let mut kept = Some(cmd(&mut device).reserve_host(N * 4, true).unwrap());
    let read_to = per_op(|| read_kept(&mut device, &y, &mut kept));
    figures.push(("read into a kept pinned buffer (read_to + wait)", read_to));

    // A small read into the caller's heap buffer lands in pinned memory of the stream's pool
    // and is copied out when the future resolves: nothing allocated, and the device copies
    // into pinned memory, never the caller's.
    let mut kept_small = Some(HostBuffer::zeroed(N * 4));
    let staged_read = per_op(|| read_kept(&mut device, &y, &mut kept_small));
    figures.push((
        "staged read into a kept heap buffer (read_to + wait, 1 KiB)",
        staged_read,
    ));
    let copies = |d: &Device<StdShim>| d.shim().stats().copies_by_host_memory;
    let before = copies(&device);
    read_kept(&mut device, &y, &mut kept_small);
    assert_eq!(
        {
            let after = copies(&device);
            (after[0] - before[0], after[1] - before[1])
        },
        (0, 1),
        "copies by host memory (pageable, pinned) of one staged read"
    );
    let direct = cmd(&mut device)
        .read_async(&[ReadRequest::whole(&y)])
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(
        kept_small.as_ref().map(HostBuffer::as_slice),
        Some(direct[0].as_slice()),
        "the staged read's bytes"
    );

    // A pipelined upload and read of 1 MiB (pieces through the stream's staging ring, copied on
    // the shim's worker threads): nothing allocated per piece or per copy once the ring is full.
    let big: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
    let z = cmd(&mut device).reserve(big.len() as u64).unwrap();
    let pipelined_write = per_op(|| {
        let mut c = cmd(&mut device);
        c.write_from(&z, &big).unwrap();
        c.sync().unwrap().wait().unwrap();
    });
    figures.push((
        "pipelined write (write_from, 1 MiB, 4 pieces) + sync",
        pipelined_write,
    ));
    let mut kept_heap = Some(HostBuffer::zeroed(big.len()));
    let pipelined_read = per_op(|| read_kept(&mut device, &z, &mut kept_heap));
    figures.push((
        "pipelined read into a kept heap buffer (read_to, 1 MiB)",
        pipelined_read,
    ));
    assert!(
        kept_heap.as_ref().unwrap().as_slice() == &big[..],
        "1 MiB round trip"
    );
    // The figures above are the pipeline's: one more of each makes four copies from and four
    // into pinned memory (the ring's buffers), none from or into the caller's memory.
    let before = copies(&device);
    let mut c = cmd(&mut device);
    c.write_from(&z, &big).unwrap();
    c.sync().unwrap().wait().unwrap();
    read_kept(&mut device, &z, &mut kept_heap);
    let after = copies(&device);
    assert_eq!(
        (after[0] - before[0], after[1] - before[1]),
        (0, 8),
        "copies by host memory (pageable, pinned) of one pipelined write and one pipelined read"
    );
    drop(kept_heap);

    let reserve_drop = per_op(|| {
        let h: Handle = cmd(&mut device).reserve(256).unwrap();
        drop(h);
    });
    figures.push(("reserve + drop of a 256 B slice", reserve_drop));

    // The results are right, too.
    let out = cmd(&mut device)
        .read_async(&[ReadRequest::whole(&y)])
        .unwrap()
        .wait()
        .unwrap();
    let expect: Vec<u8> = (0..N)
        .flat_map(|i| (2.0 * i as f32).to_le_bytes())
        .collect();
    assert_eq!(out[0].as_slice(), &expect[..]);
    drop(HostBuffer::zeroed(0));

    for (what, n) in &figures {
        println!("allocations per operation: {n:5.2}  {what}");
    }
    // The figures, pinned: every warm enqueue operation allocates nothing. `read_async` hands
    // back a new vector of buffers and keeps its bindings in another: two, by its signature
    // (`read_to` is the allocation-free read).
    let pinned = [0.0, 0.0, 0.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0];
    for ((what, n), want) in figures.iter().zip(pinned) {
        assert_eq!(*n, want, "allocations per operation of {what}");
    }
}

/// Review finding: the reuse bounds (argument lists a stream keeps, identities a manager keeps,
/// launch spans on the stack) were fixed and exceeded silently. They are raised to the workload
/// here (`spare_launches`, `spare_identities`), and a launch of more buffers than the stack holds
/// reuses the device's list: a step of 12 queued launches of 17 buffers each, then a sync, and a
/// step of 16 reservations dropped together, allocate nothing once warm.
#[test]
fn deeper_queues_and_wider_launches_stay_allocation_free_with_their_bounds_raised() {
    const QUEUED: usize = 12;
    const HANDLES: usize = 16;
    let _turn = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    // Lazy: the stream runs nothing until the sync's fence is waited on, so every step queues
    // all twelve launches at once (a deterministic peak, which the warm-up reaches).
    let shim = StdShim::builder().lazy(true).spare_launches(QUEUED).build();
    let noop = shim.register_kernel("noop", |_| Ok::<(), KernelFault>(()));
    let memory = MemoryConfig {
        spare_identities: HANDLES,
        ..MemoryConfig::default()
    };
    let config = DeviceConfig {
        memory,
        drops: DropPolicy {
            max_items: 16,
            ..DropPolicy::default()
        },
        ..DeviceConfig::default()
    };
    let mut device = Device::new(shim, config);
    let inputs: Vec<Handle> = (0..16)
        .map(|_| cmd(&mut device).reserve(64).unwrap())
        .collect();
    let out = cmd(&mut device).reserve(64).unwrap();
    let in_refs: Vec<&Handle> = inputs.iter().collect();
    let step = per_op(|| {
        for _ in 0..QUEUED {
            cmd(&mut device)
                .launch(Launch {
                    kernel: &noop,
                    dims: LaunchDims::SINGLE,
                    inputs: &in_refs,
                    outputs: &[&out],
                    params: &[],
                })
                .unwrap();
        }
        cmd(&mut device).sync().unwrap().wait().unwrap();
    });
    let mut held: Vec<Handle> = Vec::with_capacity(HANDLES);
    let burst = per_op(|| {
        for _ in 0..HANDLES {
            held.push(cmd(&mut device).reserve(256).unwrap());
        }
        held.clear();
    });
    println!(
        "allocations per step: {step:5.2} (12 launches of 17 buffers + sync), {burst:5.2} (16 reserves, then 16 drops)"
    );
    assert_eq!((step, burst), (0.0, 0.0));
}

/// `write_from` stages at most once (issue 16): from borrowed bytes, one staging buffer when the
/// pinned pool cannot serve (the heap fallback: no second heap copy), and none at all on a
/// zero-copy device (the host writes the page in place). Counted as allocations of at least
/// [`BIG_BYTES`] per upload of 1 MiB, with the bytes read back right.
#[test]
fn write_from_stages_at_most_once() {
    const LEN: usize = 1 << 20;
    let _turn = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let data: Vec<u8> = (0..LEN).map(|i| (i * 7 % 251) as u8).collect();
    let no_pinned = DeviceConfig {
        pinned: devcmd::pinned::PinnedConfig {
            max_bytes: 0,
            ..Default::default()
        },
        ..DeviceConfig::default()
    };
    let integrated = StdShim::builder().integrated(true).build();
    for (what, shim, config, want) in [
        (
            "heap fallback (no pinned memory)",
            StdShim::new(),
            no_pinned,
            1,
        ),
        ("zero copy", integrated, DeviceConfig::default(), 0),
    ] {
        let mut device = Device::new(shim, config);
        let x = cmd(&mut device).empty(LEN as u64).unwrap();
        let upload = |device: &mut Device<StdShim>| {
            let mut c = cmd(device);
            c.write_from(&x, &data).unwrap();
            c.sync().unwrap().wait().unwrap();
        };
        for _ in 0..3 {
            upload(&mut device);
        }
        BIG.store(0, Ordering::SeqCst);
        COUNTING.store(true, Ordering::SeqCst);
        const RUNS: u64 = 20;
        for _ in 0..RUNS {
            upload(&mut device);
        }
        COUNTING.store(false, Ordering::SeqCst);
        let big = BIG.load(Ordering::SeqCst);
        println!(
            "large allocations per write_from of 1 MiB, {what}: {}",
            big as f64 / RUNS as f64
        );
        assert_eq!(big, want * RUNS, "{what}: staging buffers per write_from");
        let back = cmd(&mut device)
            .read_async(&[ReadRequest::whole(&x)])
            .unwrap()
            .wait()
            .unwrap();
        assert!(back[0].as_slice() == &data[..], "{what}: the bytes landed");
    }
}
