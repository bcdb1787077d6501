//! GPU tests of graphs beyond one recording: an executable graph updated in place
//! (`cuGraphExecUpdate`) or instantiated anew when the topology changed, and what global capture
//! mode allows other streams and other threads while a stream records. Like `gpu.rs`, they run
//! for real where a CUDA driver and device are present and print a visible `skipped: ...` line
//! and pass where none is. A recording is the process's (CUDA's global capture mode, and the
//! shim's count of recordings), so tests that record must not run beside each other: run them
//! one per process, as `scripts/gpu-conformance` does (or with `--test-threads=1`).

mod common;

use common::{compile, download, gpu, page, say, wait};
use devcmd::{CopyLayout, DeviceAddr, DeviceSpan, HostMemory, KernelParam, LaunchDims, Shim};
use devcmd_cuda::{CudaKernel, CudaShim, CudaStream};

const FILL: &str = r#"
extern "C" __global__ void fill(unsigned int* out, unsigned int value, unsigned long long n) {
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = value;
}
"#;

const N: usize = 4096;

/// Enqueues `fill(out, value, N)` on `stream`.
fn fill(shim: &CudaShim, stream: &CudaStream, kernel: &CudaKernel, out: DeviceAddr, value: u32) {
    let v = value.to_ne_bytes();
    let n = (N as u64).to_ne_bytes();
    let params = [
        KernelParam::Buffer(0),
        KernelParam::Scalar(&v),
        KernelParam::Scalar(&n),
    ];
    let buffers = [DeviceSpan {
        addr: out,
        len: (N * 4) as u64,
    }];
    // SAFETY: `out` is a live page of N u32s; the kernel writes only those.
    unsafe {
        shim.launch(
            stream,
            kernel,
            LaunchDims::covering(N as u64, 256),
            &buffers,
            &params,
        )
    }
    .unwrap();
}

#[test]
fn a_graph_updates_in_place_and_a_new_topology_instantiates_anew() {
    let test = "a_graph_updates_in_place_and_a_new_topology_instantiates_anew";
    let Some(shim) = gpu(test) else { return };
    let Some(module) = compile(&shim, FILL, &[], test) else {
        return;
    };
    let kernel = module.kernel("fill").unwrap();
    let stream = shim.create_stream().unwrap();
    let (out_page, out) = page(&shim, N * 4);
    let replay = |graph| {
        // SAFETY: the page the recording writes is alive until the end of the test.
        unsafe { shim.graph_launch(graph, &stream) }.unwrap();
        wait(&shim, &stream);
        download::<u32>(&shim, &stream, out, N)
    };

    shim.begin_capture(&stream).unwrap();
    fill(&shim, &stream, &kernel, out, 1);
    let graph = shim.end_capture(&stream, false).unwrap();
    assert_eq!(replay(&graph), vec![1; N]);

    shim.begin_capture(&stream).unwrap();
    fill(&shim, &stream, &kernel, out, 2);
    let updated = shim.end_capture_update(&stream, false, &graph).unwrap();
    assert!(updated.is_none(), "the same topology is updated in place");
    assert!(!shim.is_capturing(&stream).unwrap());
    assert_eq!(
        replay(&graph),
        vec![2; N],
        "the updated graph replays the new value"
    );

    shim.begin_capture(&stream).unwrap();
    fill(&shim, &stream, &kernel, out, 5);
    fill(&shim, &stream, &kernel, out, 3);
    let anew = shim
        .end_capture_update(&stream, false, &graph)
        .unwrap()
        .expect("two nodes where there was one: a new instantiation");
    assert_eq!(replay(&anew), vec![3; N]);
    assert_eq!(
        replay(&graph),
        vec![2; N],
        "the refused update left the graph as it was"
    );

    shim.begin_capture(&stream).unwrap();
    fill(&shim, &stream, &kernel, out, 9);
    let e = shim.end_capture_update(&stream, true, &graph).unwrap_err();
    assert!(
        !shim.is_capturing(&stream).unwrap(),
        "a doomed update ends the capture"
    );
    say(&format!("a doomed update: {e}"));
    assert_eq!(
        replay(&graph),
        vec![2; N],
        "a doomed update changes nothing"
    );
    drop((graph, anew));
    // SAFETY: every replay completed (waited above).
    unsafe { shim.device_free(out_page) };
}

/// While one stream records in global mode, another stream does what the core lets other streams
/// do then (a kernel, copies through pinned memory, an event recorded), and the recording still
/// seals. What the core refuses meanwhile CUDA refuses too, and spoils the recording over it (seen
/// on the H200: status 900, then 901 at the end): a query and a wait of another stream's event (no
/// host wait on any stream), and another thread's `cuMemAlloc`. The shim keeps them from the
/// driver (`recording.rs`), each in a recording of its own here, and the recording stays valid:
/// the query answers "not yet", the wait and the other thread's allocation are refused (the
/// answers are printed).
#[test]
fn other_streams_work_while_a_stream_records_in_global_mode() {
    let test = "other_streams_work_while_a_stream_records_in_global_mode";
    let Some(shim) = gpu(test) else { return };
    let Some(module) = compile(&shim, FILL, &[], test) else {
        return;
    };
    let kernel = module.kernel("fill").unwrap();
    let (recording, other) = (shim.create_stream().unwrap(), shim.create_stream().unwrap());
    let (a_page, a) = page(&shim, N * 4);
    let (b_page, b) = page(&shim, N * 4);
    let pinned = shim.host_alloc_pinned(N * 4).unwrap();
    let p = shim.host_page_ptr(&pinned).as_ptr();
    let layout = CopyLayout::linear((N * 4) as u64);
    let before = shim.record_event(&other).unwrap();

    shim.begin_capture(&recording).unwrap();
    fill(&shim, &recording, &kernel, a, 7);
    fill(&shim, &other, &kernel, b, 4);
    // SAFETY: `pinned` holds N u32s and outlives the wait below; `b` is a live page.
    unsafe { shim.copy_to_host(&other, b, p, HostMemory::Pinned, layout) }.unwrap();
    // SAFETY: as above.
    unsafe { shim.copy_to_device(&other, p, HostMemory::Pinned, a, layout) }.unwrap();
    let after = shim.record_event(&other).unwrap();
    let graph = shim
        .end_capture(&recording, false)
        .expect("work on another stream leaves the capture valid");
    shim.event_wait(&after).unwrap();
    // SAFETY: the copy into `pinned` completed (waited above).
    let copied = unsafe { std::slice::from_raw_parts(p.cast::<u32>(), N) };
    assert!(copied.iter().all(|&v| v == 4), "the other stream's copy");
    // SAFETY: `a` is alive until the end of the test.
    unsafe { shim.graph_launch(&graph, &recording) }.unwrap();
    wait(&shim, &recording);
    assert_eq!(download::<u32>(&shim, &recording, a, N), vec![7; N]);
    drop(graph);

    shim.begin_capture(&recording).unwrap();
    let query = shim.event_query(&before);
    let waited = shim.event_wait(&before);
    let ended = shim.end_capture(&recording, false).map(drop);
    say(&format!(
        "during a capture: query {query:?}, wait {waited:?} of another stream's event; the \
         capture then: {ended:?}"
    ));
    assert!(
        matches!(query, Ok(false)),
        "a query while a stream records answers \"not yet\" without the driver"
    );
    assert!(
        waited.is_err(),
        "a host wait on the recording thread is refused"
    );
    assert!(
        ended.is_ok(),
        "kept from the driver, they leave the recording valid"
    );
    assert!(!shim.is_capturing(&recording).unwrap());
    assert!(
        shim.event_query(&before).unwrap(),
        "after the recording, the query runs"
    );

    shim.begin_capture(&recording).unwrap();
    let alloc = std::thread::scope(|s| s.spawn(|| shim.device_alloc(1 << 20).map(drop)).join());
    let alloc = alloc.expect("the thread ran");
    let ended = shim.end_capture(&recording, false).map(drop);
    say(&format!(
        "during a capture: cuMemAlloc on another thread: {alloc:?}; the capture then: {ended:?}"
    ));
    assert!(
        alloc.is_err(),
        "another thread's allocation is refused while a stream records"
    );
    assert!(
        ended.is_ok(),
        "refused before the driver, it leaves the recording valid"
    );
    assert!(!shim.is_capturing(&recording).unwrap());
    // SAFETY: every copy and replay completed (waited above).
    unsafe {
        shim.host_free_pinned(pinned);
        shim.device_free(a_page);
        shim.device_free(b_page);
    }
}

/// A module dropped while a stream records is unloaded after the recording, not inside it
/// (`cuModuleUnload` waits for the whole device, which global mode refuses: the recording was
/// spoiled and the module stayed loaded).
#[test]
fn a_module_dropped_while_a_stream_records_leaves_the_recording_valid() {
    let test = "a_module_dropped_while_a_stream_records_leaves_the_recording_valid";
    let Some(shim) = gpu(test) else { return };
    let Some(used) = compile(&shim, FILL, &[], test) else {
        return;
    };
    let Some(unused) = compile(&shim, FILL, &[], test) else {
        return;
    };
    let kernel = used.kernel("fill").unwrap();
    let stream = shim.create_stream().unwrap();
    let (out_page, out) = page(&shim, N * 4);
    shim.begin_capture(&stream).unwrap();
    fill(&shim, &stream, &kernel, out, 5);
    drop(unused);
    let graph = shim
        .end_capture(&stream, false)
        .expect("a module dropped during the recording leaves it valid");
    // SAFETY: the page the recording writes is alive until the end of the test.
    unsafe { shim.graph_launch(&graph, &stream) }.unwrap();
    wait(&shim, &stream);
    assert_eq!(download::<u32>(&shim, &stream, out, N), vec![5; N]);
    drop(graph);
    // A module dropped with nothing recording still goes at once (no recording to spoil).
    let Some(again) = compile(&shim, FILL, &[], test) else {
        return;
    };
    drop(again);
    // SAFETY: the replay completed (waited above).
    unsafe { shim.device_free(out_page) };
}

/// A second shim (a second device, or a second `CudaShim` over the same one, as here) that gives
/// memory back while the first records: global capture mode is process-wide, so `cuMemFree` and
/// the other releases would be refused and spoil the recording. They wait for it to end, then
/// run.
#[test]
fn releases_of_another_shim_wait_for_a_recording_and_leave_it_valid() {
    let test = "releases_of_another_shim_wait_for_a_recording_and_leave_it_valid";
    let Some(a) = gpu(test) else { return };
    let Some(b) = gpu(test) else { return };
    let Some(module) = compile(&a, FILL, &[], test) else {
        return;
    };
    let Some(b_module) = compile(&b, FILL, &[], test) else {
        return;
    };
    let kernel = module.kernel("fill").unwrap();
    let stream = a.create_stream().unwrap();
    let (out_page, out) = page(&a, N * 4);
    // What the second shim gives back while the first records.
    let (b_page, _) = page(&b, 1 << 20);
    let b_host = b.host_alloc_pinned(1 << 20).unwrap();
    let mut bytes = vec![0u8; 1 << 20];
    let registration = b
        .host_register(
            std::ptr::NonNull::new(bytes.as_mut_ptr()).unwrap(),
            bytes.len(),
        )
        .unwrap();
    let g = b.facts().vm_granule;
    let mapping = (g > 0).then(|| {
        let base = b.vm_reserve(g).unwrap();
        (base, b.vm_map(base, g).unwrap())
    });
    assert_eq!(devcmd_cuda::releases_waiting(), 0);

    a.begin_capture(&stream).unwrap();
    fill(&a, &stream, &kernel, out, 7);
    assert!(
        b.is_any_stream_capturing(),
        "a recording of another shim counts: global capture mode is process-wide"
    );
    // SAFETY: nothing uses any of these (no work was enqueued on the second shim).
    unsafe {
        b.device_free(b_page);
        b.host_free_pinned(b_host);
        b.host_unregister(registration);
        if let Some((base, handle)) = mapping {
            b.vm_unmap(base, g, handle);
            b.vm_release(base, g);
        }
    }
    drop(b_module);
    // The unmap runs beside the recording (the driver takes it); the reservation's release
    // waits with the frees, the unregistration and the unload.
    let queued = 4 + usize::from(mapping.is_some());
    assert_eq!(
        devcmd_cuda::releases_waiting(),
        queued,
        "the releases the driver refuses wait while a stream of the process records"
    );
    let graph = a
        .end_capture(&stream, false)
        .expect("releases of another shim leave the recording valid");
    assert_eq!(
        devcmd_cuda::releases_waiting(),
        0,
        "the end of the last recording runs what waited"
    );
    // The registration is gone: the same bytes register again.
    let again = b
        .host_register(
            std::ptr::NonNull::new(bytes.as_mut_ptr()).unwrap(),
            bytes.len(),
        )
        .expect("the waiting unregistration ran");
    // SAFETY: nothing uses the registration.
    unsafe { b.host_unregister(again) };
    // SAFETY: the page the recording writes is alive until the end of the test.
    unsafe { a.graph_launch(&graph, &stream) }.unwrap();
    wait(&a, &stream);
    assert_eq!(download::<u32>(&a, &stream, out, N), vec![7; N]);
    drop(graph);
    // SAFETY: the replay completed (waited above).
    unsafe { a.device_free(out_page) };
    assert_eq!(devcmd_cuda::releases_waiting(), 0);
}
