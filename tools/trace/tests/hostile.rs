//! Hostile inputs: what a user (or a fuzzer) may feed devcmd-trace must end in a message and exit
//! 2, never in a crash, a wrapped total or memory out of proportion to the input.
//!
//! This binary counts every byte it allocates (a global allocator that keeps the peak), so the
//! memory checks read the reader's own peak in this process; the rest run the binary.

mod common;

use common::{run, write};
use devcmd_trace::input::{ReadOptions, read};
use devcmd_trace::progress::Progress;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The system allocator, counting live bytes and their peak.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
/// Tests that measure the peak run one at a time.
static MEASURE: Mutex<()> = Mutex::new(());

// SAFETY: every call forwards to `System` with the caller's layout and pointer; the counters are
// only bookkeeping.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let now = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        PEAK.fetch_max(now, Ordering::Relaxed);
        // SAFETY: the caller's layout, as `GlobalAlloc::alloc` requires.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Reads `bytes` as a trace in this process; the message (or the operation count) and the most
/// bytes allocated above what was live before.
fn read_measured(name: &str, bytes: &[u8]) -> (Result<usize, String>, usize) {
    let path = write(name, bytes);
    let _one = MEASURE.lock().unwrap_or_else(|e| e.into_inner());
    let before = LIVE.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let result = read(&path, ReadOptions::default(), &mut Progress::off())
        .map(|t| t.ops.len())
        .map_err(|e| e.to_string());
    (result, PEAK.load(Ordering::Relaxed) - before)
}

/// `n` lists nested in each other, as `pickle.dumps` (protocol 2, no memo) writes them.
fn nested_lists(n: usize) -> Vec<u8> {
    let mut p = vec![0x80, 0x02];
    p.extend(std::iter::repeat_n(b']', n));
    p.extend(std::iter::repeat_n(b'a', n - 1));
    p.push(b'.');
    p
}

#[test]
fn lists_nested_ten_thousand_deep_are_refused_without_a_stack_overflow() {
    let bytes = nested_lists(10_000);
    // The reader runs on a thread with a small stack: recursion per level would overflow it
    // (and abort this whole test binary).
    let path = write("nested.pickle", &bytes);
    let reader = std::thread::Builder::new()
        .stack_size(256 << 10)
        .spawn(move || {
            read(&path, ReadOptions::default(), &mut Progress::off())
                .map(|t| t.ops.len())
                .map_err(|e| e.to_string())
        })
        .unwrap();
    let message = reader.join().expect("the reader returns").unwrap_err();
    assert!(
        message.contains("not a PyTorch memory snapshot") && message.contains("a list"),
        "{message}"
    );
    let r = run(&[&write("nested-bin.pickle", &bytes), "--no-search"]);
    assert_eq!(r.code, 2, "exit {}: {}", r.code, r.stderr);
}

/// Allowance for a small input: the reader's buffers and the error message.
const SLACK: usize = 4 << 20;

#[test]
fn mark_opcodes_cost_memory_in_proportion_to_the_input() {
    // 40 KB of MARK, then nothing: a pickle that never ends.
    let mut bytes = vec![0x80, 0x02];
    bytes.extend(std::iter::repeat_n(b'(', 40_000));
    let (result, peak) = read_measured("marks.pickle", &bytes);
    let message = result.unwrap_err();
    assert!(message.contains("not a readable pickle"), "{message}");
    assert!(
        peak <= 10 * bytes.len() + SLACK,
        "{} input bytes took {peak} bytes of memory",
        bytes.len()
    );
}

#[test]
fn memo_references_do_not_multiply_memory() {
    // l0 = []; l(k+1) = [lk, lk]: Python shares lk, a reader that copies it doubles per level.
    let mut p = vec![0x80, 0x02, b']', b'q', 0];
    for k in 0..40u8 {
        p.extend([b']', b'q', k + 1, b'(', b'h', k, b'h', k, b'e']);
    }
    p.push(b'.');
    let (result, peak) = read_measured("memo.pickle", &p);
    assert!(result.unwrap_err().contains("a list"));
    assert!(peak <= 10 * p.len() + SLACK, "{peak} bytes");
}

/// A snapshot with one device whose trace is `entries` (`(action, addr, size as pickle bytes)`).
fn snapshot(entries: &[(&str, u64, Vec<u8>)]) -> Vec<u8> {
    fn text(p: &mut Vec<u8>, s: &str) {
        p.push(0x8c); // SHORT_BINUNICODE
        p.push(s.len() as u8);
        p.extend(s.as_bytes());
    }
    let mut p = vec![0x80, 0x04, b'}', b'('];
    text(&mut p, "device_traces");
    p.extend([b']', b'(', b']', b'(']);
    for (action, addr, size) in entries {
        p.extend([b'}', b'(']);
        text(&mut p, "action");
        text(&mut p, action);
        text(&mut p, "addr");
        p.push(0x8a); // LONG1
        p.push(8);
        p.extend(addr.to_le_bytes());
        text(&mut p, "size");
        p.extend(size);
        p.push(b'u'); // SETITEMS
    }
    p.extend([b'e', b'e', b'u', b'.']);
    p
}

/// LONG1 of a little-endian two's complement integer.
fn long1(le: &[u8]) -> Vec<u8> {
    let mut v = vec![0x8a, le.len() as u8];
    v.extend(le);
    v
}

#[test]
fn snapshot_sizes_that_are_negative_or_too_large_say_so() {
    let ok = snapshot(&[("alloc", 0x1000, long1(&512u64.to_le_bytes()))]);
    let (result, _) = read_measured("snapshot-ok.pickle", &ok);
    assert_eq!(result, Ok(1), "the fixture itself reads");

    let minus_five = snapshot(&[("alloc", 0x1000, long1(&[0xfb]))]);
    let r = run(&[&write("minus-five.pickle", &minus_five), "--no-search"]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("field size") && r.stderr.contains("-5") && r.stderr.contains("negative"),
        "{}",
        r.stderr
    );

    let mut two_to_70 = vec![0u8; 9];
    two_to_70[8] = 0x40;
    let huge = snapshot(&[("alloc", 0x1000, long1(&two_to_70))]);
    let r = run(&[&write("two-to-70.pickle", &huge), "--no-search"]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("field size")
            && r.stderr.contains("1180591620717411303424")
            && r.stderr.contains("too large"),
        "{}",
        r.stderr
    );
}

#[test]
fn live_bytes_that_pass_two_to_the_64_are_refused_not_wrapped() {
    let half = 1u64 << 63;
    let csv = format!("seq,action,id,size,stream\n0,alloc,1,{half},0\n1,alloc,2,{half},0\n");
    let r = run(&[&write("wrap.csv", csv.as_bytes()), "--no-search"]);
    assert_eq!(r.code, 2, "exit {}: {}{}", r.code, r.stdout, r.stderr);
    assert!(
        r.stderr.contains("line 3") && r.stderr.contains("2^64"),
        "{}",
        r.stderr
    );
}

#[test]
fn help_and_readme_name_the_real_default_device() {
    let help = run(&["--help"]).stdout;
    assert!(
        help.contains("address (default)"),
        "--help does not say the default is address:\n{help}"
    );
    assert!(!help.contains("std (default)"), "{help}");
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    assert!(
        !readme.contains("The default\ndevice is devcmd-std's")
            && readme.contains("address-only device by default"),
        "README.md's trace section must say the default device is the address-only one"
    );
}

#[test]
fn a_header_or_a_line_of_many_commas_is_refused_before_it_costs_memory() {
    let commas = ",".repeat(1 << 20);
    let (header, peak) = read_measured("commas-header.csv", commas.as_bytes());
    let e = header.expect_err("a header of a million columns");
    assert!(e.contains("columns, at most 64"), "{e}");
    assert!(peak < 4 << 20, "{peak} bytes for a 1 MiB header");
    let line = format!("seq,action,id,size,stream\n{commas}\n");
    let (line, peak) = read_measured("commas-line.csv", line.as_bytes());
    let e = line.expect_err("a line of a million fields");
    assert!(e.contains("fields, the header has 5"), "{e}");
    assert!(peak < 4 << 20, "{peak} bytes for a 1 MiB line");
}

#[test]
fn entries_of_many_keys_and_long_stream_names_are_refused() {
    fn unicode(p: &mut Vec<u8>, s: &str) {
        p.push(b'X'); // BINUNICODE
        p.extend((s.len() as u32).to_le_bytes());
        p.extend(s.as_bytes());
    }
    // The size's bytes, then more key/value pairs of the same entry.
    let mut many = long1(&512u64.to_le_bytes());
    for k in 0..100 {
        unicode(&mut many, &format!("key{k}"));
        unicode(&mut many, "v");
    }
    let wide = snapshot(&[("alloc", 0x1000, many)]);
    let r = run(&[&write("wide-entry.pickle", &wide), "--no-search"]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("an entry of 103 keys"), "{}", r.stderr);

    let mut named = long1(&512u64.to_le_bytes());
    unicode(&mut named, "stream");
    unicode(&mut named, &"s".repeat(300));
    let long = snapshot(&[("alloc", 0x1000, named)]);
    let r = run(&[&write("long-stream.pickle", &long), "--no-search"]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("stream") && r.stderr.contains("a name of 300 bytes"),
        "{}",
        r.stderr
    );
}
