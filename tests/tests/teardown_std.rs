//! Teardown on the std shim: dropping a device with work still queued must not free memory
//! under that work. Lazy mode makes the queued work run only when the stream is driven, and
//! poison mode overwrites freed pages, so a kernel that ran after its pages were freed would see
//! the poison byte in its input.

use devcmd::{Device, DeviceConfig, Launch, LaunchDims, StreamId};
use devcmd_std::{POISON_BYTE, StdShim};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

#[test]
fn dropping_a_device_runs_queued_work_before_freeing_its_pages() {
    let shim = StdShim::builder().lazy(true).poison(true).build();
    let intact = Arc::new(AtomicU32::new(0));
    let ran = Arc::new(AtomicU32::new(0));
    let kernel = {
        let (intact, ran) = (Arc::clone(&intact), Arc::clone(&ran));
        shim.register_kernel("copy_checked", move |ctx| {
            let input = ctx.buffer(0)?;
            if input.iter().all(|&b| b == 7) {
                intact.fetch_add(1, Ordering::SeqCst);
            } else {
                assert!(
                    input.contains(&POISON_BYTE),
                    "input neither intact nor poisoned"
                );
            }
            ran.fetch_add(1, Ordering::SeqCst);
            Ok(())
        })
    };
    let probe = shim.clone();
    {
        let mut device = Device::new(shim, DeviceConfig::default());
        let mut cmd = device.command(StreamId(0)).unwrap();
        let input = cmd.create(&[7u8; 4096]).unwrap();
        let output = cmd.empty(4096).unwrap();
        // Release the upload's staging buffer: the drop queue is empty from here on, so no
        // fence of its own covers the launches below.
        cmd.flush_drops().unwrap();
        cmd.flush_drops().unwrap();
        ran.store(0, Ordering::SeqCst);
        for _ in 0..4 {
            cmd.launch(Launch {
                kernel: &kernel,
                dims: LaunchDims::SINGLE,
                inputs: &[&input],
                outputs: &[&output],
                params: &[],
            })
            .unwrap();
        }
        // Nothing has run yet (lazy); the handles drop with the device.
        assert_eq!(ran.load(Ordering::SeqCst), 0);
    }
    assert_eq!(ran.load(Ordering::SeqCst), 4, "every queued launch ran");
    assert_eq!(
        intact.load(Ordering::SeqCst),
        4,
        "every launch saw its input before it was freed"
    );
    assert_eq!(
        probe.stats().device_pages_live,
        0,
        "the device gave every page back"
    );
}
