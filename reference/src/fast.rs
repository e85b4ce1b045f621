//! The fast f64 reference: blocked, GEMM-based (ndarray's matrixmultiply backend), rayon-parallel.
//!
//! A work item is one request, one KV head and a block of its query positions; the `G` query
//! heads of that KV head are stacked as rows (`row = position * G + g`), so one GEMM serves the
//! whole group. Keys go by tiles of `KEY_TILE` aligned to absolute key index 0: each tile's K
//! and V pages are gathered into dense f64 tiles, `S = Q K^T`, bias and mask are applied, and an
//! online softmax (f64) accumulates `O += P V`. Tiles no row of the block sees are skipped.
//!
//! Only keys inside the block's visible hull are gathered (the rest of a tile is zero), and the
//! hull of consecutive query positions of one request holds only keys some row may see, so
//! poisoned slots are never read.
//!
//! A row's result does not depend on which other rows share its block: tiles are aligned to
//! absolute key positions, every GEMM element is a dot product in the backend's fixed order, and
//! a tile a row does not see leaves its state exactly unchanged (weights 0, rescale skipped).
//! That is what makes sampled rows bit-identical to the full computation.

use crate::output::RefOutput;
use crate::problem::Problem;
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
    full(p, true)
}

/// `attention` on the calling thread only (for single-thread throughput figures).
pub fn attention_serial(p: &Problem) -> RefOutput {
    full(p, false)
}

/// Sampled mode: the real rows among `rows` (ascending, deduplicated; padding rows and rows past
/// T are skipped), each bit-identical to the same row of `attention`. `out` is `[N, H, D]`,
/// `lse` `[N, H]`, and `rows` lists the N packed rows.
pub fn attention_rows(p: &Problem, rows: &[usize]) -> RefOutput {
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
    scatter(p, &items, &run(p, &items, true), &mut out, &mut lse);
    RefOutput {
        rows: Some(rows),
        out,
        lse,
    }
}

fn full(p: &Problem, parallel: bool) -> RefOutput {
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
    scatter(p, &items, &run(p, &items, parallel), &mut out, &mut lse);
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

fn run(p: &Problem, items: &[Item], parallel: bool) -> Vec<ItemResult> {
    if parallel {
        items.par_iter().map(|it| compute(p, it)).collect()
    } else {
        items.iter().map(|it| compute(p, it)).collect()
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
                let bias_row = &rel[rr];
                let mut tile_max = f64::NEG_INFINITY;
                for (jj, x) in row[a - j0..z - j0].iter_mut().enumerate() {
                    let dist = pos - (a + jj);
                    let bias = if dist < p.rel_extent {
                        bias_row[dist] as f64
                    } else {
                        0.0
                    };
                    *x = *x * scale + bias;
                    tile_max = tile_max.max(*x);
                }
                let m_new = m[rr].max(tile_max);
                let mut sum = 0.0;
                for x in &mut row[a - j0..z - j0] {
                    *x = (*x - m_new).exp();
                    sum += *x;
                }
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
