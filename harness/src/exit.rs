//! Exit codes of DESIGN.md's table, carried through `anyhow` errors.

use std::fmt;

/// Exit codes of every command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// A trial failed, a diff found a regression, or a planted defect was not caught.
    Failed = 1,
    /// Bad input or usage.
    Usage = 2,
    /// A GPU is required and none is usable (no driver, or the route is a rejection).
    NoGpu = 3,
}

/// An error with its exit code; any other error is treated as `Usage`.
#[derive(Debug)]
pub struct ExitError {
    pub code: Code,
    pub message: String,
}

impl fmt::Display for ExitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ExitError {}

pub fn usage(message: impl Into<String>) -> anyhow::Error {
    ExitError {
        code: Code::Usage,
        message: message.into(),
    }
    .into()
}

pub fn no_gpu(message: impl Into<String>) -> anyhow::Error {
    ExitError {
        code: Code::NoGpu,
        message: message.into(),
    }
    .into()
}

pub fn failed(message: impl Into<String>) -> anyhow::Error {
    ExitError {
        code: Code::Failed,
        message: message.into(),
    }
    .into()
}

/// The exit code an error maps to.
pub fn code_of(err: &anyhow::Error) -> Code {
    err.chain()
        .find_map(|e| e.downcast_ref::<ExitError>().map(|x| x.code))
        .unwrap_or(Code::Usage)
}
