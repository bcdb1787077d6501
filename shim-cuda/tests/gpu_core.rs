//! The core on the CUDA shim, for the paths only the core takes: zero copy on mapped pages
//! (forced here: the H200 is discrete but maps host memory over PCIe) and host memory registered
//! in place. They run where a CUDA device is present and skip with a visible line elsewhere.
//! A recording is the process's (CUDA's global capture mode), so run them one per process, as
//! `scripts/gpu-conformance` does (or with `--test-threads=1`).

mod common;

use common::{gpu, pattern, say};
use devcmd::{Device, DeviceConfig, ExternalBytes, HostOrigin, ReadRequest, StreamId};
use std::future::Future;

const S0: StreamId = StreamId(0);
const S1: StreamId = StreamId(1);

#[test]
fn the_core_runs_zero_copy_on_mapped_pages_when_asked() {
    let Some(shim) = gpu("the_core_runs_zero_copy_on_mapped_pages_when_asked") else {
        return;
    };
    let facts = devcmd::Shim::facts(&shim);
    let config = DeviceConfig {
        zero_copy: Some(true),
        ..DeviceConfig::default()
    };
    let mut dev = Device::new(shim, config);
    assert_eq!(dev.zero_copy(), facts.can_map_host);
    if !dev.zero_copy() {
        eprintln!("skipped: the device cannot map host memory");
        return;
    }
    let data = pattern(3 << 20, 5);
    let a = dev.command(S0).unwrap().create(&data).unwrap();
    // Another stream reads it by a device copy (a copy out of a mapped page), then an owned
    // read hands the allocation's own bytes back.
    let copied = dev
        .command(S1)
        .unwrap()
        .read_async(&[ReadRequest::whole(&a)])
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(copied[0].as_slice(), &data[..]);
    let owned = dev
        .command(S0)
        .unwrap()
        .read_owned(a)
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(owned[0].as_slice(), &data[..]);
    assert_eq!(owned[0].origin(), HostOrigin::Pinned);
    // Written in place again, then read.
    let b = dev.command(S0).unwrap().empty(4096).unwrap();
    dev.command(S0)
        .unwrap()
        .write_from(&b, &[0x5A; 4096])
        .unwrap();
    let back = dev
        .command(S0)
        .unwrap()
        .read_owned(b)
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(back[0].as_slice(), [0x5A; 4096]);
    drop((owned, back));
    dev.command(S0).unwrap().memory_cleanup().unwrap();
}

struct Weights(Box<[u8]>);

// SAFETY: the bytes live in the box, whose address and contents never change while it lives.
unsafe impl ExternalBytes for Weights {
    fn bytes(&self) -> &[u8] {
        &self.0
    }
    fn origin(&self) -> HostOrigin {
        HostOrigin::FileMapped
    }
}

#[test]
fn registered_host_memory_uploads_in_place() {
    let Some(shim) = gpu("registered_host_memory_uploads_in_place") else {
        return;
    };
    let mut dev = Device::new(shim, DeviceConfig::default());
    let data = pattern(8 << 20, 9);
    let bytes = dev.register_host(Box::new(Weights(data.clone().into())));
    assert_eq!(
        bytes.origin(),
        HostOrigin::Registered,
        "cuMemHostRegister took (HOST_REGISTER_SUPPORTED)"
    );
    let w = dev.command(S0).unwrap().empty(data.len() as u64).unwrap();
    dev.command(S0).unwrap().write(&w, bytes).unwrap();
    let back = dev
        .command(S0)
        .unwrap()
        .read_async(&[ReadRequest::whole(&w)])
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(back[0].as_slice(), &data[..]);
    let mut cmd = dev.command(S0).unwrap();
    cmd.flush_drops().unwrap();
    cmd.flush_drops().unwrap();
}

/// A second device used while one records: CUDA's global capture mode is the process's, so the
/// second device's host waits, allocations and frees would be refused by the driver and spoil
/// the first's recording. The shim keeps them from the driver: the second device's sync (on
/// another thread here) is refused, its frees wait for the recording to end; the recording
/// replays what it recorded, and the second device runs on afterwards.
#[test]
fn a_second_device_used_while_one_records_leaves_the_recording_valid() {
    let test = "a_second_device_used_while_one_records_leaves_the_recording_valid";
    let (Some(sa), Some(sb)) = (gpu(test), gpu(test)) else {
        return;
    };
    let mut a = Device::new(sa, DeviceConfig::default());
    let mut b = Device::new(sb, DeviceConfig::default());
    let sync = |b: &mut Device<_>| b.command(S0).and_then(|mut cmd| cmd.sync()?.wait());
    let data = pattern(1 << 20, 3);
    let y = a.command(S0).unwrap().empty(data.len() as u64).unwrap();
    let kept = b
        .command(S0)
        .unwrap()
        .create(&pattern(24 << 20, 4))
        .unwrap();
    let gone = b
        .command(S0)
        .unwrap()
        .create(&pattern(64 << 20, 5))
        .unwrap();
    sync(&mut b).unwrap();

    // On another thread, the second device drops memory, cleans up and syncs: any page it gives
    // back waits for the recording, and its sync is refused (the driver would refuse it and
    // spoil the recording).
    let recording = a.command(S0).unwrap().begin_capture("a").unwrap();
    a.command(S0).unwrap().write_from(&y, &data).unwrap();
    let synced = std::thread::scope(|s| {
        s.spawn(|| {
            drop(gone);
            b.command(S0).and_then(|mut cmd| cmd.memory_cleanup())?;
            sync(&mut b)
        })
        .join()
        .expect("the thread ran")
    });
    say(&format!(
        "a second device's sync on another thread while one records: {synced:?}; {} release(s) \
         waiting",
        devcmd_cuda::releases_waiting()
    ));
    assert!(
        synced.is_err(),
        "a host wait while a stream of the process records"
    );
    let graph = a
        .command(S0)
        .unwrap()
        .end_capture(recording)
        .expect("the other device's frees and refused sync leave the recording valid");
    assert_eq!(
        devcmd_cuda::releases_waiting(),
        0,
        "the recording's end ran what waited"
    );

    a.command(S0)
        .unwrap()
        .write_from(&y, &[0u8; 1 << 20])
        .unwrap();
    a.command(S0).unwrap().replay(&graph).unwrap();
    let back = a
        .command(S0)
        .unwrap()
        .read_async(&[ReadRequest::whole(&y)])
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(
        back[0].as_slice(),
        &data[..],
        "the replay wrote the recorded bytes"
    );
    // Once nothing records, the second device runs as usual: the refused wait's fault is
    // reported at most once more, then its sync passes.
    if let Err(e) = sync(&mut b) {
        say(&format!("the kept fault of the refused wait: {e}"));
        sync(&mut b).expect("the second device syncs once the recording ended");
    }
    let back = b
        .command(S0)
        .unwrap()
        .read_async(&[ReadRequest::whole(&kept)])
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(back[0].as_slice(), &pattern(24 << 20, 4)[..]);
}

/// The thread rule: the core calls the shim from one thread at a time, but not always the same
/// one. A device moved to another thread, a future waited and a handle dropped on a thread that
/// never touched CUDA all work, because the shim binds its context in every call.
#[test]
fn futures_handles_and_the_device_move_between_threads() {
    let Some(shim) = gpu("futures_handles_and_the_device_move_between_threads") else {
        return;
    };
    let mut dev = Device::new(shim, DeviceConfig::default());
    let data = pattern(1 << 20, 3);
    let a = dev.command(S0).unwrap().create(&data).unwrap();
    let read = dev
        .command(S0)
        .unwrap()
        .read_async(&[ReadRequest::whole(&a)])
        .unwrap();
    let got = std::thread::spawn(move || read.wait().unwrap())
        .join()
        .unwrap();
    assert_eq!(got[0].as_slice(), &data[..]);
    std::thread::spawn(move || drop(a)).join().unwrap();
    let mut dev = std::thread::spawn(move || {
        let b = dev.command(S1).unwrap().create(&[1; 4096]).unwrap();
        let got = dev
            .command(S1)
            .unwrap()
            .read_async(&[ReadRequest::whole(&b)])
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(got[0].as_slice(), [1; 4096]);
        dev
    })
    .join()
    .unwrap();
    dev.command(S0).unwrap().memory_cleanup().unwrap();
}

/// Review finding: the driver frees every pinned page of a primary context when its last retain
/// goes, so host buffers (a pinned read, a zero-copy lent buffer) that outlive their device kept
/// pointing at freed memory. Pinned pages now keep the context retained: the buffers stay valid,
/// even after another device allocates.
#[test]
fn host_buffers_outlive_their_device() {
    let Some(shim) = gpu("host_buffers_outlive_their_device") else {
        return;
    };
    let config = DeviceConfig {
        zero_copy: Some(true),
        ..DeviceConfig::default()
    };
    let mut dev = Device::new(shim, config);
    let data = pattern(1 << 20, 7);
    let a = dev.command(S0).unwrap().create(&data).unwrap();
    let b = dev.command(S0).unwrap().create(&data).unwrap();
    let pinned = dev
        .command(S0)
        .unwrap()
        .read_async(&[ReadRequest::whole(&a)])
        .unwrap()
        .wait()
        .unwrap();
    let lent = dev
        .command(S0)
        .unwrap()
        .read_owned(b)
        .unwrap()
        .wait()
        .unwrap();
    drop((a, dev));
    let Some(shim) = gpu("host_buffers_outlive_their_device") else {
        return;
    };
    let mut other = Device::new(shim, DeviceConfig::default());
    let junk = other.command(S0).unwrap().create(&[0xAB; 4 << 20]).unwrap();
    let _keep = other
        .command(S0)
        .unwrap()
        .read_async(&[ReadRequest::whole(&junk)])
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(pinned[0].as_slice(), &data[..], "the pinned read's bytes");
    assert_eq!(lent[0].as_slice(), &data[..], "the lent buffer's bytes");
}

/// A waker that counts its wakes and unparks the thread that polls.
struct Unpark {
    thread: std::thread::Thread,
    wakes: std::sync::atomic::AtomicUsize,
}

impl std::task::Wake for Unpark {
    fn wake(self: std::sync::Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &std::sync::Arc<Self>) {
        self.wakes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.thread.unpark();
    }
}

/// Issue 22: a read future awaited under an executor sleeps until the GPU is done. A read of
/// 256 bytes queued behind 200 ms of spinning is polled a handful of times (each poll after a
/// wake from the shim's callback, or a spurious unpark), not spun on; and a second notify of the
/// same event replaces the waker (only the latest is woken).
#[test]
fn a_read_future_sleeps_until_the_gpu_is_done() {
    let test = "a_read_future_sleeps_until_the_gpu_is_done";
    let Some(shim) = gpu(test) else {
        return;
    };
    let Some(module) = common::compile(&shim, common::SPIN, &[], test) else {
        return;
    };
    let spin = module.kernel_with_sizes("spin", &[8, 8]).unwrap();
    let mut dev = Device::new(shim.clone(), DeviceConfig::default());
    let out = dev.command(S0).unwrap().create(&[0u8; 256]).unwrap();
    let launch_on =
        |dev: &mut Device<devcmd_cuda::CudaShim>, s: StreamId, out: &devcmd::Handle, ms: u64| {
            let ns = (ms * 1_000_000).to_ne_bytes();
            dev.command(s)
                .unwrap()
                .launch(devcmd::Launch {
                    kernel: &spin,
                    dims: devcmd::LaunchDims::SINGLE,
                    inputs: &[],
                    outputs: &[out],
                    params: &[
                        devcmd::KernelParam::Buffer(0),
                        devcmd::KernelParam::Scalar(&ns),
                    ],
                })
                .unwrap();
        };
    let launch = |dev: &mut Device<devcmd_cuda::CudaShim>, ms: u64| launch_on(dev, S0, &out, ms);
    // Warm: the module is loaded before the timed part.
    launch(&mut dev, 1);
    dev.command(S0).unwrap().sync().unwrap().wait().unwrap();

    launch(&mut dev, 200);
    let started = std::time::Instant::now();
    let mut future = dev
        .command(S0)
        .unwrap()
        .read_async(&[ReadRequest::whole(&out)])
        .unwrap();
    let waker = std::sync::Arc::new(Unpark {
        thread: std::thread::current(),
        wakes: std::sync::atomic::AtomicUsize::new(0),
    });
    let w = std::task::Waker::from(std::sync::Arc::clone(&waker));
    let mut cx = std::task::Context::from_waker(&w);
    let mut polls = 0;
    let got = loop {
        polls += 1;
        match std::pin::Pin::new(&mut future).poll(&mut cx) {
            std::task::Poll::Ready(r) => break r.unwrap(),
            std::task::Poll::Pending => {
                std::thread::park_timeout(std::time::Duration::from_secs(5))
            }
        }
        assert!(started.elapsed().as_secs() < 10, "{test}: never woken");
    };
    let elapsed = started.elapsed();
    assert_eq!(got[0].as_slice()[0], 1, "the kernel's byte");
    assert!(
        elapsed.as_millis() >= 150,
        "{test}: resolved after {elapsed:?}, before the 200 ms kernel could finish"
    );
    assert!(
        polls <= 5,
        "{test}: {polls} polls for a read behind a 200 ms kernel: the future spun instead of \
         sleeping until the shim's callback woke it"
    );
    assert!(
        waker.wakes.load(std::sync::atomic::Ordering::SeqCst) >= 1,
        "{test}: resolved without a wake"
    );
    say(&format!(
        "{test}: {polls} polls, {} wakes, {elapsed:?}",
        waker.wakes.load(std::sync::atomic::Ordering::SeqCst)
    ));

    // Two streams: a future on stream 1 with nothing ahead of it resolves at once, although a
    // future on stream 0 (armed first) waits behind a 300 ms kernel.
    let other = dev.command(S1).unwrap().create(&[7u8; 256]).unwrap();
    dev.command(S1).unwrap().sync().unwrap().wait().unwrap();
    launch(&mut dev, 300);
    let slow_started = std::time::Instant::now();
    let mut slow = dev
        .command(S0)
        .unwrap()
        .read_async(&[ReadRequest::whole(&out)])
        .unwrap();
    assert!(
        std::pin::Pin::new(&mut slow).poll(&mut cx).is_pending(),
        "{test}: the read behind a 300 ms kernel is ready at once"
    );
    // Behind 20 ms of its own, so its first poll is pending and it must be woken.
    launch_on(&mut dev, S1, &other, 20);
    let mut quick = dev
        .command(S1)
        .unwrap()
        .read_async(&[ReadRequest::whole(&other)])
        .unwrap();
    let quick_started = std::time::Instant::now();
    let mut expected = [7u8; 256];
    expected[0] = 1;
    loop {
        match std::pin::Pin::new(&mut quick).poll(&mut cx) {
            std::task::Poll::Ready(r) => {
                assert_eq!(r.unwrap()[0].as_slice(), &expected[..]);
                break;
            }
            std::task::Poll::Pending => {
                std::thread::park_timeout(std::time::Duration::from_secs(5))
            }
        }
        assert!(
            quick_started.elapsed().as_secs() < 10,
            "{test}: never woken"
        );
    }
    let quick_took = quick_started.elapsed();
    assert!(
        quick_took.as_millis() < 150 && slow_started.elapsed().as_millis() < 290,
        "{test}: the read on stream 1 took {quick_took:?}: it waited behind stream 0's kernel \
         (one notifier for both streams)"
    );
    while std::pin::Pin::new(&mut slow).poll(&mut cx).is_pending() {
        std::thread::park_timeout(std::time::Duration::from_secs(5));
        assert!(
            slow_started.elapsed().as_secs() < 10,
            "{test}: the slow read never woke"
        );
    }
    say(&format!(
        "{test}: stream 1's read took {quick_took:?} beside stream 0's kernel"
    ));

    // The shim alone: a second notify of the same event value replaces the waker.
    use devcmd::Shim;
    let stream = shim.create_stream().unwrap();
    let (page, addr) = common::page(&shim, 256);
    let ns = 150_000_000u64.to_ne_bytes();
    // SAFETY: the page holds 256 bytes and outlives the wait below.
    unsafe {
        shim.launch(
            &stream,
            &spin,
            devcmd::LaunchDims::SINGLE,
            &[devcmd::DeviceSpan { addr, len: 256 }],
            &[
                devcmd::KernelParam::Buffer(0),
                devcmd::KernelParam::Scalar(&ns),
            ],
        )
    }
    .unwrap();
    let event = shim.record_event(&stream).unwrap();
    let first = std::sync::Arc::new(Unpark {
        thread: std::thread::current(),
        wakes: std::sync::atomic::AtomicUsize::new(0),
    });
    let second = std::sync::Arc::new(Unpark {
        thread: std::thread::current(),
        wakes: std::sync::atomic::AtomicUsize::new(0),
    });
    assert!(shim.event_notify(
        &event,
        &std::task::Waker::from(std::sync::Arc::clone(&first))
    ));
    assert!(shim.event_notify(
        &event,
        &std::task::Waker::from(std::sync::Arc::clone(&second))
    ));
    shim.event_wait(&event).unwrap();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while second.wakes.load(std::sync::atomic::Ordering::SeqCst) == 0
        && std::time::Instant::now() < until
    {
        std::thread::park_timeout(std::time::Duration::from_millis(10));
    }
    assert_eq!(
        (
            first.wakes.load(std::sync::atomic::Ordering::SeqCst),
            second.wakes.load(std::sync::atomic::Ordering::SeqCst)
        ),
        (0, 1),
        "{test}: wakes of the replaced waker and of the latest one"
    );
    // SAFETY: the stream passed the event after the only launch that used the page.
    unsafe { shim.device_free(page) };
}

/// Issue 22 on the GPU: typed uploads and reads (f32 and u16, through the pipeline at 1 MiB and
/// the single staging copy below it) and a scoped persistent window whose allocations land on
/// pages of their exact size, the mode restored after.
#[test]
fn typed_io_and_the_persistent_window_on_the_gpu() {
    let Some(shim) = gpu("typed_io_and_the_persistent_window_on_the_gpu") else {
        return;
    };
    let mut dev = Device::new(shim, DeviceConfig::default());
    let mut cmd = dev.command(S0).unwrap();
    for n in [3usize, 1000, 1 << 18] {
        let floats: Vec<f32> = (0..n).map(|i| i as f32 * 0.25 - 7.0).collect();
        let h = cmd.create_typed(&floats).unwrap();
        let mut back = vec![0f32; n];
        cmd.read_typed(&h, &mut back).unwrap();
        assert_eq!(back, floats, "{n} f32 through create_typed / read_typed");
        let halves: Vec<u16> = (0..2 * n).map(|i| (i * 7) as u16).collect();
        cmd.write_typed(&h, &halves).unwrap();
        let mut back = vec![0u16; 2 * n];
        cmd.read_typed(&h, &mut back).unwrap();
        assert_eq!(back, halves, "{} u16 written over them", 2 * n);
    }
    let weights = cmd.persistent(|c| c.create_typed(&[1.5f32; 4096])).unwrap();
    assert_eq!(
        cmd.current_allocation_mode(),
        devcmd::AllocationMode::Auto,
        "the window closed after the closure"
    );
    let mut back = vec![0f32; 4096];
    cmd.read_typed(&weights, &mut back).unwrap();
    assert!(back.iter().all(|&v| v == 1.5));
    let report = dev.memory_report();
    let persistent = report
        .streams
        .iter()
        .flat_map(|(_, r)| r.pools.iter())
        .find(|p| p.kind == devcmd::memory::PoolKind::Persistent)
        .map_or(0, |p| p.in_use);
    assert_eq!(
        persistent,
        4096 * 4,
        "the weights live in the persistent pool:\n{report}"
    );
}
