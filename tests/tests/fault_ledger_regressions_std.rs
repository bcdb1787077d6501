//! Regression tests for defects a review of the fault ledger found (issue 7): how far a stream's
//! fault reaches, fences that could not be recorded, failure marks across a bind, the kernel a
//! stream fault names, and a lost device seen by every operation.
//!
//! All run on the std shim in lazy mode (a stream runs nothing until one of its fences is waited
//! on), so work that runs too late or memory released too early shows up deterministically.

mod common;
use common::*;

use devcmd::{
    Command, Device, DeviceConfig, Handle, Launch, LibraryError, LibraryWork, ReadRequest,
    ServerError,
};
use devcmd::{DriverError, LaunchDims, Shim, ShimOp};
use devcmd_std::{Injection, StdKernel, StdShim, status};
use devcmd_tests::forward::{Forward, Hooks};
use std::sync::atomic::{AtomicBool, Ordering};

/// A stream that waited on another while it was healthy is not tainted by that stream's later
/// failure: its own fences stay clean (the shim's third rule carries a fault only to work ordered
/// after the failed work), so the ledger keeps no "ever waited on" taint.
#[test]
fn a_stream_that_waited_on_a_healthy_stream_survives_that_streams_later_failure() {
    let (shim, mut device) = lazy_device();
    let fail = failing_kernel(&shim);
    let b = device.command(S1).unwrap().create(&[2; 64]).unwrap();
    assert_eq!(read(&mut device, S0, &b).unwrap(), vec![2; 64]);
    let c = device.command(S1).unwrap().empty(64).unwrap();
    launch(&mut device, S1, &fail, &[], &[&c]).unwrap();
    let e = device.command(S1).unwrap().sync().unwrap().wait();
    assert!(
        matches!(e, Err(ServerError::StreamFaulted { stream: 1, .. })),
        "{e:?}"
    );
    let own = device.command(S0).unwrap().create(&[3; 16]);
    assert!(
        own.is_ok(),
        "stream 0 is failed by a fault of stream 1 that happened after their last order: {own:?}"
    );
}

/// A foreign use that a clean fence already covered needs no wait, and is not refused when its
/// stream fails later: the owner keeps using its memory (`FaultLedger::clean_through`).
#[test]
fn an_owner_keeps_its_memory_after_a_past_reader_fails_later() {
    let (shim, mut device) = lazy_device();
    let copy = copy_kernel(&shim);
    let fail = failing_kernel(&shim);
    let a = device.command(S0).unwrap().create(&[2; 64]).unwrap();
    let out = device.command(S1).unwrap().empty(64).unwrap();
    launch(&mut device, S1, &copy, &[&a], &[&out]).unwrap();
    device.command(S1).unwrap().sync().unwrap().wait().unwrap();
    let c = device.command(S1).unwrap().empty(64).unwrap();
    launch(&mut device, S1, &fail, &[], &[&c]).unwrap();
    let _ = device.command(S1).unwrap().sync().unwrap().wait();
    assert_eq!(
        read(&mut device, S0, &a).ok(),
        Some(vec![2; 64]),
        "the owner cannot read its own memory because a past, confirmed reader failed later"
    );
}

/// The std shim, whose next `record_event` fails (once, when armed) with the shim's own
/// classification of a kernel failure. CUDA's `cudaEventRecord` may return the error of an
/// earlier asynchronous launch, and `classify` does not look at the op, so a shim can answer a
/// record with [`devcmd::Fault::WorkFailed`]; the contract does not forbid it.
#[derive(Debug)]
struct FailNextRecord(AtomicBool);

impl Hooks<StdShim> for FailNextRecord {
    fn record_event(
        &self,
        inner: &StdShim,
        s: &<StdShim as Shim>::Stream,
    ) -> Result<<StdShim as Shim>::Event, DriverError> {
        if self.0.swap(false, Ordering::SeqCst) {
            return Err(inner.classify(ShimOp::EventRecord, status::KERNEL_FAILED));
        }
        inner.record_event(s)
    }
}

/// Every other call is the std shim's ([`Forward`]).
type RecordFailsOnce = Forward<StdShim, FailNextRecord>;

/// A fence that could not be recorded covers nothing, whatever the shim answered (here the fault
/// of earlier work): the read's buffers are leaked, never handed out again while their copies
/// may still run (`FenceOutcome::unrecorded`).
#[test]
fn a_read_whose_fence_cannot_be_recorded_keeps_its_buffers() {
    let shim = RecordFailsOnce {
        inner: StdShim::builder().lazy(true).build(),
        hooks: FailNextRecord(AtomicBool::new(false)),
    };
    let mut device = Device::new(shim, DeviceConfig::default());
    let h = device.command(S0).unwrap().create(&[0x5A; 64]).unwrap();
    device.command(S0).unwrap().flush_drops().unwrap();
    let pinned_in_use =
        |d: &mut Device<RecordFailsOnce>| d.memory_report().streams[0].1.pinned_host().in_use;
    let before = pinned_in_use(&mut device);
    device.shim().hooks.0.store(true, Ordering::SeqCst);
    let read = device
        .command(S0)
        .unwrap()
        .read_async(&[ReadRequest::whole(&h)])
        .map(drop);
    assert!(read.is_err(), "the fence could not be recorded: {read:?}");
    assert_eq!(
        pinned_in_use(&mut device),
        before + 64,
        "the read's pinned buffer was released though its copy has not run (lazy stream)"
    );
}

/// Failure marks of reserved room follow its bytes to the handle it is bound to, and go when
/// that handle's memory is freed: the records never outgrow live memory.
#[test]
fn failure_records_of_reserved_room_go_once_the_room_is_bound_and_freed() {
    let (shim, mut device) = lazy_device();
    let room = device.command(S0).unwrap().reserve(64).unwrap();
    shim.inject(Injection::nth(
        ShimOp::CopyHostToDevice,
        shim.stats().calls(ShimOp::CopyHostToDevice) + 1,
    ));
    assert!(
        device
            .command(S0)
            .unwrap()
            .write_from(&room, &[1; 64])
            .is_err()
    );
    shim.clear_injections();
    assert_eq!(
        device.failures().len(),
        (1, 1),
        "the refused upload is marked"
    );
    let t = {
        let mut cmd = device.command(S0).unwrap();
        let t = cmd.lazy(64);
        cmd.bind(room, &t).unwrap();
        t
    };
    drop(t);
    device.command(S0).unwrap().memory_cleanup().unwrap();
    assert_eq!(
        device.failures().len(),
        (0, 0),
        "a failure record outlives every handle of the memory it marked"
    );
}

/// Two allocations `y` (written) and `z` (empty) of 64 bytes, after a clean fence and then the
/// launch of a kernel that fails while it runs ("fail", writing a third allocation).
fn after_a_failing_launch(shim: &StdShim, cmd: &mut Command<'_, StdShim>) -> (Handle, Handle) {
    let bad = failing_kernel(shim);
    let x = cmd.create(&[0; 64]).unwrap();
    let y = cmd.create(&[0; 64]).unwrap();
    let z = cmd.empty(64).unwrap();
    cmd.flush_drops().unwrap();
    cmd.launch(Launch {
        kernel: &bad,
        dims: LaunchDims::SINGLE,
        inputs: &[],
        outputs: &[&x],
        params: &[],
    })
    .unwrap();
    (y, z)
}

/// A fault found by a drop-queue fence names the last kernel launched before that fence (kept
/// with the fence), not one launched after it.
#[test]
fn a_fault_found_by_the_drop_queue_names_a_kernel_launched_before_its_fence() {
    let (shim, mut device) = lazy_device();
    let good = copy_kernel(&shim);
    let mut cmd = device.command(S0).unwrap();
    let (y, z) = after_a_failing_launch(&shim, &mut cmd);
    cmd.write_from(&y, &[3; 64]).unwrap();
    // Waits for the fence before `bad` (clean) and records one after `bad` for the upload.
    cmd.flush_drops().unwrap();
    copy(&mut cmd, &good, &y, &z).unwrap();
    let e = cmd.flush_drops().unwrap_err();
    assert_names_fail(&e, "a kernel launched after the fence that reported it");
}

/// A launch the shim refuses, and library work that returns an error, were never enqueued: a
/// stream fault found later names the kernel launched before them, not them (the engine writes a
/// stream's last kernel before the device call and puts it back on a refusal).
#[test]
fn a_refused_launch_or_failed_library_call_is_not_the_kernel_a_later_fault_names() {
    for library in [false, true] {
        let (shim, mut device) = lazy_device();
        let good = copy_kernel(&shim);
        let mut cmd = device.command(S0).unwrap();
        let (y, z) = after_a_failing_launch(&shim, &mut cmd);
        let refused = if library {
            let (reads, writes) = ([&y], [&z]);
            // SAFETY: the call enqueues nothing.
            unsafe {
                cmd.library(LibraryWork::new("gemm", &reads, &writes), |_, _| {
                    Err(LibraryError::new(7, "refused by the test"))
                })
            }
        } else {
            shim.inject(Injection::nth(ShimOp::Launch, 2));
            copy(&mut cmd, &good, &y, &z)
        };
        assert!(refused.is_err(), "the work is refused (library: {library})");
        shim.clear_injections();
        // An upload gives the queue something to fence: the next flush records the fence after
        // both, the one after waits for it.
        cmd.write_from(&y, &[3; 64]).unwrap();
        cmd.flush_drops().unwrap();
        let e = cmd.flush_drops().unwrap_err();
        let what = if library { "library work" } else { "launch" };
        assert_names_fail(&e, &format!("the refused {what}, not the kernel that ran"));
    }
}

/// A launch of the copy kernel `good` from `y` into `z`.
fn copy(
    cmd: &mut Command<'_, StdShim>,
    good: &StdKernel,
    y: &Handle,
    z: &Handle,
) -> Result<(), ServerError> {
    cmd.launch(Launch {
        kernel: good,
        dims: LaunchDims::SINGLE,
        inputs: &[y],
        outputs: &[z],
        params: &[],
    })
}

/// `e` is a stream fault that names the kernel "fail"; otherwise it names `wrongly`.
fn assert_names_fail(e: &ServerError, wrongly: &str) {
    assert!(
        matches!(
            e,
            ServerError::StreamFaulted {
                kernel: Some("fail"),
                ..
            }
        ),
        "the fault names {wrongly}: {e:?}"
    );
}

/// `reserve_host` on a command held across the loss of the device fails fast.
#[test]
fn reserve_host_fails_fast_once_the_device_is_lost() {
    let (shim, mut device) = lazy_device();
    let mut cmd = device.command(S0).unwrap();
    let _h = cmd.create(&[1; 64]).unwrap();
    shim.lose_device();
    assert!(cmd.sync().and_then(|f| f.wait()).is_err());
    let host = cmd.reserve_host(64, true);
    assert!(
        matches!(host, Err(ServerError::DeviceLost { .. })),
        "reserve_host on a lost device: {host:?}"
    );
}

/// An allocation whose last handle drops on another thread leaves the failure records at the
/// device's next operation, not at a later cleanup: the return asks for the device's attention
/// (an operation that finds it silent skips the bookkeeping; issue 16).
#[test]
fn failure_marks_go_at_the_next_operation_after_a_drop_on_another_thread() {
    let (shim, mut device) = lazy_device();
    let (marked, other) = {
        let mut cmd = device.command(S0).unwrap();
        (cmd.create(&[0; 64]).unwrap(), cmd.create(&[0; 64]).unwrap())
    };
    shim.inject(Injection::nth(
        ShimOp::CopyHostToDevice,
        shim.stats().calls(ShimOp::CopyHostToDevice) + 1,
    ));
    let refused = device.command(S0).unwrap().write_from(&marked, &[1; 64]);
    assert!(refused.is_err(), "the upload was refused: {refused:?}");
    shim.clear_injections();
    device.command(S0).unwrap().sync().unwrap().wait().unwrap();
    device.command(S0).unwrap().flush_drops().unwrap();
    assert_eq!(
        device.failures().len(),
        (1, 1),
        "the refused upload is marked"
    );
    std::thread::spawn(move || drop(marked)).join().unwrap();
    device
        .command(S0)
        .unwrap()
        .write_from(&other, &[2; 64])
        .unwrap();
    assert_eq!(
        device.failures().len(),
        (0, 0),
        "the next operation did not look at what another thread dropped"
    );
}

/// Whether `r` is the refusal for now of a host wait (another device of the process records).
fn busy<T: std::fmt::Debug>(r: &Result<T, ServerError>) -> bool {
    matches!(r, Err(ServerError::Device(e)) if e.fault == devcmd::Fault::Busy)
}

/// While a stream of another device of the process records, this device's host waits are
/// refused for now (as on CUDA, where a recording is the process's). Such a wait once counted as
/// one of unknown outcome, and what its fence covered was leaked for good: the drop queue's
/// batch, a read's buffers, the staging ring's buffers. Now the fence stands and all of it is
/// kept, then settles once the recording ended.
#[test]
fn a_wait_refused_while_another_device_records_keeps_what_its_fence_covers() {
    const MIB: usize = 1 << 20;
    let shim_a = StdShim::builder().lazy(true).poison(true).build();
    let shim_b = StdShim::builder()
        .lazy(true)
        .poison(true)
        .process(&shim_a.process())
        .build();
    let mut a = Device::new(shim_a, DeviceConfig::default());
    let mut b = Device::new(shim_b.clone(), DeviceConfig::default());
    let big: Vec<u8> = (0..2 * MIB).map(|i| (i * 7 + 3) as u8).collect();
    let kept = b.command(S0).unwrap().create(&[5; 4096]).unwrap();
    let large = b.command(S0).unwrap().empty(big.len() as u64).unwrap();
    b.command(S0).unwrap().write_from(&large, &big).unwrap();
    for round in 0..2u8 {
        let gone = b.command(S0).unwrap().create(&[round; 4096]).unwrap();
        b.command(S0)
            .unwrap()
            .write_from(&kept, &[6 + round; 4096])
            .unwrap();
        drop(gone);
        b.command(S0).unwrap().flush_drops().unwrap();
    }
    let bytes_before = shim_b.stats().device_bytes_live;

    let recording = a.command(S1).unwrap().begin_capture("a").unwrap();
    let flushed = b.command(S0).unwrap().flush_drops();
    assert!(
        busy(&flushed),
        "a flush waits for a fence: refused for now, got {flushed:?}"
    );
    let synced = b.command(S0).unwrap().sync().unwrap().wait();
    assert!(busy(&synced), "a sync: refused for now, got {synced:?}");
    let refused = read(&mut b, S0, &kept);
    assert!(busy(&refused), "a read: refused for now, got {refused:?}");
    // A read into ordinary memory large enough for the staging ring waits for its slots.
    let piped = read_to_heap(&mut b, &large);
    assert!(
        busy(&piped),
        "a staged read: refused for now, got {piped:?}"
    );
    assert_eq!(leaked(&b), 0, "nothing a refused fence covered was leaked");
    assert_eq!(
        shim_b.stats().device_bytes_live,
        bytes_before,
        "nothing was freed while the device may use it"
    );
    drop(recording);
    a.command(S1).unwrap(); // ends the dropped recording

    assert_eq!(read(&mut b, S0, &kept).unwrap(), vec![7; 4096]);
    let back = read_to_heap(&mut b, &large).unwrap();
    assert!(
        back.as_slice() == big.as_slice(),
        "the staged read's bytes after the recording"
    );
    b.command(S0).unwrap().sync().unwrap().wait().unwrap();
    drop((kept, large));
    b.command(S0).unwrap().memory_cleanup().unwrap();
    b.command(S0).unwrap().memory_cleanup().unwrap();
    assert_eq!(leaked(&b), 0, "nothing leaked after the recording either");
    drop(b);
    let st = shim_b.stats();
    assert_eq!(
        (st.device_bytes_live, st.host_pages_live),
        (0, 0),
        "every page went back once the device went"
    );
}

/// Items the drop queues of `device` leaked so far.
fn leaked(device: &Device<StdShim>) -> u64 {
    device
        .drop_stats()
        .iter()
        .map(|(_, s)| s.items_leaked)
        .sum()
}

/// Reads the whole of `h` on stream 0 into a new heap buffer (`read_to`: pipelined through the
/// staging ring from 128 KiB), waiting for it.
fn read_to_heap(
    device: &mut Device<StdShim>,
    h: &Handle,
) -> Result<devcmd::HostBuffer, ServerError> {
    let len = usize::try_from(h.len()).expect("fits the host");
    device
        .command(S0)?
        .read_to(
            ReadRequest::whole(h),
            devcmd::HostBuffer::from_vec(vec![0; len]),
        )?
        .wait()
}

/// An injection that refuses the next call of `op` once the flag it returns is set.
fn once(op: ShimOp) -> (Injection, std::sync::Arc<AtomicBool>) {
    let armed = std::sync::Arc::new(AtomicBool::new(false));
    let fires = std::sync::Arc::clone(&armed);
    let injection = Injection::when(move |o, _| o == op && fires.swap(false, Ordering::AcqRel));
    (injection, armed)
}

/// Device allocations live on `device` (every stream, device pools only).
fn device_allocations(device: &mut Device<StdShim>) -> u64 {
    device
        .memory_report()
        .streams
        .iter()
        .map(|(_, r)| r.device().allocations)
        .sum()
}

/// A copy to another device whose source stream could not be made to wait for it (refused), and
/// whose end the destination could not wait for either because a third device of the process
/// records: the copy is still covered by the destination stream's next fence, so the source is
/// kept in that stream's drop queue and goes back once the fence passed. It used to be leaked for
/// good, as for a copy whose end is unknown.
#[test]
fn a_copy_whose_end_is_refused_for_now_keeps_its_source_until_the_next_fence() {
    let process = devcmd_std::Process::new();
    let (refuse_stream_wait, armed) = once(ShimOp::StreamWaitEvent);
    let shim_a = StdShim::builder()
        .process(&process)
        .inject(refuse_stream_wait)
        .build();
    let shim_b = StdShim::builder().process(&process).build();
    let shim_c = StdShim::builder().process(&process).build();
    let mut a = Device::new(shim_a.clone(), DeviceConfig::default());
    let mut b = Device::new(shim_b, DeviceConfig::default());
    let mut c = Device::new(shim_c, DeviceConfig::default());
    let src = a.command(S0).unwrap().create(&[4; 5000]).unwrap();
    // Keeps a page of A's until its teardown.
    let other = a.command(S0).unwrap().create(&[8; 100]).unwrap();
    let dst = b.command(S0).unwrap().create(&[1; 5000]).unwrap();
    let recording = c.command(S0).unwrap().begin_capture("c").unwrap();
    armed.store(true, Ordering::Release);
    let copied = {
        let mut from = a.command(S0).unwrap();
        b.command(S0).unwrap().copy_from(&dst, &mut from, &src)
    };
    assert!(copied.is_err(), "the source's wait was refused: {copied:?}");
    // The room may not go to another handle (whose drop could free it under the copy).
    let handed = {
        let mut k = a.command(S0).unwrap();
        let target = k.lazy(5000);
        k.bind(src, &target)
    };
    assert!(
        matches!(
            handed,
            Err(ServerError::Io(devcmd::IoError::Exposed { .. }))
        ),
        "the room of a source a copy may still read was handed over: {handed:?}"
    );
    assert_eq!(
        device_allocations(&mut a),
        2,
        "the copy may still read the source: kept"
    );
    drop(recording);
    c.command(S0).unwrap(); // ends the dropped recording
    b.command(S0).unwrap().sync().unwrap().wait().unwrap();
    b.command(S0).unwrap().flush_drops().unwrap();
    b.command(S0).unwrap().flush_drops().unwrap();
    a.command(S0).unwrap().memory_cleanup().unwrap();
    assert_eq!(
        device_allocations(&mut a),
        1,
        "the destination's fence passed: the source went back"
    );
    assert_eq!(leaked(&b), 0);
    // A's teardown waits for the copy's event again, finds it passed, and frees its memory (it
    // used to keep all of it for good after any copy of unknown end).
    drop(other);
    assert!(shim_a.stats().device_bytes_live > 0);
    drop(a);
    assert_eq!(
        shim_a.stats().device_bytes_live,
        0,
        "the copy is done: the source device's teardown gave its memory back"
    );
}

/// A pinned page the shim refused for now (another device of the process records) does not
/// turn the stream's pinned pool off: the writes stage from the heap meanwhile and from pinned
/// memory again once the recording ended, without a cleanup in between.
#[test]
fn a_pinned_page_refused_for_now_is_asked_for_again() {
    let shim_a = StdShim::new();
    let shim_b = StdShim::builder().process(&shim_a.process()).build();
    let mut a = Device::new(shim_a, DeviceConfig::default());
    let mut b = Device::new(shim_b.clone(), DeviceConfig::default());
    let h = b.command(S0).unwrap().empty(4096).unwrap();
    let recording = a.command(S1).unwrap().begin_capture("a").unwrap();
    b.command(S0).unwrap().write_from(&h, &[3; 4096]).unwrap();
    assert_eq!(
        shim_b.stats().host_pages_live,
        0,
        "refused for now: the heap"
    );
    drop(recording);
    a.command(S1).unwrap(); // ends the dropped recording
    b.command(S0).unwrap().write_from(&h, &[4; 4096]).unwrap();
    assert!(
        shim_b.stats().host_pages_live > 0,
        "once the recording ended, the pool asks for a pinned page again"
    );
    assert_eq!(read(&mut b, S0, &h).unwrap(), vec![4; 4096]);
}

/// The teardown of a device that made a copy of unknown end asks the destination again, but
/// never while a stream of the destination records: the core makes no host wait on a device
/// that records (the std shim spoils the recording then, as CUDA's global mode would). The
/// source then keeps its memory, and the destination's recording stays valid.
#[test]
fn a_teardown_does_not_wait_on_a_destination_that_records() {
    let (refuse_stream_wait, armed) = once(ShimOp::StreamWaitEvent);
    let shim_a = StdShim::builder().inject(refuse_stream_wait).build();
    let (refuse_event_wait, waits) = once(ShimOp::EventWait);
    let shim_b = StdShim::builder().inject(refuse_event_wait).build();
    let mut a = Device::new(shim_a.clone(), DeviceConfig::default());
    let mut b = Device::new(shim_b, DeviceConfig::default());
    let src = a.command(S0).unwrap().create(&[4; 5000]).unwrap();
    let dst = b.command(S0).unwrap().create(&[1; 5000]).unwrap();
    armed.store(true, Ordering::Release);
    waits.store(true, Ordering::Release);
    let copied = {
        let mut from = a.command(S0).unwrap();
        b.command(S0).unwrap().copy_from(&dst, &mut from, &src)
    };
    assert!(copied.is_err(), "the source's wait was refused: {copied:?}");
    drop(src);
    let h = b.command(S1).unwrap().empty(64).unwrap();
    let recording = b.command(S1).unwrap().begin_capture("b").unwrap();
    b.command(S1).unwrap().write_from(&h, &[9; 64]).unwrap();
    drop(a);
    assert!(
        shim_a.stats().device_bytes_live > 0,
        "the copy's end could not be asked: the source device kept its memory"
    );
    let graph = b.command(S1).unwrap().end_capture(recording);
    assert!(
        graph.is_ok(),
        "the destination's recording was spoiled by a wait on it: {graph:?}"
    );
}
