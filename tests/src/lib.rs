//! The devcmd conformance suite, generic over any [`devcmd::Shim`].
//!
//! A shim author implements [`Harness`] (a fresh shim per [`Mode`], the four [`TestKernel`]s
//! (the suite passes their parameters, [`TestArgs`]), and optionally a [`Probe`] for counters and
//! fault injection; the contract of
//! each method is in [`harness`]), then either calls [`run_conformance`] from one test, or lets
//! [`conformance_tests!`] generate one `#[test]` per behaviour group and mode so failures are
//! legible:
//!
//! ```ignore
//! struct MyHarness;
//! impl devcmd_tests::Harness for MyHarness { /* shim, kernel */ }
//! devcmd_tests::conformance_tests!(MyHarness);
//! // Or, with no probe of your own, let the suite's wrapper count calls and inject faults:
//! devcmd_tests::conformance_tests!(devcmd_tests::CountedHarness(MyHarness));
//! ```
//!
//! The groups ([`groups`]) check the drop queue, copy layouts and staging, round trips, memory
//! reuse across streams (ONNX Runtime #4829, PyTorch #71616 and #189504 analogues), the failure
//! rule as a seeded property against a model, fault injection of every shim call under every
//! operation, bad input, the three rules of faults of work that ran ([`groups::work_faults()`]:
//! reported only by completed fences, sticky, carried by stream waits, each failure naming the
//! rule), and that host buffers are released only after their fences ([`groups::host_release()`],
//! seen as wrong bytes), and capture ([`groups::capture()`]: record a stream, replay the graph,
//! what a recording refuses, what a graph keeps and gives back, failures through replays; a
//! shim without graphs is skipped), and virtual memory through the raw shim
//! ([`groups::virtual_memory()`]: reserve, map granule by granule, copies and a kernel across
//! mappings, unmap and map again, a map the device cannot hold leaves nothing mapped; a shim
//! whose granule is 0 is skipped). [`StdHarness`] runs them against `devcmd-std` and is the
//! reference implementation of a harness; [`CudaHarness`] runs them on an NVIDIA GPU through
//! `devcmd-cuda` (normal and poison modes; [`cuda_harness`] says why not the lazy ones, and why
//! each check of a fault of work that ran needs a process of its own there); [`Counted`] wraps
//! any shim with counters and fault injection, so an author need not write a [`Probe`];
//! [`forward::Forward`] wraps any shim bending only the calls a test names ([`forward::Hooks`]),
//! every other call forwarded (never the contract's `Unsupported` default).
//! [`example_shim`] is the guide's skeleton shim, the
//! smallest complete one, with its harness.
//!
//! A group that checks nothing (a mode the shim lacks, no graphs, no probe, no virtual memory, no
//! library) never passes silently: it prints `devcmd conformance: GROUP: skipped (WHY) [MODE]` to
//! the runner's normal output and is counted ([`skip`], [`skipped_groups`]).
#![deny(missing_docs)]

mod counted;
pub mod cuda_harness;
pub mod example_shim;
pub mod forward;
pub mod groups;
pub mod harness;
pub mod skip;
mod std_harness;
mod util;

pub use counted::{
    Counted, CountedHarness, CountedProbe, Counting, INJECTED_LOSS_STATUS, INJECTED_STATUS,
};
pub use cuda_harness::{CUDA_TEST_KERNELS, CudaHarness, CudaHarnessError, TRAP_DELAY_MS};
pub use harness::{
    Counters, FaultRule, Harness, Mode, Probe, SLOW_KERNEL_MS, TestArgs, TestKernel,
};
pub use skip::skipped_groups;
pub use std_harness::{IntegratedStdHarness, StdHarness, StdProbe};
pub use util::pinned_in_use;

/// Seeds of the failure-rule property per mode ([`groups::failure_rule`]).
pub const FAILURE_SEEDS: u64 = 40;

/// In poison mode, the byte the core fills released host buffers with
/// ([`devcmd::DropPolicy::fill_released`]): a read of a buffer released before its fence passed
/// sees it.
pub const RELEASED_HOST_FILL: u8 = 0xDB;
/// Operations per seed of the failure-rule property.
pub const FAILURE_OPS: usize = 300;

/// Runs every group in every mode the shim offers. Panics on the first failure, with a message
/// naming the mode and the behaviour; at the end says how many groups were skipped (each said
/// so when it was).
pub fn run_conformance<H: Harness>(harness: &H) {
    let before = skipped_groups().len();
    for mode in Mode::ALL {
        groups::drop_queue(harness, mode);
        groups::layouts(harness, mode);
        groups::round_trips(harness, mode);
        groups::pipelined(harness, mode);
        groups::pipelined_work_fault(harness, mode);
        groups::cross_stream_reuse(harness, mode);
        groups::pending_frees(harness, mode);
        groups::failure_rule(harness, mode);
        groups::fault_injection(harness, mode);
        groups::bad_input(harness, mode);
        groups::work_faults(harness, mode);
        groups::host_release(harness, mode);
        groups::capture(harness, mode);
        groups::capture_replay_fault(harness, mode);
        groups::virtual_memory(harness, mode);
        groups::library_work(harness, mode);
        groups::several_devices(harness, mode);
        groups::several_devices_lost(harness, mode);
        groups::several_devices_fault(harness, mode);
    }
    let skipped = skipped_groups().len() - before;
    if skipped > 0 {
        use std::io::Write;
        let _ = writeln!(
            std::io::stdout().lock(),
            "devcmd conformance: {skipped} group(s) skipped in this run (listed above); they \
             checked nothing"
        );
    }
}

/// Generates one `#[test]` per behaviour group and mode for the harness expression `$h`
/// (evaluated anew in each test): a module per mode (`normal`, `lazy_poison`) with one test per
/// group (`normal::drop_queue`, ...), and `lazy::` and `poison::` `cross_stream_reuse`,
/// `capture`, `capture_replay_fault` and `virtual_memory` besides.
#[macro_export]
macro_rules! conformance_tests {
    ($h:expr) => {
        $crate::conformance_tests!(@mode normal, NORMAL, $h;
            drop_queue, layouts, round_trips, pipelined, pipelined_work_fault, cross_stream_reuse,
            pending_frees, failure_rule, fault_injection, bad_input, work_faults, host_release, capture,
            capture_replay_fault, virtual_memory, library_work, several_devices, several_devices_lost,
            several_devices_fault);
        $crate::conformance_tests!(@mode lazy_poison, LAZY_POISON, $h;
            drop_queue, layouts, round_trips, pipelined, pipelined_work_fault, cross_stream_reuse,
            pending_frees, failure_rule, fault_injection, bad_input, work_faults, host_release, capture,
            capture_replay_fault, virtual_memory, library_work, several_devices, several_devices_lost,
            several_devices_fault);
        $crate::conformance_tests!(@mode lazy, LAZY, $h;
            pipelined, cross_stream_reuse, capture, capture_replay_fault, virtual_memory,
            library_work, several_devices, several_devices_lost, several_devices_fault);
        $crate::conformance_tests!(@mode poison, POISON, $h;
            pipelined, cross_stream_reuse, capture, capture_replay_fault, virtual_memory,
            library_work, several_devices, several_devices_lost, several_devices_fault);
    };
    (@mode $name:ident, $mode:ident, $h:expr; $($group:ident),*) => {
        #[doc = concat!("The groups in mode `", stringify!($mode), "`.")]
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[test]
                fn $group() {
                    $crate::groups::$group(&$h, $crate::Mode::$mode);
                }
            )*
        }
    };
}
