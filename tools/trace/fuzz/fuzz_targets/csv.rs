//! CSV traces: any bytes that are not gzip or a pickle are read as CSV.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let gzip = data.starts_with(&[0x1f, 0x8b]);
    let pickle = data.len() >= 2 && data[0] == 0x80 && (2..=5).contains(&data[1]);
    if gzip || pickle {
        return; // the other targets' formats
    }
    devcmd_trace_fuzz::check(data, Some(data.len()));
});
