//! A small cross-stream test of shim-std, sized for miri (CI runs it there; it runs natively in
//! the ordinary test run too). shim-std runs each stream on a worker thread and hands kernels and
//! copies raw device addresses, so this is where a missing cross-stream order or an early free
//! becomes a data race or a use after free that miri reports as undefined behaviour.
//!
//! Stream 0 creates `a`; stream 1 launches a kernel that reads `a` into `o`; the host drops `a`
//! while that kernel may still be queued and makes new allocations on stream 0 (which must not
//! reuse `a`'s memory yet) and writes them; stream 2 overwrites part of `o` after stream 1's
//! kernel; stream 0 reads `o` back. Every byte is checked, every stream cleaned up, and the shim
//! must get every page back when the device drops. Nothing is leaked on purpose here: every
//! worker thread is joined when its stream drops, and every buffer goes back through the drop
//! queues, so miri's leak check stays on for this test.

use devcmd::{Device, DeviceConfig, Handle, Launch, ReadRequest, StreamId};
use devcmd_std::StdShim;
use devcmd_tests::{Harness, Mode, StdHarness, TestArgs, TestKernel};

const N: usize = 256;

/// Pages small enough for miri (every byte of a page is tracked).
fn config() -> DeviceConfig {
    let mut config = DeviceConfig::default();
    config.memory.small_page_size = 16 << 10;
    config.memory.small_max_slice = 4 << 10;
    config.memory.arena_min_page = 64 << 10;
    config.memory.arena_granule = 16 << 10;
    config.pinned.page_size = 16 << 10;
    config.pinned.max_bytes = 64 << 10;
    config
}

fn shim(mode: Mode) -> StdShim {
    StdShim::builder()
        .lazy(mode.lazy)
        .poison(mode.poison)
        .total_memory(4 << 20)
        .max_page_size(256 << 10)
        .page_alignment(64)
        .build()
}

fn read(dev: &mut Device<StdShim>, s: u32, h: &Handle) -> Vec<u8> {
    let mut got = dev
        .command(StreamId(s))
        .and_then(|mut k| k.read_async(&[ReadRequest::whole(h)]))
        .and_then(|f| f.wait())
        .expect("read");
    got.pop().expect("one buffer").into_vec()
}

fn cross_stream(mode: Mode) {
    let shim = shim(mode);
    let probe = shim.clone();
    let add = StdHarness.kernel(&shim, TestKernel::AddByte);
    let fill = StdHarness.kernel(&shim, TestKernel::Fill);
    let n = N as u64;
    let (one, nine) = (
        TestArgs::new(TestKernel::AddByte, 1, &[n], &[n]),
        TestArgs::new(TestKernel::Fill, 9, &[], &[n / 2]),
    );
    let mut dev = Device::new(shim, config());
    let a = dev.command(StreamId(0)).unwrap().create(&[5; N]).unwrap();
    let o = dev.command(StreamId(1)).unwrap().empty(N as u64).unwrap();
    dev.command(StreamId(1))
        .unwrap()
        .launch(Launch {
            kernel: &add,
            dims: one.dims(),
            inputs: &[&a],
            outputs: &[&o],
            params: &one.params(),
        })
        .unwrap();
    // `a` goes while stream 1's kernel may still read it: its memory must not be reused yet.
    drop(a);
    let fresh: Vec<Handle> = (0..3u8)
        .map(|i| {
            dev.command(StreamId(0))
                .unwrap()
                .create(&[0xA0 + i; N])
                .unwrap()
        })
        .collect();
    // Stream 2 writes the second half of `o` after stream 1's kernel wrote all of it.
    let half = o.view(N as u64 / 2, N as u64 / 2).unwrap();
    dev.command(StreamId(2))
        .unwrap()
        .launch(Launch {
            kernel: &fill,
            dims: nine.dims(),
            inputs: &[],
            outputs: &[&half],
            params: &nine.params(),
        })
        .unwrap();
    let mut want = vec![6u8; N];
    want[N / 2..].fill(9);
    assert_eq!(read(&mut dev, 0, &o), want, "[{mode}] o read on stream 0");
    for (i, h) in fresh.iter().enumerate() {
        assert_eq!(
            read(&mut dev, 1, h),
            [0xA0 + i as u8; N],
            "[{mode}] fresh {i}"
        );
    }
    drop((o, half, fresh));
    for _ in 0..2 {
        for s in 0..3 {
            dev.command(StreamId(s)).unwrap().memory_cleanup().unwrap();
        }
    }
    let report = dev.memory_report();
    let in_use: u64 = report
        .streams
        .iter()
        .map(|(_, r)| (r.device() + r.pinned_host()).in_use)
        .sum();
    assert_eq!(in_use, 0, "[{mode}] nothing in use:\n{report}");
    drop(dev);
    let stats = probe.stats();
    assert_eq!(
        (stats.device_pages_live, stats.host_pages_live),
        (0, 0),
        "[{mode}] the shim got every page back"
    );
}

#[test]
fn work_crosses_streams_in_order() {
    cross_stream(Mode::NORMAL);
}

#[test]
fn work_crosses_streams_in_order_lazy_poison() {
    cross_stream(Mode::LAZY_POISON);
}

/// Pipelined reads into heap memory, sized for miri: short reads in a row land at walking
/// offsets of the staging ring's buffers (the read spread) and a read of several pieces cuts
/// across them; miri checks every pointer the pipeline forms inside a ring buffer and every copy
/// out of it, and each read's bytes are checked.
#[test]
fn pipelined_reads_spread_over_the_ring() {
    use devcmd::staging::StagingPolicy;
    use devcmd::{CopyLayout, HostBuffer};
    let mut cfg = config();
    cfg.staging = StagingPolicy {
        pipeline_from: 1,
        chunk: 1000,
        depth: 3,
        ..StagingPolicy::default()
    };
    let mut dev = Device::new(shim(Mode::NORMAL), cfg);
    let s = StreamId(0);
    let data: Vec<u8> = (0..2500u32).map(|i| (i * 13 % 251) as u8).collect();
    let h = dev.command(s).unwrap().create(&data).unwrap();
    for (k, len) in [300u64, 300, 300, 300, 700, 1000, 2500, 1, 999]
        .into_iter()
        .enumerate()
    {
        let layout = CopyLayout::linear(len);
        let back = dev
            .command(s)
            .unwrap()
            .read_to(
                ReadRequest { handle: &h, layout },
                HostBuffer::zeroed(len as usize),
            )
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(
            back.as_slice(),
            &data[..len as usize],
            "read {k} of {len} bytes"
        );
    }
    drop(h);
    dev.command(s).unwrap().memory_cleanup().unwrap();
}
