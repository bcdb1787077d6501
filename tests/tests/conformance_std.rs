//! The conformance suite against `devcmd-std`: one test per behaviour group and mode.

use devcmd_tests::StdHarness;

devcmd_tests::conformance_tests!(StdHarness);
