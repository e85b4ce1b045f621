//! The policies of docs/operator.md section 4, exactly as written there. Every function is total:
//! sizes a user mistypes (zero heads, huge lengths) give a defined answer instead of a panic, and
//! callers that take user input validate the shape first (`Shape::validate`).

use super::{lookup, ArchRow, Capability, Outcome, PathId, Shape};
use crate::window::{self, visible_len};

/// `bucket_max_seqlen_q(n) = 1 << bit_length(max(0, n - 1))` (docs/operator.md section 4.4): the
/// smallest power of two not below `n` (1 for 0 and 1). Past 2^63 no power of two fits a `usize`;
/// it saturates there.
pub fn bucket_max_seqlen_q(n: usize) -> usize {
    let bit_length = usize::BITS - n.saturating_sub(1).leading_zeros();
    1usize.checked_shl(bit_length).unwrap_or(usize::MAX)
}

fn ceil_div(a: usize, b: usize) -> usize {
    a.div_ceil(b)
}

/// `num_splits` of the main kernel (docs/operator.md section 4.1). Takes the raw max query length
/// and buckets it. 1 on rejected rows, on rows without `split_kv`, and on local layers.
pub fn num_splits(row: &ArchRow, shape: &Shape) -> usize {
    if !matches!(row.outcome, Outcome::Route(_)) || !row.split_kv || shape.is_local {
        return 1;
    }
    let group = shape.num_heads.checked_div(shape.num_kv_heads).unwrap_or(0);
    let q_rows = bucket_max_seqlen_q(shape.max_query_len).saturating_mul(group);
    let q_tiles = ceil_div(q_rows, 256);
    let base_ctas = shape
        .batch
        .saturating_mul(shape.num_kv_heads)
        .saturating_mul(q_tiles);
    let single = q_tiles == 1 && shape.batch == 1;
    let target: usize = if single {
        256
    } else if q_tiles == 1 {
        128
    } else {
        64
    };
    let mut max_split = 128;
    if single {
        if shape.num_kv_heads == 8 {
            max_split = 16;
        } else if shape.num_kv_heads == 4 || shape.max_kv_len <= 8192 {
            max_split = 32;
        } else if shape.max_kv_len <= 65536 {
            max_split = 64;
        }
    }
    // A zero-size shape has no CTAs; it is invalid input, and the answer only has to stay >= 1.
    let per_cta = target.checked_div(base_ctas).unwrap_or(target);
    per_cta
        .min(max_split)
        .min(ceil_div(shape.max_kv_len, 128))
        .max(1)
}

/// Whether the fallback path uses its two-stage split-KV decode kernel (docs/operator.md section
/// 4.3). `window_left` is -1 on global layers.
pub fn use_split_kv_decode(
    max_query_len: usize,
    max_kv_len: usize,
    page_size: usize,
    window_left: i64,
    enabled: bool,
) -> bool {
    if !enabled || max_query_len != 1 {
        return false;
    }
    if max_kv_len >= 8192 || page_size >= 64 {
        return true;
    }
    if window::is_local(window_left) {
        return page_size >= 32;
    }
    false
}

/// Splits of the two-stage decode kernel (docs/operator.md section 4.3): at most 4 on windowed
/// layers (one per 128 visible keys), at most 32 on global ones (one per 2048 keys).
pub fn decode_split_count(max_kv_len: usize, window_left: i64) -> usize {
    if window::is_local(window_left) {
        ceil_div(visible_len(max_kv_len, window_left), 128).clamp(1, 4)
    } else {
        ceil_div(max_kv_len.max(1), 2048).clamp(1, 32)
    }
}

/// The decode kernel's splits under docs/operator.md section 4.3 for `shape`, or None when the
/// policy keeps the fallback path's main kernel.
pub fn fallback_decode_splits(shape: &Shape) -> Option<usize> {
    use_split_kv_decode(
        shape.max_query_len,
        shape.max_kv_len,
        shape.page_size,
        shape.window_left,
        true,
    )
    .then(|| decode_split_count(shape.max_kv_len, shape.window_left))
}

/// The SM100 row's policy drives sheared_bias's split count wherever it runs.
pub const SHEARED_POLICY_ARCH: Capability = Capability::new(10, 0);

/// The split count `path`'s production policy picks for `shape`, on whichever GPU the path runs:
/// docs/operator.md section 4.1 on the SM100 row for sheared_bias, docs/operator.md section 4.3 for
/// fallback (1 when its main kernel runs), 1 for score_mod.
pub fn policy_splits(path: PathId, shape: &Shape) -> usize {
    match path {
        PathId::ScoreMod => 1,
        PathId::ShearedBias => lookup(SHEARED_POLICY_ARCH).map_or(1, |row| num_splits(row, shape)),
        PathId::Fallback => fallback_decode_splits(shape).unwrap_or(1),
    }
}
