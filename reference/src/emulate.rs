//! Same-precision emulation of a flash kernel (SPEC section 6): what a correct GPU kernel in the
//! case dtype computes, so its distance from the f64 reference sets the tolerance scale.
//!
//! Choices where the spec leaves freedom (a kernel's own order of operations):
//! - inputs as stored (the dtype values), scores in f32: `s = f32(scale) * dot + bias`, where
//!   `dot` sums `q[c] * k[c]` in f32 over 8 interleaved lanes (`c % 8`, like a SIMD or MMA
//!   accumulator) combined in a fixed tree at the end; the multiply and the add round
//!   separately (no fused multiply-add);
//! - keys go tile by tile, 128 keys per tile aligned to absolute key index 0 (the tiling of the
//!   kernels' KV loop); a tile's visible keys update the running max `m` and sum `l` (both f32):
//!   `m_new = max(m, max_tile s)`, `l = l * exp(m - m_new) + sum_tile exp(s - m_new)`, the sum
//!   taken in key order over the f32 `p` before rounding;
//! - `p = exp(s - m_new)` is rounded to the case dtype before `P V`; the f32 accumulator is
//!   rescaled by `exp(m - m_new)` and then adds `round(p) * v` key by key;
//! - at the end `out = round_dtype(acc / l)` (f32 division); for fp32 no rounding happens.
//!
//! `out` holds the rounded values as f64; `lse` is the f64 value of the final f32 state,
//! `m + ln(l)` evaluated in f64 (so it is the exact LSE of the emulated state).
//! Padding rows are 0 in both, as in the f64 reference.

use crate::output::RefOutput;
use crate::problem::Problem;
use crate::progress::{ignore, Progress};
use crate::sample::real_rows_of;
use ndarray::{Array2, Array3, Axis};
use rayon::prelude::*;

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

/// Outputs `[rows, H, D]` and LSEs `[rows, H]`, flattened, of real rows (in parallel by row).
fn compute_rows(p: &Problem, rows: &[usize], progress: Progress) -> (Vec<f64>, Vec<f64>) {
    let (h, d) = (p.num_heads, p.head_dim);
    let per_row: Vec<(Vec<f64>, Vec<f64>)> = rows
        .par_iter()
        .map(|&t| {
            let mut out = Vec::with_capacity(h * d);
            let mut lse = Vec::with_capacity(h);
            for head in 0..h {
                let (o, l) = row_head(p, t, head);
                out.extend(o);
                lse.push(l);
            }
            progress(h as u64);
            (out, lse)
        })
        .collect();
    let mut out = Vec::with_capacity(rows.len() * h * d);
    let mut lse = Vec::with_capacity(rows.len() * h);
    for (o, l) in per_row {
        out.extend(o);
        lse.extend(l);
    }
    (out, lse)
}

/// One (real row, head): the emulated kernel's KV loop.
fn row_head(p: &Problem, t: usize, head: usize) -> (Vec<f64>, f64) {
    let dtype = p.dtype;
    let r = match p.request_of_row(t) {
        Some(r) => r,
        None => return (vec![0.0; p.head_dim], 0.0),
    };
    let i = t - r.q_start;
    let pos = r.prefix() + i;
    let kvh = head / p.group();
    let (first, last) = p.visible_keys(&r, i);
    let q: Vec<f32> = (0..p.head_dim).map(|c| p.q[[t, head, c]]).collect();
    let scale = p.softmax_scale as f32;

    let mut m = f32::NEG_INFINITY;
    let mut l = 0f32;
    let mut acc = vec![0f32; p.head_dim];
    let mut s = [0f32; EMULATED_KEY_TILE];
    for tile in first / EMULATED_KEY_TILE..=last / EMULATED_KEY_TILE {
        let a = first.max(tile * EMULATED_KEY_TILE);
        let z = (last + 1).min((tile + 1) * EMULATED_KEY_TILE);
        let scores = &mut s[..z - a];
        for (x, j) in scores.iter_mut().zip(a..z) {
            *x = scale * dot_f32(&q, p.key(r.index, j, kvh)) + p.bias(t, head, pos - j);
        }
        let m_new = scores.iter().copied().fold(m, f32::max);
        let alpha = (m - m_new).exp(); // exp(-inf) = 0 on the first tile
        l *= alpha;
        acc.iter_mut().for_each(|x| *x *= alpha);
        for (x, j) in scores.iter().zip(a..z) {
            let w = (x - m_new).exp();
            l += w;
            let w = dtype.round(w);
            for (o, &v) in acc.iter_mut().zip(p.value(r.index, j, kvh)) {
                *o += w * v;
            }
        }
        m = m_new;
    }
    let out = acc.iter().map(|&x| dtype.round(x / l) as f64).collect();
    (out, m as f64 + (l as f64).ln())
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
