//! Invariants of routing and the policies over the whole input space (docs/operator.md section
//! 4.2): properties, not examples.

use proptest::prelude::*;
use relattn_routing::{
    bucket_max_seqlen_q, decide, decode_split_count, decode_split_keys, fallback_decode_splits,
    lookup, num_splits, path_spec, policy_splits, table, Capability, Outcome, PathId, Shape,
};

/// Any capability of the grid majors 0..=15 x minors 0..=9.
fn any_cc() -> impl Strategy<Value = Capability> {
    (0u32..=15, 0u32..=9).prop_map(|(major, minor)| Capability::new(major, minor))
}

/// Realistic-to-extreme shapes: sizes up to the int32 limit the operator's metadata has.
fn any_shape() -> impl Strategy<Value = Shape> {
    let len = prop_oneof![1usize..=4096, 1usize..=(i32::MAX as usize)];
    (
        1usize..=4096,
        len.clone(),
        1usize..=128,
        1usize..=128,
        len,
        prop_oneof![
            Just(16usize),
            Just(32),
            Just(64),
            Just(128),
            Just(256),
            1usize..=1024
        ],
        prop_oneof![Just(-1i64), 0i64..=(i32::MAX as i64)],
    )
        .prop_map(|(batch, q, h, hkv, kv, page, w)| Shape {
            batch,
            max_query_len: q,
            num_heads: h,
            num_kv_heads: hkv,
            max_kv_len: kv,
            page_size: page,
            window_left: w,
            is_local: w >= 0,
        })
}

/// Any values at all, valid or not: the policies must stay total and keep their invariants.
fn raw_shape() -> impl Strategy<Value = Shape> {
    (any::<[usize; 6]>(), any::<i64>(), any::<bool>()).prop_map(|(v, w, is_local)| Shape {
        batch: v[0],
        max_query_len: v[1],
        num_heads: v[2],
        num_kv_heads: v[3],
        max_kv_len: v[4],
        page_size: v[5],
        window_left: w,
        is_local,
    })
}

proptest! {
    #[test]
    fn num_splits_is_at_least_one_and_one_without_split_kv(cc in any_cc(), s in any_shape()) {
        match lookup(cc) {
            Some(row) => {
                let n = num_splits(row, &s);
                prop_assert!(n >= 1);
                prop_assert!(n <= 128);
                if !row.split_kv || s.is_local || matches!(row.outcome, Outcome::Reject(_)) {
                    prop_assert_eq!(n, 1);
                }
            }
            None => {
                // Not in the table: rejected, so no split count at all.
                let d = decide(cc, &s);
                prop_assert!(d.rejected);
                prop_assert_eq!(d.num_splits, None);
                prop_assert_eq!(d.reason, Some(format!("no route for SM {}.{}", cc.major, cc.minor)));
            }
        }
    }

    #[test]
    fn num_splits_stays_total_on_any_values(cc in any_cc(), s in raw_shape()) {
        if let Some(row) = lookup(cc) {
            let n = num_splits(row, &s);
            prop_assert!(n >= 1);
            if !row.split_kv || s.is_local {
                prop_assert_eq!(n, 1);
            }
        }
        let d = decide(cc, &s);
        prop_assert!(d.num_splits.is_none_or(|n| n >= 1));
    }

    #[test]
    fn decisions_keep_the_route_invariants(cc in any_cc(), s in any_shape()) {
        let d = decide(cc, &s);
        prop_assert_eq!(&d.cc, &cc.to_string());
        prop_assert_eq!(d.max_seqlen_q_bucket, bucket_max_seqlen_q(s.max_query_len));
        match d.path {
            Some(path) => {
                let row = lookup(cc).expect("a routed capability has a row");
                // Serving always reads the paged cache: never route to a path without it.
                prop_assert!(row.paged_kv_forward);
                prop_assert_eq!(row.outcome, Outcome::Route(path));
                prop_assert!(!d.rejected && d.reason.is_none());
                let n = d.num_splits.expect("routed decisions have a split count");
                prop_assert!(n >= 1);
                if !row.split_kv {
                    prop_assert_eq!(n, 1);
                }
                if d.split_kv_decode {
                    prop_assert_eq!(path, PathId::Fallback);
                    let count = d.decode_splits.expect("routed");
                    prop_assert!((1..=32).contains(&count));
                    prop_assert_eq!(s.max_query_len, 1);
                } else {
                    prop_assert_eq!(d.decode_splits, Some(1));
                }
            }
            None => {
                prop_assert!(d.rejected);
                prop_assert!(d.reason.as_deref().is_some_and(|r| !r.is_empty()));
                prop_assert_eq!(d.num_splits, None);
                prop_assert_eq!(d.decode_splits, None);
                prop_assert!(!d.split_kv_decode);
            }
        }
    }

    #[test]
    fn bucket_is_the_smallest_power_of_two_not_below_its_input(n in prop_oneof![0usize..=4096, 0usize..=(1usize << 63)]) {
        let b = bucket_max_seqlen_q(n);
        prop_assert!(b.is_power_of_two());
        prop_assert!(b >= n);
        prop_assert!(b == 1 || b / 2 < n);
    }

    #[test]
    fn decode_split_count_is_bounded(kv in any::<usize>(), w in prop_oneof![Just(-1i64), 0i64..=100_000, any::<i64>()]) {
        let n = decode_split_count(kv, w);
        prop_assert!(n >= 1);
        let max = if w >= 0 { 4 } else { 32 };
        prop_assert!(n <= max);
    }

    /// The policies the native paths run under wherever they run are their production rows'.
    #[test]
    fn path_policies_are_their_rows_decisions(s in any_shape()) {
        let d = |major, minor| decide(Capability::new(major, minor), &s);
        prop_assert_eq!(Some(policy_splits(PathId::ShearedBias, &s)), d(10, 0).num_splits);
        prop_assert_eq!(Some(policy_splits(PathId::ScoreMod, &s)), d(9, 0).num_splits);
        let sm80 = d(8, 0);
        prop_assert_eq!(Some(policy_splits(PathId::Fallback, &s)), sm80.decode_splits);
        prop_assert_eq!(fallback_decode_splits(&s).is_some(), sm80.split_kv_decode);
        // What a policy picks, its path takes.
        for path in PathId::ALL {
            prop_assert_eq!(path_spec(path).check_splits(policy_splits(path, &s)), Ok(()));
        }
    }

    #[test]
    fn split_ranges_partition_the_visible_keys(
        kv in prop_oneof![0usize..=4096, 0usize..=(1usize << 40)],
        w in prop_oneof![Just(-1i64), 0i64..=4096, any::<i64>()],
        splits in 1usize..=64,
    ) {
        let ranges: Vec<_> = (0..splits).map(|s| decode_split_keys(kv, w, splits, s)).collect();
        let eff = if w >= 0 { kv.min(usize::try_from(w).unwrap().saturating_add(1)) } else { kv };
        let offset = kv - eff;
        let mut next = offset;
        let mut seen_empty = false;
        for (i, r) in ranges.iter().enumerate() {
            match r {
                None => seen_empty = true,
                Some(r) => {
                    // Empty splits only at the end; non-empty ones are contiguous and in order.
                    prop_assert!(!seen_empty, "non-empty split {} after an empty one", i);
                    prop_assert_eq!(r.start, next);
                    prop_assert!(r.end > r.start);
                    next = r.end;
                }
            }
        }
        prop_assert_eq!(next, kv, "the splits cover [kv_offset, Lk) exactly");
        // Split length is a multiple of 32: every non-empty split but the last is.
        let nonempty: Vec<_> = ranges.iter().flatten().collect();
        if let Some((_, head)) = nonempty.split_last() {
            for r in head {
                prop_assert_eq!((r.end - r.start) % 32, 0);
            }
        }
    }
}

#[test]
fn every_capability_of_the_grid_routes_only_to_paged_paths() {
    // Exhaustive over majors 0..=15 and minors 0..=9 (160 values).
    for major in 0..=15 {
        for minor in 0..=9 {
            let cc = Capability::new(major, minor);
            let in_table = table().iter().any(|row| row.cc == cc);
            assert_eq!(lookup(cc).is_some(), in_table);
            if let Some(row) = lookup(cc) {
                if let Outcome::Route(_) = row.outcome {
                    assert!(row.paged_kv_forward, "{cc} routes without a paged forward");
                } else {
                    assert!(
                        !row.split_kv && !row.split_kv_decode,
                        "rejected {cc} has split flags"
                    );
                }
            }
        }
    }
}

#[test]
fn table_rows_agree_with_their_paths() {
    for row in table() {
        if let Outcome::Route(path) = row.outcome {
            // Only the sheared path splits its main kernel, only the fallback has a decode kernel.
            assert_eq!(row.split_kv, path == PathId::ShearedBias, "{:?}", row.cc);
            assert_eq!(
                row.split_kv_decode,
                path == PathId::Fallback,
                "{:?}",
                row.cc
            );
            assert_eq!(
                row.sheared_bias,
                path == PathId::ShearedBias,
                "{:?}",
                row.cc
            );
        }
    }
    let mut ccs: Vec<_> = table().iter().map(|r| r.cc).collect();
    ccs.dedup();
    assert_eq!(ccs.len(), table().len(), "one row per capability");
    assert!(
        ccs.windows(2).all(|w| w[0] < w[1]),
        "rows in capability order"
    );
}
