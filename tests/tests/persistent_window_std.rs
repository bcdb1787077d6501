//! The scoped persistent window on the std shim: it closes however its scope ends (a value, an
//! error through `?`, a panic), and what it reserved sits in the persistent pool.

use devcmd::memory::PoolKind;
use devcmd::{AllocationMode, Device, DeviceConfig, ServerError, StreamId};
use devcmd_std::StdShim;

const S0: StreamId = StreamId(0);

fn persistent_allocs(device: &mut Device<StdShim>) -> u64 {
    let report = device.memory_report();
    report.streams[0]
        .1
        .pools
        .iter()
        .filter(|p| p.kind == PoolKind::Persistent)
        .map(|p| p.allocations)
        .sum()
}

#[test]
fn the_window_closes_when_its_closure_returns_an_error() {
    let mut device = Device::new(StdShim::new(), DeviceConfig::default());
    let mut cmd = device.command(S0).unwrap();
    let result: Result<devcmd::Handle, ServerError> = cmd.persistent(|c| {
        assert_eq!(
            c.current_allocation_mode(),
            AllocationMode::Persistent,
            "inside the window"
        );
        let _w = c.create_typed(&[1f32; 256])?;
        // A write of the wrong length fails inside the window, and `?` leaves it.
        let bad = c.empty(16)?;
        c.write_typed(&bad, &[0u8; 3])?;
        Ok(bad)
    });
    assert!(result.is_err(), "the wrong length was refused");
    assert_eq!(cmd.current_allocation_mode(), AllocationMode::Auto);
    // A reservation after it is per-batch churn, not persistent.
    let _x = cmd.create_typed(&[2f32; 256]).unwrap();
    assert_eq!(
        persistent_allocs(&mut device),
        0,
        "the window's allocations were dropped"
    );
}

#[test]
fn the_window_closes_on_a_panic_and_keeps_what_it_made() {
    let mut device = Device::new(StdShim::new(), DeviceConfig::default());
    let mut cmd = device.command(S0).unwrap();
    let weights = cmd.persistent(|c| c.create_typed(&[0.5f32; 1024])).unwrap();
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        cmd.persistent(|c| {
            c.allocation_mode(AllocationMode::Dedicated); // left open by the closure
            panic!("inside the window");
        })
    }));
    assert!(panicked.is_err());
    assert_eq!(
        cmd.current_allocation_mode(),
        AllocationMode::Auto,
        "the window, and the one opened inside it, closed"
    );
    let _x = cmd.create_typed(&[2f32; 256]).unwrap();
    assert_eq!(
        persistent_allocs(&mut device),
        1,
        "only the weights are persistent"
    );
    drop(weights);
}

#[test]
fn a_guard_closes_its_window_when_dropped() {
    let mut device = Device::new(StdShim::new(), DeviceConfig::default());
    let mut cmd = device.command(S0).unwrap();
    {
        let mut window = cmd.mode_window(AllocationMode::Dedicated);
        assert_eq!(window.current_allocation_mode(), AllocationMode::Dedicated);
        let _h = window.empty(64).unwrap();
    }
    assert_eq!(cmd.current_allocation_mode(), AllocationMode::Auto);
}
