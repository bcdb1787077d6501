//! Progress on stderr for long traces: one line per phase, redrawn every ~1 % or every second.
//!
//! Owns when and how progress is drawn. On by default only when stderr is a terminal (the line
//! is redrawn in place with `\r`); `--progress` forces it elsewhere (one line per update, so
//! logs stay readable). Never writes to stdout. Callers report `done / total` as often as they
//! like: drawing is throttled here, and the clock is read at most once per 4096 calls.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// A progress line on stderr (or nothing, when disabled).
#[derive(Debug)]
pub struct Progress {
    enabled: bool,
    terminal: bool,
    label: String,
    last_pct: Option<u64>,
    last_draw: Instant,
    calls: u32,
    drawn: bool,
}

impl Progress {
    /// Progress as `force` asks: `Some(true)` always, `Some(false)` never, `None` when stderr is
    /// a terminal.
    pub fn new(force: Option<bool>) -> Self {
        let terminal = std::io::stderr().is_terminal();
        Self {
            enabled: force.unwrap_or(terminal),
            terminal,
            label: String::new(),
            last_pct: None,
            last_draw: Instant::now(),
            calls: 0,
            drawn: false,
        }
    }

    /// No progress at all.
    pub fn off() -> Self {
        Self::new(Some(false))
    }

    /// Starts a phase named `label` (the next update draws it).
    pub fn phase(&mut self, label: impl Into<String>) {
        self.label = label.into();
        self.last_pct = None;
        self.calls = 0;
    }

    /// `done` of `total` units of the current phase are done.
    #[inline]
    pub fn update(&mut self, done: u64, total: u64) {
        if !self.enabled {
            return;
        }
        let pct = done.saturating_mul(100).checked_div(total).unwrap_or(100);
        self.calls = self.calls.wrapping_add(1);
        let new_pct = self.last_pct != Some(pct);
        // The clock is read on a percent change or every 4096 calls, not on every call.
        if !new_pct && !self.calls.is_multiple_of(4096) {
            return;
        }
        let now = Instant::now();
        if new_pct || now.duration_since(self.last_draw) >= Duration::from_secs(1) {
            self.last_pct = Some(pct);
            self.last_draw = now;
            self.draw(pct);
        }
    }

    fn draw(&mut self, pct: u64) {
        let mut err = std::io::stderr().lock();
        // Progress is best effort: a closed stderr must not stop the replay.
        let _ = if self.terminal {
            write!(err, "\r\x1b[2K{}: {pct}%", self.label)
        } else {
            writeln!(err, "{}: {pct}%", self.label)
        };
        let _ = err.flush();
        self.drawn = true;
    }

    /// Clears the progress line (before the results are printed).
    pub fn finish(&mut self) {
        if self.enabled && self.terminal && self.drawn {
            let _ = write!(std::io::stderr(), "\r\x1b[2K");
        }
        self.drawn = false;
    }
}
