//! The fast f64 reference: blocked, GEMM-based (ndarray's matrixmultiply backend), rayon-parallel.
//!
//! A work item is one request, one KV head and a block of its query positions; the `G` query
//! heads of that KV head are stacked as rows (`row = position * G + g`), so one GEMM serves the
//! whole group. Keys go by tiles of `KEY_TILE` aligned to absolute key index 0: each tile's K
//! and V pages are gathered into dense f64 tiles, `S = Q K^T`, bias and mask are applied, and an
//! online softmax (f64) accumulates `O += P V`. Tiles no row of the block sees are skipped.
//!
//! Only keys inside the block's visible hull are gathered (the rest of a tile is zero). Windows
//! of successive positions overlap or touch, so the hull of any positions of one request holds
//! only keys some query of that request may see: poisoned slots are never read.
//!
//! A row's result does not depend on which other rows share its block: tiles are aligned to
//! absolute key positions, every GEMM element is a dot product in the backend's fixed order, and
//! a tile a row does not see leaves its state exactly unchanged (weights 0, rescale skipped).
//! That is what makes sampled rows bit-identical to the full computation.

use crate::output::RefOutput;
use crate::problem::Problem;
use crate::progress::{ignore, Progress};
use crate::sample::real_rows_of;
use ndarray::linalg::general_mat_mul;
use ndarray::{s, Array2, Array3};
use rayon::prelude::*;
use std::borrow::Cow;

/// Keys per tile. At most matrixmultiply's f64 `kc` (256), so `P V` sums a tile in one pass.
const KEY_TILE: usize = 256;
/// Target stacked rows (positions x G) per work item.
const BLOCK_ROWS: usize = 512;
/// Bounds on query positions per work item: more amortises the gathers, fewer wastes less work
/// on masked cells right of the diagonal.
const MIN_POSITIONS: usize = 16;
const MAX_POSITIONS: usize = 64;

/// Full-mode reference over all cores: `out` `[T, H, D]`, natural-log `lse` `[T, H]`, padding
/// rows 0.
pub fn attention(p: &Problem) -> RefOutput {
    full(p, true, &ignore)
}

/// `attention` on the calling thread only (for single-thread throughput figures).
pub fn attention_serial(p: &Problem) -> RefOutput {
    full(p, false, &ignore)
}

/// Sampled mode: the real rows among `rows` (ascending, deduplicated; padding rows and rows past
/// T are skipped), each bit-identical to the same row of `attention`. `out` is `[N, H, D]`,
/// `lse` `[N, H]`, and `rows` lists the N packed rows.
pub fn attention_rows(p: &Problem, rows: &[usize]) -> RefOutput {
    sampled(p, rows, &ignore)
}

/// `attention` (`rows` None) or `attention_rows`, telling `progress` as (row, head) pairs finish.
pub fn attention_with(p: &Problem, rows: Option<&[usize]>, progress: Progress) -> RefOutput {
    match rows {
        Some(rows) => sampled(p, rows, progress),
        None => full(p, true, progress),
    }
}

fn sampled(p: &Problem, rows: &[usize], progress: Progress) -> RefOutput {
    let rows = real_rows_of(p, rows);
    let mut items = Vec::new();
    let mut k = 0;
    while k < rows.len() {
        // Rows of one request, chunked; `request_of_row` is Some for real rows.
        let Some(r) = p.request_of_row(rows[k]) else {
            break;
        };
        let end = rows.partition_point(|&t| t < r.q_start + r.q_len);
        let mut chunk: Vec<(usize, usize)> = Vec::new();
        for (slot, &t) in rows.iter().enumerate().take(end).skip(k) {
            let i = t - r.q_start;
            let split = chunk.last().is_some_and(|&(last_i, _)| {
                // A new block when full, or when windows stop overlapping (local layers).
                chunk.len() >= positions_per_block(p)
                    || p.visible_keys(&r, i).0 > p.visible_keys(&r, last_i).1
            });
            if split {
                push_items(p, r.index, &mut items, std::mem::take(&mut chunk));
            }
            chunk.push((i, slot));
        }
        push_items(p, r.index, &mut items, chunk);
        k = end;
    }
    let n = rows.len();
    let mut out = Array3::<f64>::zeros((n, p.num_heads, p.head_dim));
    let mut lse = Array2::<f64>::zeros((n, p.num_heads));
    scatter(
        p,
        &items,
        &run(p, &items, true, progress),
        &mut out,
        &mut lse,
    );
    RefOutput {
        rows: Some(rows),
        out,
        lse,
    }
}

fn full(p: &Problem, parallel: bool, progress: Progress) -> RefOutput {
    let mut items = Vec::new();
    let step = positions_per_block(p);
    for r in p.requests() {
        for i0 in (0..r.q_len).step_by(step) {
            let chunk = (i0..(i0 + step).min(r.q_len))
                .map(|i| (i, r.q_start + i))
                .collect();
            push_items(p, r.index, &mut items, chunk);
        }
    }
    let (t, h, d) = (p.total_rows(), p.num_heads, p.head_dim);
    let mut out = Array3::<f64>::zeros((t, h, d));
    let mut lse = Array2::<f64>::zeros((t, h));
    scatter(
        p,
        &items,
        &run(p, &items, parallel, progress),
        &mut out,
        &mut lse,
    );
    RefOutput {
        rows: None,
        out,
        lse,
    }
}

fn positions_per_block(p: &Problem) -> usize {
    (BLOCK_ROWS / p.group()).clamp(MIN_POSITIONS, MAX_POSITIONS)
}

/// One request, one KV head, some of its query positions.
struct Item {
    b: usize,
    kvh: usize,
    /// `(local query index i, output row)`, ascending in `i`.
    rows: Vec<(usize, usize)>,
}

/// Per item: `out` `[positions, G, D]` and `lse` `[positions, G]`, flattened.
struct ItemResult {
    out: Vec<f64>,
    lse: Vec<f64>,
}

fn push_items(p: &Problem, b: usize, items: &mut Vec<Item>, rows: Vec<(usize, usize)>) {
    if rows.is_empty() {
        return;
    }
    for kvh in 0..p.num_kv_heads {
        items.push(Item {
            b,
            kvh,
            rows: rows.clone(),
        });
    }
}

fn run(p: &Problem, items: &[Item], parallel: bool, progress: Progress) -> Vec<ItemResult> {
    let one = |it: &Item| {
        let result = compute(p, it);
        progress((it.rows.len() * p.group()) as u64);
        result
    };
    if parallel {
        items.par_iter().map(one).collect()
    } else {
        items.iter().map(one).collect()
    }
}

fn scatter(
    p: &Problem,
    items: &[Item],
    results: &[ItemResult],
    out: &mut Array3<f64>,
    lse: &mut Array2<f64>,
) {
    let (g, d) = (p.group(), p.head_dim);
    for (it, res) in items.iter().zip(results) {
        for (ii, &(_, row)) in it.rows.iter().enumerate() {
            for gg in 0..g {
                let rr = ii * g + gg;
                let head = it.kvh * g + gg;
                lse[[row, head]] = res.lse[rr];
                out.slice_mut(s![row, head, ..])
                    .iter_mut()
                    .zip(&res.out[rr * d..(rr + 1) * d])
                    .for_each(|(o, &x)| *o = x);
            }
        }
    }
}

/// The blocked online-softmax computation of one work item.
fn compute(p: &Problem, it: &Item) -> ItemResult {
    let (g, d) = (p.group(), p.head_dim);
    let r = p.request(it.b);
    let npos = it.rows.len();
    let nr = npos * g;
    let scale = p.softmax_scale;

    let mut q = Array2::<f64>::zeros((nr, d));
    let mut rel: Vec<Cow<[f32]>> = Vec::with_capacity(nr);
    for (ii, &(i, _)) in it.rows.iter().enumerate() {
        let t = r.q_start + i;
        for gg in 0..g {
            let head = it.kvh * g + gg;
            q.row_mut(ii * g + gg)
                .iter_mut()
                .zip(p.q.slice(s![t, head, ..]))
                .for_each(|(a, &x)| *a = x as f64);
            let view = p.rel_logits.slice(s![t, head, ..]);
            rel.push(match view.to_slice() {
                Some(sl) => Cow::Borrowed(sl),
                None => Cow::Owned(view.to_vec()),
            });
        }
    }
    // Visible keys per position (inclusive), `pos = P + i` for the bias distance.
    let vis: Vec<(usize, usize)> = it
        .rows
        .iter()
        .map(|&(i, _)| p.visible_keys(&r, i))
        .collect();
    let lo = vis.iter().map(|v| v.0).min().unwrap_or(0);
    let hi = vis.iter().map(|v| v.1).max().unwrap_or(0);

    let mut kt = Array2::<f64>::zeros((KEY_TILE, d));
    let mut vt = Array2::<f64>::zeros((KEY_TILE, d));
    let mut sc = Array2::<f64>::zeros((nr, KEY_TILE));
    let mut o = Array2::<f64>::zeros((nr, d));
    let mut m = vec![f64::NEG_INFINITY; nr];
    let mut l = vec![0.0f64; nr];

    for tile in lo / KEY_TILE..=hi / KEY_TILE {
        let j0 = tile * KEY_TILE;
        let ja = j0.max(lo);
        let jb = (j0 + KEY_TILE).min(hi + 1);
        if !vis.iter().any(|&(f, last)| f < jb && last >= ja) {
            continue;
        }
        let n = jb - j0;
        gather(p, it.b, it.kvh, j0, ja, jb, &mut kt, &mut vt);
        let mut s_tile = sc.slice_mut(s![.., ..n]);
        general_mat_mul(1.0, &q, &kt.slice(s![..n, ..]).t(), 0.0, &mut s_tile);

        let s_all = sc.as_slice_mut().expect("owned arrays are contiguous");
        let o_all = o.as_slice_mut().expect("owned arrays are contiguous");
        for (ii, &(first, last)) in vis.iter().enumerate() {
            let a = first.max(j0);
            let z = (last + 1).min(jb);
            let pos = r.prefix() + it.rows[ii].0;
            for gg in 0..g {
                let rr = ii * g + gg;
                let row = &mut s_all[rr * KEY_TILE..rr * KEY_TILE + n];
                if a >= z {
                    row.fill(0.0); // nothing visible: the state stays exactly as it was
                    continue;
                }
                row[..a - j0].fill(0.0);
                row[z - j0..].fill(0.0);
                // Keys before `near` are at distance >= E (no bias); `near` ones carry
                // rel_logits[t, h, pos - j], read in reverse.
                let near = (pos + 1).saturating_sub(p.rel_extent).clamp(a, z);
                let (far_s, near_s) = row[a - j0..z - j0].split_at_mut(near - a);
                far_s.iter_mut().for_each(|x| *x *= scale);
                if near < z {
                    let bias = &rel[rr][pos + 1 - z..pos + 1 - near];
                    near_s
                        .iter_mut()
                        .zip(bias.iter().rev())
                        .for_each(|(x, &b)| *x = *x * scale + b as f64);
                }
                let tile_max = max4(&row[a - j0..z - j0]);
                let m_new = m[rr].max(tile_max);
                let visible = &mut row[a - j0..z - j0];
                visible
                    .iter_mut()
                    .for_each(|x| *x = exp_nonpositive(*x - m_new));
                let sum = sum4(visible);
                if m_new != m[rr] {
                    let alpha = (m[rr] - m_new).exp();
                    l[rr] *= alpha;
                    o_all[rr * d..(rr + 1) * d]
                        .iter_mut()
                        .for_each(|v| *v *= alpha);
                    m[rr] = m_new;
                }
                l[rr] += sum;
            }
        }
        general_mat_mul(
            1.0,
            &sc.slice(s![.., ..n]),
            &vt.slice(s![..n, ..]),
            1.0,
            &mut o,
        );
    }

    let mut out = o.into_raw_vec_and_offset().0;
    for (rr, row) in out.chunks_mut(d).enumerate() {
        row.iter_mut().for_each(|v| *v /= l[rr]);
    }
    let lse = m.iter().zip(&l).map(|(m, l)| m + l.ln()).collect();
    ItemResult { out, lse }
}

/// Gather keys `[ja, jb)` of request `b`, KV head `kvh` into rows `ja - j0 ..` of the dense tiles
/// (converted to f64); rows `..ja - j0` are zeroed so no stale or unread value enters a GEMM.
#[allow(clippy::too_many_arguments)]
fn gather(
    p: &Problem,
    b: usize,
    kvh: usize,
    j0: usize,
    ja: usize,
    jb: usize,
    kt: &mut Array2<f64>,
    vt: &mut Array2<f64>,
) {
    let d = p.head_dim;
    let kt = kt.as_slice_mut().expect("owned arrays are contiguous");
    let vt = vt.as_slice_mut().expect("owned arrays are contiguous");
    kt[..(ja - j0) * d].fill(0.0);
    vt[..(ja - j0) * d].fill(0.0);
    for j in ja..jb {
        let at = (j - j0) * d;
        kt[at..at + d]
            .iter_mut()
            .zip(p.key(b, j, kvh))
            .for_each(|(a, &x)| *a = x as f64);
        vt[at..at + d]
            .iter_mut()
            .zip(p.value(b, j, kvh))
            .for_each(|(a, &x)| *a = x as f64);
    }
}

/// `e^x` for `x <= 0` (a softmax exponent `s - m`), within a few ulp, and 0 below -708 (weights
/// that small cannot move a sum whose largest term is 1). Branch-free so the loop over a row
/// vectorises; NaN stays NaN so a poisoned read cannot hide.
#[inline]
fn exp_nonpositive(x: f64) -> f64 {
    // ln 2 split so that `k * LN2_HI` is exact for |k| < 2^11 (the fdlibm constants).
    const LN2_HI: f64 = f64::from_bits(0x3fe6_2e42_fee0_0000);
    const LN2_LO: f64 = f64::from_bits(0x3dea_39ef_3579_3c76);
    const SHIFTER: f64 = 6_755_399_441_055_744.0; // 1.5 * 2^52: adding it rounds to an integer
    let xc = if x > -708.0 { x } else { -708.0 };
    let shifted = xc * std::f64::consts::LOG2_E + SHIFTER;
    let kf = shifted - SHIFTER;
    let r = (xc - kf * LN2_HI) - kf * LN2_LO; // |r| <= ln2 / 2
                                              // Taylor series to degree 13: truncation below 1e-17 relative on |r| <= ln2 / 2.
    let mut p = 1.0 / 6_227_020_800.0;
    for c in [
        1.0 / 479_001_600.0,
        1.0 / 39_916_800.0,
        1.0 / 3_628_800.0,
        1.0 / 362_880.0,
        1.0 / 40_320.0,
        1.0 / 5_040.0,
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
        1.0,
    ] {
        p = p * r + c;
    }
    // 2^k, k in [-1022, 0]: the low bits of `shifted` hold 2^51 + k, so adding the exponent
    // bias and shifting out everything above the 11 exponent bits builds it (integer ops
    // vectorise; a float-to-integer conversion would not).
    let two_k = f64::from_bits(shifted.to_bits().wrapping_add(1023) << 52);
    if x < -708.0 {
        0.0
    } else {
        p * two_k + x * 0.0 // + NaN for NaN, + 0 otherwise
    }
}

/// Largest value, over four interleaved lanes (the maximum does not depend on the order).
#[inline]
fn max4(x: &[f64]) -> f64 {
    let mut lanes = [f64::NEG_INFINITY; 4];
    let mut chunks = x.chunks_exact(4);
    for c in &mut chunks {
        for k in 0..4 {
            lanes[k] = if c[k] > lanes[k] { c[k] } else { lanes[k] };
        }
    }
    for (k, &v) in chunks.remainder().iter().enumerate() {
        lanes[k] = if v > lanes[k] { v } else { lanes[k] };
    }
    lanes[0].max(lanes[1]).max(lanes[2].max(lanes[3]))
}

/// Sum in four interleaved lanes (a fixed order, not latency-bound).
#[inline]
fn sum4(x: &[f64]) -> f64 {
    let mut lanes = [0.0f64; 4];
    let mut chunks = x.chunks_exact(4);
    for c in &mut chunks {
        for k in 0..4 {
            lanes[k] += c[k];
        }
    }
    for (k, v) in chunks.remainder().iter().enumerate() {
        lanes[k] += v;
    }
    (lanes[0] + lanes[2]) + (lanes[1] + lanes[3])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_nonpositive_matches_std() {
        let mut worst = 0.0f64;
        for i in 0..200_000 {
            let x = -(i as f64) * 0.003_7;
            let (got, want) = (exp_nonpositive(x), x.exp());
            if x > -708.0 {
                worst = worst.max(((got - want) / want).abs());
            } else {
                assert!(got == 0.0 || (got - want).abs() < 1e-300);
            }
        }
        assert!(worst < 4.0 * f64::EPSILON, "worst relative error {worst:e}");
        assert_eq!(exp_nonpositive(0.0), 1.0);
        assert_eq!(exp_nonpositive(f64::NEG_INFINITY), 0.0);
        assert!(exp_nonpositive(f64::NAN).is_nan());
    }

    #[test]
    fn sum4_sums() {
        let x: Vec<f64> = (1..=11).map(f64::from).collect();
        assert_eq!(sum4(&x), 66.0);
        assert_eq!(sum4(&[]), 0.0);
    }
}
