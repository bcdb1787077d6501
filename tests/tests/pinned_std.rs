//! The pinned pool on the std shim: large requests get pinned pages of their own, reused by exact
//! size; a refused large page neither blocks small pinned staging nor is asked for again before a
//! cleanup; the report counts both kinds of pages.

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
