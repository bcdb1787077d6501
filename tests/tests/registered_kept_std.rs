//! A registration kept across writes (issue 18): bytes registered once serve many uploads
//! through [`HostBuffer::share`], none of them staged, and the registration is undone only after
//! the last upload's fence, once every share and the original are dropped.

use devcmd::{Device, DeviceConfig, ExternalBytes, HostBuffer, HostOrigin, ReadRequest, StreamId};
use devcmd_std::StdShim;

/// The caller's bytes, never changed while the value lives.
struct Input(Vec<u8>);

// SAFETY: the vector is owned by the value and never modified: `bytes` returns the same slice
// until the value drops.
unsafe impl ExternalBytes for Input {
    fn bytes(&self) -> &[u8] {
        &self.0
    }
    fn origin(&self) -> HostOrigin {
        HostOrigin::Heap
    }
}

#[test]
fn one_registration_serves_many_writes_and_is_undone_after_the_last_fence() {
    const LEN: usize = 1 << 20;
    // Lazy: nothing runs before a fence is waited for, so a registration undone too early
    // would be seen (the copies still pending read the bytes).
    let shim = StdShim::builder().lazy(true).build();
    let probe = shim.clone();
    let mut device = Device::new(shim, DeviceConfig::default());
    let data: Vec<u8> = (0..LEN).map(|i| (i * 13 % 251) as u8).collect();
    let input = device.register_host(Box::new(Input(data.clone())));
    assert_eq!(input.origin(), HostOrigin::Registered);
    let registrations = || probe.stats().registrations_live;
    let copies = || probe.stats().copies_by_host_memory;
    assert_eq!(registrations(), 1);

    let before = copies();
    let mut cmd = device.command(StreamId(0)).unwrap();
    let targets: Vec<_> = (0..5).map(|_| cmd.empty(LEN as u64).unwrap()).collect();
    for t in &targets {
        let again = input.share().expect("a registered buffer shares");
        assert_eq!(again.origin(), HostOrigin::Registered);
        cmd.write(t, again).unwrap();
    }
    let after = copies();
    assert_eq!(
        after[2] - before[2],
        5,
        "every write runs from the registered bytes (copies by host memory: pageable, pinned, \
         registered)"
    );
    assert_eq!(
        after[0] + after[1],
        before[0] + before[1],
        "no write was staged"
    );
    drop(input);
    assert_eq!(
        registrations(),
        1,
        "the shares in the drop queue keep the registration until their fences pass"
    );
    for t in &targets {
        let back = cmd
            .read_async(&[ReadRequest::whole(t)])
            .unwrap()
            .wait()
            .unwrap();
        assert!(
            back[0].as_slice() == &data[..],
            "a write from a shared registration"
        );
    }
    cmd.sync().unwrap().wait().unwrap();
    cmd.flush_drops().unwrap();
    cmd.flush_drops().unwrap();
    assert_eq!(
        registrations(),
        0,
        "undone once the last share's fence passed"
    );
}

#[test]
fn only_registered_buffers_share() {
    assert!(HostBuffer::from_vec(vec![1, 2, 3]).share().is_none());
    let mut device = Device::new(StdShim::new(), DeviceConfig::default());
    let pinned = device
        .command(StreamId(0))
        .unwrap()
        .reserve_host(64, true)
        .unwrap();
    assert!(
        pinned.share().is_none(),
        "a pinned buffer is written by the host"
    );
}

/// A std device (and a clone of its shim, to read its counts) holding 4 KiB registered.
fn device_with_a_registration() -> (StdShim, Device<StdShim>, HostBuffer) {
    let shim = StdShim::new();
    let probe = shim.clone();
    let device = Device::new(shim, DeviceConfig::default());
    let input = device.register_host(Box::new(Input(vec![7; 4096])));
    (probe, device, input)
}

#[test]
fn a_registration_whose_last_buffer_goes_inside_a_recording_is_undone_after_it() {
    // Unregistering inside a recording is illegal on CUDA (the std shim invalidates the
    // recording, as CUDA does): the last drop waits for the recording to end.
    let (probe, mut device, input) = device_with_a_registration();
    let registrations = || probe.stats().registrations_live;
    assert_eq!(registrations(), 1);
    let mut cmd = device.command(StreamId(0)).unwrap();
    let h = cmd.empty(4096).unwrap();
    let recording = cmd.begin_capture("g").unwrap();
    cmd.write(&h, HostBuffer::from_vec(vec![1; 4096])).unwrap();
    drop(input);
    assert_eq!(registrations(), 1, "not undone inside the recording");
    let graph = cmd
        .end_capture(recording)
        .expect("the recording stays valid");
    assert_eq!(
        registrations(),
        1,
        "still waiting: the device undoes it at its next command"
    );
    let mut cmd = device.command(StreamId(0)).unwrap();
    assert_eq!(registrations(), 0, "undone once nothing records");
    cmd.replay(&graph).unwrap();
    let back = cmd
        .read_async(&[ReadRequest::whole(&h)])
        .unwrap()
        .wait()
        .unwrap();
    assert!(back[0].as_slice() == &[1u8; 4096][..]);
}

#[test]
fn a_registration_waiting_for_a_recording_is_undone_when_the_device_goes() {
    let (probe, mut device, input) = device_with_a_registration();
    let mut cmd = device.command(StreamId(0)).unwrap();
    let recording = cmd.begin_capture("g").unwrap();
    drop(input);
    assert_eq!(probe.stats().registrations_live, 1);
    drop(recording);
    drop(device);
    assert_eq!(probe.stats().registrations_live, 0);
}
