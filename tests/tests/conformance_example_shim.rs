//! The conformance suite against the guide's skeleton shim (`devcmd_tests::example_shim`): one
//! test per behaviour group and mode; the modes it cannot offer (lazy, poison) are skipped.

devcmd_tests::conformance_tests!(devcmd_tests::example_shim::HostHarness);
