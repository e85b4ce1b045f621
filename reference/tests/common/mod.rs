//! Helpers shared by the reference's tests: a dense, page-free form of a problem that can be
//! turned back into any paged layout, small random specs and comparisons.
#![allow(dead_code)]

use ndarray::{Array2, Array3};
use proptest::prelude::*;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use relattn_reference::{
    BiasMode, CacheLayout, DType, GenSpec, PageMode, Problem, ProblemData, RefOutput,
};

/// A problem without pages: per request, K and V as `[Lk, Hkv, D]`.
#[derive(Debug, Clone)]
pub struct Dense {
    pub dtype: DType,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rel_extent: usize,
    pub softmax_scale: f64,
    pub window_left: i64,
    pub q: Array3<f32>,
    pub rel_logits: Array3<f32>,
    pub k: Vec<Array3<f32>>,
    pub v: Vec<Array3<f32>>,
    pub cu_seqlens_q: Vec<i32>,
}

impl Dense {
    /// Read every key slot `0..Lk` of every request (unread ones may hold NaN).
    pub fn from_problem(p: &Problem) -> Dense {
        let (hkv, d) = (p.num_kv_heads, p.head_dim);
        let mut k = Vec::new();
        let mut v = Vec::new();
        for r in p.requests() {
            let mut kr = Array3::<f32>::zeros((r.kv_len, hkv, d));
            let mut vr = Array3::<f32>::zeros((r.kv_len, hkv, d));
            if r.q_len > 0 {
                for j in 0..r.kv_len {
                    for h in 0..hkv {
                        for c in 0..d {
                            kr[[j, h, c]] = p.key(r.index, j, h)[c];
                            vr[[j, h, c]] = p.value(r.index, j, h)[c];
                        }
                    }
                }
            } else {
                kr.fill(f32::NAN);
                vr.fill(f32::NAN);
            }
            k.push(kr);
            v.push(vr);
        }
        Dense {
            dtype: p.dtype,
            num_heads: p.num_heads,
            num_kv_heads: p.num_kv_heads,
            head_dim: p.head_dim,
            rel_extent: p.rel_extent,
            softmax_scale: p.softmax_scale,
            window_left: p.window_left,
            q: p.q.clone(),
            rel_logits: p.rel_logits.clone(),
            k,
            v,
            cu_seqlens_q: p.cu_seqlens_q.clone(),
        }
    }

    /// Page the caches into `layout` with pages of `page` slots. Physical blocks are assigned in
    /// order, or shuffled by `shuffle` (a seed); unused slots and one spare block hold NaN.
    pub fn to_problem(&self, page: usize, layout: CacheLayout, shuffle: Option<u64>) -> Problem {
        let (hkv, d) = (self.num_kv_heads, self.head_dim);
        let pages: Vec<usize> = self.k.iter().map(|k| k.shape()[0].div_ceil(page)).collect();
        let total: usize = pages.iter().sum();
        let num_blocks = total + 1;
        let mut ids: Vec<usize> = (0..num_blocks).collect();
        if let Some(seed) = shuffle {
            ids.shuffle(&mut ChaCha8Rng::seed_from_u64(seed));
        }
        let max_pages = pages.iter().copied().max().unwrap_or(0).max(1);
        let mut table = Array2::<i32>::from_elem((self.k.len(), max_pages), ids[total] as i32);
        let (kview, vview, len) = layout.views(num_blocks, page, hkv, d);
        let mut kv = vec![f32::NAN; len];
        let mut next = 0;
        for (b, (kr, vr)) in self.k.iter().zip(&self.v).enumerate() {
            for lp in 0..pages[b] {
                let block = ids[next];
                next += 1;
                table[[b, lp]] = block as i32;
                for slot in 0..page {
                    let j = lp * page + slot;
                    if j >= kr.shape()[0] {
                        break;
                    }
                    for h in 0..hkv {
                        for c in 0..d {
                            kv[kview.at(block, slot, h) + c] = kr[[j, h, c]];
                            kv[vview.at(block, slot, h) + c] = vr[[j, h, c]];
                        }
                    }
                }
            }
        }
        Problem::new(ProblemData {
            dtype: self.dtype,
            num_heads: self.num_heads,
            num_kv_heads: hkv,
            head_dim: d,
            rel_extent: self.rel_extent,
            page_size: page,
            num_blocks,
            softmax_scale: self.softmax_scale,
            window_left: self.window_left,
            q: self.q.clone(),
            rel_logits: self.rel_logits.clone(),
            kv,
            layout,
            rows: Default::default(),
            k: kview,
            v: vview,
            block_table: table,
            seqused_k: self.k.iter().map(|k| k.shape()[0] as i32).collect(),
            cu_seqlens_q: self.cu_seqlens_q.clone(),
        })
        .expect("a dense case pages into a valid problem")
    }

    pub fn max_kv_len(&self) -> usize {
        self.k.iter().map(|k| k.shape()[0]).max().unwrap_or(0)
    }
}

/// A small spec: D = `head_dim`, scale 1/D, poison on, one padding row.
#[allow(clippy::too_many_arguments)]
pub fn small_spec(
    dtype: DType,
    heads: (usize, usize),
    head_dim: usize,
    extent: usize,
    window_left: i64,
    page: usize,
    requests: Vec<(usize, usize)>,
    seed: u64,
) -> GenSpec {
    GenSpec {
        dtype,
        num_heads: heads.0,
        num_kv_heads: heads.1,
        head_dim,
        rel_extent: extent,
        window_left,
        softmax_scale: 1.0 / head_dim as f64,
        page_size: page,
        layout: CacheLayout::NhdPacked,
        requests,
        padding_rows: 1,
        bias: BiasMode::Normal,
        pages: PageMode::Shuffled,
        spare_pages: 1,
        poison: true,
        seed,
        inputs: relattn_reference::Inputs::Rms1,
        rows: relattn_reference::RowLayout::Padded,
    }
}

/// Random small specs: GQA groups, global or local layers (E below the longest distance so the
/// zero-bias region shows), several KV tiles, zero-length requests, padding and every layout.
pub fn arb_spec() -> impl Strategy<Value = GenSpec> {
    let requests = prop::collection::vec(
        (0usize..24, 0usize..560).prop_map(|(lq, extra)| (lq, lq + extra)),
        1..4,
    );
    (
        prop::sample::select(vec![(1usize, 1usize), (2, 1), (4, 2), (4, 4), (6, 2)]),
        prop::sample::select(vec![8usize, 16, 32]),
        prop::sample::select(vec![DType::Bf16, DType::F16, DType::F32]),
        prop::option::of(1usize..300),
        prop::sample::select(vec![1usize, 3, 16, 64]),
        prop::sample::select(CacheLayout::ALL.to_vec()),
        prop::sample::select(vec![BiasMode::Normal, BiasMode::Distinct]),
        requests,
        0usize..3,
        any::<u64>(),
    )
        .prop_map(
            |(heads, d, dtype, window, page, layout, bias, requests, padding, seed)| {
                let (extent, window_left) = match window {
                    Some(w) => (w, w as i64 - 1),
                    None => (1 + (seed % 200) as usize, -1),
                };
                GenSpec {
                    layout,
                    bias,
                    padding_rows: padding,
                    ..small_spec(dtype, heads, d, extent, window_left, page, requests, seed)
                }
            },
        )
}

pub fn max_abs(a: &Array3<f64>) -> f64 {
    a.iter().fold(0.0, |m, x| m.max(x.abs()))
}

pub fn max_abs_diff<D: ndarray::Dimension>(
    a: &ndarray::Array<f64, D>,
    b: &ndarray::Array<f64, D>,
) -> f64 {
    assert_eq!(a.shape(), b.shape());
    a.iter().zip(b).fold(0.0, |m, (x, y)| m.max((x - y).abs()))
}

/// `|a - b| <= rel * max|b| + 1e-300` element by element, on `out` and on `lse` (scale of `lse`:
/// max(1, |lse|)); a NaN on either side fails.
pub fn assert_close(a: &RefOutput, b: &RefOutput, rel: f64, what: &str) {
    assert_eq!(a.rows, b.rows, "{what}: rows");
    let tol = rel * max_abs(&b.out) + 1e-300;
    assert!(
        a.out.abs_diff_eq(&b.out, tol),
        "{what}: max|out diff| = {:e} > {tol:e}",
        max_abs_diff(&a.out, &b.out)
    );
    let tol = rel * b.lse.iter().fold(1.0f64, |m, x| m.max(x.abs()));
    assert!(
        a.lse.abs_diff_eq(&b.lse, tol),
        "{what}: max|lse diff| = {:e} > {tol:e}",
        max_abs_diff(&a.lse, &b.lse)
    );
}

/// Exact equality of outputs (bit for bit up to the sign of zero), with the first difference.
pub fn assert_identical(a: &RefOutput, b: &RefOutput, what: &str) {
    assert_eq!(a.rows, b.rows, "{what}: rows");
    assert_eq!(a.out.shape(), b.out.shape(), "{what}: shape");
    if let Some((ix, (x, y))) = a
        .out
        .indexed_iter()
        .zip(&b.out)
        .map(|((ix, x), y)| (ix, (x, y)))
        .find(|(_, (x, y))| x != y)
    {
        panic!("{what}: out differs at {ix:?}: {x} vs {y}");
    }
    if let Some((ix, (x, y))) = a
        .lse
        .indexed_iter()
        .zip(&b.lse)
        .map(|((ix, x), y)| (ix, (x, y)))
        .find(|(_, (x, y))| x != y)
    {
        panic!("{what}: lse differs at {ix:?}: {x} vs {y}");
    }
}

/// Every value of real rows finite, padding rows 0.
pub fn assert_finite_real_rows(p: &Problem, res: &RefOutput, what: &str) {
    for k in 0..res.num_rows() {
        let t = res.row(k);
        let real = t < p.real_rows();
        for h in 0..p.num_heads {
            let l = res.lse[[k, h]];
            assert!(
                if real { l.is_finite() } else { l == 0.0 },
                "{what}: lse[{t},{h}] = {l}"
            );
            for c in 0..p.head_dim {
                let x = res.out[[k, h, c]];
                assert!(
                    if real { x.is_finite() } else { x == 0.0 },
                    "{what}: out[{t},{h},{c}] = {x}"
                );
            }
        }
    }
}

/// How far the same-precision emulation may be from the f64 reference `ref_out` (worst case).
///
/// With u the dtype's unit roundoff (spacing/2): rounding each weight `p` to the dtype moves it
/// by at most u relative, so the weighted mean of V moves by at most u max|V|; rounding the
/// output adds u max|out|. f32 arithmetic (u32 = 2^-24): a score, summed in 8 lanes of D/8
/// terms plus a 3-level tree, scaled and biased, is off by at most about u32 (D/8 + 5) S, with S
/// bounding |score| (scale |q| |k| + max|bias|); exp turns twice that into a relative error of
/// the weights, and the sums over Lk keys (l and the accumulator) add Lk u32 each. Every term
/// scales with max|V| + max|out|; 1.25 covers the second-order terms.
pub fn emulation_bound(p: &Problem, ref_out: &Array3<f64>) -> f64 {
    let norm = |x: &[f32]| x.iter().map(|&a| (a as f64).powi(2)).sum::<f64>().sqrt();
    let (mut max_v, mut max_k) = (0.0f64, 0.0f64);
    for r in p.requests().filter(|r| r.q_len > 0) {
        for j in p.visible_keys(&r, 0).0..r.kv_len {
            for h in 0..p.num_kv_heads {
                max_v = p
                    .value(r.index, j, h)
                    .iter()
                    .fold(max_v, |m, &x| m.max(x.abs() as f64));
                max_k = max_k.max(norm(p.key(r.index, j, h)));
            }
        }
    }
    let real = p.real_rows();
    let mut max_q = 0.0f64;
    for t in 0..real {
        for h in 0..p.num_heads {
            max_q = max_q.max(norm(p.q.slice(ndarray::s![t, h, ..]).as_slice().unwrap()));
        }
    }
    let max_bias = p
        .rel_logits
        .slice(ndarray::s![..real, .., ..])
        .iter()
        .fold(0.0f64, |m, &x| m.max(x.abs() as f64));
    let score = p.softmax_scale.abs() * max_q * max_k + max_bias;
    let u = p.dtype.spacing_at_one() / 2.0;
    let u32 = 2f64.powi(-24);
    let f32_rel =
        u32 * (4.0 * (p.head_dim as f64 / 8.0 + 5.0) * score + 2.0 * p.max_kv_len() as f64 + 8.0);
    1.25 * (u + f32_rel) * (max_abs(ref_out) + max_v)
}
