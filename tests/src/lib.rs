//! The conformance suite.
