//! What can go wrong, and the exit code each kind maps to.
//!
//! Owns [`Failure`] (a bad command line or input: exit 2; a verification failure: exit 1) and
//! [`InputError`], the message of a malformed trace, which names where (line or snapshot entry)
//! and which field. Does not own the checks themselves (the parsers and `verify.rs` do).

use std::fmt;

/// Why the tool stopped without a result.
#[derive(Debug)]
pub enum Failure {
    /// A bad command line (exit 2).
    Usage(String),
    /// A trace that cannot be read or replayed, or an output that cannot be written (exit 2).
    Input(String),
    /// `--verify` found the manager inconsistent with the independent model (exit 1).
    Verify(String),
}

impl Failure {
    /// The process exit code: 2 for bad input or usage, 1 for a verification failure.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Usage(_) | Self::Input(_) => 2,
            Self::Verify(_) => 1,
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Usage(m) => write!(f, "{m}\n(devcmd-trace --help lists the options)"),
            Self::Input(m) => f.write_str(m),
            Self::Verify(m) => write!(f, "verification failed: {m}"),
        }
    }
}

impl std::error::Error for Failure {}

impl From<InputError> for Failure {
    fn from(e: InputError) -> Self {
        Self::Input(e.to_string())
    }
}

/// Where in a trace a problem was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// A line of a CSV trace (1-based, the header is line 1).
    Line(u64),
    /// An entry of a snapshot's device trace (0-based, as Python indexes the list).
    Entry {
        /// The device whose trace it is.
        device: usize,
        /// The entry's index.
        index: u64,
    },
    /// The file as a whole.
    File,
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Line(n) => write!(f, "line {n}"),
            Self::Entry { device, index } => write!(f, "device_traces[{device}][{index}]"),
            Self::File => f.write_str("the file"),
        }
    }
}

/// A malformed trace: where, which field, what is wrong and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputError {
    /// The trace's path, as given.
    pub path: String,
    /// Where.
    pub place: Place,
    /// The field (CSV column or snapshot key), when one is at fault.
    pub field: Option<&'static str>,
    /// What is wrong (and what to do).
    pub message: String,
}

impl fmt::Display for InputError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.place)?;
        if let Some(field) = self.field {
            write!(f, ", field {field}")?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for InputError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_tell_bad_input_from_a_failed_check() {
        assert_eq!(Failure::Usage("x".into()).exit_code(), 2);
        assert_eq!(Failure::Input("x".into()).exit_code(), 2);
        assert_eq!(Failure::Verify("x".into()).exit_code(), 1);
        let e = InputError {
            path: "t.csv".into(),
            place: Place::Line(17),
            field: Some("size"),
            message: "\"12x\" is not a byte count".into(),
        };
        assert_eq!(
            e.to_string(),
            "t.csv: line 17, field size: \"12x\" is not a byte count"
        );
        let at = Place::Entry {
            device: 0,
            index: 5,
        };
        assert_eq!(at.to_string(), "device_traces[0][5]");
    }
}
