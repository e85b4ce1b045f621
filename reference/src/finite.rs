//! Whether a case's inputs are finite wherever a real row reads them. A NaN or infinity there
//! makes the reference itself non-finite, and a judgement against it means nothing: such a case
//! is invalid input, refused before any run or judgement. Padding rows, pages no real row reads
//! and bias cells past the visible distances may hold anything (tests put NaN there on purpose).

use crate::problem::{Problem, ProblemError};
use rayon::prelude::*;

/// The first non-finite input a real row of `p` reads, in the order q, rel_logits, key_cache,
/// value_cache (each scanned in index order), as an error naming the tensor and its index.
pub fn check_finite_inputs(p: &Problem) -> Result<(), ProblemError> {
    let (h, d) = (p.num_heads, p.head_dim);
    // q and rel_logits: the real rows; of rel_logits only distances a row can see.
    let first_bad_row = |tensor: &'static str| {
        (0..p.real_rows()).into_par_iter().find_first(|&t| {
            let span = bias_span(p, t);
            (0..h).any(|hh| match tensor {
                "q" => (0..d).any(|c| !p.q[[t, hh, c]].is_finite()),
                _ => (0..span).any(|dd| !p.rel_logits[[t, hh, dd]].is_finite()),
            })
        })
    };
    if let Some(t) = first_bad_row("q") {
        let (hh, c) = first_in(h, d, |hh, c| !p.q[[t, hh, c]].is_finite());
        return Err(non_finite(p, "q", vec![t, hh, c], p.q[[t, hh, c]], t));
    }
    if let Some(t) = first_bad_row("rel_logits") {
        let span = bias_span(p, t);
        let (hh, dd) = first_in(h, span, |hh, dd| !p.rel_logits[[t, hh, dd]].is_finite());
        let value = p.rel_logits[[t, hh, dd]];
        return Err(non_finite(p, "rel_logits", vec![t, hh, dd], value, t));
    }
    for (tensor, view) in [("key_cache", p.k), ("value_cache", p.v)] {
        for r in p.requests().filter(|r| r.q_len > 0) {
            let first = p.window().first_visible(r.prefix());
            let bad = (first..r.kv_len).into_par_iter().find_first(|&j| {
                (0..p.num_kv_heads).any(|kvh| {
                    let at = view.at(p.block_of(r.index, j), j % p.page_size, kvh);
                    p.kv[at..at + d].iter().any(|x| !x.is_finite())
                })
            });
            if let Some(j) = bad {
                let (block, slot) = (p.block_of(r.index, j), j % p.page_size);
                let (kvh, c) = first_in(p.num_kv_heads, d, |kvh, c| {
                    !p.kv[view.at(block, slot, kvh) + c].is_finite()
                });
                let value = p.kv[view.at(block, slot, kvh) + c];
                return Err(ProblemError::NonFinite {
                    tensor,
                    index: vec![block, slot, kvh, c],
                    value,
                    reader: format!(
                        "key {j} of request {} (block_table[{}, {}] = {block})",
                        r.index,
                        r.index,
                        j / p.page_size
                    ),
                });
            }
        }
    }
    Ok(())
}

/// The distances row `t` reads a bias for: `0..min(E, the keys it sees)`.
fn bias_span(p: &Problem, t: usize) -> usize {
    let Some(r) = p.request_of_row(t) else {
        return 0;
    };
    let (lo, hi) = p.visible_keys(&r, t - r.q_start);
    (hi - lo + 1).min(p.rel_extent)
}

/// The first `(a, b)` in `0..n_a x 0..n_b` (row-major) where `bad` holds.
fn first_in(n_a: usize, n_b: usize, bad: impl Fn(usize, usize) -> bool) -> (usize, usize) {
    (0..n_a)
        .flat_map(|a| (0..n_b).map(move |b| (a, b)))
        .find(|&(a, b)| bad(a, b))
        .unwrap_or((0, 0))
}

fn non_finite(
    p: &Problem,
    tensor: &'static str,
    index: Vec<usize>,
    value: f32,
    t: usize,
) -> ProblemError {
    let reader = match p.request_of_row(t) {
        Some(r) => format!("row {t}, position {} of request {}", t - r.q_start, r.index),
        None => format!("row {t}"),
    };
    ProblemError::NonFinite {
        tensor,
        index,
        value,
        reader,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gen::{generate, GenSpec};

    fn case() -> Problem {
        let mut spec = GenSpec::global(4, 2, vec![(2, 5), (3, 3)], 11);
        spec.head_dim = 8;
        spec.rel_extent = 4;
        spec.padding_rows = 2;
        generate(&spec).unwrap()
    }

    fn with(p: &Problem, change: impl FnOnce(&mut crate::ProblemData)) -> Problem {
        let mut data = p.clone().into_data();
        change(&mut data);
        Problem::new(data).unwrap()
    }

    #[test]
    fn generated_cases_are_finite_where_read_even_with_nan_padding() {
        let p = case();
        assert!(p.q.iter().skip(p.real_rows() * 4 * 8).all(|x| x.is_nan()));
        check_finite_inputs(&p).unwrap();
    }

    #[test]
    fn each_tensor_is_named_with_its_index() {
        let p = case();
        let q = with(&p, |d| d.q[[3, 1, 5]] = f32::NAN);
        let e = check_finite_inputs(&q).unwrap_err().to_string();
        assert!(
            e.starts_with("q[3, 1, 5] = NaN, read by row 3, position 1 of request 1"),
            "{e}"
        );
        let rel = with(&p, |d| d.rel_logits[[0, 2, 0]] = f32::INFINITY);
        let e = check_finite_inputs(&rel).unwrap_err().to_string();
        assert!(
            e.starts_with("rel_logits[0, 2, 0] = inf, read by row 0"),
            "{e}"
        );
        // Key 4 of request 0: its block and slot in the cache.
        let (block, slot) = (p.block_of(0, 4), 4 % p.page_size);
        let at = p.v.at(block, slot, 1) + 7;
        let v = with(&p, |d| d.kv[at] = f32::NEG_INFINITY);
        let e = check_finite_inputs(&v).unwrap_err().to_string();
        assert!(
            e.starts_with(&format!(
                "value_cache[{block}, {slot}, 1, 7] = -inf, read by key 4 of request 0"
            )),
            "{e}"
        );
    }

    #[test]
    fn cells_no_real_row_reads_may_hold_anything() {
        let p = case();
        // Row 2 is position 0 of request 1 (no prefix): it sees one key, distance 0 only.
        let r = with(&p, |d| d.rel_logits[[2, 0, 3]] = f32::NAN);
        check_finite_inputs(&r).unwrap();
        let padding = with(&p, |d| d.rel_logits[[6, 0, 0]] = f32::NAN);
        check_finite_inputs(&padding).unwrap();
    }
}
