//! relattn-matrices: parameter axes as TOML tiers, expansion into cases, exclusions, ids, shards,
//! and case folders (a tier of case files, `folder`).
//!
//! A matrix file is a list of `[[group]]`s, each the cartesian product of its axes (layer,
//! heads, head dim, page size, cache layout, dtype, named batch mix, bias mode, seed) with a list
//! of split settings its trials run. `Matrix::expand` turns it into `Case`s with stable ids and
//! lists, as `Skip`s, every (case, path, split) trial a path cannot take: by the path's limits
//! (`relattn_routing::PathSpec`) or by the rules of tiers/paths.toml. Paths are
//! `relattn_routing::PathId`s; their names are text only in files and reports.
#![deny(unsafe_code)]

mod case;
mod count;
mod error;
mod folder;
mod group;
mod layer;
mod matrix;
mod mixes;
mod rules;
mod shard;
mod tolerance;

pub use case::{
    canonical_form, case_id, file_case_id, Case, CaseSource, Facts, FileCase, TrialPlan, ID_DIGITS,
    ID_PREFIX,
};
pub use count::{
    MAX_CASES, MAX_FORCED_SPLITS, MAX_MATRIX_FILE_BYTES, MAX_SPLIT_SETTINGS, MAX_TRIALS,
};
pub use error::MatrixError;
pub use folder::{
    load_folder, parse_splits, read_file_case, BadFile, Folder, DEFAULT_FOLDER_SPLITS,
    FOLDER_TIER_PREFIX,
};
pub use layer::Layer;
pub use matrix::{Expansion, Matrix, Skip};
pub use mixes::{mix, Mix, MixShape, MIXES, REGRESSION_ONLY_MIXES};
pub use relattn_routing::SplitSetting;
pub use rules::{Requirement, Rule, Rules, STRIDED_NATIVE};
pub use shard::{shard, Shard};

use std::path::Path;

/// The built-in tiers, cheapest first.
pub const TIERS: &[&str] = &["smoke", "ci", "nightly", "regressions"];

/// The bug classes of docs/operator.md section 5 (items 1-8, then the "plausible classes"), each
/// with the bug it stands for. Every class has exactly one case in the `regressions` tier.
pub const REGRESSION_CLASSES: &[(&str, &str)] = &[
    (
        "wrong_arch_entry",
        "an architecture handed another architecture's kernel entry (5.1)",
    ),
    (
        "split_kv_without_support",
        "split-KV reaching an architecture without it (5.2)",
    ),
    (
        "capability_misclassified",
        "a capability family sent to the wrong path (5.3)",
    ),
    (
        "late_unsupported_arch",
        "an unsupported architecture failing after the work began (5.4)",
    ),
    (
        "rel_logits_padding_rows_read",
        "rel_logits read from tile padding rows (5.5)",
    ),
    (
        "softmax_reset_per_block",
        "online-softmax state reset per KV block (5.6)",
    ),
    (
        "nan_from_unused_pages",
        "NaN from unused or pre-window pages (5.7)",
    ),
    (
        "empty_split_partials",
        "empty splits publishing uninitialised partials (5.7)",
    ),
    (
        "warmup_all_zero_table",
        "warm-up shape: all-zero block table (5.8)",
    ),
    (
        "warmup_prefill_128x16",
        "warm-up shape: 128 x 16-token prefills (5.8)",
    ),
    (
        "warmup_decode8_prefill9",
        "warm-up shape: 8 decodes and one prefill (5.8)",
    ),
    (
        "warmup_spec_verify9",
        "warm-up shape: speculative verify, q_len 9 bucketed to 16 (5.8)",
    ),
    (
        "rel_index_off_by_one",
        "relative index d - 1, d == E, or reversed rows",
    ),
    (
        "wrong_query_offset",
        "i instead of P + i, or another request's Lk",
    ),
    (
        "wrong_rel_logits_row",
        "local row instead of packed row of rel_logits",
    ),
    (
        "wrong_rel_logits_head",
        "KV head instead of query head of rel_logits",
    ),
    (
        "zero_len_requests",
        "zero-length requests in the middle of the batch",
    ),
    (
        "shuffled_pages",
        "page table read as if pages were in order",
    ),
    (
        "no_page_slack",
        "reads past the last page when the table has no slack",
    ),
    (
        "offset_over_2_31",
        "cache offsets past 2^31 elements in 32-bit arithmetic",
    ),
    ("large_pages", "page sizes other than 16 (up to 256)"),
    (
        "split_missing_rescale",
        "split combine without the max rescale",
    ),
    ("more_splits_than_tiles", "more KV splits than key tiles"),
    (
        "window_off_by_one",
        "window edge off by one at page and tile edges",
    ),
    ("gqa_mapping", "h % Hkv instead of h / G"),
    ("bias_times_scale", "bias multiplied by the softmax scale"),
    (
        "clamp_without_zero_select",
        "clamped bias index without selecting 0 at d >= E",
    ),
    ("bf16_accumulation", "accumulating in bf16 instead of fp32"),
    ("padding_row_writes", "writes to padding rows"),
    (
        "large_launch_unwritten_rows",
        "rows left unwritten by long launches at production head counts",
    ),
    (
        "window_beyond_int32",
        "a window wider than any int32 position narrowed to 32 bits",
    ),
    (
        "rel_logits_tile_overrun",
        "rel_logits read past its last row by a tile's padding rows, outside the tensor (5.5; vLLM #49049)",
    ),
    (
        "empty_kv_requests",
        "output written for seqused_k = 0 requests of a batch (vLLM 0.34.0's Hopper FA4)",
    ),
    (
        "zero_len_shift",
        "packed row t taken as request t past a zero-length request (vLLM 0.34.0's Triton split-KV decode never reads cu_seqlens_q)",
    ),
    (
        "empty_kv_batch",
        "output written for a batch whose every request has seqused_k = 0 (graph-replay padding)",
    ),
    (
        "paged_cache_past_2_31",
        "short requests on blocks past 2^31 elements of a large cache (vLLM #50427)",
    ),
    (
        "hopper_split_kv",
        "split-KV forced on the Hopper path (5.2; vLLM PR #53317 drops SM90's num_splits = 1)",
    ),
];

fn tier_text(name: &str) -> Option<&'static str> {
    Some(match name {
        "smoke" => include_str!("../tiers/smoke.toml"),
        "ci" => include_str!("../tiers/ci.toml"),
        "nightly" => include_str!("../tiers/nightly.toml"),
        "regressions" => include_str!("../tiers/regressions.toml"),
        _ => return None,
    })
}

/// A built-in tier.
pub fn load_tier(name: &str) -> Result<Matrix, MatrixError> {
    let text = tier_text(name).ok_or_else(|| MatrixError::UnknownTier {
        name: name.to_string(),
        known: TIERS.join(", "),
    })?;
    Matrix::parse(text, name, &format!("tiers/{name}.toml"))
}

/// A user's matrix file; its cases' `tier` is the file's stem.
pub fn load_file(path: impl AsRef<Path>) -> Result<Matrix, MatrixError> {
    let path = path.as_ref();
    let file = path.display().to_string();
    let io = |source| MatrixError::Io {
        file: file.clone(),
        source,
    };
    // A regular file only (a FIFO would hang the read, a device never end it), read up to the
    // limit.
    let (handle, bytes) = relattn_common::files::open_regular(path).map_err(io)?;
    if bytes > MAX_MATRIX_FILE_BYTES {
        return Err(MatrixError::FileTooLarge {
            file: file.clone(),
            bytes,
            limit: MAX_MATRIX_FILE_BYTES,
        });
    }
    let raw = relattn_common::files::read_limited(handle, MAX_MATRIX_FILE_BYTES).map_err(io)?;
    let text = String::from_utf8(raw).map_err(|e| {
        io(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            e.utf8_error(),
        ))
    })?;
    let stem = path
        .file_stem()
        .map_or(file.clone(), |s| s.to_string_lossy().into_owned());
    Matrix::parse(&text, &stem, &file)
}

/// A tier by name, or else a file by path.
pub fn load(name_or_path: &str) -> Result<Matrix, MatrixError> {
    if TIERS.contains(&name_or_path) {
        return load_tier(name_or_path);
    }
    let path = Path::new(name_or_path);
    if path.exists() || name_or_path.ends_with(".toml") || name_or_path.contains('/') {
        return load_file(path);
    }
    Err(MatrixError::UnknownTier {
        name: name_or_path.to_string(),
        known: TIERS.join(", "),
    })
}
