//! The pinned pool on the std shim: large requests get pinned pages of their own, reused by exact
//! size; a refused large page neither blocks small pinned staging nor is asked for again before a
//! cleanup; slices carved from one page are distinct bytes that go back when their buffers drop;
//! the report counts both kinds of pages, and keeps pinned host memory apart from device memory;
//! a mapped file is staged on the heap once no pinned memory is left.

use devcmd::memory::PoolKind;
use devcmd::{Device, DeviceConfig, HostOrigin, ShimOp, StreamId};
use devcmd_std::{Injection, StdShim};

const MIB: usize = 1 << 20;

#[test]
fn large_requests_get_pinned_pages_of_their_own_and_refusals_stay_local() {
    let shim = StdShim::new();
    let probe = shim.clone();
    let mut device = Device::new(shim, DeviceConfig::default());
    let mut cmd = device.command(StreamId(0)).unwrap();
    let big = cmd.reserve_host(48 * MIB, true).unwrap();
    assert_eq!(
        big.origin(),
        HostOrigin::Pinned,
        "larger than a 32 MiB page, still pinned"
    );
    let big_addr = big.as_slice().as_ptr();
    drop(big);
    let again = cmd.reserve_host(48 * MIB, true).unwrap();
    assert_eq!(again.as_slice().as_ptr(), big_addr, "reused by exact size");
    drop(again);

    // Refuse every large pinned page from now on: small staging keeps its pinned memory.
    probe.inject(Injection::when(|op, size| {
        op == ShimOp::HostAlloc && size > 32 * MIB as u64
    }));
    let asks = || probe.stats().calls(ShimOp::HostAlloc);
    let before = asks();
    let refused = cmd.reserve_host(80 * MIB, true).unwrap();
    assert_eq!(
        refused.origin(),
        HostOrigin::Heap,
        "a refused page falls back to the heap"
    );
    assert_eq!(asks(), before + 1);
    let refused_again = cmd.reserve_host(96 * MIB, true).unwrap();
    assert_eq!(refused_again.origin(), HostOrigin::Heap);
    assert_eq!(
        asks(),
        before + 1,
        "not asked again for a page at least as large"
    );
    let small = cmd.reserve_host(4096, true).unwrap();
    assert_eq!(
        small.origin(),
        HostOrigin::Pinned,
        "small staging is not blocked"
    );

    let report = cmd.memory_report();
    let pinned = report.streams[0]
        .1
        .pools
        .iter()
        .find(|p| p.kind == PoolKind::PinnedHost)
        .copied()
        .unwrap();
    assert_eq!(pinned.allocations, 1);
    assert_eq!(pinned.pages, 2, "one carved page and the idle 48 MiB page");
    assert_eq!(pinned.reserved, (32 + 48) as u64 * MIB as u64);
    drop((refused, refused_again, small));
    probe.clear_injections();
    cmd.memory_cleanup().unwrap();
    drop(device);
    assert_eq!(probe.stats().host_pages_live, 0);
}

#[test]
fn slices_of_one_pinned_page_are_distinct_bytes_and_go_back_when_dropped() {
    let shim = StdShim::new();
    let mut device = Device::new(shim, DeviceConfig::default());
    let mut cmd = device.command(StreamId(0)).unwrap();
    let mut buffers: Vec<_> = (0..8u8)
        .map(|i| {
            let mut b = cmd.reserve_host(1000 + usize::from(i), true).unwrap();
            assert_eq!(b.origin(), HostOrigin::Pinned);
            b.as_mut_slice().fill(i);
            b
        })
        .collect();
    let mut spans: Vec<(usize, usize)> = buffers
        .iter()
        .map(|b| {
            let start = b.as_slice().as_ptr() as usize;
            (start, start + b.len())
        })
        .collect();
    spans.sort_unstable();
    assert!(spans.windows(2).all(|w| w[0].1 <= w[1].0), "slices overlap");
    for (i, b) in buffers.iter().enumerate() {
        assert!(b.as_slice().iter().all(|&x| usize::from(x) == i));
    }
    let pinned =
        |cmd: &mut devcmd::Command<'_, StdShim>| cmd.memory_report().streams[0].1.pinned_host();
    assert_eq!(
        (pinned(&mut cmd).allocations, pinned(&mut cmd).reserved),
        (8, 32 * MIB as u64)
    );
    buffers.truncate(3);
    assert_eq!(
        pinned(&mut cmd).allocations,
        3,
        "dropped buffers gave their slices back"
    );
    drop(buffers);
    assert_eq!(pinned(&mut cmd).allocations, 0);
}

#[test]
fn the_report_keeps_pinned_host_memory_apart_from_device_memory() {
    let shim = StdShim::new();
    let mut device = Device::new(shim, DeviceConfig::default());
    let mut cmd = device.command(StreamId(0)).unwrap();
    let _h = cmd.empty(1000).unwrap();
    let host = cmd.reserve_host(4096, true).unwrap();
    assert_eq!(host.origin(), HostOrigin::Pinned);
    let report = cmd.memory_report();
    let stream = &report.streams[0].1;
    let (dev, pinned) = (stream.device(), stream.pinned_host());
    assert_eq!((dev.allocations, dev.in_use), (1, 1000));
    assert_eq!((pinned.allocations, pinned.in_use), (1, 4096));
    assert_eq!(
        report.held, dev.reserved,
        "device pages held count no host bytes"
    );
    assert_eq!(report.pinned_host, pinned.reserved);
    let text = report.to_string();
    let line = |label: &str| {
        text.lines()
            .find(|l| l.starts_with(label))
            .unwrap_or_else(|| panic!("no `{label}` line in\n{text}"))
            .to_string()
    };
    assert!(
        line("device total").ends_with(&devcmd::memory::ReadableBytes(dev.reserved).to_string()),
        "{text}"
    );
    assert!(line("pinned host total").ends_with("32 MiB"), "{text}");
    assert!(line("pinned host pages held").ends_with("32 MiB"), "{text}");
    assert!(
        line("device memory held")
            .contains(&devcmd::memory::ReadableBytes(report.held).to_string()),
        "{text}"
    );
    drop(host);
}

/// Review finding (issue 16): a mapped file is staged even when no pinned memory is left: it is
/// copied once into the heap, so the caller's mapping is released as soon as the write returns
/// (a mapped file may fault while the device reads it), and the device reads the copy.
#[test]
fn a_mapped_file_is_staged_on_the_heap_when_no_pinned_memory_is_left() {
    use devcmd::pinned::PinnedConfig;
    use devcmd::{ExternalBytes, HostBuffer};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    struct Mapped(Vec<u8>, Arc<AtomicBool>);
    // SAFETY: the same owned bytes on every call, unchanged while the value lives.
    unsafe impl ExternalBytes for Mapped {
        fn bytes(&self) -> &[u8] {
            &self.0
        }
        fn origin(&self) -> HostOrigin {
            HostOrigin::FileMapped
        }
    }
    impl Drop for Mapped {
        fn drop(&mut self) {
            self.1.store(true, Ordering::SeqCst);
        }
    }

    let config = DeviceConfig {
        pinned: PinnedConfig {
            max_bytes: 0,
            ..PinnedConfig::default()
        },
        ..DeviceConfig::default()
    };
    // Lazy: the device runs nothing until a fence is waited for, so a buffer the device still
    // had to read could not be released when the write returns.
    let mut device = Device::new(StdShim::builder().lazy(true).build(), config);
    let data: Vec<u8> = (0..4096u32).map(|i| (i % 253) as u8).collect();
    let released = Arc::new(AtomicBool::new(false));
    let mut cmd = device.command(StreamId(0)).unwrap();
    let x = cmd.empty(data.len() as u64).unwrap();
    let file = HostBuffer::external(Box::new(Mapped(data.clone(), Arc::clone(&released))));
    cmd.write(&x, file).unwrap();
    assert!(
        released.load(Ordering::SeqCst),
        "the mapping was handed to the device instead of a heap copy"
    );
    let back = cmd.read_owned(x).unwrap().wait().unwrap();
    assert!(back[0].as_slice() == &data[..], "the copy landed");
}

/// Pipelined reads spread over the staging ring only with room to spare: under a tight pinned
/// budget the spread stops at half of it, so the caller's own pinned buffer still gets pinned
/// memory after many reads (review of the spread: it took the whole budget before).
#[test]
fn reads_spread_over_the_ring_leave_half_the_pinned_budget_to_the_caller() {
    use devcmd::pinned::PinnedConfig;
    use devcmd::staging::StagingPolicy;
    use devcmd::{CopyLayout, HostBuffer, ReadRequest};
    const KIB: usize = 1 << 10;
    let config = DeviceConfig {
        staging: StagingPolicy {
            pipeline_from: 1,
            chunk: 32 * KIB as u64,
            depth: 4,
            ..StagingPolicy::default()
        },
        pinned: PinnedConfig {
            page_size: 64 * KIB as u64,
            max_bytes: 128 * KIB as u64,
            ..PinnedConfig::default()
        },
        ..DeviceConfig::default()
    };
    let mut device = Device::new(StdShim::new(), config);
    let s = StreamId(0);
    let data: Vec<u8> = (0..32 * KIB).map(|i| (i * 7 % 251) as u8).collect();
    let h = device.command(s).unwrap().create(&data).unwrap();
    for k in 0..8 {
        let back = device
            .command(s)
            .unwrap()
            .read_to(
                ReadRequest {
                    handle: &h,
                    layout: CopyLayout::linear(data.len() as u64),
                },
                HostBuffer::zeroed(data.len()),
            )
            .unwrap()
            .wait()
            .unwrap();
        assert!(
            back.as_slice() == data.as_slice(),
            "read {k} returned other bytes"
        );
    }
    let in_use = devcmd_tests::pinned_in_use(&mut device, s);
    assert!(
        in_use <= 64 * KIB as u64,
        "8 reads of 32 KiB left {in_use} bytes of pinned buffers in use under a 128 KiB \
         budget: the spread took more than half of it"
    );
    let mine = device
        .command(s)
        .unwrap()
        .reserve_host(64 * KIB, true)
        .unwrap();
    assert_eq!(
        mine.origin(),
        HostOrigin::Pinned,
        "after the reads, the caller's 64 KiB buffer found no pinned memory"
    );
}

/// A new pinned page's bytes reach the user before anything wrote them (a pinned buffer to
/// fill, a zero-copy allocation read in place), and the driver does not clear them (the std shim
/// fills a new page with `FRESH_HOST_BYTE`, as `cuMemHostAlloc` may leave anything): the core
/// zeroes each new page once, so those bytes are initialised, never a driver's leftovers.
#[test]
fn new_pinned_pages_reach_the_user_zeroed() {
    let mut device = Device::new(StdShim::new(), DeviceConfig::default());
    let mut cmd = device.command(StreamId(0)).unwrap();
    for len in [4096, 48 * MIB] {
        let buffer = cmd.reserve_host(len, true).unwrap();
        assert_eq!(buffer.origin(), HostOrigin::Pinned);
        assert!(
            buffer.as_slice().iter().all(|&b| b == 0),
            "a pinned buffer of {len} bytes on a new page holds zeros, not the page's leftovers"
        );
    }
    let config = DeviceConfig {
        zero_copy: Some(true),
        ..DeviceConfig::default()
    };
    let mut device = Device::new(StdShim::builder().integrated(true).build(), config);
    assert!(device.zero_copy());
    let mut cmd = device.command(StreamId(0)).unwrap();
    let empty = cmd.empty(4096).unwrap();
    let read = cmd.read_owned(empty).unwrap().wait().unwrap();
    assert!(
        read[0].as_slice().iter().all(|&b| b == 0),
        "a zero-copy allocation on a new page reads zeros, not the page's leftovers"
    );
}
