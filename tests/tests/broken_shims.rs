//! The suite catches shims that break its rules (faults of work that ran, host waits, cross-stream
//! order, pitched copies), and says which rule and which shim call.
//!
//! Wrappers around the std shim each break one promise of `devcmd::shim` and keep every other:
//! [`Forgetful`] reports a fault of work that ran once, then answers clean (not sticky);
//! [`NoCarry`] orders streams by waiting on the host, so the fault stays behind (it does not
//! travel with `stream_wait_event`); [`EarlyWait`] returns from `event_wait` at once, before its
//! fence completed; [`EarlyQuery`] answers "complete" to every query; [`IgnoresWaits`] answers
//! `stream_wait_event` and orders nothing; [`FlatCopies`] copies every layout as one linear run,
//! ignoring the pitch. The checks must fail
//! against each, with a message that names the broken rule and the shim call at fault (a
//! forgotten fault and an early wait must not get the same message), and pass the rules each
//! wrapper keeps. The early ones are run only through checks on the shim itself, whose pages are
//! leaked when a check fails: through the core, an early wait frees memory under running work.
//!
//! Each wrapper is a [`Forward`] of the std shim with a few [`Hooks`] bent: every other call,
//! the optional ones included (graphs, virtual memory, registration), reaches the std shim.

use devcmd::{CopyLayout, DeviceAddr, DriverError, Fault, HostMemory, Shim};
use devcmd_std::StdShim;
use devcmd_tests::forward::{Forward, Hooks};
use devcmd_tests::groups::work_faults::{
    RULE_STICKY, RULE_TRAVELS, RULE_WAIT, a_wait_covers_what_came_before, fault_is_sticky,
    fault_reported_by_completed_fence, fault_travels_with_waits, work_faults_through_core,
};
use devcmd_tests::{Harness, Mode, Probe, StdHarness, StdProbe, TestKernel, groups};
use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};

/// How a broken shim bends the answers of the std shim.
trait Twist: Default {
    /// Whether stream waits are enqueued on the device (false: the host waits instead, and the
    /// fault of the awaited work stays behind).
    const CARRIES: bool = true;
    /// Whether `stream_wait_event` orders at all (false: it answers `Ok` and does nothing).
    const ORDERS: bool = true;
    /// Whether `event_wait` waits (false: it returns `Ok` at once).
    const WAITS: bool = true;
    /// Whether `event_query` tells the truth (false: it answers "complete" while work runs).
    const QUERIES: bool = true;

    /// What a completed fence answers, given the std shim's answer.
    fn fence(&self, answer: Result<(), DriverError>) -> Result<(), DriverError> {
        answer
    }
}

/// Reports a fault of work that ran once, then answers clean: breaks rule 2 (sticky).
#[derive(Debug, Default)]
struct Forgetful {
    heard: AtomicBool,
}

impl Twist for Forgetful {
    fn fence(&self, answer: Result<(), DriverError>) -> Result<(), DriverError> {
        match answer {
            Err(e) if e.fault == Fault::WorkFailed && self.heard.swap(true, Ordering::SeqCst) => {
                Ok(())
            }
            other => other,
        }
    }
}

/// Orders streams with a host-side wait: breaks rule 3 (travels with `stream_wait_event`).
#[derive(Debug, Default)]
struct NoCarry;

impl Twist for NoCarry {
    const CARRIES: bool = false;
}

/// Answers `Ok` to `stream_wait_event` and orders nothing: breaks cross-stream order.
#[derive(Debug, Default)]
struct IgnoresWaits;

impl Twist for IgnoresWaits {
    const ORDERS: bool = false;
}

/// Returns from `event_wait` at once: breaks what a host wait promises.
#[derive(Debug, Default)]
struct EarlyWait;

impl Twist for EarlyWait {
    const WAITS: bool = false;
}

/// Answers "complete" to a query of a fence that is not: breaks what a query promises.
#[derive(Debug, Default)]
struct EarlyQuery;

impl Twist for EarlyQuery {
    const QUERIES: bool = false;
}

/// The hooks of a broken shim: the std shim's calls, three of them bent by the twist `T`; every
/// other call forwards ([`Forward`]).
#[derive(Debug, Default)]
struct Bent<T>(T);

/// The std shim with a twist.
type Broken<T> = Forward<StdShim, Bent<T>>;

impl<T: Twist + std::fmt::Debug> Hooks<StdShim> for Bent<T> {
    fn stream_wait_event(
        &self,
        inner: &StdShim,
        stream: &<StdShim as Shim>::Stream,
        event: &<StdShim as Shim>::Event,
    ) -> Result<(), DriverError> {
        if !T::ORDERS {
            return Ok(());
        }
        if T::CARRIES {
            return inner.stream_wait_event(stream, event);
        }
        // The order holds (the host waits until the event completed), but the fault the event
        // reports is dropped here instead of reaching `stream`'s later fences.
        let _ = inner.event_wait(event);
        Ok(())
    }

    fn event_query(
        &self,
        inner: &StdShim,
        event: &<StdShim as Shim>::Event,
    ) -> Result<bool, DriverError> {
        match inner.event_query(event) {
            Err(e) => self.0.fence(Err(e)).map(|()| true),
            Ok(false) if !T::QUERIES => Ok(true),
            other => other,
        }
    }

    fn event_wait(
        &self,
        inner: &StdShim,
        event: &<StdShim as Shim>::Event,
    ) -> Result<(), DriverError> {
        if !T::WAITS {
            return Ok(());
        }
        self.0.fence(inner.event_wait(event))
    }
}

/// The std harness, through a [`Broken`] shim.
#[derive(Debug, Default)]
struct BrokenHarness<T>(std::marker::PhantomData<T>);

impl<T: Twist + std::fmt::Debug> Harness for BrokenHarness<T> {
    type S = Broken<T>;

    fn shim(&self, mode: Mode) -> Option<Self::S> {
        Some(Forward {
            inner: StdHarness.shim(mode)?,
            hooks: Bent(T::default()),
        })
    }

    fn kernel(&self, shim: &Self::S, kernel: TestKernel) -> <StdShim as Shim>::Kernel {
        StdHarness.kernel(&shim.inner, kernel)
    }

    fn probe(&self, shim: &Self::S) -> Option<Box<dyn Probe>> {
        Some(Box::new(StdProbe(shim.inner.clone())))
    }
}

fn message(payload: Box<dyn Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(s) => *s,
        Err(p) => p
            .downcast::<&str>()
            .map(|s| (*s).to_owned())
            .unwrap_or_else(|_| "<a panic without a message>".to_owned()),
    }
}

/// Runs `check`, which must fail with a message naming `rule`.
#[track_caller]
fn fails_naming(what: &str, rule: &str, check: impl FnOnce()) {
    match catch_unwind(AssertUnwindSafe(check)) {
        Ok(()) => panic!("{what}: passed, but the shim breaks {rule}"),
        Err(payload) => {
            let msg = message(payload);
            assert!(
                msg.contains(rule),
                "{what}: failed, but its message does not name {rule}:\n{msg}"
            );
        }
    }
}

#[test]
fn a_shim_that_forgets_a_fault_fails_the_sticky_rule() {
    let h = BrokenHarness::<Forgetful>::default();
    for mode in [Mode::NORMAL, Mode::LAZY_POISON] {
        fails_naming("fault_is_sticky", RULE_STICKY, || fault_is_sticky(&h, mode));
        fails_naming("fault_reported_by_completed_fence", RULE_STICKY, || {
            fault_reported_by_completed_fence(&h, mode)
        });
        fails_naming("work_faults_through_core", RULE_STICKY, || {
            work_faults_through_core(&h, mode)
        });
        fails_naming("the work_faults group", "sticky", || {
            groups::work_faults(&h, mode)
        });
    }
}

#[test]
fn a_forgetful_shim_passes_the_groups_that_came_before() {
    // What issue 7 found: a shim that forgets faults of work that ran passed the suite. The
    // older groups still pass it; only the work_faults group catches it (above).
    let h = BrokenHarness::<Forgetful>::default();
    groups::round_trips(&h, Mode::LAZY_POISON);
    groups::failure_rule_with(&h, Mode::LAZY_POISON, 4, 200);
}

#[test]
fn a_shim_whose_faults_stay_behind_fails_the_travel_rule_and_only_it() {
    let h = BrokenHarness::<NoCarry>::default();
    for mode in [Mode::NORMAL, Mode::LAZY_POISON] {
        fails_naming("fault_travels_with_waits", RULE_TRAVELS, || {
            fault_travels_with_waits(&h, mode)
        });
        fails_naming("work_faults_through_core", RULE_TRAVELS, || {
            work_faults_through_core(&h, mode)
        });
        fails_naming(
            "the work_faults group",
            "travels with stream_wait_event",
            || groups::work_faults(&h, mode),
        );
        // The rules it keeps, it passes.
        fault_is_sticky(&h, mode);
        fault_reported_by_completed_fence(&h, mode);
    }
}

/// Runs `check`, which must fail naming every one of `names` and none of `not`.
#[track_caller]
fn fails_saying(what: &str, names: &[&str], not: &[&str], check: impl FnOnce()) {
    match catch_unwind(AssertUnwindSafe(check)) {
        Ok(()) => panic!("{what}: passed, but the shim breaks {names:?}"),
        Err(payload) => {
            let msg = message(payload);
            for name in names {
                assert!(
                    msg.contains(name),
                    "{what}: its message does not name {name:?}:\n{msg}"
                );
            }
            for name in not {
                assert!(
                    !msg.contains(name),
                    "{what}: its message names {name:?}:\n{msg}"
                );
            }
        }
    }
}

#[test]
fn a_forgotten_fault_is_named_as_such_not_as_an_early_wait() {
    let h = BrokenHarness::<Forgetful>::default();
    for mode in [Mode::NORMAL, Mode::LAZY_POISON] {
        fails_saying(
            "fault_is_sticky",
            &[RULE_STICKY, "forgot the fault", "event_query / event_wait"],
            &[RULE_WAIT],
            || fault_is_sticky(&h, mode),
        );
        // A forgetful shim's waits cover what came before them.
        a_wait_covers_what_came_before(&h, mode);
    }
}

#[test]
fn a_wait_that_returns_early_is_named_by_its_call() {
    let h = BrokenHarness::<EarlyWait>::default();
    for mode in [Mode::NORMAL, Mode::LAZY_POISON] {
        fails_saying(
            "a_wait_covers_what_came_before",
            &[RULE_WAIT, "event_wait", "had not landed"],
            &[],
            || a_wait_covers_what_came_before(&h, mode),
        );
        fails_saying(
            "fault_is_sticky",
            &[
                RULE_WAIT,
                "the shim call at fault is event_wait",
                "not a forgotten fault",
            ],
            &[RULE_STICKY],
            || fault_is_sticky(&h, mode),
        );
    }
}

#[test]
fn a_query_that_completes_early_is_named_by_its_call() {
    let h = BrokenHarness::<EarlyQuery>::default();
    for mode in [Mode::NORMAL, Mode::LAZY_POISON] {
        fails_saying(
            "fault_reported_by_completed_fence",
            &[RULE_WAIT, "the shim call at fault is event_query"],
            &[RULE_STICKY],
            || fault_reported_by_completed_fence(&h, mode),
        );
        // Its waits are honest.
        a_wait_covers_what_came_before(&h, mode);
    }
}

#[test]
fn ignored_cross_stream_waits_fail_cross_stream_reuse_naming_the_call() {
    // What issue 21 found: the group's cleanup drained stream A before B's read, which hid a
    // shim that ignores stream_wait_event in every mode. In lazy mode it shows every time.
    let h = BrokenHarness::<IgnoresWaits>::default();
    for mode in [Mode::LAZY, Mode::LAZY_POISON] {
        fails_saying(
            "cross_stream_reuse",
            &["stream_wait_event", "before A's upload of it landed"],
            &[],
            || groups::cross_stream_reuse(&h, mode),
        );
    }
}

/// Copies every layout as one linear run of its packed bytes: breaks pitched copies (rows of
/// `width` bytes, `pitch` apart on the device) and keeps every linear one.
#[derive(Debug, Default)]
struct FlatCopies;

impl Hooks<StdShim> for FlatCopies {
    unsafe fn copy_to_device(
        &self,
        inner: &StdShim,
        stream: &<StdShim as Shim>::Stream,
        src: *const u8,
        src_memory: HostMemory,
        dst: DeviceAddr,
        layout: CopyLayout,
    ) -> Result<(), DriverError> {
        let flat = CopyLayout::linear(layout.packed_bytes());
        // SAFETY: the caller's contract, handed on: `src` holds the packed bytes, and the packed
        // run starting at `dst` lies inside the layout's device span (the pitch is at least the
        // width).
        unsafe { inner.copy_to_device(stream, src, src_memory, dst, flat) }
    }

    unsafe fn copy_to_host(
        &self,
        inner: &StdShim,
        stream: &<StdShim as Shim>::Stream,
        src: DeviceAddr,
        dst: *mut u8,
        dst_memory: HostMemory,
        layout: CopyLayout,
    ) -> Result<(), DriverError> {
        let flat = CopyLayout::linear(layout.packed_bytes());
        // SAFETY: as above: `dst` has room for the packed bytes, and the packed run starting at
        // `src` lies inside the layout's device span.
        unsafe { inner.copy_to_host(stream, src, dst, dst_memory, flat) }
    }
}

/// The std harness, through a shim whose copies ignore the pitch.
#[derive(Debug, Default)]
struct FlatHarness;

impl Harness for FlatHarness {
    type S = Forward<StdShim, FlatCopies>;

    fn shim(&self, mode: Mode) -> Option<Self::S> {
        Some(Forward {
            inner: StdHarness.shim(mode)?,
            hooks: FlatCopies,
        })
    }

    fn kernel(&self, shim: &Self::S, kernel: TestKernel) -> <StdShim as Shim>::Kernel {
        StdHarness.kernel(&shim.inner, kernel)
    }

    fn probe(&self, shim: &Self::S) -> Option<Box<dyn Probe>> {
        Some(Box::new(StdProbe(shim.inner.clone())))
    }
}

#[test]
fn copies_that_ignore_the_pitch_fail_layouts_naming_the_call() {
    let h = FlatHarness;
    for mode in [Mode::NORMAL, Mode::LAZY_POISON] {
        let tag = format!("[{mode}] layouts: a pitched upload");
        fails_saying(
            "layouts",
            &[
                &tag,
                "first difference at byte",
                "expected 0xee",
                "copy_to_device / copy_to_host with a pitched CopyLayout",
            ],
            &[],
            || groups::layouts(&h, mode),
        );
        // Linear copies it keeps: the round trips pass.
        groups::round_trips(&h, mode);
    }
}
