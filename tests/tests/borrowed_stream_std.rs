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
