//! The references never read a poisoned slot or a padding row; sampled rows equal full rows.

mod common;

use common::{assert_finite_real_rows, assert_identical, small_spec};
use ndarray::s;
use relattn_reference::gen::generate;
use relattn_reference::sample::sample_rows;
use relattn_reference::{emulate, fast, oracle, DType, PageMode, Problem};

fn mixed_local() -> Problem {
    // Local layer (window 31), requests: decode at long context, a zero-length one, chunked
    // prefill, a fresh prefill; padding rows after them.
    let mut spec = small_spec(
        DType::Bf16,
        (4, 2),
        16,
        32,
        31,
        16,
        vec![(1, 300), (0, 40), (20, 90), (37, 37)],
        3,
    );
    spec.padding_rows = 3;
    generate(&spec).unwrap()
}

fn mixed_global() -> Problem {
    let mut spec = small_spec(
        DType::F16,
        (6, 2),
        8,
        100,
        -1,
        3,
        vec![(5, 600), (30, 45), (0, 0), (1, 1)],
        4,
    );
    spec.padding_rows = 2;
    generate(&spec).unwrap()
}

#[test]
fn poisoned_caches_and_padding_give_finite_output() {
    for p in [mixed_local(), mixed_global()] {
        assert!(
            p.kv.iter().any(|x| x.is_nan()),
            "the generator poisons unread slots"
        );
        assert!(p
            .q
            .slice(s![p.real_rows().., .., ..])
            .iter()
            .all(|x| x.is_nan()));
        assert_finite_real_rows(&p, &oracle::attention(&p), "oracle");
        assert_finite_real_rows(&p, &fast::attention(&p), "fast");
        assert_finite_real_rows(&p, &emulate::attention(&p), "emulate");
    }
}

#[test]
fn aliased_all_zero_block_table() {
    // Every request aliases block 0 (warm-up shape): nothing is poisoned then, all must agree.
    let mut spec = small_spec(
        DType::Bf16,
        (2, 1),
        8,
        16,
        -1,
        16,
        vec![(3, 10), (2, 12)],
        9,
    );
    spec.pages = PageMode::AllZero;
    let p = generate(&spec).unwrap();
    common::assert_close(
        &fast::attention(&p),
        &oracle::attention(&p),
        1e-12,
        "fast vs oracle",
    );
}

/// Plant NaN in K and V at `(request, key)` slots and in padding rows' q and rel_logits.
fn plant_nan(p: &Problem, slots: &[(usize, usize)]) -> Problem {
    let mut data = p.clone().into_data();
    for &(b, j) in slots {
        let block = p.block_of(b, j);
        for h in 0..p.num_kv_heads {
            for view in [p.k, p.v] {
                let at = view.at(block, j % p.page_size, h);
                data.kv[at..at + p.head_dim].fill(f32::NAN);
            }
        }
    }
    let real = p.real_rows();
    data.q.slice_mut(s![real.., .., ..]).fill(f32::NAN);
    data.rel_logits.slice_mut(s![real.., .., ..]).fill(f32::NAN);
    Problem::new(data).unwrap()
}

#[test]
fn nan_right_before_the_window_and_right_after_lk_is_not_read() {
    // Unpoisoned problem, then NaN in the slot just before request 0's earliest window start
    // and in the slot just past Lk (page 16, Lk = 90: slot 10 of its last page is free).
    let mut spec = small_spec(
        DType::Bf16,
        (4, 2),
        16,
        32,
        31,
        16,
        vec![(20, 90), (3, 40)],
        5,
    );
    spec.poison = false;
    spec.padding_rows = 2;
    let p = generate(&spec).unwrap();
    let r = p.request(0);
    let (first, _) = p.visible_keys(&r, 0);
    assert_eq!(first, 90 - 20 - 31);
    let planted = plant_nan(
        &p,
        &[(0, first - 1), (0, r.kv_len), (1, p.request(1).kv_len)],
    );
    assert_identical(
        &oracle::attention(&planted),
        &oracle::attention(&p),
        "oracle",
    );
    assert_identical(&fast::attention(&planted), &fast::attention(&p), "fast");
    assert_identical(
        &emulate::attention(&planted),
        &emulate::attention(&p),
        "emulate",
    );
}

#[test]
fn sample_always_holds_first_and_last_rows() {
    for p in [mixed_local(), mixed_global()] {
        let rows = sample_rows(&p, 6, 11);
        assert!(
            rows.windows(2).all(|w| w[0] < w[1]),
            "ascending, no duplicates: {rows:?}"
        );
        for r in p.requests().filter(|r| r.q_len > 0) {
            assert!(rows.contains(&r.q_start) && rows.contains(&(r.q_start + r.q_len - 1)));
        }
        assert!(rows.contains(&(p.real_rows() - 1)));
        assert!(
            rows.iter().all(|&t| t < p.real_rows()),
            "padding rows are never sampled"
        );
        assert_eq!(rows.len(), 6, "five required rows plus one drawn");
        assert_eq!(rows, sample_rows(&p, 6, 11), "seeded");
        assert_eq!(
            sample_rows(&p, 10_000, 0),
            (0..p.real_rows()).collect::<Vec<_>>()
        );
    }
}

#[test]
fn sample_fills_up_to_n_with_seeded_rows() {
    let p = mixed_global();
    // Required: first and last rows of three non-empty requests, one of them a single row:
    // 5 rows (of 36 real rows).
    let a = sample_rows(&p, 20, 1);
    let b = sample_rows(&p, 20, 2);
    assert_eq!((a.len(), b.len()), (20, 20));
    assert_ne!(a, b, "the seed chooses the extra rows");
    // Fewer than the required rows: all required rows anyway.
    assert_eq!(sample_rows(&p, 1, 1).len(), 5);
}

#[test]
fn sampled_rows_are_bit_identical_to_full() {
    for p in [mixed_local(), mixed_global()] {
        let rows = sample_rows(&p, 9, 21);
        let fast_full = fast::attention(&p);
        let emu_full = emulate::attention(&p);
        let fast_rows = fast::attention_rows(&p, &rows);
        let emu_rows = emulate::attention_rows(&p, &rows);
        for (name, full, part) in [
            ("fast", &fast_full, &fast_rows),
            ("emulate", &emu_full, &emu_rows),
        ] {
            assert_eq!(part.rows.as_deref(), Some(&rows[..]), "{name}");
            for (k, &t) in rows.iter().enumerate() {
                for h in 0..p.num_heads {
                    assert_eq!(
                        part.lse[[k, h]].to_bits(),
                        full.lse[[t, h]].to_bits(),
                        "{name} lse[{t},{h}]"
                    );
                    for c in 0..p.head_dim {
                        let (x, y) = (part.out[[k, h, c]], full.out[[t, h, c]]);
                        assert_eq!(
                            x.to_bits(),
                            y.to_bits(),
                            "{name} out[{t},{h},{c}]: {x} vs {y}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn sampled_mode_skips_padding_and_unsorted_input() {
    let p = mixed_local();
    let real = p.real_rows();
    let res = fast::attention_rows(&p, &[real + 1, 5, 0, 5, real - 1]);
    assert_eq!(res.rows, Some(vec![0, 5, real - 1]));
    assert_eq!(res.out.shape(), [3, p.num_heads, p.head_dim]);
    let emu = emulate::attention_rows(&p, &[real, 5, 0, real - 1]);
    assert_eq!(emu.rows, Some(vec![0, 5, real - 1]));
}

/// Progress counts every computed (row, head) pair once, full and sampled, and reporting it
/// changes no bit of the result.
#[test]
fn progress_counts_every_row_and_head_once() {
    use std::sync::atomic::{AtomicU64, Ordering};
    for p in [mixed_local(), mixed_global()] {
        let sample = sample_rows(&p, 7, 1);
        for rows in [None, Some(sample.as_slice())] {
            let n = rows.map_or(p.real_rows(), <[usize]>::len) as u64 * p.num_heads as u64;
            let (f, e) = (AtomicU64::new(0), AtomicU64::new(0));
            let a = fast::attention_with(&p, rows, &|k| {
                f.fetch_add(k, Ordering::Relaxed);
            });
            let b = emulate::attention_with(&p, rows, &|k| {
                e.fetch_add(k, Ordering::Relaxed);
            });
            assert_eq!((f.into_inner(), e.into_inner()), (n, n));
            let (a0, b0) = match rows {
                Some(r) => (fast::attention_rows(&p, r), emulate::attention_rows(&p, r)),
                None => (fast::attention(&p), emulate::attention(&p)),
            };
            assert_identical(&a, &a0, "fast");
            assert_identical(&b, &b0, "emulate");
        }
    }
}
