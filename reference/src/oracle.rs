//! The naive f64 oracle: plain loops over rows, heads and visible keys (docs/operator.md section
//! 1).
//!
//! Obviously right rather than fast; used for small cases and to check `fast`. Only visible
//! keys and real rows are ever read, so poisoned (NaN) slots and padding rows cannot leak.
//!
//! Also the per-key-range partials and their LSE merge (docs/operator.md section 4.3), which
//! split-KV kernels rely on: merging the partials of disjoint key ranges that cover every key
//! equals the whole.

use crate::output::RefOutput;
use crate::problem::{Problem, Request};
use ndarray::{Array2, Array3};

/// Full-mode f64 reference: `out` `[T, H, D]` and natural-log `lse` `[T, H]`; padding rows 0.
pub fn attention(p: &Problem) -> RefOutput {
    let mut res = attention_key_range(p, |r| (0, r.kv_len));
    for t in p.real_rows()..p.total_rows() {
        res.lse.row_mut(t).fill(0.0);
    }
    res
}

/// Attention restricted to keys `[start, end)` of each request (`range(&request)`), on top of
/// the causal and window mask. A (row, head) with no visible key in its range gets `out` 0 and
/// `lse` -inf (an empty partial, which `merge_partials` skips); so do padding rows.
pub fn attention_key_range<F>(p: &Problem, range: F) -> RefOutput
where
    F: Fn(&Request) -> (usize, usize),
{
    let (t_rows, h, d) = (p.total_rows(), p.num_heads, p.head_dim);
    let mut out = Array3::<f64>::zeros((t_rows, h, d));
    let mut lse = Array2::<f64>::from_elem((t_rows, h), f64::NEG_INFINITY);
    for r in p.requests() {
        let (start, end) = range(&r);
        for i in 0..r.q_len {
            let (first, last) = p.visible_keys(&r, i);
            let lo = first.max(start);
            let hi = (last + 1).min(end); // exclusive
            if lo >= hi {
                continue;
            }
            let t = r.q_start + i;
            for head in 0..h {
                let (o, l) = row_head(p, &r, i, head, lo, hi);
                out.slice_mut(ndarray::s![t, head, ..])
                    .assign(&ndarray::Array1::from(o));
                lse[[t, head]] = l;
            }
        }
    }
    RefOutput {
        rows: None,
        out,
        lse,
    }
}

/// Output and LSE of local query `i` of `r`, query head `head`, over keys `[lo, hi)`, which the
/// caller has already clipped to the visible range (non-empty).
fn row_head(
    p: &Problem,
    r: &Request,
    i: usize,
    head: usize,
    lo: usize,
    hi: usize,
) -> (Vec<f64>, f64) {
    let t = r.q_start + i;
    let kvh = head / p.group();
    let q: Vec<f64> = (0..p.head_dim).map(|c| p.q[[t, head, c]] as f64).collect();
    let pos = r.prefix() + i;

    let mut scores = Vec::with_capacity(hi - lo);
    for j in lo..hi {
        let k = p.key(r.index, j, kvh);
        let dot: f64 = q.iter().zip(k).map(|(a, &b)| a * b as f64).sum();
        let bias = p.bias(t, head, pos - j) as f64;
        scores.push(p.softmax_scale * dot + bias);
    }
    let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let mut sum = 0.0;
    let mut acc = vec![0.0f64; p.head_dim];
    for (j, s) in (lo..hi).zip(&scores) {
        let w = (s - m).exp();
        sum += w;
        let v = p.value(r.index, j, kvh);
        for (a, &x) in acc.iter_mut().zip(v) {
            *a += w * x as f64;
        }
    }
    for a in &mut acc {
        *a /= sum;
    }
    (acc, m + sum.ln())
}

/// Merge full-mode partials of disjoint key ranges by their LSE (docs/operator.md section 4.3): per
/// (row, head), over the partials with a finite LSE, `m = max lse_s`, `out = sum_s e^(lse_s - m)
/// o_s / sum_s e^(lse_s - m)`, `lse = m + ln(sum_s e^(lse_s - m))`. Padding rows come out 0, as in
/// `attention`; a real (row, head) that no partial covers gets `out` 0 and `lse` -inf.
///
/// Returns None when the partials are not all full-mode outputs of `p`'s shape.
pub fn merge_partials(p: &Problem, parts: &[RefOutput]) -> Option<RefOutput> {
    let (t_rows, h, d) = (p.total_rows(), p.num_heads, p.head_dim);
    if parts
        .iter()
        .any(|x| x.rows.is_some() || x.out.dim() != (t_rows, h, d) || x.lse.dim() != (t_rows, h))
    {
        return None;
    }
    let mut out = Array3::<f64>::zeros((t_rows, h, d));
    let mut lse = Array2::<f64>::zeros((t_rows, h));
    for t in 0..p.real_rows() {
        for head in 0..h {
            let live: Vec<&RefOutput> = parts
                .iter()
                .filter(|x| x.lse[[t, head]].is_finite())
                .collect();
            let m = live
                .iter()
                .map(|x| x.lse[[t, head]])
                .fold(f64::NEG_INFINITY, f64::max);
            if live.is_empty() {
                lse[[t, head]] = f64::NEG_INFINITY;
                continue;
            }
            let mut sum = 0.0;
            for x in &live {
                let w = (x.lse[[t, head]] - m).exp();
                sum += w;
                for c in 0..d {
                    out[[t, head, c]] += w * x.out[[t, head, c]];
                }
            }
            for c in 0..d {
                out[[t, head, c]] /= sum;
            }
            lse[[t, head]] = m + sum.ln();
        }
    }
    Some(RefOutput {
        rows: None,
        out,
        lse,
    })
}
