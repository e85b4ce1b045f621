//! Transformations that must not change the operator's output (the invariances the reference
//! and the GPU paths are checked against): another cache layout, another placement of the
//! physical pages, a prefill split into chunks.

use crate::problem::{CacheLayout, Problem, ProblemData};
use ndarray::Array2;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;

/// The same problem with its caches in `layout` (every slot copied, poisoned ones included).
pub fn with_layout(p: &Problem, layout: CacheLayout) -> Problem {
    relayout(p, layout, |block| block)
}

/// The same problem with its physical blocks permuted (seeded); the block table follows.
pub fn permute_pages(p: &Problem, seed: u64) -> Problem {
    let mut perm: Vec<usize> = (0..p.num_blocks).collect();
    perm.shuffle(&mut ChaCha8Rng::seed_from_u64(seed));
    let moved = relayout(p, p.layout, |block| perm[block]);
    let mut data = moved.into_data();
    data.block_table.mapv_inplace(|b| {
        if b >= 0 && (b as usize) < perm.len() {
            perm[b as usize] as i32
        } else {
            b
        }
    });
    Problem::new(data).expect("a page permutation keeps a valid problem valid")
}

/// Copy the caches into `layout`, moving old block `b` to new block `to(b)`.
fn relayout(p: &Problem, layout: CacheLayout, to: impl Fn(usize) -> usize) -> Problem {
    let (k, v, len) = layout.views(p.num_blocks, p.page_size, p.num_kv_heads, p.head_dim);
    let mut kv = vec![0f32; len];
    let d = p.head_dim;
    for block in 0..p.num_blocks {
        for slot in 0..p.page_size {
            for head in 0..p.num_kv_heads {
                for (src, dst) in [(p.k, k), (p.v, v)] {
                    let s = src.at(block, slot, head);
                    let t = dst.at(to(block), slot, head);
                    kv[t..t + d].copy_from_slice(&p.kv[s..s + d]);
                }
            }
        }
    }
    let data = ProblemData {
        kv,
        layout,
        k,
        v,
        ..p.data().clone()
    };
    Problem::new(data).expect("a relayout keeps a valid problem valid")
}

/// Split request `b` after its first `first_len` query rows into two requests (a chunked
/// prefill): packed rows keep their positions, so every row's output must stay the same.
/// Returns None when `first_len` is not strictly inside the request.
pub fn split_request(p: &Problem, b: usize, first_len: usize) -> Option<Problem> {
    let r = p.request(b);
    if first_len == 0 || first_len >= r.q_len {
        return None;
    }
    let mut data = p.data().clone();
    let first_kv = (r.kv_len - r.q_len + first_len) as i32;
    data.cu_seqlens_q
        .insert(b + 1, (r.q_start + first_len) as i32);
    data.seqused_k.insert(b, first_kv);
    let (rows, cols) = (p.block_table.shape()[0], p.block_table.shape()[1]);
    let mut table = Array2::<i32>::zeros((rows + 1, cols));
    for new_b in 0..=rows {
        let old_b = if new_b <= b { new_b } else { new_b - 1 };
        table.row_mut(new_b).assign(&p.block_table.row(old_b));
    }
    data.block_table = table;
    Problem::new(data).ok()
}

/// The same problem with every value no real row reads made finite (0.0): the NaN a generated
/// case puts in unused and pre-window pages, padding rows and bias cells past the visible
/// distances (a case file may hold NaN only there too: `finite.rs`). The output must not change,
/// so a kernel that passes on this problem and fails on the original leaks NaN from memory it
/// must not read (docs/operator.md section 5, class 7). None when the problem holds no non-finite
/// value.
pub fn finite_unread(p: &Problem) -> Option<Problem> {
    // In parallel: a case past 2^31 elements takes seconds on one thread, on the path of a
    // failing trial's triage.
    let finite = |x: &f32| x.is_finite();
    let all_finite = |a: &ndarray::Array3<f32>| {
        a.as_slice_memory_order()
            .map_or_else(|| a.iter().all(finite), |s| s.par_iter().all(finite))
    };
    if all_finite(&p.q) && all_finite(&p.rel_logits) && p.kv.par_iter().all(finite) {
        return None;
    }
    let zero = |x: f32| if x.is_finite() { x } else { 0.0 };
    let d = p.data();
    let data = ProblemData {
        dtype: d.dtype,
        num_heads: d.num_heads,
        num_kv_heads: d.num_kv_heads,
        head_dim: d.head_dim,
        rel_extent: d.rel_extent,
        page_size: d.page_size,
        num_blocks: d.num_blocks,
        softmax_scale: d.softmax_scale,
        window_left: d.window_left,
        q: d.q.mapv(zero),
        rel_logits: d.rel_logits.mapv(zero),
        kv: d.kv.par_iter().map(|&x| zero(x)).collect(),
        layout: d.layout,
        rows: d.rows,
        k: d.k,
        v: d.v,
        block_table: d.block_table.clone(),
        seqused_k: d.seqused_k.clone(),
        cu_seqlens_q: d.cu_seqlens_q.clone(),
    };
    Some(Problem::new(data).expect("finite values keep a valid problem valid"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gen::{generate, GenSpec};

    #[test]
    fn transforms_keep_keys_and_values() {
        let mut spec = GenSpec::global(4, 2, vec![(3, 40), (0, 5), (2, 2)], 11);
        spec.head_dim = 8;
        spec.poison = false;
        let p = generate(&spec).unwrap();
        let q = with_layout(&p, CacheLayout::HndPacked);
        let r = permute_pages(&q, 5);
        for b in 0..p.batch() {
            for j in 0..p.seqused_k[b] as usize {
                for h in 0..2 {
                    assert_eq!(p.key(b, j, h), r.key(b, j, h));
                    assert_eq!(p.value(b, j, h), r.value(b, j, h));
                }
            }
        }
        let s = split_request(&p, 0, 1).unwrap();
        assert_eq!(s.batch(), 4);
        assert_eq!(s.request(0).kv_len, 38);
        assert_eq!(s.request(1).q_start, 1);
        assert_eq!(s.request(1).kv_len, 40);
        assert!(split_request(&p, 1, 1).is_none());
    }

    #[test]
    fn finite_unread_changes_only_what_no_row_reads() {
        let mut spec = GenSpec::global(4, 2, vec![(3, 40), (0, 5), (2, 2)], 11);
        spec.head_dim = 8;
        let p = generate(&spec).unwrap();
        assert!(
            p.kv.iter().any(|x| x.is_nan()),
            "a generated case is poisoned"
        );
        let f = finite_unread(&p).unwrap();
        assert!(f
            .kv
            .iter()
            .chain(f.q.iter())
            .chain(f.rel_logits.iter())
            .all(|x| x.is_finite()));
        // The keys of requests with queries are read (a zero-length request reads none).
        for b in (0..p.batch()).filter(|&b| p.request(b).q_len > 0) {
            for j in 0..p.seqused_k[b] as usize {
                for h in 0..2 {
                    assert_eq!(p.key(b, j, h), f.key(b, j, h));
                    assert_eq!(p.value(b, j, h), f.value(b, j, h));
                }
            }
        }
        for t in 0..p.real_rows() {
            assert_eq!(
                p.q.index_axis(ndarray::Axis(0), t),
                f.q.index_axis(ndarray::Axis(0), t)
            );
        }
        assert!(finite_unread(&f).is_none(), "nothing left to change");
    }
}
