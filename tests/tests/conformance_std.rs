//! The conformance suite against `devcmd-std`: one test per behaviour group and mode.

use devcmd_tests::StdHarness;

devcmd_tests::conformance_tests!(StdHarness);

/// The work-faults group one check and one failure source at a time, as the CUDA suite runs it
/// (`conformance_cuda.rs`: a process each): every pair passes alone too.
#[test]
fn work_faults_one_check_at_a_time() {
    use devcmd_tests::Mode;
    use devcmd_tests::groups::work_faults::{Check, Source, work_fault};
    for mode in [Mode::NORMAL, Mode::LAZY_POISON] {
        for check in Check::ALL {
            for source in Source::ALL {
                work_fault(&StdHarness, mode, check, source);
            }
        }
    }
}
