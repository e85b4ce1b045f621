//! Judging a GPU result against the reference (docs/operator.md section 6): the judge every command
//! and test uses, and the one tolerance type it takes, with the defaults of each dtype.

mod text;

pub use text::{describe, location};

use crate::{DType, Problem, RefOutput};
use ndarray::Array3;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

/// The judgement constants of one dtype:
/// `(a) max|out - ref64| <= rtol * max|ref_lp - ref64| + atol` and
/// `(b) |out - ref64| <= atol2 + rtol2 * |ref64|` elementwise.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Tolerance {
    pub rtol: f64,
    pub atol: f64,
    pub atol2: f64,
    pub rtol2: f64,
}

impl Tolerance {
    /// docs/operator.md section 6's defaults for `dtype`, the only place they are written down:
    /// `rtol = 2`, `atol` the dtype's spacing at 1.0 (so rule (a)'s bound is never zero), and
    /// `atol2 = rtol2` = 2e-2 (bf16), 5e-3 (fp16), 1e-5 (fp32), so rule (b) is never looser than
    /// vLLM's flat check. A matrix file may override any of them (`[tolerance.<dtype>]`).
    pub fn default_for(dtype: DType) -> Tolerance {
        let flat = match dtype {
            DType::Bf16 => 2e-2,
            DType::F16 => 5e-3,
            DType::F32 => 1e-5,
        };
        Tolerance {
            rtol: 2.0,
            atol: dtype.spacing_at_one(),
            atol2: flat,
            rtol2: flat,
        }
    }
}

/// One output element: where it is, its value, the reference's, and the bound it is held to.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Element {
    /// Packed row `t`, query head `h`, dim `c`.
    pub t: usize,
    pub h: usize,
    pub c: usize,
    pub out: f64,
    pub reference: f64,
    /// What the rule that names this element allows `|out - ref64|` to be there.
    pub bound: f64,
}

impl Element {
    /// `|out - ref64|`; a NaN output counts as an infinite error.
    pub fn error(&self) -> f64 {
        let e = (self.out - self.reference).abs();
        if e.is_nan() {
            f64::INFINITY
        } else {
            e
        }
    }

    /// How much of its bound the error uses (above 1 fails; NaN when the bound or the
    /// reference is NaN, which fails too).
    pub fn ratio(&self) -> f64 {
        self.error() / self.bound
    }

    /// Whether the error is within the bound. Fails closed: a NaN bound or a NaN reference
    /// holds nothing (every comparison with NaN is false, so `error > bound` would pass it).
    pub fn within(&self) -> bool {
        self.error() <= self.bound
    }
}

/// How one rule went on the judged elements.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct RuleOutcome {
    /// Elements whose error exceeds their bound.
    pub over: usize,
    /// The element with the largest error relative to its bound (None: nothing judged).
    pub worst: Option<Element>,
}

impl RuleOutcome {
    fn note(&mut self, e: Element) {
        if !e.within() {
            self.over += 1;
        }
        if self.worst.is_none_or(|w| e.ratio() > w.ratio()) {
            self.worst = Some(e);
        }
    }
}

/// What a judgement measured, and whether the output passed.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub pass: bool,
    pub max_abs: f64,
    pub mean_abs: f64,
    pub rel_l2: f64,
    /// Rule (a)'s bound.
    pub bound: f64,
    /// Worst of `max_abs / bound` and the largest elementwise `|out - ref| / (atol2 + rtol2 |ref|)`:
    /// above 1 fails.
    pub ratio: f64,
    /// First failing element as `t:h:c`.
    pub first_bad: Option<String>,
    /// Elements judged: judged rows x H x D.
    pub judged: usize,
    /// Whether the judged rows are a sample of the real rows.
    pub sampled: bool,
    /// Real output elements that are NaN or infinite, and the first of them as `(t, h, c)`.
    pub non_finite: usize,
    pub first_non_finite: Option<(usize, usize, usize)>,
    /// Judged elements whose reference (`ref64` or `ref_lp`) is NaN or infinite, and the first
    /// as `(t, h, c)`: the case's inputs were not finite there, so nothing can pass.
    pub reference_non_finite: usize,
    pub first_reference_non_finite: Option<(usize, usize, usize)>,
    pub padding_intact: bool,
    pub counters_left: usize,
    /// Rule (a): every element against the one bound `rtol * max|ref_lp - ref64| + atol`.
    pub rule_a: RuleOutcome,
    /// Rule (b): every element against its own `atol2 + rtol2 * |ref64|`.
    pub rule_b: RuleOutcome,
    /// Why it failed, in one line (`describe`); empty on a pass.
    pub reason: String,
}

/// Padding rows (`cu_seqlens_q[B] <= t < T`) all NaN, as poisoned before a run whose padding
/// bits are not known here (workers, `relattn judge`).
pub fn padding_is_nan(problem: &Problem, out: &Array3<f32>) -> bool {
    out.outer_iter()
        .skip(problem.real_rows())
        .all(|row| row.iter().all(|x| x.is_nan()))
}

/// An element's (row, head, column).
type Element3 = (usize, usize, usize);

/// How many elements of the first `rows` rows of `out` are not finite, and the first of them
/// (row, head, column), in parallel over rows.
fn non_finite_rows(out: &Array3<f32>, rows: usize) -> (usize, Option<Element3>) {
    let per_row: Vec<(usize, Option<Element3>)> = (0..rows.min(out.shape()[0]))
        .into_par_iter()
        .map(|t| {
            let mut n = 0;
            let mut first = None;
            for ((hh, c), x) in out.slice(ndarray::s![t, .., ..]).indexed_iter() {
                if !x.is_finite() {
                    first.get_or_insert((t, hh, c));
                    n += 1;
                }
            }
            (n, first)
        })
        .collect();
    let n = per_row.iter().map(|r| r.0).sum();
    (n, per_row.into_iter().find_map(|r| r.1))
}

/// Judge `out` (`[T, H, D]`, as read back from the device) on the rows of `ref64`.
///
/// `padding_intact` says whether the padding rows are bit-identical to what they held before
/// the launch (checked where the bits are known); `counters_left`, how many decode merge counters
/// the launch left non-zero (each must be reset for the next launch on the same workspace).
pub fn judge(
    problem: &Problem,
    out: &Array3<f32>,
    ref64: &RefOutput,
    ref_lp: &RefOutput,
    tolerance: &Tolerance,
    padding_intact: bool,
    counters_left: usize,
) -> Verdict {
    let (h, d) = (problem.num_heads, problem.head_dim);

    // Every real row written and finite (even in sampled mode: the check is cheap).
    let (non_finite, first_non_finite) = non_finite_rows(out, problem.real_rows());

    // Rule (a)'s bound from the emulation's own error.
    let judged: Vec<usize> = (0..ref64.num_rows())
        .filter(|&k| ref64.row(k) < problem.real_rows())
        .collect();
    let mut lp_err = 0f64;
    let (mut reference_non_finite, mut first_reference_non_finite) = (0usize, None);
    for &k in &judged {
        for hh in 0..h {
            for c in 0..d {
                let (r64, rlp) = (ref64.out[[k, hh, c]], ref_lp.out[[k, hh, c]]);
                if !r64.is_finite() || !rlp.is_finite() {
                    reference_non_finite += 1;
                    first_reference_non_finite.get_or_insert((ref64.row(k), hh, c));
                }
                let e = (rlp - r64).abs();
                if e > lp_err || e.is_nan() {
                    lp_err = e;
                }
            }
        }
    }
    let bound = tolerance.rtol * lp_err + tolerance.atol;

    let (mut sum_abs, mut sum_d2, mut sum_r2, mut n) = (0f64, 0f64, 0f64, 0usize);
    let (mut rule_a, mut rule_b) = (RuleOutcome::default(), RuleOutcome::default());
    let (mut first_a, mut first_b) = (None, None);
    for &k in &judged {
        let t = ref64.row(k);
        for hh in 0..h {
            for c in 0..d {
                let reference = ref64.out[[k, hh, c]];
                let at = |bound| Element {
                    t,
                    h: hh,
                    c,
                    out: out[[t, hh, c]] as f64,
                    reference,
                    bound,
                };
                let a = at(bound);
                let b = at(tolerance.atol2 + tolerance.rtol2 * reference.abs());
                let diff = a.error();
                sum_abs += diff;
                sum_d2 += diff * diff;
                sum_r2 += reference * reference;
                n += 1;
                if !a.within() {
                    first_a.get_or_insert((t, hh, c));
                }
                if !b.within() {
                    first_b.get_or_insert((t, hh, c));
                }
                rule_a.note(a);
                rule_b.note(b);
            }
        }
    }
    let max_abs = rule_a.worst.map_or(0.0, |e| e.error());
    let worst_b = rule_b.worst.map_or(0.0, |e| e.ratio());
    // The first bad element: a non-finite one, else the first over rule (b), else over rule (a).
    let first_bad = first_non_finite
        .or(first_reference_non_finite)
        .or(first_b)
        .or(first_a)
        .map(|(t, hh, c)| format!("{t}:{hh}:{c}"));
    let mut verdict = Verdict {
        pass: false,
        max_abs,
        mean_abs: if n > 0 { sum_abs / n as f64 } else { 0.0 },
        rel_l2: if sum_r2 > 0.0 {
            (sum_d2 / sum_r2).sqrt()
        } else {
            sum_d2.sqrt()
        },
        bound,
        ratio: (max_abs / bound).max(worst_b),
        first_bad,
        judged: n,
        sampled: ref64.rows.is_some(),
        non_finite,
        first_non_finite,
        reference_non_finite,
        first_reference_non_finite,
        padding_intact,
        counters_left,
        rule_a,
        rule_b,
        reason: String::new(),
    };
    verdict.pass = non_finite == 0
        && reference_non_finite == 0
        && bound.is_finite()
        && padding_intact
        && counters_left == 0
        && rule_a.over == 0
        && rule_b.over == 0;
    if !verdict.pass {
        verdict.reason = describe(problem, &verdict);
    }
    verdict
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gen::{generate, GenSpec};
    use approx::assert_abs_diff_eq;
    use ndarray::{Array2, Array3};

    fn setup() -> (Problem, RefOutput) {
        let mut spec = GenSpec::global(2, 1, vec![(2, 3), (1, 4)], 7);
        spec.head_dim = 4;
        spec.padding_rows = 1;
        let p = generate(&spec).unwrap();
        let mut out = Array3::<f64>::zeros((4, 2, 4));
        for (i, x) in out.iter_mut().enumerate() {
            *x = (i as f64 * 0.37).sin();
        }
        let r = RefOutput {
            rows: None,
            out,
            lse: Array2::zeros((4, 2)),
        };
        (p, r)
    }

    fn tolerance() -> Tolerance {
        Tolerance::default_for(DType::Bf16)
    }

    /// docs/operator.md section 6's numbers, written out here as that page writes them.
    #[test]
    fn the_defaults_are_spec_6s() {
        for (dtype, atol, flat) in [
            (DType::Bf16, 2f64.powi(-7), 2e-2),
            (DType::F16, 2f64.powi(-10), 5e-3),
            (DType::F32, 2f64.powi(-23), 1e-5),
        ] {
            let want = Tolerance {
                rtol: 2.0,
                atol,
                atol2: flat,
                rtol2: flat,
            };
            assert_eq!(Tolerance::default_for(dtype), want, "{dtype}");
        }
    }

    fn as_f32(r: &RefOutput) -> Array3<f32> {
        r.out.mapv(|x| x as f32)
    }

    #[test]
    fn exact_output_passes() {
        let (p, r) = setup();
        let mut out = as_f32(&r);
        out.index_axis_mut(ndarray::Axis(0), 3).fill(f32::NAN); // padding row
        let v = judge(&p, &out, &r, &r, &tolerance(), true, 0);
        assert!(v.pass, "{}", v.reason);
        assert!(v.first_bad.is_none());
        assert!(v.reason.is_empty());
        assert!(v.bound > 0.0, "the bound is never zero");
        assert_eq!(v.judged, 3 * 2 * 4, "three real rows of 2 heads x 4 dims");
    }

    #[test]
    fn one_bad_element_fails_and_is_located() {
        let (p, r) = setup();
        let mut out = as_f32(&r);
        out[[1, 1, 2]] += 0.1;
        let v = judge(&p, &out, &r, &r, &tolerance(), true, 0);
        assert!(!v.pass);
        assert_eq!(v.first_bad.as_deref(), Some("1:1:2"));
        assert_abs_diff_eq!(v.max_abs, 0.1, epsilon = 1e-6);
        assert!(v.ratio > 1.0);
        for rule in [v.rule_a, v.rule_b] {
            assert_eq!(rule.over, 1);
            let w = rule.worst.unwrap();
            assert_eq!((w.t, w.h, w.c), (1, 1, 2));
            assert_eq!(w.reference, r.out[[1, 1, 2]]);
        }
        assert_eq!(
            v.rule_b.worst.unwrap().bound,
            2e-2 + 2e-2 * r.out[[1, 1, 2]].abs()
        );
    }

    #[test]
    fn unwritten_row_and_padding_fail() {
        let (p, r) = setup();
        let mut out = as_f32(&r);
        out[[2, 0, 0]] = f32::NAN;
        let v = judge(&p, &out, &r, &r, &tolerance(), true, 0);
        assert!(!v.pass);
        assert_eq!(v.first_bad.as_deref(), Some("2:0:0"));
        assert_eq!((v.non_finite, v.first_non_finite), (1, Some((2, 0, 0))));
        assert!(v.max_abs.is_infinite(), "a NaN output is an infinite error");
        let out = as_f32(&r);
        let v = judge(&p, &out, &r, &r, &tolerance(), false, 0);
        assert!(!v.pass);
        assert!(v.reason.contains("padding"));
        let v = judge(&p, &out, &r, &r, &tolerance(), true, 2);
        assert!(!v.pass);
        assert!(
            v.reason
                .starts_with("2 decode counters left non-zero after the launch; rule (a) holds"),
            "{}",
            v.reason
        );
    }

    #[test]
    fn rule_a_scales_with_emulation_error() {
        let (p, r) = setup();
        let mut lp = r.clone();
        lp.out[[0, 0, 0]] += 0.01; // the emulation is 0.01 off: bound = 0.02 + 2^-7
        let mut out = as_f32(&r);
        out[[0, 0, 1]] += 0.015;
        let loose = Tolerance {
            atol2: 1.0,
            rtol2: 1.0,
            ..tolerance()
        };
        assert!(judge(&p, &out, &r, &lp, &loose, true, 0).pass);
        out[[0, 0, 1]] += 0.02;
        let v = judge(&p, &out, &r, &lp, &loose, true, 0);
        assert!(!v.pass);
        assert_eq!((v.rule_a.over, v.rule_b.over), (1, 0));
        assert!(v.reason.contains("rule (b) holds"), "{}", v.reason);
    }

    /// A NaN in a real input makes the reference NaN, the bound NaN and every comparison with
    /// NaN false: an output of 12345s must still fail, and say why.
    #[test]
    fn a_nan_reference_fails_every_output() {
        let (p, r) = setup();
        let mut nan = r.clone();
        nan.out.index_axis_mut(ndarray::Axis(0), 1).fill(f64::NAN);
        let mut out = Array3::from_elem((4, 2, 4), 12345f32);
        out.index_axis_mut(ndarray::Axis(0), 3).fill(f32::NAN);
        let v = judge(&p, &out, &nan, &nan, &tolerance(), true, 0);
        assert!(!v.pass);
        assert!(v.bound.is_nan());
        assert_eq!(v.reference_non_finite, 2 * 4);
        assert!(
            v.reason.starts_with(
                "the reference is NaN/inf at 8 judged elements, the first at request 0, \
                 position 1, head 0, dim 0 (row 1)"
            ),
            "{}",
            v.reason
        );
        assert!(v.reason.contains("rule (a) fails"), "{}", v.reason);
    }

    proptest::proptest! {
        /// No output passes when the reference (ref64 or the emulation) of a real element is
        /// NaN or infinite, whatever the output: the reference itself, its f32 copy, the bad
        /// value, or any offset of it.
        #[test]
        fn no_output_passes_a_non_finite_reference(
            k in 0usize..24,
            bad in proptest::prop_oneof![
                proptest::strategy::Just(f64::NAN),
                proptest::strategy::Just(f64::INFINITY),
                proptest::strategy::Just(f64::NEG_INFINITY),
            ],
            in_emulation: bool,
            out_kind in 0u8..3,
            offset in -1.0f32..1.0,
        ) {
            let (p, r) = setup();
            let (t, hh, c) = (k / 8, (k / 4) % 2, k % 4);
            let (mut r64, mut lp) = (r.clone(), r.clone());
            if in_emulation {
                lp.out[[t, hh, c]] = bad;
            } else {
                r64.out[[t, hh, c]] = bad;
            }
            let mut out = match out_kind {
                0 => as_f32(&r64),
                1 => as_f32(&r).mapv(|x| x + offset),
                _ => Array3::from_elem((4, 2, 4), offset),
            };
            out.index_axis_mut(ndarray::Axis(0), 3).fill(f32::NAN);
            let v = judge(&p, &out, &r64, &lp, &tolerance(), true, 0);
            proptest::prop_assert!(!v.pass, "passed: {}", describe(&p, &v));
            proptest::prop_assert_eq!(v.first_reference_non_finite, Some((t, hh, c)));
        }
    }

    /// Rows are located in their request: row 2 is position 0 of request 1. When the two rules'
    /// worst elements differ, each is named with its own values.
    #[test]
    fn the_text_names_each_rules_worst_element_by_request_and_position() {
        let (p, r) = setup();
        let mut out = as_f32(&r);
        out[[2, 1, 3]] += 0.03; // the largest error
        out[[1, 0, 0]] += 0.025; // a smaller one on a reference near 0: the worst ratio
        let mut lp = r.clone();
        lp.out[[0, 0, 0]] += 0.01;
        let v = judge(&p, &out, &r, &lp, &tolerance(), true, 0);
        let at_a = "request 1, position 0, head 1, dim 3 (row 2)";
        let at_b = "request 0, position 1, head 0, dim 0 (row 1)";
        assert!(r.out[[1, 0, 0]].abs() < r.out[[2, 1, 3]].abs());
        assert!(
            v.reason.contains(&format!(
                "of 24 elements (4.2%) over it; worst at {at_a}: out "
            )),
            "{}",
            v.reason
        );
        assert!(v.reason.contains(&format!("rule (b) fails: 1 of 24 elements (4.2%) over atol2 + rtol2*|ref64|; worst at {at_b}: out ")), "{}", v.reason);
        let mut out = as_f32(&r);
        out[[2, 1, 0]] = f32::NAN;
        let v = judge(&p, &out, &r, &r, &tolerance(), true, 0);
        assert!(v.reason.starts_with("1 of 24 real output elements are NaN/inf (unwritten or NaN leak), the first at request 1, position 0, head 1, dim 0 (row 2); rule (a) fails: max|out - ref64| = inf > "), "{}", v.reason);
        assert!(v.reason.contains("out NaN, ref64 "), "{}", v.reason);
    }
}
