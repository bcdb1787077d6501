//! Skipped groups: said where the test runner shows it, and counted.
//!
//! Owns the one way a group says it checked nothing: [`skipped`] writes
//! `devcmd conformance: GROUP: skipped (WHY) [MODE]` straight to stdout (past the test runner's
//! capture, so it shows in `cargo test`'s normal output, not only when a test fails) once per
//! group, mode and reason, and records it; [`skipped_groups`] lists what was skipped so far in
//! this process, so a runner (or a test) can count it. A skipped group never looks like a pass.

use crate::harness::Mode;
use std::io::Write;
use std::sync::Mutex;

/// Every skip said so far: (group, mode, why).
static SKIPPED: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Says that `group` checked nothing in `mode` because of `why` (once per group, mode and
/// reason), and records it.
pub fn skipped(group: &str, mode: Mode, why: &str) {
    let line = format!("devcmd conformance: {group}: skipped ({why}) [{mode}]");
    let mut all = SKIPPED.lock().unwrap_or_else(|e| e.into_inner());
    if all.contains(&line) {
        return;
    }
    // Straight to the process's stdout: `println!` would be captured by the test runner and
    // shown only for a failing test.
    let _ = writeln!(std::io::stdout().lock(), "{line}");
    all.push(line);
}

/// The skip lines said so far in this process, in order (each once).
pub fn skipped_groups() -> Vec<String> {
    SKIPPED.lock().unwrap_or_else(|e| e.into_inner()).clone()
}
