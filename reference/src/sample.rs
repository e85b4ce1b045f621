//! Sampled-row mode: a seeded subset of query rows for cases too large for a full reference.
//!
//! Rows are independent, so the references compute exactly the listed rows, bit-identical to
//! the same rows of a full computation (`fast::attention_rows`, `emulate::attention_rows`).

use crate::problem::Problem;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// Packed rows to check, ascending and without duplicates.
///
/// Always holds the first and last row of every non-empty request (which includes row
/// `cu_seqlens_q[B] - 1`), then up to `n` rows in all, the rest drawn uniformly without
/// replacement from the other real rows with ChaCha8 seeded by `seed`. If `n` covers every real
/// row, all real rows are returned; if the required rows alone exceed `n`, they are all
/// returned anyway. Padding rows are never sampled.
pub fn sample_rows(p: &Problem, n: usize, seed: u64) -> Vec<usize> {
    let real = p.real_rows();
    if n >= real {
        return (0..real).collect();
    }
    let mut required = Vec::new();
    for r in p.requests().filter(|r| r.q_len > 0) {
        required.push(r.q_start);
        required.push(r.q_start + r.q_len - 1);
    }
    if real > 0 {
        required.push(real - 1);
    }
    required.sort_unstable();
    required.dedup();

    let extra = n.saturating_sub(required.len());
    let mut rows = required.clone();
    if extra > 0 {
        // Candidates: real rows not already required (`required` is sorted).
        let candidates: Vec<usize> = (0..real)
            .filter(|t| required.binary_search(t).is_err())
            .collect();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let picked =
            rand::seq::index::sample(&mut rng, candidates.len(), extra.min(candidates.len()));
        rows.extend(picked.into_iter().map(|k| candidates[k]));
        rows.sort_unstable();
    }
    rows
}

/// The rows a sampled-mode reference computes: the real rows among `rows`, ascending, without
/// duplicates. Padding rows and rows past T have no output and are skipped.
pub(crate) fn real_rows_of(p: &Problem, rows: &[usize]) -> Vec<usize> {
    let real = p.real_rows();
    let mut out: Vec<usize> = rows.iter().copied().filter(|&t| t < real).collect();
    out.sort_unstable();
    out.dedup();
    out
}
