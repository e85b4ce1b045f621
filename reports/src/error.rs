//! The crate's one error type.

use std::path::PathBuf;

/// Everything that can go wrong reading, writing, merging or diffing reports. Each message
/// includes its cause, which is therefore not also given as `source()`: printed as a chain
/// (`{:#}`), the cause would appear twice.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("cannot {action} {path}: {cause}")]
    Io {
        action: &'static str,
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("{path}: line {line}: not a report row: {source}")]
    JsonLine {
        path: PathBuf,
        line: usize,
        #[source]
        source: serde_json::Error,
    },
    #[error(
        "{path}: line {line} is longer than {limit} bytes, longer than any report row: not a \
         report written by relattn"
    )]
    LongLine {
        path: PathBuf,
        line: usize,
        limit: usize,
    },
    #[error("{path}: not valid JSON for a report: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path}: {source}")]
    Csv {
        path: PathBuf,
        #[source]
        source: csv::Error,
    },
    #[error("{path}: line {line}: {message}")]
    BadCsv {
        path: PathBuf,
        line: u64,
        message: String,
    },
    #[error(
        "no report found in {path}: expected results.jsonl or results.csv (with summary.json) \
         there, or in architecture subdirectories such as sm90/, sm100/ or cpu/"
    )]
    NotAReport { path: PathBuf },
    #[error(
        "architecture name {name:?} is not one relattn writes: expected sm<digits> (sm90, \
         sm100, ...) or cpu"
    )]
    BadArchName { name: String },
    #[error(
        "{path}: architecture {name:?} ({origin}) is not one relattn writes: expected \
         sm<digits> (sm90, sm100, ...) or cpu"
    )]
    BadArch {
        path: PathBuf,
        name: String,
        origin: &'static str,
    },
    #[error(
        "{path}: trial {trial} appears twice, on lines {first} and {second}: a report holds \
         each trial once"
    )]
    DuplicateTrial {
        path: PathBuf,
        trial: String,
        first: u64,
        second: u64,
    },
    #[error("{path}: the file has {bytes} bytes, more than a report file may have ({limit})")]
    TooLarge {
        path: PathBuf,
        bytes: u64,
        limit: u64,
    },
    #[error(
        "trial {trial} ({arch}) appears in {first} and {second} with different results \
         ({field} differs); merge only shards of one run, or drop one of the directories"
    )]
    Conflict {
        arch: String,
        trial: String,
        field: &'static str,
        first: PathBuf,
        second: PathBuf,
    },
    #[error(
        "{base} holds architecture(s) {base_archs} and {new} holds {new_archs}: reports of \
         different architectures cannot be compared; diff against a baseline of the same \
         architecture (or give one architecture directory of each)"
    )]
    ArchMismatch {
        base: PathBuf,
        base_archs: String,
        new: PathBuf,
        new_archs: String,
    },
    #[error("nothing to merge: give at least one report directory")]
    NoInputs,
    #[error("cannot draw the plots of {path}: {message}")]
    Plot { path: PathBuf, message: String },
}

pub(crate) fn io(
    action: &'static str,
    path: impl Into<PathBuf>,
) -> impl FnOnce(std::io::Error) -> ReportError {
    let path = path.into();
    move |cause| ReportError::Io {
        action,
        path,
        cause,
    }
}
