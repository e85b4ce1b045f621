//! What each input regime is for, shown on the reference: where the softmax weight goes, and
//! that a regime changes values only.

use relattn_reference::gen::{generate, GenSpec};
use relattn_reference::{fast, oracle, DType, Inputs, Problem};

/// Decode rows of a global layer (E = 1024): 4 requests of 1,024 keys, 16 heads.
fn decode_spec(inputs: Inputs, dtype: DType) -> GenSpec {
    GenSpec {
        dtype,
        inputs,
        ..GenSpec::global(16, 2, vec![(1, 1024); 4], 7)
    }
}

/// Per (row, head) of the real rows: `f(lse over keys [lo, hi))` for each range.
fn range_lse(p: &Problem, lo: impl Fn(usize) -> usize, hi: impl Fn(usize) -> usize) -> Vec<f64> {
    let part = oracle::attention_key_range(p, |r| (lo(r.kv_len), hi(r.kv_len)));
    part.lse
        .outer_iter()
        .take(p.real_rows())
        .flat_map(|row| row.to_vec())
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// |LSE of split 1 - LSE of split 2| per (row, head), two splits of 512 keys.
fn split_gap(inputs: Inputs) -> f64 {
    let p = generate(&decode_spec(inputs, DType::Bf16)).unwrap();
    let a = range_lse(&p, |_| 0, |k| k / 2);
    let b = range_lse(&p, |k| k / 2, |k| k);
    median(a.iter().zip(&b).map(|(x, y)| (x - y).abs()).collect())
}

/// Share of the softmax weight on keys `[lo, hi)`, median over (row, head).
fn weight_on(inputs: Inputs, lo: impl Fn(usize) -> usize, hi: impl Fn(usize) -> usize) -> f64 {
    let p = generate(&decode_spec(inputs, DType::Bf16)).unwrap();
    let all = range_lse(&p, |_| 0, |k| k);
    let part = range_lse(&p, lo, hi);
    median(part.iter().zip(&all).map(|(x, y)| (x - y).exp()).collect())
}

#[test]
fn peaked_splits_have_lses_many_units_apart_rms1_not() {
    let peaked = split_gap(Inputs::Peaked);
    let flat = split_gap(Inputs::Rms1);
    eprintln!("median split LSE gap: peaked {peaked:.2}, rms1 {flat:.3}");
    assert!(peaked >= 4.0, "peaked: median split LSE gap {peaked}");
    assert!(flat < 1.0, "rms1: median split LSE gap {flat}");
}

#[test]
fn sink_puts_most_weight_on_the_first_keys() {
    let sink = weight_on(Inputs::Sink, |_| 0, |_| 4);
    let flat = weight_on(Inputs::Rms1, |_| 0, |_| 4);
    eprintln!("median weight on keys 0..4: sink {sink:.3}, rms1 {flat:.4}");
    assert!(sink > 0.5, "sink: weight on keys 0..4 is {sink}");
    assert!(flat < 0.02, "rms1: weight on keys 0..4 is {flat}");
}

#[test]
fn diagonal_puts_most_weight_on_the_newest_keys() {
    let diag = weight_on(Inputs::Diagonal, |k| k - 3, |k| k);
    let flat = weight_on(Inputs::Rms1, |k| k - 3, |k| k);
    eprintln!("median weight on d < 3: diagonal {diag:.3}, rms1 {flat:.4}");
    assert!(diag > 0.5, "diagonal: weight on d < 3 is {diag}");
    assert!(flat < 0.02, "rms1: weight on d < 3 is {flat}");
}

#[test]
fn large_logits_reach_thousands_and_stay_finite_in_fp16() {
    let p = generate(&decode_spec(Inputs::LargeLogits, DType::F16)).unwrap();
    let lse = range_lse(&p, |_| 0, |k| k);
    let m = median(lse.iter().map(|x| x.abs()).collect());
    assert!(m > 5000.0, "large_logits: median |LSE| {m}");
    let d = p.data();
    assert!(d.rel_logits.iter().all(|x| x.is_finite()));
    assert!(d
        .q
        .iter()
        .take(p.real_rows() * 16 * 128)
        .all(|x| x.is_finite()));
    let out = fast::attention(&p);
    assert!(out.out.iter().all(|x| x.is_finite()));
    let flat = generate(&decode_spec(Inputs::Rms1, DType::F16)).unwrap();
    let m_flat = median(
        range_lse(&flat, |_| 0, |k| k)
            .iter()
            .map(|x| x.abs())
            .collect(),
    );
    eprintln!("median |LSE|: large_logits {m:.0}, rms1 {m_flat:.2}");
    assert!(m_flat < 10.0, "rms1: median |LSE| {m_flat}");
}

#[test]
fn regimes_change_values_only_and_keep_the_poison() {
    let base = generate(&decode_spec(Inputs::Rms1, DType::Bf16)).unwrap();
    let nan = |p: &Problem| p.data().kv.iter().filter(|x| x.is_nan()).count();
    for inputs in Inputs::ALL {
        let p = generate(&decode_spec(inputs, DType::Bf16)).unwrap();
        let (a, b) = (p.data(), base.data());
        assert_eq!(a.block_table, b.block_table, "{inputs:?}");
        assert_eq!(a.q.shape(), b.q.shape(), "{inputs:?}");
        assert_eq!(nan(&p), nan(&base), "{inputs:?}: poisoned slots");
        let bits = |d: &relattn_reference::ProblemData| -> Vec<u32> {
            d.q.iter()
                .chain(d.rel_logits.iter())
                .chain(d.kv.iter())
                .map(|x| x.to_bits())
                .collect()
        };
        assert_eq!(bits(a) == bits(b), inputs == Inputs::Rms1, "{inputs:?}");
        // Every value is one the dtype holds.
        assert!(a.q.iter().all(|&x| x.is_nan() || DType::Bf16.round(x) == x));
        assert!(a
            .kv
            .iter()
            .all(|&x| x.is_nan() || DType::Bf16.round(x) == x));
    }
}

#[test]
fn regime_names_round_trip() {
    for inputs in Inputs::ALL {
        assert_eq!(inputs.name().parse::<Inputs>(), Ok(inputs));
    }
    let e = "flat".parse::<Inputs>().unwrap_err();
    assert!(e.contains("rms1") && e.contains("large_logits"), "{e}");
}

#[test]
fn a_spec_the_problem_refuses_is_refused_under_every_regime_without_a_panic() {
    for inputs in Inputs::ALL {
        let spec = GenSpec {
            inputs,
            ..GenSpec::global(6, 4, vec![(1, 10)], 1)
        };
        assert!(generate(&spec).is_err(), "{inputs:?}");
    }
}
