//! The memory report on the std shim (virtual memory on: granule pools): its device figures add
//! up (held = in the pools + let go awaiting a fence + leaked), a cleanup brings every pool to
//! zero, and reserved address space is reported apart from memory.

use devcmd::{Device, DeviceConfig, DeviceReport, StreamId};
use devcmd_std::StdShim;

const S0: StreamId = StreamId(0);

fn adds_up(report: &DeviceReport, when: &str) {
    let awaiting = report.awaiting_fence().pages;
    assert_eq!(report.leaked(), 0, "{when}: nothing leaked here:\n{report}");
    assert_eq!(
        report.in_pools() + awaiting,
        report.held,
        "{when}: held is not the pools plus what awaits a fence:\n{report}"
    );
}

#[test]
fn the_report_adds_up_and_a_cleanup_empties_every_pool() {
    let mut device = Device::new(StdShim::new(), DeviceConfig::default());
    assert!(device.facts().vm_granule > 0, "the std shim maps granules");
    let mut cmd = device.command(S0).unwrap();
    let w = cmd.persistent(|c| c.create_typed(&[1f32; 1024])).unwrap();
    let small = cmd.create_typed(&[1f32; 1024]).unwrap();
    let big = cmd.create_typed(&[1f32; 1 << 20]).unwrap();
    let report = device.memory_report();
    adds_up(&report, "three allocations live");
    assert!(report.in_pools() >= (4 << 20) + 8192, "{report}");
    assert!(report.address_space() > report.held, "{report}");

    // Churn: dropped, reserved again, let go by periodic cleanups.
    for i in 0..8u32 {
        let mut cmd = device.command(S0).unwrap();
        let _x = cmd.create_typed(&vec![i as f32; (1 << 19) * (i as usize % 3 + 1)]);
        cmd.poll_drops().unwrap();
        adds_up(&device.memory_report(), "churn");
    }

    drop((w, small, big));
    device.command(S0).unwrap().memory_cleanup().unwrap();
    let report = device.memory_report();
    adds_up(&report, "after cleanup");
    assert_eq!(report.held, 0, "{report}");
    for (_, stream) in &report.streams {
        for pool in stream.pools.iter().filter(|p| !p.is_host()) {
            assert_eq!(
                (pool.pages, pool.reserved),
                (0, 0),
                "{} still reports memory after a cleanup:\n{report}",
                pool.kind
            );
        }
    }
    assert!(
        report.address_space() > 0,
        "the granule pools keep their address space:\n{report}"
    );
    let text = report.to_string();
    assert!(
        text.contains("device memory held: 0 B = 0 B in the pools + 0 B let go"),
        "{text}"
    );
}
