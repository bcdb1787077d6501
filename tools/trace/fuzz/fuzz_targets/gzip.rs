//! Gzipped traces. An even first byte: the rest, gzipped here (a valid stream of any CSV or
//! pickle), checked against its uncompressed size; an odd one: the rest after gzip's magic bytes,
//! as it comes (damaged, cut off or inflating to much more than it is).
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::io::Write;

fuzz_target!(|data: &[u8]| {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    if first % 2 == 0 {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(rest).expect("writes to a vector");
        let gz = e.finish().expect("writes to a vector");
        devcmd_trace_fuzz::check(&gz, Some(rest.len()));
    } else {
        let mut raw = vec![0x1f, 0x8b];
        raw.extend_from_slice(rest);
        devcmd_trace_fuzz::check(&raw, None);
    }
});
