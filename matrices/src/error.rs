//! The crate's one error type. Every variant names the file (or tier) it comes from, and for a
//! bad value the key and the value, so the message says what to change.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum MatrixError {
    #[error("unknown matrix `{name}`: expected a tier ({known}) or the path of a TOML file")]
    UnknownTier { name: String, known: String },

    #[error("cannot read matrix file {file}: {source}")]
    Io {
        file: String,
        #[source]
        source: std::io::Error,
    },

    /// Not TOML, an unknown key (axis), or a value of the wrong type; `message` is the TOML
    /// parser's, which quotes the offending line.
    #[error("{file}: {message}")]
    Parse { file: String, message: String },

    #[error("{file}: {key} = {value}: {reason}")]
    BadValue {
        file: String,
        key: String,
        value: String,
        reason: String,
    },

    #[error(
        "{file}: the matrix expands to zero cases; add a [[group]] with at least `layers`, \
         `heads` and `mixes`"
    )]
    Empty { file: String },

    #[error(
        "{file}: case {id} is produced twice with different {what} ({first} vs {second}); \
         make the two groups differ in a parameter or agree on {what}"
    )]
    ConflictingDuplicate {
        file: String,
        id: String,
        what: String,
        first: String,
        second: String,
    },

    #[error(
        "{file}: cases `{first}` and `{second}` hash to the same id {id}; change a seed of one"
    )]
    IdCollision {
        file: String,
        id: String,
        first: String,
        second: String,
    },

    #[error("{file}: the file has {bytes} bytes, more than a matrix file may have ({limit})")]
    FileTooLarge {
        file: String,
        bytes: u64,
        limit: u64,
    },

    /// Counted before anything is expanded.
    #[error(
        "{file}: {what}: the matrix would expand to {count} {unit}, more than the limit of \
         {limit}; split it into several files or shrink an axis"
    )]
    TooMany {
        file: String,
        what: String,
        count: u64,
        unit: &'static str,
        limit: u64,
    },

    /// A case out of the operator's ranges (`relattn_reference::limits`).
    #[error("{file}: {key}: {case}: {error}")]
    Limit {
        file: String,
        key: String,
        case: String,
        error: Box<relattn_reference::limits::LimitError>,
    },

    /// A case folder that cannot be read as a whole (its files are judged one by one).
    #[error("case folder {dir}: {message}")]
    Folder { dir: String, message: String },

    #[error("bad shard `{value}`: {reason} (write K/N with 1 <= K <= N, e.g. 2/8)")]
    Shard { value: String, reason: String },
}

impl MatrixError {
    pub(crate) fn bad(
        file: &str,
        key: impl Into<String>,
        value: impl std::fmt::Display,
        reason: impl Into<String>,
    ) -> MatrixError {
        MatrixError::BadValue {
            file: file.to_string(),
            key: key.into(),
            value: value.to_string(),
            reason: reason.into(),
        }
    }
}
