//! Which keys each KV split of a request covers, as the paths' kernels compute it: sheared_bias
//! cuts the keys into whole 128-key tiles (sheared_bias.cu), the fallback decode kernel into the
//! 32-aligned splits of docs/operator.md section 4.3 (fallback.cu). The launch plans and the tests
//! use these functions; the kernels mirror them. Every function is total: sizes past any real case
//! give a defined answer instead of an overflow.

use crate::window::visible_len;
use std::ops::Range;

/// Key tile of the sheared bias buffer and of sheared_bias splits; mirrors `SHEAR_TILE` in
/// kernels/cuda/constants.cuh.
pub const SHEAR_TILE: usize = 128;

/// Decode splits are a whole number of this many keys (docs/operator.md section 4.3).
pub const DECODE_SPLIT_ALIGN: usize = 32;

/// Keys `[start, end)` of sheared_bias split `s` of a request with `kv_len` keys, or None when the
/// split is empty: split s covers key tiles `[s * tps, (s + 1) * tps)` with
/// `tps = ceil(ceil(kv_len / 128) / splits)`, and is empty iff `s * tps >= ceil(kv_len / 128)`.
pub fn sheared_split_keys(kv_len: usize, splits: usize, s: usize) -> Option<Range<usize>> {
    let tiles = kv_len.div_ceil(SHEAR_TILE);
    let tps = tiles.div_ceil(splits.max(1));
    let first = s.saturating_mul(tps);
    (first < tiles).then(|| {
        let end = first.saturating_add(tps).saturating_mul(SHEAR_TILE);
        first * SHEAR_TILE..end.min(kv_len)
    })
}

/// Keys of one decode split of a request with `eff` visible keys (docs/operator.md section 4.3):
/// `split_len = ceil(ceil(eff / splits) / 32) * 32` (0 when `eff` is 0).
pub fn decode_split_len(eff: usize, splits: usize) -> usize {
    eff.div_ceil(splits.max(1))
        .div_ceil(DECODE_SPLIT_ALIGN)
        .saturating_mul(DECODE_SPLIT_ALIGN)
}

/// Absolute keys of decode split `s` of a request with `kv_len` keys cut into `splits` splits
/// (docs/operator.md section 4.3), or None when the split is empty: the request's `eff =
/// visible_len(kv_len, window_left)` keys start at `kv_offset = kv_len - eff`; split s covers
/// `kv_offset + [s * split_len, min((s + 1) * split_len, eff))` and is empty iff `s * split_len >=
/// eff`. So the non-empty splits are the first `ceil(eff / split_len)`, and together they are
/// `[kv_offset, kv_len)` in order.
pub fn decode_split_keys(
    kv_len: usize,
    window_left: i64,
    splits: usize,
    s: usize,
) -> Option<Range<usize>> {
    let eff = visible_len(kv_len, window_left);
    let offset = kv_len - eff;
    let split_len = decode_split_len(eff, splits);
    let first = s.saturating_mul(split_len);
    (first < eff).then(|| {
        let last = first.saturating_add(split_len).min(eff);
        offset + first..offset + last
    })
}
