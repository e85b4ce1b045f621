//! Exit codes of every command (the table in README.md and docs/commands.md), carried through
//! `anyhow` errors.

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

/// The message of an error and its causes, `: `-separated, leaving out a cause whose text the
/// message already holds (an I/O error quoted by its context would print twice otherwise).
pub fn message_of(err: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in err.chain() {
        let part = cause.to_string();
        if text.contains(&part) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&part);
    }
    text
}

/// The exit code an error maps to.
pub fn code_of(err: &anyhow::Error) -> Code {
    err.chain()
        .find_map(|e| e.downcast_ref::<ExitError>().map(|x| x.code))
        .unwrap_or(Code::Usage)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot write {path}: {source}")]
    struct Quoting {
        path: &'static str,
        #[source]
        source: std::io::Error,
    }

    /// A full disk once printed "No space left on device" twice: the context quoted its cause
    /// and the chain printed the cause again.
    #[test]
    fn a_quoted_cause_is_printed_once() {
        let io = std::io::Error::from_raw_os_error(28);
        let err = anyhow::Error::new(Quoting {
            path: "out/cpu/results.jsonl",
            source: io,
        });
        let text = message_of(&err);
        assert_eq!(text.matches("No space left on device").count(), 1, "{text}");
        let err = anyhow::Error::new(std::io::Error::from_raw_os_error(28)).context("writing x");
        assert_eq!(
            message_of(&err),
            "writing x: No space left on device (os error 28)"
        );
    }
}
