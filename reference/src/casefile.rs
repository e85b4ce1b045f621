//! Case and reference-output files: one safetensors file each.
//!
//! A case file holds `q` `[T, H, D]`, `key_cache` and `value_cache` (contiguous
//! `[num_blocks, page_size, Hkv, D]`), `rel_logits` `[T, H, E]` (all four BF16, F16 or F32
//! alike), `block_table` `[B, max_pages]`, `seqused_k` `[B]` and `cu_seqlens_q` `[B + 1]` (I32),
//! with string metadata `format_version` ("1"; absent = 1), `softmax_scale` (a decimal that
//! round-trips the f64), `rel_extent`, `window_left` ("-1" = none), `causal` ("true") and the
//! optional `case_id`, `seed` and `cache_layout` (how GPU runs should place the caches).
//!
//! An output file holds `out` (F64 `[N, H, D]`), `lse` (F64 `[N, H]`), `out_lp` (the
//! same-precision emulation, in the case dtype, `[N, H, D]`; absent when it was not computed)
//! and, when only sampled rows were computed, `rows` (I32 `[N]`). Without `rows`, N = T and the rows are all rows in order.
//!
//! Every malformed input ends in a `CaseFileError` naming the file, the tensor or key and what
//! was expected; nothing here panics on file contents.

mod case;
mod impl_out;
mod output;
mod tensors;

use crate::dtype::DType;
use crate::limits::LimitError;
use crate::output::RefOutput;
use crate::problem::{CacheLayout, Problem, ProblemError};
use ndarray::Array3;
use safetensors::SafeTensorError;
use std::path::PathBuf;
use thiserror::Error;

pub use case::{parse_case, read_case, read_case_bytes_nofollow, read_case_limited, write_case};
pub use impl_out::{read_impl_output, read_worker_output, write_impl_output};
pub use output::{read_output, write_output};

/// The format version this build writes and reads.
pub const FORMAT_VERSION: &str = "1";

/// Optional facts about a case that are not operator inputs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaseMeta {
    pub case_id: Option<String>,
    pub seed: Option<u64>,
    /// How GPU runs should place the caches (the file itself always stores them contiguous).
    pub cache_layout: CacheLayout,
}

impl Default for CaseMeta {
    fn default() -> CaseMeta {
        CaseMeta {
            case_id: None,
            seed: None,
            cache_layout: CacheLayout::Contiguous,
        }
    }
}

impl CaseMeta {
    /// Metadata that keeps the problem's own cache layout.
    pub fn of(problem: &Problem) -> CaseMeta {
        CaseMeta {
            cache_layout: problem.layout,
            ..CaseMeta::default()
        }
    }
}

/// A case read from a file: validated inputs plus metadata.
#[derive(Debug, Clone, PartialEq)]
pub struct CaseFile {
    pub problem: Problem,
    pub meta: CaseMeta,
}

/// A reference-output file read back.
#[derive(Debug, Clone, PartialEq)]
pub struct OutputFile {
    /// The f64 reference: `rows` (sampled mode), `out` and `lse`.
    pub reference: RefOutput,
    /// The same-precision emulation's output, absent from files written without it
    /// (`relattn reference --no-emulation`).
    pub out_lp: Option<EmulatedOutput>,
}

/// `out_lp` of an output file: one row per reference row.
#[derive(Debug, Clone, PartialEq)]
pub struct EmulatedOutput {
    /// Values of `dtype`.
    pub out: Array3<f64>,
    /// Storage dtype (the case dtype).
    pub dtype: DType,
}

#[derive(Debug, Error)]
pub enum CaseFileError {
    #[error("{}: {action}: {error}", path.display())]
    Io {
        path: PathBuf,
        action: &'static str,
        error: std::io::Error,
    },
    #[error("{}: not a valid safetensors file: {error}", path.display())]
    Format {
        path: PathBuf,
        error: SafeTensorError,
    },
    #[error("{}: not a valid safetensors file: {reason}", path.display())]
    Header { path: PathBuf, reason: String },
    #[error("{}: cannot write: {error}", path.display())]
    Serialize {
        path: PathBuf,
        error: SafeTensorError,
    },
    #[error("{}: missing tensor `{tensor}`", path.display())]
    MissingTensor { path: PathBuf, tensor: &'static str },
    #[error("{}: tensor `{tensor}` has dtype {actual}, expected {expected}", path.display())]
    Dtype {
        path: PathBuf,
        tensor: &'static str,
        actual: String,
        expected: String,
    },
    #[error(
        "{}: tensor `{tensor}` has rank {} (shape {actual:?}), expected rank {rank} {dims}",
        path.display(),
        actual.len()
    )]
    Rank {
        path: PathBuf,
        tensor: &'static str,
        actual: Vec<usize>,
        rank: usize,
        dims: &'static str,
    },
    #[error("{}: tensor `{tensor}` has shape {actual:?}, expected {expected}", path.display())]
    Shape {
        path: PathBuf,
        tensor: &'static str,
        actual: Vec<usize>,
        expected: String,
    },
    #[error("{}: tensor `{tensor}` holds {value} at index {index}, expected {expected}", path.display())]
    Value {
        path: PathBuf,
        tensor: &'static str,
        index: usize,
        value: i64,
        expected: &'static str,
    },
    #[error("{}: metadata key `{key}` is missing", path.display())]
    MissingMetadata { path: PathBuf, key: &'static str },
    #[error("{}: metadata `{key}` = {value:?} is invalid, expected {expected}", path.display())]
    BadMetadata {
        path: PathBuf,
        key: &'static str,
        value: String,
        expected: &'static str,
    },
    #[error(
        "{}: format_version {version:?} is not supported (this build reads version {FORMAT_VERSION})",
        path.display()
    )]
    Version { path: PathBuf, version: String },
    #[error("{}: inconsistent case: {error}", path.display())]
    Problem { path: PathBuf, error: ProblemError },
    #[error("{}: cannot write: {what}", path.display())]
    Mismatch { path: PathBuf, what: String },
    /// An output file larger than any output of the case's shape can be.
    #[error(
        "{}: the file takes {bytes} bytes, more than an output `out` {shape:?} (the case's \
         [T, H, D]) can ({most} bytes at most): it is not an output of this case",
        path.display()
    )]
    OutputTooLarge {
        path: PathBuf,
        bytes: u64,
        shape: [usize; 3],
        most: u64,
    },
    /// A size limit (`crate::limits`): a dimension out of the operator's range, or more bytes
    /// than the case-byte limit.
    #[error("{}: {error}", path.display())]
    Limit { path: PathBuf, error: LimitError },
}
