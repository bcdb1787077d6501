//! A group that checks nothing says so where `cargo test` shows it, and is counted: the guide's
//! example shim has no graphs, no probe, no virtual memory, no library and only the normal mode.

use devcmd_tests::example_shim::HostHarness;
use devcmd_tests::{Mode, groups, skipped_groups};

fn said(line: &str) -> bool {
    skipped_groups().iter().any(|s| s.contains(line))
}

#[test]
fn a_shim_without_graphs_sees_capture_skipped() {
    groups::capture(&HostHarness, Mode::NORMAL);
    groups::capture_replay_fault(&HostHarness, Mode::NORMAL);
    assert!(
        said("capture: skipped (no graphs) [normal]"),
        "{:?}",
        skipped_groups()
    );
    assert!(said("capture_replay_fault: skipped (no graphs) [normal]"));
}

#[test]
fn every_reason_to_check_nothing_is_said_and_counted() {
    groups::fault_injection(&HostHarness, Mode::NORMAL);
    groups::virtual_memory(&HostHarness, Mode::NORMAL);
    groups::library_work(&HostHarness, Mode::NORMAL);
    groups::drop_queue(&HostHarness, Mode::LAZY);
    for line in [
        "fault_injection: skipped (the harness has no probe) [normal]",
        "virtual_memory: skipped (no virtual memory: DeviceFacts::vm_granule is 0) [normal]",
        "library_work: skipped (the harness offers no library) [normal]",
        "drop_queue: skipped (the shim has no lazy mode) [lazy]",
    ] {
        assert!(said(line), "{line:?} not in {:?}", skipped_groups());
    }
    // Said once each, however often a group asks.
    let before = skipped_groups().len();
    groups::drop_queue(&HostHarness, Mode::LAZY);
    assert_eq!(skipped_groups().len(), before);
}
