//! Faults of work that ran: the three rules of [`devcmd::shim`], checked directly on the shim and
//! through the core, with a kernel that fails while it runs
//! ([`TestKernel::WriteThenFail`](crate::TestKernel::WriteThenFail)) and, when the harness has a
//! probe, an upload injected to fail while it runs
//! ([`FaultRule::WorkFails`](crate::FaultRule::WorkFails)).
//!
//! Every check function panics with a message that names the rule it enforces
//! ([`RULE_COMPLETED`], [`RULE_STICKY`], [`RULE_TRAVELS`], [`RULE_KIND`]), so a shim author reads
//! which promise the shim broke ([`RULE_INDEPENDENT`] besides, for a fault reported where it has
//! no business, and [`RULE_WAIT`] for a wait or query that returns before its fence completed:
//! a clean answer where a fault was due is asked again, so a forgotten fault and an early wait
//! get different messages, each naming the shim call at fault). No check depends on timing: a fence that answers "not yet" is polled, then
//! waited on; only answers are compared, never durations (the slow kernel of the first rule's
//! check only gives a shim that reports early more time to be caught).
//!
//! Owns the rules' names and the group; `bench` owns direct calls of a shim under test,
//! `on_shim` the checks made that way, `through_core` the checks made through a device.

mod bench;
mod on_shim;
mod through_core;

use crate::harness::{Harness, Mode};
use std::fmt;

pub use on_shim::{
    a_wait_covers_what_came_before, fault_is_sticky, fault_reported_by_completed_fence,
    fault_travels_with_waits,
};
pub use through_core::work_faults_through_core;

/// Rule 1 of [`devcmd::shim`], as the checks name it.
pub const RULE_COMPLETED: &str = "rule 1 of devcmd::shim (a fault of work that ran is reported \
                                  only by a fence that has completed)";
/// Rule 2 of [`devcmd::shim`], as the checks name it.
pub const RULE_STICKY: &str = "rule 2 of devcmd::shim (sticky: every fence of the stream at or \
                               after the failed work reports the fault)";
/// Rule 3 of [`devcmd::shim`], as the checks name it.
pub const RULE_TRAVELS: &str = "rule 3 of devcmd::shim (travels with stream_wait_event: a stream \
                                ordered after the failed work reports the fault at its later \
                                fences)";
/// How a fault of work that ran is classified ([`devcmd::shim`]), as the checks name it.
pub const RULE_KIND: &str = "devcmd::shim: a fault of work that ran surfaces as Fault::WorkFailed \
                             (Fault::DeviceLost when the device is lost)";
/// What a host wait promises ([`devcmd::Shim::event_wait`]), as the checks name it.
pub const RULE_WAIT: &str = "devcmd::shim: event_wait returns (and event_query answers complete) \
                             only once everything enqueued before the event has completed, \
                             copies into host memory included";
/// The promise that streams are independent unless ordered ([`devcmd::shim`]).
pub const RULE_INDEPENDENT: &str = "devcmd::shim: streams run independently unless ordered by \
                                    stream_wait_event";

/// Bytes of every buffer the checks use.
pub(super) const LEN: usize = 256;
/// The byte failed work writes.
pub(super) const FAILED_BYTE: u8 = 0x5A;
/// Queries of a fence before a check stops polling and waits (1 ms apart).
pub(super) const POLLS: u32 = 2000;

/// What makes work fail while it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The harness's [`TestKernel::WriteThenFail`](crate::TestKernel::WriteThenFail), writing its
    /// output.
    Kernel,
    /// An upload made to fail while it runs by the probe
    /// ([`FaultRule::WorkFails`](crate::FaultRule::WorkFails)); the check is skipped without a
    /// probe.
    InjectedUpload,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Kernel => "a WriteThenFail kernel",
            Self::InjectedUpload => "an upload injected to fail while it runs",
        })
    }
}

impl Source {
    /// Every source, in the order the group runs them.
    pub const ALL: [Self; 2] = [Self::Kernel, Self::InjectedUpload];
}

pub(super) const SOURCES: [Source; 2] = Source::ALL;

/// One check of the group, run with one [`Source`] by [`work_fault`]: for a shim whose failed
/// work poisons the whole process (CUDA's sticky errors), where each needs a process of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// Rule 1 on the shim ([`fault_reported_by_completed_fence`]).
    CompletedFence,
    /// Rule 2 on the shim ([`fault_is_sticky`]).
    Sticky,
    /// Rule 3 on the shim, the stream ordered after the failed work asked first
    /// ([`fault_travels_with_waits`]).
    TravelsWaitingFirst,
    /// Rule 3 on the shim, the failing stream asked first ([`fault_travels_with_waits`]).
    TravelsFailingFirst,
    /// Rules 1 and 2 through the core: drop-queue polls and reads after the failed work
    /// ([`work_faults_through_core`]).
    StickyThroughCore,
    /// Rules 2 and 3 through the core: a stream ordered after the failed work, the failing
    /// stream, an independent one ([`work_faults_through_core`]).
    TravelsThroughCore,
}

impl Check {
    /// Every check, in the order the group runs them.
    pub const ALL: [Self; 6] = [
        Self::CompletedFence,
        Self::Sticky,
        Self::TravelsWaitingFirst,
        Self::TravelsFailingFirst,
        Self::StickyThroughCore,
        Self::TravelsThroughCore,
    ];
}

/// One check of the group with one failure source, on a fresh shim (or device): together,
/// every `(check, source)` pair is [`work_faults`].
pub fn work_fault<H: Harness>(h: &H, mode: Mode, check: Check, source: Source) {
    match check {
        Check::CompletedFence => on_shim::completed_fence_with(h, mode, source),
        Check::Sticky => on_shim::sticky_with(h, mode, source),
        Check::TravelsWaitingFirst => on_shim::travels_with(h, mode, source, true),
        Check::TravelsFailingFirst => on_shim::travels_with(h, mode, source, false),
        Check::StickyThroughCore => through_core::sticky_through_core(h, mode, source),
        Check::TravelsThroughCore => through_core::travels_through_core(h, mode, source),
    }
}

/// The work-faults group: that a wait covers what came before it
/// ([`a_wait_covers_what_came_before`], [`RULE_WAIT`]), then the three rules of [`devcmd::shim`]
/// on the shim
/// ([`fault_reported_by_completed_fence`], [`fault_is_sticky`], [`fault_travels_with_waits`])
/// and through the core ([`work_faults_through_core`]). The failure comes from
/// [`TestKernel::WriteThenFail`](crate::TestKernel::WriteThenFail) always, and from
/// [`FaultRule::WorkFails`](crate::FaultRule::WorkFails) on an upload when the harness has a
/// probe. [`work_fault`] runs one check with one source.
pub fn work_faults<H: Harness>(h: &H, mode: Mode) {
    a_wait_covers_what_came_before(h, mode);
    fault_reported_by_completed_fence(h, mode);
    fault_is_sticky(h, mode);
    fault_travels_with_waits(h, mode);
    work_faults_through_core(h, mode);
}
