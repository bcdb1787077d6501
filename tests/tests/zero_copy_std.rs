//! Zero copy on an integrated std device (mapped pages), registered host memory, and the kind of
//! host memory every copy is told: what the core decides from the device's facts and what it
//! asks of the shim.

mod common;

use common::{S0, S1, copy_kernel, launch};
use devcmd::{Device, DeviceConfig, ExternalBytes, HostBuffer, HostOrigin, ReadRequest, ShimOp};
use devcmd_std::{Injection, StdShim};

fn integrated(lazy: bool) -> (StdShim, Device<StdShim>) {
    let shim = StdShim::builder()
        .integrated(true)
        .lazy(lazy)
        .poison(true)
        .build();
    let device = Device::new(shim.clone(), DeviceConfig::default());
    (shim, device)
}

fn copies(shim: &StdShim) -> (u64, u64) {
    let s = shim.stats();
    (
        s.calls(ShimOp::CopyHostToDevice),
        s.calls(ShimOp::CopyDeviceToHost),
    )
}

#[test]
fn zero_copy_is_read_from_the_facts_and_the_configuration() {
    let (_, dev) = integrated(false);
    assert!(dev.zero_copy(), "integrated and can map host memory: on");
    let off = DeviceConfig {
        zero_copy: Some(false),
        ..DeviceConfig::default()
    };
    let dev = Device::new(StdShim::builder().integrated(true).build(), off);
    assert!(!dev.zero_copy(), "turned off by the configuration");
    let dev = Device::new(StdShim::new(), DeviceConfig::default());
    assert!(!dev.zero_copy(), "discrete: off by default");
    let forced = DeviceConfig {
        zero_copy: Some(true),
        ..DeviceConfig::default()
    };
    let dev = Device::new(StdShim::new(), forced);
    assert!(
        !dev.zero_copy(),
        "a device that cannot map host memory never runs zero copy, even when asked"
    );
}

#[test]
fn uploads_and_owned_reads_make_no_device_copy() {
    for lazy in [false, true] {
        let (shim, mut dev) = integrated(lazy);
        let copy = copy_kernel(&shim);
        let data: Vec<u8> = (0..=255).collect();
        let a = dev.command(S0).unwrap().create(&data).unwrap();
        let b = dev.command(S0).unwrap().empty(256).unwrap();
        launch(&mut dev, S0, &copy, &[&a], &[&b]).unwrap();
        let got = dev
            .command(S0)
            .unwrap()
            .read_owned(b)
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(got[0].as_slice(), &data[..], "lazy={lazy}");
        assert_eq!(
            got[0].origin(),
            HostOrigin::Pinned,
            "the allocation's own pinned bytes"
        );
        assert_eq!(
            copies(&shim),
            (0, 0),
            "lazy={lazy}: no device copy either way"
        );
        assert_eq!(
            shim.stats().calls(ShimOp::DeviceAlloc),
            0,
            "every page is a mapped host page"
        );
    }
}

#[test]
fn an_owned_read_of_a_shared_allocation_copies() {
    let (shim, mut dev) = integrated(false);
    let a = dev.command(S0).unwrap().create(&[9; 64]).unwrap();
    let view = a.view(0, 32).unwrap();
    let got = dev
        .command(S0)
        .unwrap()
        .read_owned(a)
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(got[0].as_slice(), [9; 64]);
    assert_eq!(
        copies(&shim).1,
        1,
        "another view is alive (later work could write it): the bytes are copied out"
    );
    drop(view);
}

/// A zero-copy write must not overtake work another stream enqueued on the same memory: here a
/// kernel on stream 1 reads `a` (lazily, so it has not run) when stream 0 overwrites `a`.
#[test]
fn a_zero_copy_write_waits_for_earlier_readers() {
    let (shim, mut dev) = integrated(true);
    let copy = copy_kernel(&shim);
    let a = dev.command(S0).unwrap().create(&[1; 64]).unwrap();
    let out = dev.command(S1).unwrap().empty(64).unwrap();
    launch(&mut dev, S1, &copy, &[&a], &[&out]).unwrap();
    dev.command(S0).unwrap().write_from(&a, &[2; 64]).unwrap();
    let got = dev
        .command(S1)
        .unwrap()
        .read_owned(out)
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(
        got[0].as_slice(),
        [1; 64],
        "stream 1's kernel read what `a` held when it was launched"
    );
    let got = dev
        .command(S0)
        .unwrap()
        .read_async(&[ReadRequest::whole(&a)])
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(got[0].as_slice(), [2; 64]);
}

/// A buffer lent out of a mapped page outlives the device: the page is leaked, never freed (and
/// so never poisoned) under it.
#[test]
fn a_lent_buffer_outlives_the_device() {
    let (shim, mut dev) = integrated(false);
    let a = dev.command(S0).unwrap().create(&[7; 4096]).unwrap();
    let got = dev
        .command(S0)
        .unwrap()
        .read_owned(a)
        .unwrap()
        .wait()
        .unwrap();
    drop(dev);
    assert_eq!(
        got[0].as_slice(),
        [7; 4096],
        "still the device's last bytes"
    );
    assert_eq!(
        shim.stats().host_pages_live,
        1,
        "the page under the lent buffer is leaked, not freed"
    );
    drop(got);
}

/// Memory-mapped weights stand-in: bytes the caller owns, lent to the device.
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
fn registered_bytes_upload_in_place_and_unregister_after_their_fence() {
    let shim = StdShim::builder().lazy(true).build();
    let mut dev = Device::new(shim.clone(), DeviceConfig::default());
    let bytes = dev.register_host(Box::new(Weights(vec![5; 1 << 16].into())));
    assert_eq!(bytes.origin(), HostOrigin::Registered);
    assert_eq!(shim.stats().registrations_live, 1);
    let w = dev.command(S0).unwrap().empty(1 << 16).unwrap();
    let staged_before = shim.stats().host_pages_live;
    dev.command(S0).unwrap().write(&w, bytes).unwrap();
    assert_eq!(
        shim.stats().copies_by_host_memory,
        [0, 0, 1],
        "one copy, straight from the registered bytes"
    );
    assert_eq!(
        shim.stats().host_pages_live,
        staged_before,
        "nothing staged"
    );
    assert_eq!(
        shim.stats().registrations_live,
        1,
        "the copy has not run (lazy stream): still registered"
    );
    let got = dev
        .command(S0)
        .unwrap()
        .read_async(&[ReadRequest::whole(&w)])
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(got[0].as_slice(), vec![5; 1 << 16]);
    let mut cmd = dev.command(S0).unwrap();
    cmd.flush_drops().unwrap(); // a fence for what the queue holds
    cmd.flush_drops().unwrap(); // waits for it, releases what it covered
    assert_eq!(
        shim.stats().registrations_live,
        0,
        "unregistered once the drop queue's fence after the copy passed"
    );
}

#[test]
fn bytes_the_device_cannot_register_stay_ordinary() {
    // The device refuses the registration: the bytes come back as an external buffer, staged.
    let shim = StdShim::new();
    let dev = Device::new(shim.clone(), DeviceConfig::default());
    shim.inject(Injection::nth(ShimOp::HostRegister, 1));
    let bytes = dev.register_host(Box::new(Weights(vec![1; 64].into())));
    assert_eq!(bytes.origin(), HostOrigin::FileMapped);
    assert_eq!(shim.stats().registrations_live, 0);
    let empty = Device::new(StdShim::new(), DeviceConfig::default())
        .register_host(Box::new(Weights(Box::new([]))));
    assert_eq!(
        empty.origin(),
        HostOrigin::FileMapped,
        "nothing to register"
    );
}

#[test]
fn every_copy_names_its_host_memory() {
    let shim = StdShim::new();
    let mut dev = Device::new(shim.clone(), DeviceConfig::default());
    let mut cmd = dev.command(S0).unwrap();
    let a = cmd.create(&[3; 1024]).unwrap();
    let got = cmd
        .read_async(&[ReadRequest::whole(&a)])
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(got[0].as_slice(), [3; 1024]);
    assert_eq!(
        shim.stats().copies_by_host_memory,
        [0, 2, 0],
        "an upload staged through pinned memory and a read into pinned memory"
    );
    let big = DeviceConfig {
        staging: devcmd::staging::StagingPolicy {
            max_staged: 0,
            flush_after: u64::MAX,
            ..devcmd::staging::StagingPolicy::default()
        },
        ..DeviceConfig::default()
    };
    let mut dev = Device::new(shim.clone(), big);
    let mut cmd = dev.command(S0).unwrap();
    let b = cmd.empty(1024).unwrap();
    cmd.write(&b, HostBuffer::from_vec(vec![4; 1024])).unwrap();
    cmd.sync().unwrap().wait().unwrap();
    assert_eq!(
        shim.stats().copies_by_host_memory,
        [1, 2, 0],
        "heap bytes past the staging threshold go as they are: pageable"
    );
}

/// Review finding: an allocation whose address was handed out raw (a managed resource) may be
/// written by work the core never sees, so `read_owned` copies it rather than lend its bytes.
#[test]
fn an_owned_read_of_an_exposed_allocation_copies() {
    let (shim, mut dev) = integrated(false);
    let a = dev.command(S0).unwrap().create(&[1; 64]).unwrap();
    let managed = dev.command(S0).unwrap().managed_resource(&a).unwrap();
    assert!(a.is_exposed());
    let got = dev
        .command(S0)
        .unwrap()
        .read_owned(a)
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(got[0].as_slice(), [1; 64]);
    assert_eq!(copies(&shim).1, 1, "copied out, not lent");
    drop(managed);
}

struct Claims(Box<[u8]>, HostOrigin);

// SAFETY: the bytes live in the box, unchanged while it lives (the origin is the test's lie).
unsafe impl ExternalBytes for Claims {
    fn bytes(&self) -> &[u8] {
        &self.0
    }
    fn origin(&self) -> HostOrigin {
        self.1
    }
}

/// Review finding: only `Device::register_host` registers bytes; an external buffer that claims
/// to be registered is staged as a file mapping, never handed to the shim as registered memory.
#[test]
fn a_claim_of_registration_is_not_believed() {
    let shim = StdShim::new();
    let mut dev = Device::new(shim.clone(), DeviceConfig::default());
    let bytes = HostBuffer::external(Box::new(Claims(vec![3; 64].into(), HostOrigin::Registered)));
    assert_eq!(bytes.origin(), HostOrigin::FileMapped);
    let h = dev.command(S0).unwrap().empty(64).unwrap();
    dev.command(S0).unwrap().write(&h, bytes).unwrap();
    assert_eq!(
        shim.stats().copies_by_host_memory,
        [0, 1, 0],
        "staged through pinned memory"
    );
}
