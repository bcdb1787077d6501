//! Regression tests for defects found in the command layer, one test each, on the std shim in lazy
//! and poison mode. The bind-order races are pinned in `command_model.rs` (also under miri), the
//! bad inputs of every operation in the suite's `bad_input` table.

mod common;
use common::*;

use devcmd::{CopyLayout, IoError, ReadRequest, ServerError, Validation};
use devcmd_std::KernelFault;

#[test]
fn reads_of_impossible_layouts_fail_before_reserving_host_memory() {
    let (_shim, mut device) = lazy_device();
    let h = device.command(S0).unwrap().create(&[5; 64]).unwrap();
    let before = device.command(S0).unwrap().memory_report();
    for bytes in [u64::MAX, 1 << 40, 200 << 20, 65] {
        let request = ReadRequest {
            handle: &h,
            layout: CopyLayout::linear(bytes),
        };
        let err = device
            .command(S0)
            .unwrap()
            .read_async(&[request])
            .map(drop)
            .unwrap_err();
        assert!(
            matches!(
                err,
                ServerError::Validation(Validation::LayoutPastView { view: 64, .. })
            ),
            "{bytes} bytes: {err:?}"
        );
    }
    assert_eq!(
        device.command(S0).unwrap().memory_report(),
        before,
        "a refused read holds no memory"
    );
    assert_eq!(read(&mut device, S0, &h).unwrap(), vec![5; 64]);
    let host = device.command(S0).unwrap().reserve_host(usize::MAX, true);
    assert!(
        matches!(
            host,
            Err(ServerError::Io(IoError::HostAllocFailed { len })) if len == usize::MAX as u64
        ),
        "{host:?}"
    );
}

#[test]
fn a_command_held_across_the_loss_of_the_device_fails_fast() {
    let (shim, mut device) = lazy_device();
    let mut cmd = device.command(S0).unwrap();
    let h = cmd.create(&[1; 64]).unwrap();
    cmd.flush_drops().unwrap();
    shim.lose_device();
    let lost = |r: Result<(), ServerError>| matches!(r, Err(ServerError::DeviceLost { .. }));
    assert!(lost(cmd.sync().and_then(|f| f.wait())));
    assert!(lost(cmd.poll_drops().map(drop)), "poll_drops");
    assert!(lost(cmd.flush_drops()), "flush_drops");
    assert!(lost(cmd.write_from(&h, &[2; 64])), "write");
    assert!(lost(cmd.empty(8).map(drop)), "empty");
}

#[test]
fn a_stream_fault_names_the_kernel_and_leaves_other_streams_working() {
    let (shim, mut device) = lazy_device();
    let failing = shim.register_kernel("write_then_fail", |ctx| {
        for b in ctx.buffers_mut()? {
            b.fill(0xEE);
        }
        Err(KernelFault::Failed)
    });
    let x = device.command(S0).unwrap().empty(64).unwrap();
    launch(&mut device, S0, &failing, &[], &[&x]).unwrap();
    let err = device
        .command(S0)
        .unwrap()
        .sync()
        .unwrap()
        .wait()
        .unwrap_err();
    assert!(
        matches!(
            err,
            ServerError::StreamFaulted {
                stream: 0,
                kernel: Some("write_then_fail"),
                ..
            }
        ),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(text.contains("`write_then_fail`"), "{text}");
    assert!(text.contains("other streams keep working"), "{text}");
    assert!(
        text.matches("recreate the device").count() <= 1,
        "advice repeated: {text}"
    );
    let y = device.command(S1).unwrap().create(&[4; 16]).unwrap();
    assert_eq!(read(&mut device, S1, &y).unwrap(), vec![4; 16]);
}

/// `bind` gave a room whose raw address was out (a managed resource) to another handle: the
/// resource's binding kept `reserved`, not the room's new owner, so dropping the new owner freed
/// memory the resource still named, and the new owner did not count as exposed. Refused while a
/// binding of the room is out; after, the room moves and its new owner counts as exposed.
#[test]
fn a_room_whose_raw_address_is_out_is_not_given_away() {
    let (_shim, mut d) = lazy_device();
    let x = d.command(S0).unwrap().create(&[1u8; 256]).unwrap();
    assert_eq!(read(&mut d, S0, &x).unwrap(), vec![1u8; 256]);
    let mut cmd = d.command(S0).unwrap();
    cmd.flush_drops().unwrap();
    cmd.flush_drops().unwrap(); // the upload's binding let go
    let resource = cmd.managed_resource(&x).unwrap();
    let target = cmd.lazy(256);
    let id = x.id();
    let r = cmd.bind(x.clone(), &target);
    assert!(
        matches!(r, Err(ServerError::Io(IoError::Exposed { handle })) if handle == id),
        "{r:?}"
    );
    assert!(r.unwrap_err().to_string().contains("managed_resource"));
    drop(resource);
    cmd.bind(x, &target).unwrap();
    assert!(target.is_exposed(), "the room's address was handed out");
    assert_eq!(read(&mut d, S0, &target).unwrap(), vec![1u8; 256]);
}

/// `end_capture_update` into a graph of another device refuses, and this stream's recording ends
/// with the refusal: the work the same command enqueues next runs (it was recorded into a
/// recording nobody ended, and lost without a mark).
#[test]
fn a_foreign_graph_ends_the_recording_at_once() {
    let (shim, mut other) = lazy_device();
    let mut mine = devcmd::Device::new(shim, devcmd::DeviceConfig::default());
    let mut foreign = {
        let mut cmd = other.command(S0).unwrap();
        let rec = cmd.begin_capture("theirs").unwrap();
        cmd.end_capture(rec).unwrap()
    };
    let mut cmd = mine.command(S0).unwrap();
    let x = cmd.create(&[1; 64]).unwrap();
    let rec = cmd.begin_capture("mine").unwrap();
    let refused = cmd.end_capture_update(rec, &mut foreign);
    assert!(
        matches!(
            refused,
            Err(ServerError::Capture(
                devcmd::CaptureError::ForeignGraph { .. }
            ))
        ),
        "{refused:?}"
    );
    assert_eq!(cmd.capture_phase(), devcmd::CapturePhase::Idle);
    cmd.write_from(&x, &[7; 64]).unwrap();
    let back = cmd
        .read_async(&[ReadRequest::whole(&x)])
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(
        back[0].as_slice(),
        [7; 64],
        "the write after the refusal ran"
    );
}
