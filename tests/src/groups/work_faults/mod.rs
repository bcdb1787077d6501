//! Faults of work that ran: the three rules of [`devcmd::shim`], checked directly on the shim and
//! through the core, with a kernel that fails while it runs
//! ([`TestKernel::WriteThenFail`](crate::TestKernel::WriteThenFail)) and, when the harness has a
//! probe, an upload injected to fail while it runs
//! ([`FaultRule::WorkFails`](crate::FaultRule::WorkFails)).
//!
//! Every check function panics with a message that names the rule it enforces
//! ([`RULE_COMPLETED`], [`RULE_STICKY`], [`RULE_TRAVELS`], [`RULE_KIND`]), so a shim author reads
//! which promise the shim broke ([`RULE_INDEPENDENT`] besides, for a fault reported where it has
//! no business). No check depends on timing: a fence that answers "not yet" is polled, then
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

pub use on_shim::{fault_is_sticky, fault_reported_by_completed_fence, fault_travels_with_waits};
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
pub(super) enum Source {
    /// The harness's [`TestKernel::WriteThenFail`](crate::TestKernel::WriteThenFail), writing its
    /// output.
    Kernel,
    /// An upload made to fail while it runs by the probe
    /// ([`FaultRule::WorkFails`](crate::FaultRule::WorkFails)).
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

pub(super) const SOURCES: [Source; 2] = [Source::Kernel, Source::InjectedUpload];

/// The work-faults group: the three rules of [`devcmd::shim`] on the shim
/// ([`fault_reported_by_completed_fence`], [`fault_is_sticky`], [`fault_travels_with_waits`])
/// and through the core ([`work_faults_through_core`]). The failure comes from
/// [`TestKernel::WriteThenFail`](crate::TestKernel::WriteThenFail) always, and from
/// [`FaultRule::WorkFails`](crate::FaultRule::WorkFails) on an upload when the harness has a
/// probe.
pub fn work_faults<H: Harness>(h: &H, mode: Mode) {
    fault_reported_by_completed_fence(h, mode);
    fault_is_sticky(h, mode);
    fault_travels_with_waits(h, mode);
    work_faults_through_core(h, mode);
}
