//! Reading traces: the three formats agree, PyTorch's own snapshot converts to its stored CSV,
//! malformed inputs are refused with the line and the field (exit 2, never a panic), and a small
//! fuzz of mutated CSV, gzip and pickle files never panics.

mod common;

use common::{QUICK, data, run, write};
use devcmd_trace::input::{Action, ReadOptions, read};
use devcmd_trace::progress::Progress;
use std::io::Write;
use std::path::Path;

fn load(path: &str) -> Result<devcmd_trace::input::Trace, String> {
    read(path, ReadOptions::default(), &mut Progress::off()).map_err(|e| e.to_string())
}

#[test]
fn csv_gzip_and_snapshot_fixtures_replay_alike() {
    let mut seen = Vec::new();
    for (file, format) in [
        ("tiny.csv", "csv"),
        ("tiny.csv.gz", "csv.gz"),
        ("snapshot-tiny.pickle", "snapshot"),
    ] {
        let path = data(file);
        let mut args = vec![path.as_str(), "--json", "--no-search"];
        args.extend(QUICK);
        let j = run(&args).json();
        assert_eq!(j["format"], format, "{file}");
        let c = &j["configs"][0];
        seen.push((
            j["ops"].clone(),
            j["live_peak"].clone(),
            c["held_peak"].clone(),
            c["pages"].clone(),
            c["pages_allocated"].clone(),
        ));
        if format == "snapshot" {
            let notes = j["notes"].to_string();
            assert!(notes.contains("1 frees of allocations"), "{notes}");
            assert!(notes.contains("free_requested"), "{notes}");
            assert!(notes.contains("oom"), "{notes}");
        }
    }
    assert_eq!(seen[0], seen[1]);
    assert_eq!(seen[0], seen[2]);
}

#[test]
fn the_snapshot_and_csv_fixtures_hold_the_same_operations() {
    let csv = load(&data("tiny.csv")).unwrap();
    let pickle = load(&data("snapshot-tiny.pickle")).unwrap();
    let ops = |t: &devcmd_trace::input::Trace| -> Vec<(Action, u64)> {
        t.ops.iter().map(|o| (o.action, o.size)).collect()
    };
    assert_eq!(ops(&csv), ops(&pickle));
    assert_eq!(csv.live_peak, pickle.live_peak);
}

/// PyTorch's own snapshot (`traces/snapshot-small.pickle`, written by
/// `torch.cuda.memory._dump_snapshot`) converts to exactly the stored CSV beside it.
#[test]
fn a_real_pytorch_snapshot_converts_to_its_stored_csv() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../traces");
    let (pickle, csv) = (
        dir.join("snapshot-small.pickle"),
        dir.join("snapshot-small.csv.gz"),
    );
    if !pickle.exists() || !csv.exists() {
        eprintln!("skipped: no traces/snapshot-small.pickle and .csv.gz");
        return;
    }
    let p = load(&pickle.to_string_lossy()).unwrap();
    let c = load(&csv.to_string_lossy()).unwrap();
    let ops = |t: &devcmd_trace::input::Trace| -> Vec<(Action, u64, u64)> {
        t.ops.iter().map(|o| (o.action, o.id, o.size)).collect()
    };
    assert_eq!(ops(&p), ops(&c));
    assert_eq!(
        (p.live_peak, p.allocs, p.frees),
        (c.live_peak, c.allocs, c.frees)
    );
}

const HEADER: &str = "seq,action,id,size,stream\n";

/// (what, file content, what the message must contain).
fn malformed() -> Vec<(&'static str, Vec<u8>, Vec<&'static str>)> {
    let csv = |body: &str| format!("{HEADER}{body}").into_bytes();
    vec![
        (
            "bad size",
            csv("0,alloc,1,12x,0\n"),
            vec!["line 2, field size", "\"12x\" is not a byte count"],
        ),
        (
            "bad action",
            csv("0,alloc,1,8,0\n1,malloc,2,8,0\n"),
            vec!["line 3, field action", "\"malloc\""],
        ),
        (
            "bad id",
            csv("0,alloc,one,8,0\n"),
            vec!["line 2, field id", "\"one\""],
        ),
        ("bad seq", csv("x,alloc,1,8,0\n"), vec!["line 2, field seq"]),
        (
            "size 0",
            csv("0,alloc,1,0,0\n"),
            vec!["line 2, field size", "0 bytes"],
        ),
        (
            "no size on alloc",
            csv("0,alloc,1,,0\n"),
            vec!["line 2, field size", "needs a size"],
        ),
        (
            "unknown free",
            csv("0,alloc,1,8,0\n1,free,2,8,0\n"),
            vec!["line 3, field id", "not live", "--lenient"],
        ),
        (
            "double free",
            csv("0,alloc,1,8,0\n1,free,1,8,0\n2,free,1,8,0\n"),
            vec!["line 4, field id", "not live"],
        ),
        (
            "duplicate live id",
            csv("0,alloc,1,8,0\n1,alloc,1,16,0\n"),
            vec!["line 3, field id", "allocated again while live", "line 2"],
        ),
        (
            "free size mismatch",
            csv("0,alloc,1,8,0\n1,free,1,9,0\n"),
            vec!["line 3, field size", "asked for 8"],
        ),
        (
            "too few fields",
            csv("0,alloc,1,8\n"),
            vec!["line 2", "4 fields, the header has 5"],
        ),
        (
            "no header",
            b"0,alloc,1,8,0\n".to_vec(),
            vec!["line 1", "no \"action\" column"],
        ),
        (
            "header without size",
            b"seq,action,id,stream\n".to_vec(),
            vec!["line 1", "no \"size\" column"],
        ),
        ("empty", Vec::new(), vec!["empty trace"]),
        (
            "comments only",
            b"# nothing\n\n".to_vec(),
            vec!["empty trace"],
        ),
        (
            "header only",
            HEADER.as_bytes().to_vec(),
            vec!["holds no allocation"],
        ),
        (
            "binary",
            vec![0xff, 0xfe, 0x00, 0x01, b'\n'],
            vec!["line 1", "not UTF-8"],
        ),
        (
            "cut gzip",
            gz(&csv("0,alloc,1,8,0\n1,free,1,8,0\n"))[..20].to_vec(),
            vec!["cannot read"],
        ),
        (
            "garbage pickle",
            vec![0x80, 0x04, 0xff, 0xff, 0x00],
            vec!["not a readable pickle"],
        ),
        (
            "pickle of a list",
            pickle_of_list(),
            vec!["not a PyTorch memory snapshot", "a list"],
        ),
    ]
}

fn gz(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

/// `pickle.dumps([1, 2], protocol=2)`.
fn pickle_of_list() -> Vec<u8> {
    vec![
        0x80, 0x02, b']', b'q', 0x00, b'(', b'K', 0x01, b'K', 0x02, b'e', b'.',
    ]
}

#[test]
fn malformed_traces_are_refused_with_the_line_and_the_field() {
    for (i, (what, bytes, expected)) in malformed().into_iter().enumerate() {
        let path = write(&format!("malformed-{i}.csv"), &bytes);
        let r = run(&[&path, "--no-search", "--no-timing"]);
        assert_eq!(r.code, 2, "{what}: exit {} ({})", r.code, r.stderr);
        assert!(r.stdout.is_empty(), "{what}: printed {}", r.stdout);
        for e in expected {
            assert!(r.stderr.contains(e), "{what}: {e:?} not in {:?}", r.stderr);
        }
    }
}

#[test]
fn lenient_skips_unknown_frees_and_frees_reallocated_ids() {
    let path = write(
        "lenient.csv",
        format!("{HEADER}0,free,9,8,0\n1,alloc,1,8,0\n2,alloc,1,16,0\n3,free,1,16,0\n").as_bytes(),
    );
    assert_eq!(run(&[&path, "--no-search", "--no-timing"]).code, 2);
    let mut args = vec![path.as_str(), "--lenient", "--json", "--no-search"];
    args.extend(QUICK);
    let j = run(&args).json();
    let notes = j["notes"].to_string();
    assert!(notes.contains("1 frees of allocations"), "{notes}");
    assert!(notes.contains("1 ids were allocated again"), "{notes}");
    assert_eq!(j["ops"], 4);
}

/// A tiny deterministic generator (no dependency).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn mutate(rng: &mut Lcg, base: &[u8]) -> Vec<u8> {
    let mut b = base.to_vec();
    for _ in 0..1 + rng.below(4) {
        if b.is_empty() {
            break;
        }
        let at = rng.below(b.len());
        match rng.below(5) {
            0 => b[at] = rng.next() as u8,
            1 => b.truncate(at),
            2 => {
                b.remove(at);
            }
            3 => b.insert(at, b",\n0x-9"[rng.below(6)]),
            _ => {
                let end = (at + rng.below(64)).min(b.len());
                let chunk = b[at..end].to_vec();
                b.splice(at..at, chunk);
            }
        }
    }
    b
}

/// Mutated fixtures are either read or refused with a message; nothing panics, and what is read
/// replays and verifies.
#[test]
fn mutated_inputs_never_panic() {
    let mut rng = Lcg(0x5eed);
    let bases: Vec<(&str, Vec<u8>)> = ["tiny.csv", "tiny.csv.gz", "snapshot-tiny.pickle"]
        .iter()
        .map(|f| (*f, std::fs::read(data(f)).unwrap()))
        .collect();
    let (mut read_ok, mut refused) = (0, 0);
    for round in 0..300 {
        let (name, base) = &bases[round % bases.len()];
        let bytes = mutate(&mut rng, base);
        let path = write(&format!("fuzz-{round}-{name}"), &bytes);
        match load(&path) {
            Ok(t) => {
                read_ok += 1;
                // A trace that reads must replay and verify (the manager is sound on any trace).
                if round % 10 == 0 {
                    let mut args = vec![path.as_str(), "--verify", "--no-search", "--no-timing"];
                    args.extend(QUICK);
                    let r = run(&args);
                    assert_eq!(
                        r.code,
                        0,
                        "{name} round {round} ({} ops): {}",
                        t.ops.len(),
                        r.stderr
                    );
                }
            }
            Err(e) => {
                refused += 1;
                assert!(e.contains(&path), "the message names the file: {e}");
            }
        }
    }
    assert!(
        read_ok > 0 && refused > 0,
        "{read_ok} read, {refused} refused"
    );
}
