//! Shared by the integration tests: running the binary, the fixtures, scratch files.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// What a run of the binary gave.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// The stdout as the one JSON object `--json` prints.
    pub fn json(&self) -> serde_json::Value {
        assert_eq!(self.code, 0, "exit {}: {}", self.code, self.stderr);
        let lines: Vec<&str> = self.stdout.lines().collect();
        assert_eq!(
            lines.len(),
            1,
            "--json printed more than one line:\n{}",
            self.stdout
        );
        serde_json::from_str(lines[0]).expect("stdout is JSON")
    }
}

/// Runs `devcmd-trace` with `args`.
pub fn run(args: &[&str]) -> Run {
    let out = Command::new(env!("CARGO_BIN_EXE_devcmd-trace"))
        .args(args)
        .output()
        .expect("the binary runs");
    let run = Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    assert!(
        !run.stderr.contains("panicked"),
        "devcmd-trace {args:?} panicked:\n{}",
        run.stderr
    );
    run
}

/// A fixture of `tests/data/`.
pub fn data(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
        .to_string_lossy()
        .into_owned()
}

/// The repository's stored traces (`traces/` at the workspace root): `.csv`, `.csv.gz` and
/// `.pickle` files, sorted.
pub fn stored_traces() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../traces");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p.to_string_lossy();
            name.ends_with(".csv") || name.ends_with(".csv.gz") || name.ends_with(".pickle")
        })
        .collect();
    out.sort();
    out
}

/// A scratch path for `name`, unique to this test binary.
pub fn scratch(name: &str) -> String {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("devcmd-trace-tests");
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir.join(name).to_string_lossy().into_owned()
}

/// Writes `bytes` to a scratch file named `name`; its path.
pub fn write(name: &str, bytes: &[u8]) -> String {
    let path = scratch(name);
    std::fs::write(&path, bytes).expect("scratch file");
    path
}

/// Options that keep a run short: no timing loop, the address-only device.
pub const QUICK: &[&str] = &["--timing-seconds", "0", "--pages", "address"];
