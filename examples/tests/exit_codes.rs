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

/// Output into a pipe whose reader is gone (`program | head`) ends a program quietly, as it ends
/// `cat` or `grep` (killed by `SIGPIPE`), never with a panic: every program's `--help`, and
/// `gpt2` decoding its fixture, with the reading end closed before they write.
#[cfg(unix)]
#[test]
fn a_closed_output_ends_every_program_without_a_panic() {
    use std::os::unix::process::ExitStatusExt;
    use std::process::Stdio;
    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/gpt2-tiny");
    let gpt2 = env!("CARGO_BIN_EXE_gpt2");
    let runs = PROGRAMS
        .iter()
        .map(|(name, path)| (*name, *path, vec!["--help"]))
        .chain([("gpt2", gpt2, vec!["--check", fixture])]);
    for (name, path, args) in runs {
        let mut child = Command::new(path)
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("runs");
        // The reading end goes before the program has written its first line.
        drop(child.stdout.take());
        let out = child.wait_with_output().expect("ends");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{name} {args:?}: {stderr}");
        assert!(
            out.status.success() || out.status.signal() == Some(libc::SIGPIPE),
            "{name} {args:?}: ended with {:?}: {stderr}",
            out.status
        );
    }
}
