//! docs/operator.md section 1's window rule, as routing needs it: a local layer has `window_left >=
//! 0` and its queries see keys at distances `0..=window_left`; any negative `window_left` (the
//! operator's -1) is a global layer. `relattn_reference::Window` states the same rule for the
//! oracle; a test of the kernels crate checks that the two agree.

/// The most keys a query sees, `window_left + 1`, or `None` on a global layer.
pub(crate) fn span(window_left: i64) -> Option<u64> {
    u64::try_from(window_left).ok().map(|w| w.saturating_add(1))
}

/// Whether `window_left` is a local layer's window.
pub fn is_local(window_left: i64) -> bool {
    window_left >= 0
}

/// The keys the last query of a request with `kv_len` keys sees: all of them, or the window
/// (`eff` of docs/operator.md section 4.3).
pub fn visible_len(kv_len: usize, window_left: i64) -> usize {
    match span(window_left) {
        Some(s) => kv_len.min(usize::try_from(s).unwrap_or(usize::MAX)),
        None => kv_len,
    }
}

/// Whether the window is the model's local one for extent `rel_extent`: `window_left + 1 == E`
/// (false on global layers).
pub fn spans_extent(window_left: i64, rel_extent: usize) -> bool {
    span(window_left) == Some(rel_extent as u64)
}
