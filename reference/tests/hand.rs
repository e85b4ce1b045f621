//! Tiny cases with expected values worked out by hand from docs/operator.md section 1.

use approx::{abs_diff_eq, assert_abs_diff_eq};
use ndarray::{Array2, Array3};
use relattn_reference::{emulate, fast, oracle, CacheLayout, DType, Problem, ProblemData};

const PAGE: usize = 2;

/// Per key: `Hkv * D` values.
type Rows = Vec<Vec<f32>>;

/// A hand-written case: fp32 values, contiguous cache in pages of 2, one spare NaN block.
struct Tiny {
    heads: usize,
    kv_heads: usize,
    d: usize,
    e: usize,
    scale: f64,
    window_left: i64,
    /// Per packed row: `H * D` values (NaN for padding rows).
    q: Vec<Vec<f32>>,
    /// Per packed row: `H * E` values.
    rel: Vec<Vec<f32>>,
    /// Per request: keys and values, each `[Lk][Hkv * D]`.
    kv: Vec<(Rows, Rows)>,
    cu: Vec<i32>,
}

impl Tiny {
    fn problem(&self) -> Problem {
        self.problem_in(DType::F32)
    }

    /// The case stored in `dtype` (its values must be exact in it).
    fn problem_in(&self, dtype: DType) -> Problem {
        let (h, hkv, d, e) = (self.heads, self.kv_heads, self.d, self.e);
        let t = self.q.len();
        let pages: Vec<usize> = self.kv.iter().map(|x| x.0.len().div_ceil(PAGE)).collect();
        let num_blocks = pages.iter().sum::<usize>() + 1;
        let (kview, vview, len) = CacheLayout::Contiguous.views(num_blocks, PAGE, hkv, d);
        let mut cache = vec![f32::NAN; len];
        let max_pages = pages.iter().copied().max().unwrap_or(0) + 1;
        let mut table = Array2::<i32>::from_elem((self.kv.len(), max_pages), num_blocks as i32 - 1);
        let mut next_block = 0i32;
        for (b, (keys, values)) in self.kv.iter().enumerate() {
            for (j, (k, v)) in keys.iter().zip(values).enumerate() {
                if j % PAGE == 0 {
                    table[[b, j / PAGE]] = next_block;
                    next_block += 1;
                }
                let block = table[[b, j / PAGE]] as usize;
                for kvh in 0..hkv {
                    for c in 0..d {
                        cache[kview.at(block, j % PAGE, kvh) + c] = k[kvh * d + c];
                        cache[vview.at(block, j % PAGE, kvh) + c] = v[kvh * d + c];
                    }
                }
            }
        }
        Problem::new(ProblemData {
            dtype,
            num_heads: h,
            num_kv_heads: hkv,
            head_dim: d,
            rel_extent: e,
            page_size: PAGE,
            num_blocks,
            softmax_scale: self.scale,
            window_left: self.window_left,
            q: Array3::from_shape_fn((t, h, d), |(r, x, c)| self.q[r][x * d + c]),
            rel_logits: Array3::from_shape_fn((t, h, e), |(r, x, c)| self.rel[r][x * e + c]),
            kv: cache,
            layout: CacheLayout::Contiguous,
            rows: Default::default(),
            k: kview,
            v: vview,
            block_table: table,
            seqused_k: self.kv.iter().map(|x| x.0.len() as i32).collect(),
            cu_seqlens_q: self.cu.clone(),
        })
        .unwrap()
    }
}

/// Softmax-weighted mean of `v` under scores `s`, and the LSE, spelled out.
fn softmax_mean(s: &[f64], v: &[f64]) -> (f64, f64) {
    let weights: Vec<f64> = s.iter().map(|x| x.exp()).collect();
    let total: f64 = weights.iter().sum();
    let mean = weights.iter().zip(v).map(|(w, x)| w * x).sum::<f64>() / total;
    (mean, total.ln())
}

/// Check oracle and fast to 1e-14 and the fp32 emulation to 1e-6 against `(t, h, out, lse)`.
fn check(p: &Problem, expected: &[(usize, usize, Vec<f64>, f64)]) {
    let results = [
        ("oracle", oracle::attention(p), 1e-14),
        ("fast", fast::attention(p), 1e-14),
        ("emulate", emulate::attention(p), 1e-6),
    ];
    for (name, res, tol) in &results {
        for (t, h, out, lse) in expected {
            for (c, want) in out.iter().enumerate() {
                let got = res.out[[*t, *h, c]];
                assert!(
                    abs_diff_eq!(got, want, epsilon = tol * want.abs().max(1.0)),
                    "{name}: out[{t},{h},{c}] = {got}, expected {want}"
                );
            }
            let got = res.lse[[*t, *h]];
            assert!(
                abs_diff_eq!(got, lse, epsilon = tol * lse.abs().max(1.0)),
                "{name}: lse[{t},{h}] = {got}, expected {lse}"
            );
        }
        for t in p.real_rows()..p.total_rows() {
            assert!(
                res.out
                    .slice(ndarray::s![t, .., ..])
                    .iter()
                    .all(|&x| x == 0.0),
                "{name}: padding row {t}"
            );
        }
    }
}

#[test]
fn single_key_returns_its_value() {
    // s = 0.25 * (1*3 + 2*(-1)) + 0.75 = 1: softmax of one key is 1, so out = v, lse = s.
    let case = Tiny {
        heads: 1,
        kv_heads: 1,
        d: 2,
        e: 1,
        scale: 0.25,
        window_left: -1,
        q: vec![vec![1.0, 2.0]],
        rel: vec![vec![0.75]],
        kv: vec![(vec![vec![3.0, -1.0]], vec![vec![0.5, -2.0]])],
        cu: vec![0, 1],
    };
    check(&case.problem(), &[(0, 0, vec![0.5, -2.0], 1.0)]);
}

#[test]
fn bias_only_below_extent_and_never_scaled() {
    // One query at position P = 3 over keys 0..4: d = 3, 2, 1, 0 with E = 2, so the bias is
    // 0, 0 (d = E + 1 and d = E: zero, not rel[E - 1]), rel[1] (d = E - 1), rel[0].
    // scale * q * k = 0.5 * 2 * k = k; the bias is added unscaled.
    let case = Tiny {
        heads: 1,
        kv_heads: 1,
        d: 1,
        e: 2,
        scale: 0.5,
        window_left: -1,
        q: vec![vec![2.0]],
        rel: vec![vec![-0.5, 3.0]],
        kv: vec![(
            vec![vec![0.5], vec![1.0], vec![-1.0], vec![0.25]],
            vec![vec![1.0], vec![10.0], vec![100.0], vec![1000.0]],
        )],
        cu: vec![0, 1],
    };
    let s = [0.5, 1.0, -1.0 + 3.0, 0.25 - 0.5];
    let (out, lse) = softmax_mean(&s, &[1.0, 10.0, 100.0, 1000.0]);
    check(&case.problem(), &[(0, 0, vec![out], lse)]);
}

#[test]
fn window_edges_and_chunk_offset() {
    // Local layer, window_left = 1 (E = 2), Lq = 2 new tokens after P = 3 cached ones.
    // Row 0 is position 3: keys 2 (d = 1) and 3 (d = 0). Row 1 is position 4: keys 3, 4.
    // Keys 0 and 1 precede every window and hold NaN: reading them would show.
    let nan = f32::NAN;
    let case = Tiny {
        heads: 1,
        kv_heads: 1,
        d: 1,
        e: 2,
        scale: 1.0,
        window_left: 1,
        q: vec![vec![1.0], vec![-1.0]],
        rel: vec![vec![0.5, 0.25], vec![-0.5, 2.0]],
        kv: vec![(
            vec![vec![nan], vec![nan], vec![1.0], vec![2.0], vec![3.0]],
            vec![vec![nan], vec![nan], vec![4.0], vec![8.0], vec![16.0]],
        )],
        cu: vec![0, 2],
    };
    // Row 0: s(key 2) = 1*1 + rel[1] = 1.25, s(key 3) = 1*2 + rel[0] = 2.5.
    let (o0, l0) = softmax_mean(&[1.25, 2.5], &[4.0, 8.0]);
    // Row 1: s(key 3) = -2 + rel[1] = 0, s(key 4) = -3 + rel[0] = -3.5.
    let (o1, l1) = softmax_mean(&[0.0, -3.5], &[8.0, 16.0]);
    check(
        &case.problem(),
        &[(0, 0, vec![o0], l0), (1, 0, vec![o1], l1)],
    );
}

#[test]
fn window_of_zero_sees_only_itself() {
    // window_left = 0: each query sees only d = 0, so out = v[P + i], lse = s.
    let nan = f32::NAN;
    let case = Tiny {
        heads: 1,
        kv_heads: 1,
        d: 1,
        e: 1,
        scale: 1.0,
        window_left: 0,
        q: vec![vec![2.0], vec![3.0]],
        rel: vec![vec![0.5], vec![-1.0]],
        kv: vec![(
            vec![vec![nan], vec![1.0], vec![2.0]],
            vec![vec![nan], vec![-7.0], vec![9.0]],
        )],
        cu: vec![0, 2],
    };
    check(
        &case.problem(),
        &[(0, 0, vec![-7.0], 2.5), (1, 0, vec![9.0], 5.0)],
    );
}

#[test]
fn gqa_head_reads_kv_head_h_over_g() {
    // H = 4, Hkv = 2 (G = 2): heads 0, 1 read KV head 0; heads 2, 3 read KV head 1.
    // One query at position 1 over keys 0 (d = 1) and 1 (d = 0); bias per query head.
    let case = Tiny {
        heads: 4,
        kv_heads: 2,
        d: 1,
        e: 2,
        scale: 1.0,
        window_left: -1,
        q: vec![vec![1.0, 2.0, 1.0, -1.0]],
        rel: vec![vec![0.0, 0.0, 1.0, 0.0, 0.0, 0.5, 0.0, 0.0]],
        kv: vec![(
            vec![vec![1.0, -1.0], vec![0.0, 2.0]],
            vec![vec![3.0, 5.0], vec![6.0, 7.0]],
        )],
        cu: vec![0, 1],
    };
    // Head h: s(key 0) = q_h * k0[kvh] + rel[h][1], s(key 1) = q_h * k1[kvh] + rel[h][0].
    let (o0, l0) = softmax_mean(&[1.0, 0.0], &[3.0, 6.0]);
    let (o1, l1) = softmax_mean(&[2.0, 1.0], &[3.0, 6.0]);
    let (o2, l2) = softmax_mean(&[-1.0 + 0.5, 2.0], &[5.0, 7.0]);
    let (o3, l3) = softmax_mean(&[1.0, -2.0], &[5.0, 7.0]);
    check(
        &case.problem(),
        &[
            (0, 0, vec![o0], l0),
            (0, 1, vec![o1], l1),
            (0, 2, vec![o2], l2),
            (0, 3, vec![o3], l3),
        ],
    );
}

#[test]
fn zero_length_request_in_the_middle_and_padding() {
    // Requests: (Lq 1, Lk 2), (Lq 0, Lk 3), (Lq 1, Lk 1); then one NaN padding row.
    // Row 1 belongs to request 2 (not 1) and reads its own cache and its own bias row.
    let nan = f32::NAN;
    let case = Tiny {
        heads: 1,
        kv_heads: 1,
        d: 1,
        e: 4,
        scale: 0.5,
        window_left: -1,
        q: vec![vec![2.0], vec![4.0], vec![nan]],
        rel: vec![
            vec![1.0, 2.0, 3.0, 4.0],
            vec![-1.0, -2.0, -3.0, -4.0],
            vec![nan; 4],
        ],
        kv: vec![
            (vec![vec![1.0], vec![-1.0]], vec![vec![2.0], vec![-2.0]]),
            (vec![vec![nan]; 3], vec![vec![nan]; 3]),
            (vec![vec![0.5]], vec![vec![11.0]]),
        ],
        cu: vec![0, 1, 1, 2],
    };
    // Row 0 at position 1: s(key 0) = 0.5*2*1 + rel[1] = 3, s(key 1) = -1 + rel[0] = 0.
    let (o0, l0) = softmax_mean(&[3.0, 0.0], &[2.0, -2.0]);
    // Row 1 at position 0 of request 2: one key, s = 0.5*4*0.5 + (-1) = 0.
    check(
        &case.problem(),
        &[(0, 0, vec![o0], l0), (1, 0, vec![11.0], 0.0)],
    );
}

#[test]
fn emulation_rounds_the_weights_but_not_their_sum() {
    // bf16, one query at position 1: s(key 0) = 0 + rel[1] = 0, s(key 1) = 0 + rel[0] = -1,
    // log2(e) and -log2(e) in the log2 domain. Both keys share one 128-key tile, so m = 0:
    // p = [1, 2^-log2(e)] in f32; l sums the f32 p; P V uses p rounded to bf16; the output is
    // rounded to bf16 after the f32 division.
    let case = Tiny {
        heads: 1,
        kv_heads: 1,
        d: 1,
        e: 2,
        scale: 1.0,
        window_left: -1,
        q: vec![vec![1.0]],
        rel: vec![vec![-1.0, 0.0]],
        kv: vec![(vec![vec![0.0], vec![0.0]], vec![vec![0.0], vec![64.0]])],
        cu: vec![0, 1],
    };
    let p = case.problem_in(DType::Bf16);
    let to_bf16 = |x: f32| half::bf16::from_f32(x).to_f32();
    let p1 = (-std::f32::consts::LOG2_E).exp2();
    let l = 1.0f32 + p1;
    let want = to_bf16((to_bf16(p1) * 64.0) / l);
    let emu = emulate::attention(&p);
    assert_eq!(emu.out[[0, 0, 0]], want as f64);
    assert_eq!(emu.lse[[0, 0]], (l as f64).log2() * std::f64::consts::LN_2);
    // Rounding p shows: e^-1 = 0.3679 becomes 0.3672, 23.54 / 1.368 = 17.21 becomes
    // 23.5 / 1.368 = 17.18, which bf16 rounds to 17.125 where the exact 17.21 rounds to 17.25.
    assert_eq!(want, 17.125);
    let exact = 64.0 * (-1.0f64).exp() / (1.0 + (-1.0f64).exp());
    assert_abs_diff_eq!(oracle::attention(&p).out[[0, 0, 0]], exact, epsilon = 1e-12);
    assert_eq!(to_bf16(exact as f32), 17.25);
}

#[test]
fn emulation_keeps_scores_in_the_log2_domain() {
    // fp32, one query at position 1, both keys at bias 32384 (large_logits' size), dot products
    // 0 and 0.5. Flash kernels score `fma(dot, scale log2(e), bias log2(e))` near 46,720, where
    // f32's spacing is 2^-8, then take exp2 of the difference to the max: the weight of key 0 is
    // 2^(s0 - s1) with s0 - s1 a multiple of 2^-8, not e^-0.5. The emulation computes exactly that.
    let case = Tiny {
        heads: 1,
        kv_heads: 1,
        d: 1,
        e: 2,
        scale: 1.0,
        window_left: -1,
        q: vec![vec![1.0]],
        rel: vec![vec![32384.0, 32384.0]],
        kv: vec![(vec![vec![0.0], vec![0.5]], vec![vec![0.0], vec![1.0]])],
        cu: vec![0, 1],
    };
    let p = case.problem();
    let log2e = std::f32::consts::LOG2_E;
    let bias2 = 32384.0f32 * log2e;
    let (s0, s1) = (0.0f32.mul_add(log2e, bias2), 0.5f32.mul_add(log2e, bias2));
    let w0 = (s0 - s1).exp2();
    let l = w0 + 1.0;
    let emu = emulate::attention(&p);
    assert_eq!(emu.out[[0, 0, 0]], (1.0 / l) as f64);
    assert_eq!(
        emu.lse[[0, 0]],
        (s1 as f64 + (l as f64).log2()) * std::f64::consts::LN_2
    );
    // The rounding of the scores moved the weight by more than f32 arithmetic on the natural
    // scores (whose difference 0.5 is exact) would: this is the error rule (a) scales with.
    let natural = 1.0 / (1.0 + (-0.5f32).exp());
    let exact = 1.0 / (1.0 + (-0.5f64).exp());
    assert!(
        (emu.out[[0, 0, 0]] - exact).abs() > 1e-4,
        "{}",
        emu.out[[0, 0, 0]]
    );
    assert!((natural as f64 - exact).abs() < 1e-7);
    assert_abs_diff_eq!(oracle::attention(&p).out[[0, 0, 0]], exact, epsilon = 1e-12);
}
