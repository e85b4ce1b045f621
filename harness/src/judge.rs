//! Judging a GPU result against the reference (SPEC section 6).

use ndarray::Array3;
use relattn_reference::{Problem, RefOutput};

/// The constants of SPEC section 6 for one dtype (data: they come from the matrix files).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bounds {
    /// (a): `max|out - ref64| <= rtol * max|ref_lp - ref64| + atol`.
    pub rtol: f64,
    pub atol: f64,
    /// (b): elementwise `|out - ref64| <= atol2 + rtol2 * |ref64|`.
    pub atol2: f64,
    pub rtol2: f64,
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
    /// Why it failed, in one line; empty on a pass.
    pub reason: String,
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
    bounds: &Bounds,
    padding_intact: bool,
    counters_left: usize,
) -> Verdict {
    let (h, d) = (problem.num_heads, problem.head_dim);
    let mut reasons: Vec<String> = Vec::new();
    let mut first_bad: Option<String> = None;
    let mut note_bad = |t: usize, hh: usize, c: usize| {
        if first_bad.is_none() {
            first_bad = Some(format!("{t}:{hh}:{c}"));
        }
    };

    // Every real row written and finite (even in sampled mode: the check is cheap).
    let mut non_finite = 0usize;
    for t in 0..problem.real_rows() {
        for hh in 0..h {
            for c in 0..d {
                if !out[[t, hh, c]].is_finite() {
                    if non_finite == 0 {
                        note_bad(t, hh, c);
                    }
                    non_finite += 1;
                }
            }
        }
    }
    if non_finite > 0 {
        reasons.push(format!(
            "{non_finite} real output elements are NaN/inf (unwritten or NaN leak)"
        ));
    }
    if !padding_intact {
        reasons.push("padding rows were modified".to_string());
    }
    if counters_left > 0 {
        reasons.push(format!(
            "{counters_left} decode counters left non-zero after the launch"
        ));
    }

    // Rule (a)'s bound from the emulation's own error.
    let judged: Vec<usize> = (0..ref64.num_rows())
        .filter(|&k| ref64.row(k) < problem.real_rows())
        .collect();
    let mut lp_err = 0f64;
    for &k in &judged {
        for hh in 0..h {
            for c in 0..d {
                let e = (ref_lp.out[[k, hh, c]] - ref64.out[[k, hh, c]]).abs();
                if e > lp_err || e.is_nan() {
                    lp_err = e;
                }
            }
        }
    }
    let bound = bounds.rtol * lp_err + bounds.atol;

    let (mut max_abs, mut sum_abs, mut sum_d2, mut sum_r2, mut n) =
        (0f64, 0f64, 0f64, 0f64, 0usize);
    let mut worst_b = 0f64;
    let mut b_fail = 0usize;
    let mut a_first: Option<(usize, usize, usize)> = None;
    for &k in &judged {
        let t = ref64.row(k);
        for hh in 0..h {
            for c in 0..d {
                let r = ref64.out[[k, hh, c]];
                let o = out[[t, hh, c]] as f64;
                let diff = (o - r).abs();
                let diff = if diff.is_nan() { f64::INFINITY } else { diff };
                max_abs = max_abs.max(diff);
                sum_abs += diff;
                sum_d2 += diff * diff;
                sum_r2 += r * r;
                n += 1;
                let lim = bounds.atol2 + bounds.rtol2 * r.abs();
                worst_b = worst_b.max(diff / lim);
                if diff > lim {
                    if b_fail == 0 {
                        note_bad(t, hh, c);
                    }
                    b_fail += 1;
                }
                if diff > bound && a_first.is_none() {
                    a_first = Some((t, hh, c));
                }
            }
        }
    }
    if max_abs > bound {
        if let Some((t, hh, c)) = a_first {
            note_bad(t, hh, c);
        }
        reasons.push(format!(
            "rule (a): max|out - ref64| = {max_abs:.3e} > bound {bound:.3e}"
        ));
    }
    if b_fail > 0 {
        reasons.push(format!(
            "rule (b): {b_fail} elements exceed atol2 + rtol2*|ref64| (worst ratio {worst_b:.2})"
        ));
    }
    let ratio = (max_abs / bound).max(worst_b);
    Verdict {
        pass: reasons.is_empty(),
        max_abs,
        mean_abs: if n > 0 { sum_abs / n as f64 } else { 0.0 },
        rel_l2: if sum_r2 > 0.0 {
            (sum_d2 / sum_r2).sqrt()
        } else {
            sum_d2.sqrt()
        },
        bound,
        ratio,
        first_bad,
        reason: reasons.join("; "),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{Array2, Array3};
    use relattn_reference::gen::{generate, GenSpec};

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

    fn bounds() -> Bounds {
        Bounds {
            rtol: 2.0,
            atol: 2f64.powi(-7),
            atol2: 2e-2,
            rtol2: 2e-2,
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
        let v = judge(&p, &out, &r, &r, &bounds(), true, 0);
        assert!(v.pass, "{}", v.reason);
        assert!(v.first_bad.is_none());
        assert!(v.bound > 0.0, "the bound is never zero");
    }

    #[test]
    fn one_bad_element_fails_and_is_located() {
        let (p, r) = setup();
        let mut out = as_f32(&r);
        out[[1, 1, 2]] += 0.1;
        let v = judge(&p, &out, &r, &r, &bounds(), true, 0);
        assert!(!v.pass);
        assert_eq!(v.first_bad.as_deref(), Some("1:1:2"));
        assert!((v.max_abs - 0.1).abs() < 1e-6);
        assert!(v.ratio > 1.0);
    }

    #[test]
    fn unwritten_row_and_padding_fail() {
        let (p, r) = setup();
        let mut out = as_f32(&r);
        out[[2, 0, 0]] = f32::NAN;
        let v = judge(&p, &out, &r, &r, &bounds(), true, 0);
        assert!(!v.pass);
        assert_eq!(v.first_bad.as_deref(), Some("2:0:0"));
        let out = as_f32(&r);
        let v = judge(&p, &out, &r, &r, &bounds(), false, 0);
        assert!(!v.pass);
        assert!(v.reason.contains("padding"));
        let v = judge(&p, &out, &r, &r, &bounds(), true, 2);
        assert!(!v.pass);
        assert_eq!(v.reason, "2 decode counters left non-zero after the launch");
    }

    #[test]
    fn rule_a_scales_with_emulation_error() {
        let (p, r) = setup();
        let mut lp = r.clone();
        lp.out[[0, 0, 0]] += 0.01; // the emulation is 0.01 off: bound = 0.02 + 2^-7
        let mut out = as_f32(&r);
        out[[0, 0, 1]] += 0.015;
        let loose = Bounds {
            atol2: 1.0,
            rtol2: 1.0,
            ..bounds()
        };
        assert!(judge(&p, &out, &r, &lp, &loose, true, 0).pass);
        out[[0, 0, 1]] += 0.02;
        assert!(!judge(&p, &out, &r, &lp, &loose, true, 0).pass);
    }
}
