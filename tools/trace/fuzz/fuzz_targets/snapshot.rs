//! Snapshot pickles: the first byte picks the protocol (2 to 5), the rest is the pickle's body
//! after its PROTO opcode, so every input reaches the pickle reader.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&first, body)) = data.split_first() else {
        return;
    };
    let mut pickle = vec![0x80, 2 + first % 4];
    pickle.extend_from_slice(body);
    devcmd_trace_fuzz::check(&pickle, Some(pickle.len()));
});
