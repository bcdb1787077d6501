//! A devcmd stream over a stream another runtime owns (`Device::borrow_stream`, issue 16), on the
//! std shim: devcmd orders and runs its work there, refuses an id already in use, and leaves the
//! stream running when the device goes.

use devcmd::{Device, DeviceConfig, ReadRequest, ServerError, Shim, StreamId, Validation};
use devcmd_std::StdShim;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

#[test]
fn a_borrowed_stream_runs_devcmd_work_and_outlives_the_device() {
    let shim = StdShim::new();
    // The runtime's own stream, created and owned outside devcmd.
    let theirs = shim.create_stream().unwrap();
    let mut device = Device::new(shim.clone(), DeviceConfig::default());
    // SAFETY: `theirs` is a live stream of this shim, outlives the device, and is under no other
    // devcmd stream.
    unsafe { device.borrow_stream(StreamId(3), &theirs) }.unwrap();
    // SAFETY: as above.
    let again = unsafe { device.borrow_stream(StreamId(3), &theirs) };
    assert!(
        matches!(
            again,
            Err(ServerError::Validation(Validation::StreamInUse {
                stream: 3
            }))
        ),
        "{again:?}"
    );
    // Work of the runtime and of devcmd interleave on the one stream, in order.
    let ran = Arc::new(AtomicU32::new(0));
    let counter = Arc::clone(&ran);
    theirs.enqueue_host(move || {
        counter.fetch_add(1, Ordering::SeqCst);
        Ok(())
    });
    let mut cmd = device.command(StreamId(3)).unwrap();
    let x = cmd.create(&[5; 64]).unwrap();
    let back = cmd
        .read_async(&[ReadRequest::whole(&x)])
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(back[0].as_slice(), [5; 64]);
    assert_eq!(
        ran.load(Ordering::SeqCst),
        1,
        "the runtime's work ran before devcmd's fence"
    );
    drop(x);
    drop(device);
    // The stream is the runtime's still: work enqueued after the device went runs.
    let counter = Arc::clone(&ran);
    theirs.enqueue_host(move || {
        counter.fetch_add(1, Ordering::SeqCst);
        Ok(())
    });
    shim.event_wait(&shim.record_event(&theirs).unwrap())
        .unwrap();
    assert_eq!(ran.load(Ordering::SeqCst), 2);
}

#[test]
fn a_recording_stream_is_not_borrowed_and_a_borrower_dropped_mid_recording_ends_it() {
    let shim = StdShim::new();
    let theirs = shim.create_stream().unwrap();
    shim.begin_capture(&theirs).unwrap();
    // SAFETY: `theirs` is a live stream of this shim that outlives the borrow.
    let refused = unsafe { shim.borrow_stream(&theirs) };
    assert_eq!(
        refused.map(drop).map_err(|e| e.status),
        Err(devcmd_std::status::CAPTURE_STATE),
        "a recording stream was borrowed"
    );
    drop(shim.end_capture(&theirs, true)); // a doomed end answers CAPTURE_DOOMED
    // A borrower that begins a recording and is dropped: the stream records no more, and the
    // device allocates again (a device refuses allocations while a stream records).
    // SAFETY: as above.
    let borrowed = unsafe { shim.borrow_stream(&theirs) }.unwrap();
    shim.begin_capture(&borrowed).unwrap();
    assert!(shim.device_alloc(64).is_err(), "refused while it records");
    drop(borrowed);
    let page = shim
        .device_alloc(64)
        .expect("allocations after the borrower went");
    // SAFETY: nothing uses the page.
    unsafe { shim.device_free(page) };
    shim.begin_capture(&theirs)
        .expect("the owner may record again");
    drop(shim.end_capture(&theirs, true)); // a doomed end answers CAPTURE_DOOMED
}

/// `event_query` never blocks, even once the device is lost while another stream's worker still
/// runs an operation: the event reads as not done until the workers are idle, then the loss.
#[test]
fn a_query_on_a_lost_device_does_not_wait_for_other_streams_work() {
    use std::sync::atomic::AtomicBool;
    use std::time::Duration;
    let shim = StdShim::new();
    let (busy, idle) = (shim.create_stream().unwrap(), shim.create_stream().unwrap());
    let done = shim.record_event(&idle).unwrap();
    shim.event_wait(&done).unwrap();
    let (started, release) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let (s, r) = (Arc::clone(&started), Arc::clone(&release));
    busy.enqueue_host(move || {
        s.store(true, Ordering::SeqCst);
        while !r.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    });
    while !started.load(Ordering::SeqCst) {
        std::thread::yield_now();
    }
    shim.lose_device();
    // Asked on another thread: a query that blocked would wait for `release`, which comes only
    // after the answer (or five seconds).
    let (tx, rx) = std::sync::mpsc::channel();
    let querier = {
        let shim = shim.clone();
        std::thread::spawn(move || tx.send(shim.event_query(&done).is_ok_and(|d| !d)).unwrap())
    };
    let answered = rx.recv_timeout(Duration::from_secs(5));
    release.store(true, Ordering::SeqCst);
    querier.join().unwrap();
    assert_eq!(
        answered,
        Ok(true),
        "event_query blocked on the other stream's work, or did not answer 'not done'"
    );
}
