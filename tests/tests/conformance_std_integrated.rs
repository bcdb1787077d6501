//! The conformance suite against an integrated `devcmd-std` device, where the core runs zero
//! copy: device memory is mapped host memory, uploads are host writes into it.
//!
//! The groups whose checks are about the staging path do not apply, and are left out:
//! `drop_queue` counts the fences of staged copies (a zero-copy write waits for the device
//! instead, and stages nothing); `layouts` checks the staging decision itself; `fault_injection`
//! refuses `device_alloc` and the copy calls, which zero copy does not make (its pages come
//! from `host_alloc_pinned`); `work_faults` expects a write behind failed work to be enqueued
//! without waiting, where a zero-copy write waits and so reports the fault at once.

use devcmd_tests::{IntegratedStdHarness, Mode, groups};

macro_rules! zero_copy_groups {
    ($($mode:ident: $($group:ident),*;)*) => {
        $(
            #[allow(non_snake_case)]
            mod $mode {
                use super::*;
                $(
                    #[test]
                    fn $group() {
                        groups::$group(&IntegratedStdHarness, Mode::$mode);
                    }
                )*
            }
        )*
    };
}

zero_copy_groups! {
    NORMAL: round_trips, cross_stream_reuse, pending_frees, failure_rule, bad_input, host_release,
        capture, capture_replay_fault, virtual_memory, library_work, several_devices,
        several_devices_lost, several_devices_fault;
    LAZY_POISON: round_trips, cross_stream_reuse, pending_frees, failure_rule, bad_input,
        host_release, capture, capture_replay_fault, virtual_memory, library_work, several_devices,
        several_devices_lost, several_devices_fault;
    LAZY: cross_stream_reuse, capture, capture_replay_fault, library_work, several_devices,
        several_devices_lost, several_devices_fault;
    POISON: cross_stream_reuse, capture, capture_replay_fault, library_work, several_devices,
        several_devices_lost, several_devices_fault;
}
