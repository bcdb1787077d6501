//! `Command` operations on shim-std, read from the bytes, checked against a model.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    devcmd_trace_fuzz::commands::run(data);
});
