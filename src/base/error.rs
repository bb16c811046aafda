//! The library's one error type for failures that are not findings: [`Error`], with an
//! [`ErrorKind`] that decides the exit code ([`Error::exit_code`], the only place that maps a
//! failure to one). Richer errors of one layer (`HarnessError`, `LlamaError`, `MeasureError`,
//! `ModelError`, `ParseError`) say what broke in their terms and convert into it.
//!
//! A divergence of a target is never an error: it is a finding, a value in a report.

use std::fmt;

use crate::base::cache::HarnessError;
use crate::base::exit;

/// Whose fault a failure is, and so which exit code it gives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// Bad input: a command line, file or text kvaudit cannot use ([`exit::USAGE`]).
    Input,
    /// The harness broke: a target failed to build, load or run, an I/O error
    /// ([`exit::HARNESS`]).
    Harness,
}

/// A failure with its kind: one line saying what failed and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    /// Whose fault it is.
    pub kind: ErrorKind,
    /// What failed (the input and the position where there is one).
    pub message: String,
}

impl Error {
    /// Bad input.
    pub fn input(message: impl Into<String>) -> Error {
        Error {
            kind: ErrorKind::Input,
            message: message.into(),
        }
    }

    /// The harness broke.
    pub fn harness(message: impl Into<String>) -> Error {
        Error {
            kind: ErrorKind::Harness,
            message: message.into(),
        }
    }

    /// The same failure, its message prefixed with where it happened (`FILE: `).
    pub fn context(self, at: impl fmt::Display) -> Error {
        Error {
            message: format!("{at}: {}", self.message),
            ..self
        }
    }

    /// The exit code of the `kvaudit` binary for this failure.
    pub fn exit_code(&self) -> i32 {
        match self.kind {
            ErrorKind::Input => exit::USAGE,
            ErrorKind::Harness => exit::HARNESS,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

/// A message alone is a complaint about the input that produced it.
impl From<String> for Error {
    fn from(message: String) -> Error {
        Error::input(message)
    }
}

impl From<&str> for Error {
    fn from(message: &str) -> Error {
        Error::input(message)
    }
}

impl From<crate::base::op::InvalidOp> for Error {
    fn from(e: crate::base::op::InvalidOp) -> Error {
        Error::input(e.0)
    }
}

impl From<HarnessError> for Error {
    fn from(e: HarnessError) -> Error {
        Error::harness(e.to_string())
    }
}

/// For callers that only print it.
impl From<Error> for String {
    fn from(e: Error) -> String {
        e.message
    }
}
