//! Property tests of the references over random small problems (docs/operator.md section 1
//! invariants).

mod common;

use common::{
    arb_spec, assert_close, assert_identical, emulation_bound, max_abs, max_abs_diff, Dense,
};
use ndarray::{s, Array3};
use proptest::prelude::*;
use relattn_reference::gen::generate;
use relattn_reference::{emulate, fast, oracle, BiasMode, CacheLayout, DType, Problem, RefOutput};

/// All three references of a problem.
fn all(p: &Problem) -> [RefOutput; 3] {
    [
        oracle::attention(p),
        fast::attention(p),
        emulate::attention(p),
    ]
}

fn assert_all_identical(a: &Problem, b: &Problem, what: &str) {
    for (name, (x, y)) in ["oracle", "fast", "emulate"]
        .iter()
        .zip(all(a).iter().zip(all(b).iter()))
    {
        assert_identical(x, y, &format!("{what} ({name})"));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// The fast reference equals the naive oracle to 1e-12 relative, in full and sampled mode.
    #[test]
    fn fast_equals_oracle(spec in arb_spec()) {
        let p = generate(&spec).unwrap();
        let want = oracle::attention(&p);
        let got = fast::attention(&p);
        assert_close(&got, &want, 1e-12, "fast vs oracle");
        let rows: Vec<usize> = (0..p.total_rows()).step_by(3).collect();
        let sampled = fast::attention_rows(&p, &rows);
        for (k, &t) in sampled.rows.as_ref().unwrap().iter().enumerate() {
            prop_assert_eq!(sampled.out.slice(s![k, .., ..]), got.out.slice(s![t, .., ..]));
            prop_assert_eq!(sampled.lse.row(k), got.lse.row(t));
        }
    }

    /// A paged cache (small shuffled pages, any layout) gives the same bits as one page per
    /// request in order.
    #[test]
    fn paged_equals_dense(spec in arb_spec()) {
        let p = generate(&spec).unwrap();
        let dense = Dense::from_problem(&p);
        let one_page = dense.to_problem(dense.max_kv_len().max(1), CacheLayout::Contiguous, None);
        assert_all_identical(&p, &one_page, "paged vs dense");
    }

    /// Any permutation of the physical pages, and any of the three cache layouts, gives
    /// identical output.
    #[test]
    fn pages_and_layouts_do_not_matter(spec in arb_spec(), perm in any::<u64>()) {
        let p = generate(&spec).unwrap();
        let dense = Dense::from_problem(&p);
        let base = dense.to_problem(spec.page_size, CacheLayout::Contiguous, None);
        for layout in CacheLayout::ALL {
            let other = dense.to_problem(spec.page_size, layout, Some(perm));
            assert_all_identical(&base, &other, &format!("pages shuffled, {layout}"));
        }
    }

    /// GQA equals repeating each KV head G times (H = Hkv).
    #[test]
    fn gqa_equals_repeated_kv_heads(spec in arb_spec()) {
        let p = generate(&spec).unwrap();
        let mut dense = Dense::from_problem(&p);
        let g = p.group();
        let repeat = |a: &Array3<f32>| {
            Array3::from_shape_fn((a.shape()[0], p.num_heads, a.shape()[2]), |(j, h, c)| a[[j, h / g, c]])
        };
        dense.k = dense.k.iter().map(repeat).collect();
        dense.v = dense.v.iter().map(repeat).collect();
        dense.num_kv_heads = p.num_heads;
        let mha = dense.to_problem(spec.page_size, spec.layout, None);
        assert_all_identical(&p, &mha, "GQA vs repeated KV heads");
    }

    /// Splitting every request's prefill into chunks (each chunk a request whose cache holds
    /// the earlier chunks) gives identical rows.
    #[test]
    fn chunked_prefill_gives_identical_rows(spec in arb_spec(), cuts in prop::collection::vec(0.0f64..1.0, 1..3)) {
        let p = generate(&spec).unwrap();
        let dense = Dense::from_problem(&p);
        let mut chunked = dense.clone();
        chunked.k.clear();
        chunked.v.clear();
        chunked.cu_seqlens_q = vec![0];
        for r in p.requests() {
            let mut bounds: Vec<usize> = cuts.iter().map(|c| (c * r.q_len as f64) as usize).collect();
            bounds.push(r.q_len);
            bounds.sort_unstable();
            let mut start = 0;
            for end in bounds {
                // Chunk [start, end) of the new tokens: Lk = P + end.
                let lk = r.prefix() + end;
                chunked.k.push(dense.k[r.index].slice(s![..lk, .., ..]).to_owned());
                chunked.v.push(dense.v[r.index].slice(s![..lk, .., ..]).to_owned());
                chunked.cu_seqlens_q.push((r.q_start + end) as i32);
                start = end;
            }
            debug_assert_eq!(start, r.q_len);
        }
        let cp = chunked.to_problem(spec.page_size, spec.layout, Some(spec.seed));
        assert_all_identical(&p, &cp, "chunked prefill");
    }

    /// Merging per-range partials by their LSE (docs/operator.md section 4.3) equals the whole.
    #[test]
    fn lse_merge_of_partials_equals_whole(spec in arb_spec(), cuts in prop::collection::vec(0.0f64..1.0, 1..4)) {
        let p = generate(&spec).unwrap();
        let whole = oracle::attention(&p);
        let mut parts = Vec::new();
        for k in 0..=cuts.len() {
            let cut = |r: &relattn_reference::Request, k: usize| -> usize {
                let mut c: Vec<usize> = cuts.iter().map(|c| (c * r.kv_len as f64) as usize).collect();
                c.sort_unstable();
                if k == 0 { 0 } else if k > c.len() { r.kv_len } else { c[k - 1] }
            };
            parts.push(oracle::attention_key_range(&p, |r| (cut(r, k), cut(r, k + 1))));
        }
        let merged = oracle::merge_partials(&p, &parts).unwrap();
        assert_close(&merged, &whole, 1e-12, "merged partials vs whole");
    }

    /// The emulation stays within what its roundings allow (`common::emulation_bound`).
    #[test]
    fn emulation_within_dtype_bound(spec in arb_spec()) {
        let p = generate(&spec).unwrap();
        let ref64 = oracle::attention(&p);
        let emu = emulate::attention(&p);
        let bound = emulation_bound(&p, &ref64.out);
        let err = max_abs_diff(&emu.out, &ref64.out);
        prop_assert!(err <= bound, "{}: max|emu - ref64| = {:e} > {:e}", p.dtype, err, bound);
        // And it is a real emulation: bf16 and fp16 outputs are values of the dtype.
        prop_assert!(emu.out.iter().all(|&x| p.dtype.round(x as f32) as f64 == x));
    }

    /// Zero bias is plain causal attention, checked against an independent dense softmax.
    #[test]
    fn zero_bias_is_plain_causal_attention(spec in arb_spec()) {
        let spec = relattn_reference::GenSpec { bias: BiasMode::Zero, window_left: -1, ..spec };
        let p = generate(&spec).unwrap();
        let dense = Dense::from_problem(&p);
        let want = plain_causal(&dense);
        for (name, got) in [("oracle", oracle::attention(&p)), ("fast", fast::attention(&p))] {
            let real = p.real_rows();
            let got = got.out.slice(s![..real, .., ..]).to_owned();
            prop_assert!(
                got.abs_diff_eq(&want, 1e-12 * max_abs(&want) + 1e-300),
                "{}: {:e}",
                name,
                max_abs_diff(&got, &want)
            );
        }
    }
}

/// softmax(scale Q K^T + causal mask) V per request and head, in f64, from dense tensors.
fn plain_causal(x: &Dense) -> Array3<f64> {
    let real = *x.cu_seqlens_q.last().unwrap() as usize;
    let g = x.num_heads / x.num_kv_heads;
    let mut out = Array3::<f64>::zeros((real, x.num_heads, x.head_dim));
    for (b, k) in x.k.iter().enumerate() {
        let (q0, q1) = (x.cu_seqlens_q[b] as usize, x.cu_seqlens_q[b + 1] as usize);
        let lk = k.shape()[0];
        for t in q0..q1 {
            let visible = lk - (q1 - t) + 1; // keys 0..=P+i
            for h in 0..x.num_heads {
                let scores: Vec<f64> = (0..visible)
                    .map(|j| {
                        let dot: f64 = (0..x.head_dim)
                            .map(|c| x.q[[t, h, c]] as f64 * k[[j, h / g, c]] as f64)
                            .sum();
                        x.softmax_scale * dot
                    })
                    .collect();
                let top = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let w: Vec<f64> = scores.iter().map(|s| (s - top).exp()).collect();
                let total: f64 = w.iter().sum();
                for c in 0..x.head_dim {
                    out[[t, h, c]] = (0..visible)
                        .map(|j| w[j] * x.v[b][[j, h / g, c]] as f64)
                        .sum::<f64>()
                        / total;
                }
            }
        }
    }
    out
}

#[test]
fn emulation_in_fp32_is_close_to_f64() {
    // fp32 has no rounding of p or out: only f32 arithmetic separates it from f64.
    let spec = common::small_spec(
        DType::F32,
        (4, 2),
        32,
        64,
        -1,
        16,
        vec![(20, 300), (5, 5)],
        7,
    );
    let p = generate(&spec).unwrap();
    let err = max_abs_diff(&emulate::attention(&p).out, &oracle::attention(&p).out);
    assert!(err < 1e-5, "fp32 emulation error {err:e}");
    assert!(
        err > 0.0,
        "fp32 emulation should not be bit-identical to f64"
    );
}
