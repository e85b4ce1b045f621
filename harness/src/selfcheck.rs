//! Reference self-checks: the fast reference against the naive oracle, and the invariances
//! the operator must have (paging, cache layouts, chunked prefill, LSE merge, sampled rows).

use ndarray::{Array2, Array3};
use relattn_reference::{fast, oracle, sample, transform, CacheLayout, Problem, RefOutput};
use std::fmt;
use std::str::FromStr;

/// Relative tolerance between two f64 computations of the same function.
pub const F64_RTOL: f64 = 1e-12;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Check {
    /// `fast` equals the naive `oracle` to 1e-12 relative.
    Oracle,
    /// Permuting the physical pages changes nothing (bit for bit).
    Paging,
    /// HND, NHD and contiguous caches give the same output (bit for bit).
    Layouts,
    /// Splitting a prefill into two chunks gives the same rows.
    Chunking,
    /// Merging per-key-range partials by their LSE equals the whole.
    LseMerge,
    /// Sampled rows equal the same rows of the full computation (bit for bit).
    Sampling,
}

impl Check {
    pub const ALL: [Check; 6] = [
        Check::Oracle,
        Check::Paging,
        Check::Layouts,
        Check::Chunking,
        Check::LseMerge,
        Check::Sampling,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Check::Oracle => "oracle",
            Check::Paging => "paging",
            Check::Layouts => "layouts",
            Check::Chunking => "chunking",
            Check::LseMerge => "lse_merge",
            Check::Sampling => "sampling",
        }
    }
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Check {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Check::ALL
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| format!("unknown reference check `{s}`"))
    }
}

/// Outcome of one self-check.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckOutcome {
    pub pass: bool,
    /// Largest absolute difference found.
    pub max_abs: f64,
    /// `max_abs` over the largest magnitude of the expected output.
    pub rel: f64,
    pub message: String,
}

/// Run one check on a problem. `base` is `fast::attention(p)` when the caller has it already.
pub fn check(check: Check, p: &Problem, base: Option<&RefOutput>) -> CheckOutcome {
    let owned;
    let base = match base {
        Some(b) => b,
        None => {
            owned = fast::attention(p);
            &owned
        }
    };
    match check {
        Check::Oracle => {
            let o = oracle::attention(p);
            close(
                "fast vs oracle",
                &base.out,
                &o.out,
                &base.lse,
                &o.lse,
                real(p),
            )
        }
        Check::Paging => {
            let moved = fast::attention(&transform::permute_pages(p, 0x5eed));
            identical("permuted pages", base, &moved)
        }
        Check::Layouts => {
            let mut worst = identical("layouts", base, base);
            for layout in CacheLayout::ALL.into_iter().filter(|&l| l != p.layout) {
                let other = fast::attention(&transform::with_layout(p, layout));
                let c = identical(&format!("{} vs {}", p.layout, layout), base, &other);
                if !c.pass || c.max_abs > worst.max_abs {
                    worst = c;
                }
            }
            worst
        }
        Check::Chunking => match longest_prefill(p) {
            None => skipped("no request with two or more query rows to chunk"),
            Some((b, len)) => {
                let chunked =
                    transform::split_request(p, b, len / 2).expect("split inside the request");
                let other = fast::attention(&chunked);
                close(
                    "chunked prefill",
                    &base.out,
                    &other.out,
                    &base.lse,
                    &other.lse,
                    real(p),
                )
            }
        },
        Check::LseMerge => {
            let whole = oracle::attention(p);
            let thirds = |r: &relattn_reference::Request, k: usize| r.kv_len * k / 3;
            let parts: Vec<RefOutput> = (0..3)
                .map(|k| oracle::attention_key_range(p, |r| (thirds(r, k), thirds(r, k + 1))))
                .collect();
            match oracle::merge_partials(p, &parts) {
                Some(m) => close(
                    "LSE merge of 3 key ranges",
                    &whole.out,
                    &m.out,
                    &whole.lse,
                    &m.lse,
                    real(p),
                ),
                None => fail("merge_partials refused full-mode partials"),
            }
        }
        Check::Sampling => {
            let rows = sample::sample_rows(p, 5, 0x5a);
            let sampled = fast::attention_rows(p, &rows);
            let want = RefOutput {
                rows: Some(rows.clone()),
                out: base.out.select(ndarray::Axis(0), &rows),
                lse: base.lse.select(ndarray::Axis(0), &rows),
            };
            identical(
                &format!("sampled rows {rows:?} vs the full run"),
                &want,
                &sampled,
            )
        }
    }
}

fn real(p: &Problem) -> usize {
    p.real_rows()
}

fn longest_prefill(p: &Problem) -> Option<(usize, usize)> {
    p.requests()
        .filter(|r| r.q_len >= 2)
        .max_by_key(|r| r.q_len)
        .map(|r| (r.index, r.q_len))
}

fn skipped(why: &str) -> CheckOutcome {
    CheckOutcome {
        pass: true,
        max_abs: 0.0,
        rel: 0.0,
        message: format!("nothing to check: {why}"),
    }
}

fn fail(why: &str) -> CheckOutcome {
    CheckOutcome {
        pass: false,
        max_abs: f64::INFINITY,
        rel: f64::INFINITY,
        message: why.to_string(),
    }
}

/// Both outputs (first `rows` rows) agree to `F64_RTOL` relative, NaN never passing.
fn close(
    what: &str,
    want: &Array3<f64>,
    got: &Array3<f64>,
    want_lse: &Array2<f64>,
    got_lse: &Array2<f64>,
    rows: usize,
) -> CheckOutcome {
    let mut max_abs = 0f64;
    let mut scale = 0f64;
    let mut non_finite = 0usize;
    for t in 0..rows {
        for (a, b) in want
            .index_axis(ndarray::Axis(0), t)
            .iter()
            .zip(got.index_axis(ndarray::Axis(0), t))
        {
            if !a.is_finite() || !b.is_finite() {
                non_finite += 1;
                continue;
            }
            max_abs = max_abs.max((a - b).abs());
            scale = scale.max(a.abs());
        }
        for (a, b) in want_lse.row(t).iter().zip(got_lse.row(t)) {
            if a.is_finite() != b.is_finite()
                || (a.is_finite() && (a - b).abs() > F64_RTOL * a.abs().max(1.0))
            {
                non_finite += 1;
            }
        }
    }
    let rel = max_abs / scale.max(f64::MIN_POSITIVE);
    let pass = non_finite == 0 && max_abs <= F64_RTOL * scale + 1e-300;
    let message = if pass {
        String::new()
    } else if non_finite > 0 {
        format!("{what}: {non_finite} non-finite or mismatched values")
    } else {
        format!("{what}: max abs difference {max_abs:.3e} ({rel:.3e} relative) > {F64_RTOL:e}")
    };
    CheckOutcome {
        pass,
        max_abs,
        rel,
        message,
    }
}

/// Both outputs are bit-identical.
fn identical(what: &str, a: &RefOutput, b: &RefOutput) -> CheckOutcome {
    let mut max_abs = 0f64;
    let mut differing = 0usize;
    for (x, y) in a
        .out
        .iter()
        .zip(b.out.iter())
        .chain(a.lse.iter().zip(b.lse.iter()))
    {
        if x.to_bits() != y.to_bits() {
            differing += 1;
            let d = (x - y).abs();
            max_abs = max_abs.max(if d.is_nan() {
                f64::INFINITY
            } else {
                d.max(f64::MIN_POSITIVE)
            });
        }
    }
    let shapes_match = a.out.dim() == b.out.dim() && a.lse.dim() == b.lse.dim();
    let pass = differing == 0 && shapes_match;
    CheckOutcome {
        pass,
        max_abs,
        rel: max_abs,
        message: if pass {
            String::new()
        } else {
            format!("{what}: {differing} values differ (max {max_abs:.3e})")
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use relattn_reference::gen::{generate, GenSpec};

    fn problem() -> Problem {
        let mut spec = GenSpec::local(4, 2, 16, vec![(5, 40), (0, 3), (1, 20)], 3);
        spec.head_dim = 16;
        spec.padding_rows = 2;
        generate(&spec).unwrap()
    }

    #[test]
    fn every_check_passes_on_a_generated_case() {
        let p = problem();
        let base = fast::attention(&p);
        for check in Check::ALL {
            let c = self::check(check, &p, Some(&base));
            assert!(c.pass, "{check}: {}", c.message);
        }
    }

    #[test]
    fn a_wrong_base_is_caught() {
        let p = problem();
        let mut base = fast::attention(&p);
        base.out[[4, 3, 7]] += 1e-9;
        for check in [
            Check::Oracle,
            Check::Paging,
            Check::Layouts,
            Check::Chunking,
            Check::Sampling,
        ] {
            let c = self::check(check, &p, Some(&base));
            assert!(!c.pass, "{check} missed a planted difference");
        }
    }
}
