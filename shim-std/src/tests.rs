//! Behaviour of the device through the `Shim` trait.

use crate::*;
use devcmd::{CopyLayout, DriverError, Fault, HostMemory, KernelParam, LaunchDims, Shim, ShimOp};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

fn span(shim: &StdShim, page: &StdDevicePage) -> devcmd::DeviceSpan {
    devcmd::DeviceSpan {
        addr: shim.device_page_addr(page),
        len: page.size(),
    }
}

fn sync(shim: &StdShim, stream: &StdStream) -> Result<(), DriverError> {
    shim.event_wait(&shim.record_event(stream)?)
}

fn upload(shim: &StdShim, stream: &StdStream, page: &StdDevicePage, data: &[u8]) {
    let layout = CopyLayout::linear(data.len() as u64);
    // SAFETY: `data` outlives the wait below; the page holds `data.len()` bytes.
    unsafe {
        shim.copy_to_device(
            stream,
            data.as_ptr(),
            HostMemory::Pageable,
            shim.device_page_addr(page),
            layout,
        )
    }
    .unwrap();
    sync(shim, stream).unwrap();
}

fn download(shim: &StdShim, stream: &StdStream, page: &StdDevicePage) -> Vec<u8> {
    let mut out = vec![0u8; page.size() as usize];
    let layout = CopyLayout::linear(page.size());
    // SAFETY: `out` outlives the wait below; the page holds `out.len()` bytes.
    unsafe {
        shim.copy_to_host(
            stream,
            shim.device_page_addr(page),
            out.as_mut_ptr(),
            HostMemory::Pageable,
            layout,
        )
    }
    .unwrap();
    sync(shim, stream).unwrap();
    out
}

/// The page's bytes read directly by the host; only while no work on it can run.
fn peek(shim: &StdShim, page: &StdDevicePage) -> Vec<u8> {
    let p = std::ptr::with_exposed_provenance::<u8>(shim.device_page_addr(page).0 as usize);
    // SAFETY: the page is live and zero-initialised; the caller makes sure nothing writes it now.
    unsafe { std::slice::from_raw_parts(p, page.size() as usize) }.to_vec()
}

fn fill_kernel(shim: &StdShim) -> StdKernel {
    shim.register_kernel("fill", |ctx| {
        let value = ctx.scalar_u32(0)? as u8;
        ctx.buffers_mut()?.into_iter().for_each(|b| b.fill(value));
        Ok(())
    })
}

fn blocking_kernel(shim: &StdShim) -> (StdKernel, mpsc::Sender<()>) {
    let (tx, rx) = mpsc::channel::<()>();
    let rx = Mutex::new(rx);
    let k = shim.register_kernel("block", move |_| {
        crate::lock(&rx).recv().map_err(|_| KernelFault::Failed)
    });
    (k, tx)
}

fn launch(shim: &StdShim, s: &StdStream, k: &StdKernel, pages: &[&StdDevicePage], arg: u32) {
    let spans: Vec<_> = pages.iter().map(|p| span(shim, p)).collect();
    // SAFETY: the spans are whole live pages.
    unsafe {
        shim.launch(
            s,
            k,
            LaunchDims::SINGLE,
            &spans,
            &[KernelParam::Scalar(&arg.to_ne_bytes())],
        )
    }
    .unwrap();
}

#[test]
fn a_stream_runs_its_work_in_order() {
    let shim = StdShim::new();
    let s = shim.create_stream().unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&log);
    let k = shim.register_kernel("log", move |ctx| {
        crate::lock(&seen).push(ctx.scalar_u32(0)?);
        Ok(())
    });
    assert_eq!(
        shim.kernel("log").map(|k| k.name().to_owned()),
        Some("log".into())
    );
    for i in 0..50 {
        launch(&shim, &s, &k, &[], i);
    }
    sync(&shim, &s).unwrap();
    assert_eq!(*crate::lock(&log), (0..50).collect::<Vec<_>>());
    assert_eq!(shim.stats().kernels_run, 50);
}

#[test]
fn work_runs_asynchronously_from_the_host() {
    let shim = StdShim::new();
    let s = shim.create_stream().unwrap();
    let (k, tx) = blocking_kernel(&shim);
    launch(&shim, &s, &k, &[], 0);
    let page = shim.device_alloc(64).unwrap();
    launch(&shim, &s, &fill_kernel(&shim), &[&page], 3); // enqueues behind the blocked kernel
    let e = shim.record_event(&s).unwrap();
    assert!(!shim.event_query(&e).unwrap());
    tx.send(()).unwrap();
    shim.event_wait(&e).unwrap();
    assert!(shim.event_query(&e).unwrap());
    assert_eq!(download(&shim, &s, &page), vec![3; 64]);
    let idle = shim.record_event(&s).unwrap();
    assert!(
        shim.event_query(&idle).unwrap(),
        "an event on an idle stream completes at once"
    );
}

#[test]
fn a_stream_waits_for_another_on_the_device() {
    let shim = StdShim::new();
    let (a, b) = (shim.create_stream().unwrap(), shim.create_stream().unwrap());
    let page = shim.device_alloc(32).unwrap();
    let (k, tx) = blocking_kernel(&shim);
    launch(&shim, &a, &k, &[], 0);
    launch(&shim, &a, &fill_kernel(&shim), &[&page], 7);
    let ea = shim.record_event(&a).unwrap();
    shim.stream_wait_event(&b, &ea).unwrap(); // does not block the host
    let mut out = [0u8; 32];
    // SAFETY: `out` outlives the wait below; the page holds 32 bytes.
    unsafe {
        shim.copy_to_host(
            &b,
            span(&shim, &page).addr,
            out.as_mut_ptr(),
            HostMemory::Pageable,
            CopyLayout::linear(32),
        )
    }
    .unwrap();
    let eb = shim.record_event(&b).unwrap();
    std::thread::sleep(Duration::from_millis(10));
    assert!(!shim.event_query(&eb).unwrap());
    tx.send(()).unwrap();
    shim.event_wait(&eb).unwrap();
    assert_eq!(out, [7; 32]);
}

#[test]
fn lazy_mode_runs_nothing_until_an_event_is_waited_on() {
    let shim = StdShim::builder().lazy(true).build();
    let s = shim.create_stream().unwrap();
    let page = shim.device_alloc(16).unwrap();
    let fill = fill_kernel(&shim);
    launch(&shim, &s, &fill, &[&page], 1);
    let e1 = shim.record_event(&s).unwrap();
    launch(&shim, &s, &fill, &[&page], 2);
    let e2 = shim.record_event(&s).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!((shim.stats().ops_run, s.pending()), (0, 2));
    assert_eq!(peek(&shim, &page), vec![0; 16]);
    shim.event_wait(&e1).unwrap();
    assert_eq!(
        peek(&shim, &page),
        vec![1; 16],
        "runs up to the event, not past it"
    );
    assert_eq!(s.pending(), 1);
    while !shim.event_query(&e2).unwrap() {
        std::thread::sleep(Duration::from_millis(1)); // a query drives the stream too
    }
    assert_eq!(peek(&shim, &page), vec![2; 16]);
}

#[test]
fn lazy_cross_stream_waits_drive_the_other_stream() {
    let shim = StdShim::builder().lazy(true).build();
    let (a, b) = (shim.create_stream().unwrap(), shim.create_stream().unwrap());
    let page = shim.device_alloc(8).unwrap();
    launch(&shim, &a, &fill_kernel(&shim), &[&page], 9);
    let ea = shim.record_event(&a).unwrap();
    shim.stream_wait_event(&b, &ea).unwrap();
    assert_eq!(download(&shim, &b, &page), vec![9; 8]);
    assert!(shim.event_query(&ea).unwrap());
}

#[test]
fn dropping_a_stream_finishes_its_queue() {
    for lazy in [false, true] {
        let shim = StdShim::builder().lazy(lazy).build();
        let s = shim.create_stream().unwrap();
        let done = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&done);
        let k = shim.register_kernel("slow", move |_| {
            std::thread::sleep(Duration::from_millis(20));
            flag.store(true, Ordering::SeqCst);
            Ok(())
        });
        launch(&shim, &s, &k, &[], 0);
        let e = shim.record_event(&s).unwrap();
        drop(s);
        assert!(done.load(Ordering::SeqCst));
        assert!(shim.event_query(&e).unwrap(), "events outlive their stream");
    }
}

#[test]
fn poisoned_memory_shows_a_free_before_the_fence() {
    let shim = StdShim::builder().lazy(true).poison(true).build();
    let s = shim.create_stream().unwrap();
    let page = shim.device_alloc(16).unwrap();
    upload(&shim, &s, &page, &[1; 16]);
    let mut out = [0u8; 16];
    // SAFETY: `out` outlives the wait below; the page holds 16 bytes.
    unsafe {
        shim.copy_to_host(
            &s,
            span(&shim, &page).addr,
            out.as_mut_ptr(),
            HostMemory::Pageable,
            CopyLayout::linear(16),
        )
    }
    .unwrap();
    let e = shim.record_event(&s).unwrap();
    // SAFETY: deliberately early (the bug poison mode exists to show): the quarantine keeps the
    // block allocated, so the late copy reads poison, not freed memory.
    unsafe { shim.device_free(page) };
    shim.event_wait(&e).unwrap();
    assert_eq!(out, [POISON_BYTE; 16]);
    let stats = shim.stats();
    assert!(stats.quarantined_bytes >= 16);
    assert_eq!(
        (
            stats.device_frees,
            stats.device_pages_live,
            stats.device_bytes_live
        ),
        (1, 0, 0)
    );
}

#[test]
fn too_big_out_of_memory_and_zero_size() {
    let shim = StdShim::builder()
        .total_memory(1 << 20)
        .max_page_size(512 << 10)
        .build();
    let fault = |size| shim.device_alloc(size).map(|_| ()).unwrap_err().fault;
    assert_eq!(fault(600 << 10), Fault::TooBig);
    assert_eq!(fault(2 << 20), Fault::TooBig);
    let a = shim.device_alloc(512 << 10).unwrap();
    let b = shim.device_alloc(512 << 10).unwrap();
    let err = shim.device_alloc(1).unwrap_err();
    assert_eq!(
        (err.fault, err.status),
        (Fault::OutOfMemory, status::OUT_OF_MEMORY)
    );
    // SAFETY: no work was enqueued.
    unsafe { shim.device_free(a) };
    let z1 = shim.device_alloc(0).unwrap();
    let z2 = shim.device_alloc(0).unwrap();
    assert_eq!(z1.size(), 0);
    assert_ne!(shim.device_page_addr(&z1), shim.device_page_addr(&z2));
    assert_eq!(shim.device_page_addr(&z1).0 % 256, 0);
    assert_eq!(shim.stats().device_bytes_live, 512 << 10);
    // SAFETY: no work was enqueued.
    unsafe { [b, z1, z2].into_iter().for_each(|p| shim.device_free(p)) };
}

#[test]
fn pitched_copies_round_trip() {
    let shim = StdShim::new();
    let s = shim.create_stream().unwrap();
    let layout = CopyLayout::of(&[4, 8], &[12, 1], 1).unwrap();
    assert!(!layout.is_linear());
    let (p1, p2) = (
        shim.device_alloc(48).unwrap(),
        shim.device_alloc(48).unwrap(),
    );
    let data: Vec<u8> = (1..=32).collect();
    let mut back = vec![0u8; 32];
    let (a1, a2) = (shim.device_page_addr(&p1), shim.device_page_addr(&p2));
    // SAFETY: `data` outlives the wait; the layout spans 44 of the page's 48 bytes.
    unsafe { shim.copy_to_device(&s, data.as_ptr(), HostMemory::Pageable, a1, layout) }.unwrap();
    let device = download(&shim, &s, &p1);
    for row in 0..4 {
        assert_eq!(&device[row * 12..row * 12 + 8], &data[row * 8..row * 8 + 8]);
        assert_eq!(&device[row * 12 + 8..(row * 12 + 12).min(48)], &[0; 4][..]);
    }
    // SAFETY: both spans lie in live pages and do not overlap; `back` outlives the wait.
    unsafe {
        shim.copy_on_device(&s, a1, a2, layout).unwrap();
        shim.copy_to_host(&s, a2, back.as_mut_ptr(), HostMemory::Pageable, layout)
            .unwrap();
    }
    sync(&shim, &s).unwrap();
    assert_eq!(back, data);
    // SAFETY: a span past the page is refused before anything is enqueued.
    let err = unsafe { shim.copy_on_device(&s, a1, a2.offset(8), layout) }.unwrap_err();
    assert_eq!(err.status, status::BAD_ADDRESS);
}

#[test]
fn graphs_record_then_replay_rereading_host_bytes() {
    let shim = StdShim::new();
    let s = shim.create_stream().unwrap();
    let page = shim.device_alloc(8).unwrap();
    let inc = shim.register_kernel("inc", |ctx| {
        ctx.buffers_mut()?
            .into_iter()
            .for_each(|b| b.iter_mut().for_each(|x| *x += 1));
        Ok(())
    });
    let mut host = [1u8; 8];
    shim.begin_capture(&s).unwrap();
    // SAFETY: `host` stays alive and unmoved for every replay below.
    unsafe {
        shim.copy_to_device(
            &s,
            host.as_ptr(),
            HostMemory::Pageable,
            shim.device_page_addr(&page),
            CopyLayout::linear(8),
        )
    }
    .unwrap();
    launch(&shim, &s, &inc, &[&page], 0);
    let graph = shim.end_capture(&s, false).unwrap();
    assert_eq!((graph.len(), shim.stats().ops_run, s.pending()), (2, 0, 0));
    shim.graph_upload(&graph, &s).unwrap();
    // SAFETY: the page and `host` are alive and unmoved.
    unsafe { shim.graph_launch(&graph, &s) }.unwrap();
    assert_eq!(download(&shim, &s, &page), vec![2; 8]);
    host.fill(5);
    // SAFETY: as above.
    unsafe { shim.graph_launch(&graph, &s) }.unwrap();
    assert_eq!(download(&shim, &s, &page), vec![6; 8]);

    shim.begin_capture(&s).unwrap();
    assert_eq!(
        shim.begin_capture(&s).unwrap_err().status,
        status::CAPTURE_STATE
    );
    assert_eq!(
        shim.end_capture(&s, true).unwrap_err().status,
        status::CAPTURE_DOOMED
    );
    shim.begin_capture(&s).unwrap();
    let err = shim.device_alloc(8).unwrap_err();
    assert_eq!(
        (err.fault, err.status),
        (Fault::Failed, status::CAPTURE_INVALIDATED)
    );
    assert_eq!(
        shim.end_capture(&s, false).unwrap_err().status,
        status::CAPTURE_INVALIDATED
    );
    assert_eq!(
        shim.end_capture(&s, false).unwrap_err().status,
        status::CAPTURE_STATE
    );
    assert!(shim.device_alloc(8).is_ok()); // allowed again (leaked on purpose)
    // Registering host memory spoils a recording too, as on CUDA.
    shim.begin_capture(&s).unwrap();
    let mut bytes = [0u8; 64];
    let ptr = std::ptr::NonNull::new(bytes.as_mut_ptr()).unwrap();
    let err = shim.host_register(ptr, bytes.len()).unwrap_err();
    assert_eq!(err.status, status::CAPTURE_INVALIDATED);
    assert_eq!(
        shim.end_capture(&s, false).unwrap_err().status,
        status::CAPTURE_INVALIDATED
    );
    assert_eq!(shim.stats().registrations_live, 0);
}

#[test]
fn kernel_faults_surface_at_every_later_fence_of_their_stream() {
    let shim = StdShim::new();
    let (s, other) = (shim.create_stream().unwrap(), shim.create_stream().unwrap());
    let fail = shim.register_kernel("fail", |_| Err(KernelFault::Failed));
    let panics = shim.register_kernel("panics", |_| panic!("kernel panic (expected by the test)"));
    let before = shim.record_event(&s).unwrap();
    launch(&shim, &s, &fail, &[], 0);
    assert!(
        shim.event_query(&before).is_ok(),
        "an event before the launch is not affected"
    );
    let err = sync(&shim, &s).unwrap_err();
    assert_eq!(
        (err.op, err.fault, err.status),
        (ShimOp::Launch, Fault::WorkFailed, status::KERNEL_FAILED)
    );
    // Sticky: a later fence reports the same first fault, whoever asked before.
    launch(&shim, &s, &panics, &[], 0);
    assert_eq!(sync(&shim, &s).unwrap_err().status, status::KERNEL_FAILED);
    assert_eq!(shim.stats().async_faults, 2);
    // Another stream is unaffected until it is ordered after the failed one.
    assert!(sync(&shim, &other).is_ok());
    let e = shim.record_event(&s).unwrap();
    shim.stream_wait_event(&other, &e).unwrap();
    assert_eq!(sync(&shim, &other).unwrap_err().fault, Fault::WorkFailed);
    assert!(!shim.is_lost());
}

#[test]
fn a_kernel_that_loses_the_device_fails_every_later_call() {
    let shim = StdShim::new();
    let s = shim.create_stream().unwrap();
    let lose = shim.register_kernel("lose", |_| Err(KernelFault::DeviceLost));
    let fill = fill_kernel(&shim);
    let page = shim.device_alloc(8).unwrap();
    // The stream is held by a blocked kernel while the rest is enqueued, so the fill is queued
    // behind the kernel that loses the device whatever the scheduling (no launch races the loss).
    let (block, release) = blocking_kernel(&shim);
    launch(&shim, &s, &block, &[], 0);
    launch(&shim, &s, &lose, &[], 0);
    launch(&shim, &s, &fill, &[&page], 4); // skipped: queued behind the loss
    let after = shim.record_event(&s).unwrap();
    assert!(!shim.is_lost(), "nothing ran yet: the stream is blocked");
    release.send(()).unwrap();
    // Waiting on the event is the deterministic point of the loss: it returns only once the
    // device-losing kernel has run (or the device is lost with no operation still running).
    let err = shim.event_wait(&after).unwrap_err();
    assert_eq!(
        (err.op, err.fault, err.status),
        (
            ShimOp::EventWait,
            Fault::DeviceLost,
            status::KERNEL_LOST_DEVICE
        )
    );
    assert!(shim.is_lost());
    assert_eq!(shim.stats().async_faults, 1);
    assert_eq!(
        peek(&shim, &page),
        vec![0; 8],
        "work after the loss never runs"
    );

    // Every later call fails fast with a device-lost error that carries the cause's status.
    let lost = |op: ShimOp, r: Result<(), DriverError>| {
        let err = r.expect_err("a call on a lost device must fail");
        assert_eq!(
            (err.op, err.fault, err.status),
            (op, Fault::DeviceLost, status::KERNEL_LOST_DEVICE),
            "{op:?} after the device was lost"
        );
    };
    let addr = shim.device_page_addr(&page);
    let mut host = [0u8; 8];
    // SAFETY: the span is the whole live page; the call fails before anything is enqueued.
    let r = unsafe {
        shim.launch(
            &s,
            &fill,
            LaunchDims::SINGLE,
            &[span(&shim, &page)],
            &[KernelParam::Scalar(&[4; 4])],
        )
    };
    lost(ShimOp::Launch, r);
    // SAFETY: `host` outlives the call, which fails before anything is enqueued.
    let r = unsafe {
        shim.copy_to_device(
            &s,
            host.as_ptr(),
            HostMemory::Pageable,
            addr,
            CopyLayout::linear(8),
        )
    };
    lost(ShimOp::CopyHostToDevice, r);
    // SAFETY: as above.
    let r = unsafe {
        shim.copy_to_host(
            &s,
            addr,
            host.as_mut_ptr(),
            HostMemory::Pageable,
            CopyLayout::linear(8),
        )
    };
    lost(ShimOp::CopyDeviceToHost, r);
    // SAFETY: as above.
    let r = unsafe { shim.copy_on_device(&s, addr, addr.offset(4), CopyLayout::linear(4)) };
    lost(ShimOp::CopyDeviceToDevice, r);
    lost(ShimOp::EventRecord, shim.record_event(&s).map(drop));
    lost(ShimOp::EventQuery, shim.event_query(&after).map(drop));
    lost(ShimOp::EventWait, shim.event_wait(&after));
    lost(ShimOp::StreamWaitEvent, shim.stream_wait_event(&s, &after));
    lost(ShimOp::DeviceAlloc, shim.device_alloc(8).map(drop));
    lost(ShimOp::StreamCreate, shim.create_stream().map(drop));
    lost(ShimOp::GraphBegin, shim.begin_capture(&s));
    lost(ShimOp::HostAlloc, shim.host_alloc_pinned(8).map(drop));
    assert_eq!(host, [0; 8]);
    // SAFETY: the device is lost: nothing will run again.
    unsafe { shim.device_free(page) };
}

#[test]
fn injection_by_count() {
    let shim = StdShim::builder()
        .inject(Injection::nth(ShimOp::DeviceAlloc, 2))
        .build();
    shim.inject(Injection::after(ShimOp::EventWait, 1));
    let s = shim.create_stream().unwrap();
    let a = shim.device_alloc(8).unwrap();
    let err = shim.device_alloc(8).unwrap_err();
    let code = status::injected(ShimOp::DeviceAlloc, false);
    assert_eq!((err.status, err.fault), (code, Fault::OutOfMemory));
    let b = shim.device_alloc(8).unwrap();
    sync(&shim, &s).unwrap();
    let err = sync(&shim, &s).unwrap_err();
    assert_eq!((err.op, err.fault), (ShimOp::EventWait, Fault::Failed));
    assert!(sync(&shim, &s).is_err());
    shim.clear_injections();
    sync(&shim, &s).unwrap();
    let stats = shim.stats();
    assert_eq!(
        (
            stats.calls(ShimOp::DeviceAlloc),
            stats.calls(ShimOp::EventWait)
        ),
        (3, 4)
    );
    assert_eq!((stats.device_pages_live, stats.device_bytes_live), (2, 16));
    // SAFETY: no work used the pages.
    unsafe { [a, b].into_iter().for_each(|p| shim.device_free(p)) };
}

#[test]
fn injection_by_predicate_and_budget() {
    let shim = StdShim::new();
    shim.inject(Injection::when(|op, size| {
        op == ShimOp::CopyHostToDevice && size > 1024
    }));
    let s = shim.create_stream().unwrap();
    let page = shim.device_alloc(4096).unwrap();
    let data = vec![0u8; 4096];
    let addr = shim.device_page_addr(&page);
    // SAFETY: `data` outlives the wait; the page holds 4096 bytes.
    unsafe {
        shim.copy_to_device(
            &s,
            data.as_ptr(),
            HostMemory::Pageable,
            addr,
            CopyLayout::linear(1024),
        )
        .unwrap();
        let err = shim.copy_to_device(
            &s,
            data.as_ptr(),
            HostMemory::Pageable,
            addr,
            CopyLayout::linear(2048),
        );
        assert_eq!(
            err.unwrap_err().status,
            status::injected(ShimOp::CopyHostToDevice, false)
        );
    }
    sync(&shim, &s).unwrap();
    shim.set_alloc_budget(Some(6000));
    let err = shim.device_alloc(4096).unwrap_err();
    assert_eq!(
        (err.status, err.fault),
        (status::BUDGET, Fault::OutOfMemory)
    );
    // SAFETY: the work that used the page has completed.
    unsafe { shim.device_free(page) };
    shim.device_alloc(4096).map(drop).unwrap();
}

#[test]
fn injected_loss_and_lose_device() {
    let shim = StdShim::new();
    shim.inject(Injection::nth(ShimOp::Launch, 1).losing_device());
    let s = shim.create_stream().unwrap();
    let k = fill_kernel(&shim);
    // SAFETY: no buffers.
    let err = unsafe {
        shim.launch(
            &s,
            &k,
            LaunchDims::SINGLE,
            &[],
            &[KernelParam::Scalar(&[0; 4])],
        )
    }
    .unwrap_err();
    assert_eq!(
        (err.status, err.fault),
        (status::injected(ShimOp::Launch, true), Fault::DeviceLost)
    );
    let err = shim.record_event(&s).unwrap_err();
    assert_eq!(
        (err.op, err.fault),
        (ShimOp::EventRecord, Fault::DeviceLost)
    );

    let shim = StdShim::new();
    shim.lose_device();
    let err = shim.device_alloc(1).unwrap_err();
    assert_eq!(
        (err.status, err.fault),
        (status::DEVICE_LOST, Fault::DeviceLost)
    );
}

/// A query never blocks, also when it is the call that loses the device while a worker still
/// runs an operation: it answers "not yet" (waiting for the workers is a wait's to do).
#[test]
fn a_query_that_loses_the_device_does_not_wait_for_the_workers() {
    let shim = StdShim::new();
    let s = shim.create_stream().unwrap();
    // A kernel that says it started, then blocks until released.
    let (started_tx, started) = mpsc::channel::<()>();
    let (release, released) = mpsc::channel::<()>();
    let channels = Mutex::new((started_tx, released));
    let block = shim.register_kernel("started_then_block", move |_| {
        let c = crate::lock(&channels);
        c.0.send(()).map_err(|_| KernelFault::Failed)?;
        c.1.recv().map_err(|_| KernelFault::Failed)
    });
    launch(&shim, &s, &block, &[], 0);
    let event = shim.record_event(&s).unwrap();
    // The worker runs the kernel now, so the query below meets a busy worker, never an idle one
    // (an idle one would make the lost device's error the right answer at once).
    started.recv().unwrap();
    shim.inject(Injection::nth(ShimOp::EventQuery, 1).losing_device());
    let (tx, rx) = mpsc::channel();
    std::thread::scope(|scope| {
        scope.spawn(|| tx.send(shim.event_query(&event)).unwrap());
        // A query that waited for the kernel would wait for the release below.
        let answer = rx.recv_timeout(std::time::Duration::from_secs(10));
        release.send(()).unwrap();
        assert!(
            matches!(answer, Ok(Ok(false))),
            "the query answered {answer:?}, not at once with \"not yet\""
        );
    });
    assert_eq!(
        shim.event_wait(&event).unwrap_err().fault,
        Fault::DeviceLost
    );
}

#[test]
fn integrated_host_pages_are_device_memory() {
    let shim = StdShim::builder().integrated(true).build();
    assert!(shim.facts().can_map_host && shim.facts().integrated);
    let s = shim.create_stream().unwrap();
    let page = shim.host_alloc_pinned(16).unwrap();
    let addr = shim.host_page_device_addr(&page).unwrap();
    assert_eq!(addr.0 as usize, shim.host_page_ptr(&page).as_ptr().addr());
    let spans = [devcmd::DeviceSpan { addr, len: 16 }];
    // SAFETY: the span is the whole live host page, mapped on this integrated device.
    unsafe {
        shim.launch(
            &s,
            &fill_kernel(&shim),
            LaunchDims::SINGLE,
            &spans,
            &[KernelParam::Scalar(&5u32.to_ne_bytes())],
        )
    }
    .unwrap();
    sync(&shim, &s).unwrap();
    // SAFETY: the page holds 16 initialised bytes and the kernel has completed.
    let bytes = unsafe { std::slice::from_raw_parts(shim.host_page_ptr(&page).as_ptr(), 16) };
    assert_eq!(bytes, [5; 16]);
    // SAFETY: the work that used the page has completed.
    unsafe { shim.host_free_pinned(page) };
    assert_eq!(shim.stats().host_pages_live, 0);

    let discrete = StdShim::new();
    let page = discrete.host_alloc_pinned(16).unwrap();
    assert_eq!(discrete.host_page_device_addr(&page), None);
    let spans = [devcmd::DeviceSpan {
        addr: devcmd::DeviceAddr(discrete.host_page_ptr(&page).as_ptr().addr() as u64),
        len: 16,
    }];
    let s = discrete.create_stream().unwrap();
    // SAFETY: refused before anything is enqueued: host pages are not device memory here.
    let err =
        unsafe { discrete.launch(&s, &fill_kernel(&discrete), LaunchDims::SINGLE, &spans, &[]) };
    assert_eq!(err.unwrap_err().status, status::BAD_ADDRESS);
    // SAFETY: nothing used the page.
    unsafe { discrete.host_free_pinned(page) };
}

#[test]
fn a_launch_past_cudas_geometry_is_refused_as_on_cuda() {
    let shim = StdShim::new();
    let s = shim.create_stream().unwrap();
    let k = shim.register_kernel("noop", |_| Ok(()));
    let within = [
        LaunchDims::linear(i32::MAX as u32, 1024),
        LaunchDims {
            grid: devcmd::Dim3 {
                x: 1,
                y: 65_535,
                z: 65_535,
            },
            block: devcmd::Dim3 { x: 16, y: 16, z: 4 },
            shared_bytes: 48 << 10,
        },
    ];
    for dims in within {
        // SAFETY: no buffers.
        unsafe { shim.launch(&s, &k, dims, &[], &[]) }.unwrap();
    }
    let mut past = Vec::new();
    past.push(LaunchDims::linear(1, 1025));
    let mut d = LaunchDims::SINGLE;
    d.grid.y = 65_536;
    past.push(d);
    let mut d = LaunchDims::SINGLE;
    d.block = devcmd::Dim3 { x: 32, y: 32, z: 2 };
    past.push(d);
    let mut d = LaunchDims::SINGLE;
    d.block.z = 65;
    past.push(d);
    let mut d = LaunchDims::SINGLE;
    d.shared_bytes = (48 << 10) + 1;
    past.push(d);
    past.push(LaunchDims::linear(u32::MAX, 1));
    for dims in past {
        // SAFETY: no buffers; the call is refused before anything is enqueued.
        let e = unsafe { shim.launch(&s, &k, dims, &[], &[]) }.unwrap_err();
        assert_eq!(
            (e.status, e.fault),
            (status::BAD_LAUNCH, Fault::Failed),
            "{dims:?}"
        );
    }
    sync(&shim, &s).unwrap();
}

/// A panic on a stream's worker outside a kernel (here: a value a host function captured, whose
/// drop panics when the worker drops the finished operation) fails that work instead of killing
/// the worker: the stream's fences still complete, report the fault, and later work runs.
#[test]
fn a_panic_on_the_worker_outside_a_kernel_fails_the_work_and_the_stream_goes_on() {
    struct PanicsOnDrop;
    impl Drop for PanicsOnDrop {
        fn drop(&mut self) {
            panic!("a captured value's drop panicked (on purpose)");
        }
    }
    let shim = StdShim::new();
    let s = shim.create_stream().unwrap();
    let guard = PanicsOnDrop;
    s.enqueue_host(move || {
        let _ = &guard;
        Ok(())
    });
    let event = shim.record_event(&s).unwrap();
    // Waited for on a thread of its own, not joined: a dead worker fails the test after the
    // timeout instead of hanging it.
    let (tx, rx) = mpsc::channel();
    let waiter = shim.clone();
    std::thread::spawn(move || tx.send(waiter.event_wait(&event)));
    let waited = rx
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("the wait completes: the worker lives on");
    let e = waited.unwrap_err();
    assert_eq!(
        (e.status, e.fault),
        (status::WORKER_PANICKED, Fault::WorkFailed)
    );
    // The stream goes on: later work runs, and its fences report the fault too (sticky).
    let ran = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&ran);
    s.enqueue_host(move || {
        flag.store(true, Ordering::Release);
        Ok(())
    });
    let later = shim.record_event(&s).unwrap();
    assert_eq!(
        shim.event_wait(&later).unwrap_err().status,
        status::WORKER_PANICKED
    );
    assert!(ran.load(Ordering::Acquire), "later work ran");
}
