//! The one-line text of a verdict: what failed, rule (a) and rule (b) each with the count of
//! elements over their bound and the worst element, located by request, position, head and dim
//! as well as by packed row.

use super::Verdict;
use crate::Problem;

/// The verdict `v` on `problem`: the checks that failed, then rule (a) and rule (b),
/// `; `-separated (a failed verdict's `reason`).
pub fn describe(problem: &Problem, v: &Verdict) -> String {
    let mut parts = Vec::new();
    if v.non_finite > 0 {
        let real = problem.real_rows() * problem.num_heads * problem.head_dim;
        let first = v.first_non_finite.map_or(String::new(), |(t, h, c)| {
            format!(", the first at {}", location(problem, t, h, c))
        });
        parts.push(format!(
            "{} of {real} real output elements are NaN/inf (unwritten or NaN leak){first}",
            v.non_finite
        ));
    }
    if v.reference_non_finite > 0 {
        let first = v
            .first_reference_non_finite
            .map_or(String::new(), |(t, h, c)| {
                format!(", the first at {}", location(problem, t, h, c))
            });
        parts.push(format!(
            "the reference is NaN/inf at {} judged elements{first}: the case's inputs are not \
             finite where real rows read them, so no output can pass",
            v.reference_non_finite
        ));
    }
    if !v.padding_intact {
        parts.push("padding rows were modified".to_string());
    }
    if v.counters_left > 0 {
        parts.push(format!(
            "{} decode counters left non-zero after the launch",
            v.counters_left
        ));
    }
    let of = format!(
        "of {} elements{}",
        v.judged,
        if v.sampled { " (sampled rows)" } else { "" }
    );
    parts.push(rule_a(problem, v, &of));
    parts.push(rule_b(problem, v, &of));
    parts.join("; ")
}

fn rule_a(problem: &Problem, v: &Verdict, of: &str) -> String {
    let max = format!("max|out - ref64| = {:.3e}", v.max_abs);
    match v.rule_a.worst {
        Some(w) if v.rule_a.over > 0 => format!(
            "rule (a) fails: {max} > bound {:.3e} (rtol * max|ref_lp - ref64| + atol), {} {of} \
             ({}) over it; worst at {}: out {}, ref64 {}",
            v.bound,
            v.rule_a.over,
            percent(v.rule_a.over, v.judged),
            location(problem, w.t, w.h, w.c),
            value(w.out),
            value(w.reference)
        ),
        _ => format!("rule (a) holds: {max} <= bound {:.3e}", v.bound),
    }
}

fn rule_b(problem: &Problem, v: &Verdict, of: &str) -> String {
    let b = &v.rule_b;
    let Some(w) = b.worst.filter(|_| b.over > 0) else {
        let ratio = b.worst.map_or(0.0, |w| w.ratio());
        return format!(
            "rule (b) holds: worst |out - ref64| / (atol2 + rtol2*|ref64|) = {ratio:.2}"
        );
    };
    let same = v.rule_a.over > 0
        && v.rule_a
            .worst
            .is_some_and(|a| (a.t, a.h, a.c) == (w.t, w.h, w.c));
    let at = if same {
        "the same element".to_string()
    } else {
        format!(
            "{}: out {}, ref64 {}",
            location(problem, w.t, w.h, w.c),
            value(w.out),
            value(w.reference)
        )
    };
    format!(
        "rule (b) fails: {} {of} ({}) over atol2 + rtol2*|ref64|; worst at {at}, \
         |out - ref64| = {:.3e} > bound {:.3e} there (ratio {:.2})",
        b.over,
        percent(b.over, v.judged),
        w.error(),
        w.bound,
        w.ratio()
    )
}

/// `request b, position i, head h, dim c (row t)`: where packed row `t` is in its request.
pub fn location(problem: &Problem, t: usize, h: usize, c: usize) -> String {
    match problem.request_of_row(t) {
        Some(r) => format!(
            "request {}, position {}, head {h}, dim {c} (row {t})",
            r.index,
            t - r.q_start
        ),
        None => format!("padding row {t}, head {h}, dim {c}"),
    }
}

/// `part` of `whole` as a percentage with two significant digits (at least one decimal).
fn percent(part: usize, whole: usize) -> String {
    if whole == 0 {
        return "0%".to_string();
    }
    let p = 100.0 * part as f64 / whole as f64;
    let decimals = if p > 0.0 {
        (1 - p.log10().floor() as i32).clamp(1, 8) as usize
    } else {
        1
    };
    format!("{p:.decimals$}%")
}

/// A value with six significant digits (scientific outside 1e-3 ..= 1e5).
fn value(x: f64) -> String {
    let a = x.abs();
    if x == 0.0 || !x.is_finite() {
        format!("{x}")
    } else if (1e-3..1e5).contains(&a) {
        let decimals = (5 - a.log10().floor() as i32).max(0) as usize;
        format!("{x:.decimals$}")
    } else {
        format!("{x:.5e}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentages_and_values_keep_their_significant_digits() {
        assert_eq!(percent(1, 93184), "0.0011%");
        assert_eq!(percent(1, 3), "33.3%");
        assert_eq!(percent(3, 3), "100.0%");
        assert_eq!(percent(0, 3), "0.0%");
        assert_eq!(value(0.177_042_603_492_736_82), "0.177043");
        assert_eq!(value(-1.5), "-1.50000");
        assert_eq!(value(2.5e-5), "2.50000e-5");
        assert_eq!(value(f64::NAN), "NaN");
    }
}
