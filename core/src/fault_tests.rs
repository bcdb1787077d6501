//! The fault ledger's tests: fence outcomes, the ledger's records and answers.

use super::*;
use crate::error::ShimOp;

fn err(fault: Fault) -> DriverError {
    DriverError::new(ShimOp::EventWait, 7, fault)
}

#[test]
fn a_fence_that_was_never_recorded_covers_nothing() {
    for fault in [Fault::WorkFailed, Fault::Failed, Fault::OutOfMemory] {
        assert!(
            !FenceOutcome::unrecorded(err(fault)).completed(),
            "{fault:?}"
        );
    }
    assert!(FenceOutcome::unrecorded(err(Fault::DeviceLost)).completed());
}

#[test]
fn every_fault_of_a_wait_has_one_outcome() {
    assert_eq!(FenceOutcome::of(Ok(())), FenceOutcome::Passed);
    for (fault, completed) in [
        (Fault::WorkFailed, true),
        (Fault::DeviceLost, true),
        (Fault::Failed, false),
        (Fault::OutOfMemory, false),
        (Fault::TooBig, false),
        (Fault::Unsupported, false),
    ] {
        assert_eq!(
            FenceOutcome::of(Err(err(fault))).completed(),
            completed,
            "{fault:?}"
        );
    }
}

fn at(cursor: u64, kernel: Option<&'static str>, outcome: FenceOutcome) -> Fenced {
    Fenced {
        outcome,
        mark: FenceMark { cursor, kernel },
    }
}

#[test]
fn failed_work_is_sticky_and_names_the_kernel_before_its_fence() {
    let ledger = FaultLedger::default();
    let outcome = FenceOutcome::of(Err(err(Fault::WorkFailed)));
    let first = ledger.answer(1, at(5, Some("k"), outcome)).unwrap_err();
    assert!(matches!(
        first,
        ServerError::StreamFaulted {
            stream: 1,
            kernel: Some("k"),
            ..
        }
    ));
    // A later clean fence of the stream still fails.
    assert_eq!(
        ledger.answer(1, at(9, None, FenceOutcome::Passed)),
        Err(first)
    );
    assert!(ledger.check(0).is_ok(), "an unrelated stream keeps working");
}

#[test]
fn work_behind_a_clean_fence_stays_usable_after_a_later_fault() {
    let ledger = FaultLedger::default();
    assert!(ledger.answer(1, at(4, None, FenceOutcome::Passed)).is_ok());
    assert!(ledger.clean_through(1, 3) && !ledger.clean_through(1, 4));
    let failed = FenceOutcome::of(Err(err(Fault::WorkFailed)));
    assert!(ledger.answer(1, at(7, None, failed)).is_err());
    assert!(
        ledger.check_stream_at(1, 3).is_ok(),
        "written before the clean fence"
    );
    assert!(
        ledger.check_stream_at(1, 4).is_err(),
        "may be the failed work"
    );
}

#[test]
fn deferred_faults_surface_once_and_a_lost_device_fails_everything() {
    let ledger = FaultLedger::default();
    let unknown = FenceOutcome::of(Err(err(Fault::Failed)));
    assert!(ledger.defer(0, at(1, None, unknown)).is_ok());
    assert!(ledger.check(0).is_ok(), "an unknown outcome does not taint");
    assert!(ledger.take_deferred(0).is_err());
    assert!(ledger.take_deferred(0).is_ok(), "reported once");
    let lost = FenceOutcome::of(Err(err(Fault::DeviceLost)));
    assert!(ledger.defer(3, at(1, None, lost)).is_err());
    assert!(matches!(
        ledger.check(0),
        Err(ServerError::DeviceLost { .. })
    ));
}

#[test]
fn the_graver_outcome_wins() {
    let f = FenceOutcome::of(Err(err(Fault::WorkFailed)));
    let u = FenceOutcome::of(Err(err(Fault::Failed)));
    let l = FenceOutcome::of(Err(err(Fault::DeviceLost)));
    assert_eq!(FenceOutcome::Passed.and(f), f);
    assert_eq!(
        f.and(u),
        u,
        "a sequence with an unknown wait never claims completion"
    );
    assert_eq!(u.and(f), u);
    assert!(!f.and(u).completed());
    assert_eq!(l.and(u), l);
    assert_eq!(u.and(FenceOutcome::Passed), u);
}

#[test]
fn checks_pass_without_the_lock_until_a_fault_is_on_record() {
    let ledger = FaultLedger::default();
    assert!(ledger.clean());
    assert!(ledger.check(0).is_ok() && ledger.check_stream_at(0, 9).is_ok());
    let failed = Fenced {
        outcome: FenceOutcome::PassedOverFailedWork(err(Fault::WorkFailed)),
        mark: FenceMark::default(),
    };
    assert!(ledger.answer(0, failed).is_err());
    assert!(!ledger.clean());
    assert!(ledger.check(0).is_err(), "the fault is seen once on record");
    assert!(ledger.check(1).is_ok(), "other streams are not affected");
}

#[test]
fn what_a_future_could_not_wait_for_is_kept_for_the_device() {
    let ledger = FaultLedger::default();
    assert!(ledger.take_orphans().is_empty());
    ledger.orphan((2, alloc::vec![HostBuffer::zeroed(8)], Vec::new()));
    let taken = ledger.take_orphans();
    assert_eq!((taken.len(), taken[0].0, taken[0].1.len()), (1, 2, 1));
    assert!(ledger.take_orphans().is_empty(), "taken once");
}

#[test]
fn what_no_device_took_leaks_on_purpose_with_the_ledger_never_freed() {
    use crate::memory::pool::{Pool, Size};
    use crate::memory::{Handle, Issuer, Location, Placed, ReturnQueue, Returned};
    let returns = Arc::new(ReturnQueue::issued_by(
        Issuer {
            device: 1,
            stream: 0,
        },
        None,
    ));
    let handle = Handle::new(7, 64, &returns);
    handle.set_location(
        Some(Placed {
            location: Location {
                pool: Pool::Pages(Size::Small),
                block: 0,
            },
            addr: 0,
        }),
        false,
    );
    let ledger = FaultLedger::default();
    // A future that could not wait (a wait refused for now) after its device went.
    ledger.orphan((0, Vec::new(), alloc::vec![handle.binding()]));
    drop(handle);
    drop(ledger);
    let mut back: Vec<Returned> = Vec::new();
    returns.drain_into(&mut back);
    assert!(
        back.is_empty(),
        "the device may still use what the orphan held: it must not go back unfenced"
    );
}
