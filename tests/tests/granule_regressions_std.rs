//! The granule pools' accounting against what the std shim really maps (issue 19): after a
//! cleanup the report and the budget count what the shim holds, granules the drop queue unmapped
//! included; a budget that lies between granules serves a request that fits it in a page, and
//! leaves nothing mapped that nothing uses; a buffer under a granule shares the small pool's
//! granule instead of mapping one of its own. A property test compares them after every step of
//! a random sequence.

use devcmd::{Device, DeviceConfig, ReadRequest, StreamId};
use devcmd_std::StdShim;
use proptest::prelude::*;

const MIB: u64 = 1 << 20;
const S: StreamId = StreamId(0);

/// Bytes the report says the device pools hold, bytes the budget counts, bytes the shim maps.
fn figures(device: &mut Device<StdShim>) -> (u64, u64, u64) {
    let report = device.command(S).unwrap().memory_report();
    let pools: u64 = report
        .streams
        .iter()
        .map(|(_, r)| r.device().reserved)
        .sum();
    (pools, report.held, device.shim().stats().device_bytes_live)
}

#[test]
fn after_a_cleanup_the_report_counts_no_granule_the_shim_gave_back() {
    let mut device = Device::new(StdShim::new(), DeviceConfig::default());
    let mut cmd = device.command(S).unwrap();
    drop(cmd.empty(10 * MIB).unwrap());
    cmd.memory_cleanup().unwrap();
    assert_eq!(
        figures(&mut device),
        (0, 0, 0),
        "(pools in the report, budget's count, shim's mapped bytes) after every handle dropped \
         and a cleanup"
    );
}

#[test]
fn a_budget_between_granules_serves_what_fits_and_maps_nothing_idle() {
    for size in [9 * MIB, 8 * MIB + 1] {
        let config = DeviceConfig {
            memory_budget: Some(9 * MIB),
            ..DeviceConfig::default()
        };
        let mut device = Device::new(StdShim::new(), config);
        let mut cmd = device.command(S).unwrap();
        let h = cmd
            .empty(size)
            .unwrap_or_else(|e| panic!("{size} bytes under a 9 MiB budget: {e}"));
        assert_eq!(h.len(), size);
        let (pools, held, mapped) = figures(&mut device);
        assert!(held <= 9 * MIB, "{held} bytes held under a 9 MiB budget");
        assert_eq!(
            (pools, held),
            (mapped, mapped),
            "{size} bytes: the report and the budget count what the shim maps"
        );
        assert!(
            mapped < size + 2 * MIB,
            "{size} bytes placed with {mapped} bytes mapped: nothing idle is left mapped"
        );
    }
}

#[test]
fn a_request_past_the_budget_is_refused_and_leaves_nothing_mapped() {
    let config = DeviceConfig {
        memory_budget: Some(9 * MIB),
        ..DeviceConfig::default()
    };
    let mut device = Device::new(StdShim::new(), config);
    let mut cmd = device.command(S).unwrap();
    // (What the refusal says is the errors' business: issue 22.)
    assert!(
        cmd.empty(10 * MIB).is_err(),
        "10 MiB cannot fit a 9 MiB budget"
    );
    cmd.memory_cleanup().unwrap();
    assert_eq!(figures(&mut device), (0, 0, 0));
}

/// Issue 19, "no granule wasted": a small slice and a 1 MiB buffer on an empty device hold one
/// 2 MiB granule between them (two before the pools shared memory), and each keeps its bytes.
#[test]
fn a_small_slice_and_a_buffer_under_a_granule_share_one_granule() {
    let mut device = Device::new(StdShim::new(), DeviceConfig::default());
    let mut cmd = device.command(S).unwrap();
    let small = cmd.create(&[7u8; 4096]).unwrap();
    let buffer = cmd.create(&vec![9u8; MIB as usize]).unwrap();
    let back = cmd
        .read_async(&[ReadRequest::whole(&small), ReadRequest::whole(&buffer)])
        .unwrap()
        .wait()
        .unwrap();
    assert!(
        back[0].as_slice().iter().all(|&b| b == 7),
        "the small slice's bytes"
    );
    assert!(
        back[1].as_slice().iter().all(|&b| b == 9),
        "the buffer's bytes"
    );
    drop(back);
    assert_eq!(
        figures(&mut device),
        (2 * MIB, 2 * MIB, 2 * MIB),
        "(pools in the report, budget's count, shim's mapped bytes): one granule"
    );
    drop((small, buffer));
    device.command(S).unwrap().memory_cleanup().unwrap();
    assert_eq!(figures(&mut device), (0, 0, 0));
}

#[derive(Debug, Clone)]
enum Op {
    Reserve(u64),
    Drop(usize),
    Cleanup,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1u64..12 * MIB).prop_map(Op::Reserve),
        // Small slices and buffers under a granule, which may share granules across the pools.
        2 => (1u64..64 * 1024).prop_map(Op::Reserve),
        2 => (64 * 1024u64..2 * MIB).prop_map(Op::Reserve),
        3 => any::<usize>().prop_map(Op::Drop),
        1 => Just(Op::Cleanup),
    ]
}

/// Case count: `DEVCMD_PROPTEST_CASES` (default `default`), as the suite's other property tests.
fn cases(default: u32) -> u32 {
    std::env::var("DEVCMD_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(48),
        ..ProptestConfig::default()
    })]

    /// After every step and a cleanup, the report's pools, the budget and the shim agree; under
    /// a budget nothing passes it.
    #[test]
    fn the_report_and_the_budget_agree_with_the_shim_after_every_step(
        ops in proptest::collection::vec(op(), 1..24),
        budget in prop_oneof![Just(None), (12u64..48).prop_map(|m| Some(m * MIB + MIB / 2))],
    ) {
        let config = DeviceConfig { memory_budget: budget, ..DeviceConfig::default() };
        let mut device = Device::new(StdShim::new(), config);
        let mut live = Vec::new();
        for (step, op) in ops.iter().enumerate() {
            let mut cmd = device.command(S).unwrap();
            match op {
                Op::Reserve(size) => {
                    if let Ok(h) = cmd.empty(*size) {
                        live.push(h);
                    }
                }
                Op::Drop(i) if !live.is_empty() => {
                    let at = i % live.len();
                    live.swap_remove(at);
                }
                Op::Drop(_) => {}
                Op::Cleanup => {}
            }
            cmd.memory_cleanup().unwrap();
            let (pools, held, mapped) = figures(&mut device);
            prop_assert_eq!(
                (pools, held), (mapped, mapped),
                "step {} ({:?}): (report's pools, budget) against the shim's mapped bytes",
                step, op
            );
            if let Some(limit) = budget {
                prop_assert!(held <= limit, "step {step}: {held} held past {limit}");
            }
        }
    }
}
