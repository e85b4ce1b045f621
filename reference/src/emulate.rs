//! Same-precision emulation of a flash kernel (docs/operator.md section 6): what a correct GPU
//! kernel in the case dtype computes, so its distance from the f64 reference sets the tolerance
//! scale.
//!
//! Choices where the spec leaves freedom (a kernel's own order of operations):
//! - inputs as stored (the dtype values); `dot` sums `q[c] * k[c]` in f32 over 8 interleaved
//!   lanes (`c % 8`, like a SIMD or MMA accumulator) combined in a fixed tree at the end, each
//!   multiply and add rounding separately;
//! - scores in f32 in the log2 domain, as flash kernels keep them (FlashAttention's
//!   `softmax_scale * log2(e)`, `exp2`): `s = fma(dot, f32(scale) * log2(e), bias * log2(e))`,
//!   one rounding for the fused multiply-add. With logits in the thousands the rounding of `s`
//!   is what the weights' error is made of, and it is 1.44 times coarser than in the natural
//!   domain (see docs/reference.md);
//! - keys go tile by tile, 128 keys per tile aligned to absolute key index 0 (the tiling of the
//!   kernels' KV loop); a tile's visible keys update the running max `m` and sum `l` (both f32):
//!   `m_new = max(m, max_tile s)`, `l = l * exp2(m - m_new) + sum_tile exp2(s - m_new)`, the sum
//!   taken in key order over the f32 `p` before rounding;
//! - `p = exp2(s - m_new)` is rounded to the case dtype before `P V`; the f32 accumulator is
//!   rescaled by `exp2(m - m_new)` and then adds `round(p) * v` key by key;
//! - at the end `out = round_dtype(acc / l)` (f32 division); for fp32 no rounding happens.
//!
//! `out` holds the rounded values as f64; `lse` is the f64 value of the final f32 state,
//! `(m + log2(l)) ln(2)` evaluated in f64 (so it is the exact LSE of the emulated state).
//! Padding rows are 0 in both, as in the f64 reference.

use crate::output::RefOutput;
use crate::problem::Problem;
use crate::progress::{ignore, Progress};
use crate::sample::real_rows_of;
use ndarray::{Array2, Array3, Axis};
use rayon::prelude::*;
use std::f32::consts::LOG2_E;
use std::f64::consts::LN_2;

/// Keys per tile of the emulated KV loop, aligned to absolute key index 0.
pub const EMULATED_KEY_TILE: usize = 128;
const LANES: usize = 8;

/// Full-mode emulation: `out` `[T, H, D]` (values of the case dtype), `lse` `[T, H]`; padding
/// rows 0.
pub fn attention(p: &Problem) -> RefOutput {
    attention_with(p, None, &ignore)
}

/// Sampled mode: the real rows among `rows` (ascending, deduplicated; padding rows and rows past
/// T are skipped), each bit-identical to the same row of `attention`.
pub fn attention_rows(p: &Problem, rows: &[usize]) -> RefOutput {
    attention_with(p, Some(rows), &ignore)
}

/// `attention` (`rows` None) or `attention_rows`, telling `progress` as (row, head) pairs finish.
pub fn attention_with(p: &Problem, rows: Option<&[usize]>, progress: Progress) -> RefOutput {
    match rows {
        Some(rows) => emulate_rows(p, &real_rows_of(p, rows), false, progress),
        None => {
            let rows: Vec<usize> = (0..p.real_rows()).collect();
            emulate_rows(p, &rows, true, progress)
        }
    }
}

/// Emulate real `rows`: in full mode into a `[T, ..]` output at their own index, else into
/// output row `k` for `rows[k]`.
fn emulate_rows(p: &Problem, rows: &[usize], full: bool, progress: Progress) -> RefOutput {
    let (h, d) = (p.num_heads, p.head_dim);
    let n = if full { p.total_rows() } else { rows.len() };
    let (o, l) = compute_rows(p, rows, progress);
    let mut out = Array3::<f64>::zeros((n, h, d));
    let mut lse = Array2::<f64>::zeros((n, h));
    for (k, &row) in rows.iter().enumerate() {
        let at = if full { row } else { k };
        out.index_axis_mut(Axis(0), at)
            .iter_mut()
            .zip(&o[k * h * d..])
            .for_each(|(a, &x)| *a = x);
        lse.row_mut(at)
            .iter_mut()
            .zip(&l[k * h..])
            .for_each(|(a, &x)| *a = x);
    }
    RefOutput {
        rows: (!full).then(|| rows.to_vec()),
        out,
        lse,
    }
}

/// Rows per work item, times the GQA group: each item runs up to this many (row, head) pairs of
/// one request and one KV head over the cache together, so every key tile is read from memory
/// once per item rather than once per pair (the pairs' arithmetic is untouched).
const PAIRS_PER_ITEM: usize = 64;

/// Outputs `[rows, H, D]` and LSEs `[rows, H]`, flattened, of real rows (in parallel over items of
/// (row, head) pairs that share a request and a KV head).
fn compute_rows(p: &Problem, rows: &[usize], progress: Progress) -> (Vec<f64>, Vec<f64>) {
    compute_rows_grouped(p, rows, PAIRS_PER_ITEM, progress)
}

/// `compute_rows` with at most `max_pairs` (row, head) pairs per item (at least one whole row of
/// a KV head's group, so 1 gives one row per item). Every pair's result is the same whatever the
/// grouping: a pair sees the same tiles, in the same order, with the same operations.
fn compute_rows_grouped(
    p: &Problem,
    rows: &[usize],
    max_pairs: usize,
    progress: Progress,
) -> (Vec<f64>, Vec<f64>) {
    let (h, d, g) = (p.num_heads, p.head_dim, p.group());
    let rows_per_item = (max_pairs / g).max(1);
    // Items: (first index into `rows`, end, KV head); the rows of one item share a request.
    let mut items = Vec::new();
    let mut k = 0;
    while k < rows.len() {
        let b = p.request_of_row(rows[k]).map(|r| r.index);
        let mut end = k + 1;
        while end < rows.len()
            && end - k < rows_per_item
            && p.request_of_row(rows[end]).map(|r| r.index) == b
        {
            end += 1;
        }
        for kvh in 0..p.num_kv_heads {
            items.push((k, end, kvh));
        }
        k = end;
    }
    let results: Vec<Vec<(Vec<f64>, f64)>> = items
        .par_iter()
        .map(|&(a, z, kvh)| {
            let pairs: Vec<(usize, usize)> = rows[a..z]
                .iter()
                .flat_map(|&t| (kvh * g..(kvh + 1) * g).map(move |head| (t, head)))
                .collect();
            let out = item(p, &pairs, kvh);
            progress(pairs.len() as u64);
            out
        })
        .collect();
    let mut out = vec![0f64; rows.len() * h * d];
    let mut lse = vec![0f64; rows.len() * h];
    for (&(a, z, kvh), res) in items.iter().zip(results) {
        let mut res = res.into_iter();
        for k in a..z {
            for head in kvh * g..(kvh + 1) * g {
                let (o, l) = res.next().unwrap_or_default();
                let at = k * h + head;
                out[at * d..(at + 1) * d].copy_from_slice(&o);
                lse[at] = l;
            }
        }
    }
    (out, lse)
}

/// The emulated kernel state of one (real row, head) pair.
struct Pair {
    t: usize,
    head: usize,
    b: usize,
    pos: usize,
    first: usize,
    last: usize,
    q: Vec<f32>,
    m: f32,
    l: f32,
    acc: Vec<f32>,
}

/// The (row, head) `pairs` of one request and KV head `kvh`: the emulated kernel's KV loop of
/// each, tile by tile over the union of their visible keys (a tile outside a pair's range is
/// not its tile). Results in the order of `pairs`; a padding row gives zeros.
fn item(p: &Problem, pairs: &[(usize, usize)], kvh: usize) -> Vec<(Vec<f64>, f64)> {
    let dtype = p.dtype;
    let scale2 = p.softmax_scale as f32 * LOG2_E;
    let mut states: Vec<Option<Pair>> = pairs
        .iter()
        .map(|&(t, head)| {
            let r = p.request_of_row(t)?;
            let i = t - r.q_start;
            let (first, last) = p.visible_keys(&r, i);
            Some(Pair {
                t,
                head,
                b: r.index,
                pos: r.prefix() + i,
                first,
                last,
                q: (0..p.head_dim).map(|c| p.q[[t, head, c]]).collect(),
                m: f32::NEG_INFINITY,
                l: 0.0,
                acc: vec![0f32; p.head_dim],
            })
        })
        .collect();
    let live = || states.iter().flatten();
    let (Some(lo), Some(hi)) = (
        live().map(|s| s.first / EMULATED_KEY_TILE).min(),
        live().map(|s| s.last / EMULATED_KEY_TILE).max(),
    ) else {
        return vec![(vec![0.0; p.head_dim], 0.0); pairs.len()];
    };
    let mut s = [0f32; EMULATED_KEY_TILE];
    for tile in lo..=hi {
        for st in states.iter_mut().flatten() {
            if tile < st.first / EMULATED_KEY_TILE || tile > st.last / EMULATED_KEY_TILE {
                continue;
            }
            let a = st.first.max(tile * EMULATED_KEY_TILE);
            let z = (st.last + 1).min((tile + 1) * EMULATED_KEY_TILE);
            let scores = &mut s[..z - a];
            for (x, j) in scores.iter_mut().zip(a..z) {
                let bias2 = p.bias(st.t, st.head, st.pos - j) * LOG2_E;
                *x = dot_f32(&st.q, p.key(st.b, j, kvh)).mul_add(scale2, bias2);
            }
            let m_new = scores.iter().copied().fold(st.m, f32::max);
            let alpha = (st.m - m_new).exp2(); // exp2(-inf) = 0 on the first tile
            st.l *= alpha;
            st.acc.iter_mut().for_each(|x| *x *= alpha);
            for (x, j) in scores.iter().zip(a..z) {
                let w = (x - m_new).exp2();
                st.l += w;
                let w = dtype.round(w);
                for (o, &v) in st.acc.iter_mut().zip(p.value(st.b, j, kvh)) {
                    *o += w * v;
                }
            }
            st.m = m_new;
        }
    }
    states
        .into_iter()
        .map(|st| match st {
            Some(st) => (
                st.acc
                    .iter()
                    .map(|&x| dtype.round(x / st.l) as f64)
                    .collect(),
                (st.m as f64 + (st.l as f64).log2()) * LN_2,
            ),
            None => (vec![0.0; p.head_dim], 0.0),
        })
        .collect()
}

/// f32 dot product over 8 interleaved lanes combined in a fixed tree (vectorisable, reproducible).
fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; LANES];
    let mut ca = a.chunks_exact(LANES);
    let mut cb = b.chunks_exact(LANES);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for k in 0..LANES {
            lanes[k] += x[k] * y[k];
        }
    }
    for (k, (x, y)) in ca.remainder().iter().zip(cb.remainder()).enumerate() {
        lanes[k] += x * y;
    }
    let [a0, a1, a2, a3, a4, a5, a6, a7] = lanes;
    ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gen::{generate, GenSpec};
    use crate::progress::ignore;

    fn bits(v: &[f64]) -> Vec<u64> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    #[test]
    fn grouping_pairs_into_items_changes_no_bit() {
        let specs = [
            // Decode rows of several requests, GQA group 4, keys over several tiles.
            GenSpec::global(8, 2, vec![(1, 300), (1, 129), (0, 17), (1, 1)], 3),
            // A chunk and a prefill on a local layer: windows start mid-tile.
            GenSpec::local(4, 1, 100, vec![(40, 400), (70, 70)], 5),
            // Group 1 and rows past the first tile's end.
            GenSpec::global(2, 2, vec![(9, 260), (3, 3)], 7),
        ];
        for spec in &specs {
            let p = generate(spec).expect("small spec");
            let rows: Vec<usize> = (0..p.real_rows()).collect();
            let one = compute_rows_grouped(&p, &rows, 1, &ignore);
            for max_pairs in [3, 16, PAIRS_PER_ITEM, 1 << 20] {
                let many = compute_rows_grouped(&p, &rows, max_pairs, &ignore);
                assert_eq!(
                    bits(&one.0),
                    bits(&many.0),
                    "out, {max_pairs} pairs per item"
                );
                assert_eq!(
                    bits(&one.1),
                    bits(&many.1),
                    "lse, {max_pairs} pairs per item"
                );
            }
            // Every real row was computed (no row left at zero with a finite LSE of 0).
            assert!(one.1.iter().all(|l| l.is_finite() && *l != 0.0));
        }
    }
}
