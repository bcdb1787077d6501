//! Every program of devcmd-examples lists the same exit codes in its `--help`
//! ([`devcmd_examples::exit::HELP`]) and exits 0 after printing it; a bad flag value is bad input
//! (2) everywhere.

use devcmd_examples::exit;
use std::process::Command;

/// Every binary of the crate, by the path cargo built it at.
const PROGRAMS: [(&str, &str); 6] = [
    ("edge-host", env!("CARGO_BIN_EXE_edge-host")),
    ("gpt2", env!("CARGO_BIN_EXE_gpt2")),
    ("command-bench", env!("CARGO_BIN_EXE_command-bench")),
    ("engine-bench", env!("CARGO_BIN_EXE_engine-bench")),
    ("cuda-bench", env!("CARGO_BIN_EXE_cuda-bench")),
    ("graph-bench", env!("CARGO_BIN_EXE_graph-bench")),
];

#[test]
fn every_help_lists_the_shared_exit_codes() {
    for (name, path) in PROGRAMS {
        let out = Command::new(path).arg("--help").output().expect("runs");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{name} --help: {stdout}");
        assert!(
            stdout.contains(exit::HELP),
            "{name} --help lacks the exit codes:\n{stdout}"
        );
    }
}

#[test]
fn a_bad_flag_value_is_bad_input_everywhere() {
    for (name, path, args) in [
        ("edge-host", PROGRAMS[0].1, ["--batches", "zero"]),
        ("gpt2", PROGRAMS[1].1, ["--batch", "zero"]),
        ("command-bench", PROGRAMS[2].1, ["--drop-mib", "many"]),
        ("engine-bench", PROGRAMS[3].1, ["--iters", "many"]),
        ("cuda-bench", PROGRAMS[4].1, ["--only", "nothing"]),
    ] {
        let out = Command::new(path).args(args).output().expect("runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(i32::from(exit::BAD_INPUT)),
            "{name} {args:?}: {stderr}"
        );
        assert!(stderr.starts_with(&format!("{name}: ")), "{stderr}");
    }
}
