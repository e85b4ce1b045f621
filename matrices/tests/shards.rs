//! Shards: disjoint, covering, balanced, independent of input order; "K/N" parsing.

use proptest::prelude::*;
use relattn_matrices::{load_tier, shard, Case, Shard};
use std::collections::BTreeSet;

fn ids(cases: &[Case]) -> BTreeSet<String> {
    cases.iter().map(|c| c.id.clone()).collect()
}

#[test]
fn shards_are_disjoint_and_cover_the_tier() {
    let cases = load_tier("ci").unwrap().expand().unwrap().cases;
    let all = ids(&cases);
    for n in [1, 2, 3, 4, 7, 16, 1000] {
        let mut union = BTreeSet::new();
        let mut total = 0;
        let (mut small, mut large) = (usize::MAX, 0);
        for k in 1..=n {
            let part = shard(&cases, k, n);
            total += part.len();
            small = small.min(part.len());
            large = large.max(part.len());
            for id in ids(&part) {
                assert!(union.insert(id), "n = {n}: a case is in two shards");
            }
        }
        assert_eq!(total, cases.len(), "n = {n}");
        assert_eq!(union, all, "n = {n}");
        assert!(large - small <= 1, "n = {n}: shard sizes {small}..{large}");
    }
}

fn bytes(c: &Case) -> u64 {
    c.spec().unwrap().size().map_or(0, |s| s.bytes())
}

/// Dealt largest first, back and forth: the shards' bytes differ by at most the largest case's,
/// and the long-context cases (most of the nightly's time) spread evenly over the shards.
#[test]
fn large_cases_are_spread_over_the_shards() {
    let cases = load_tier("nightly").unwrap().expand().unwrap().cases;
    let largest = cases.iter().map(bytes).max().unwrap();
    // Cases of 1 GiB or more: long context (1M keys, or 128k keys with 8 KV heads).
    let long = |c: &Case| bytes(c) >= 1 << 30;
    let n_long = cases.iter().filter(|c| long(c)).count();
    for n in [7, 40] {
        let parts: Vec<Vec<Case>> = (1..=n).map(|k| shard(&cases, k, n)).collect();
        let sums: Vec<u64> = parts.iter().map(|p| p.iter().map(bytes).sum()).collect();
        let (lo, hi) = (sums.iter().min().unwrap(), sums.iter().max().unwrap());
        assert!(
            hi - lo <= largest,
            "n = {n}: shard bytes {lo}..{hi}, largest case {largest}"
        );
        for (k, p) in parts.iter().enumerate() {
            let here = p.iter().filter(|c| long(c)).count();
            // They are the first ranks, dealt one per shard a round.
            assert!(
                here >= n_long / n && here <= n_long.div_ceil(n),
                "n = {n}: shard {} holds {here} of {n_long} long-context cases",
                k + 1
            );
        }
    }
}

#[test]
fn shards_keep_the_original_order_and_ignore_the_input_order() {
    let cases = load_tier("smoke").unwrap().expand().unwrap().cases;
    let part = shard(&cases, 2, 3);
    let positions: Vec<usize> = part
        .iter()
        .map(|c| cases.iter().position(|x| x.id == c.id).unwrap())
        .collect();
    assert!(positions.windows(2).all(|w| w[0] < w[1]));
    let mut reversed = cases.clone();
    reversed.reverse();
    assert_eq!(ids(&shard(&reversed, 2, 3)), ids(&part));
}

#[test]
fn a_shard_out_of_range_selects_nothing() {
    let cases = load_tier("smoke").unwrap().expand().unwrap().cases;
    assert!(shard(&cases, 0, 3).is_empty());
    assert!(shard(&cases, 4, 3).is_empty());
    assert!(shard(&cases, 1, 0).is_empty());
}

#[test]
fn shard_text_parses_and_rejects_bad_values() {
    assert_eq!(
        "2/8".parse::<Shard>().unwrap(),
        Shard { index: 2, count: 8 }
    );
    assert_eq!("1/1".parse::<Shard>().unwrap(), Shard::ALL);
    assert_eq!(Shard::new(3, 4).unwrap().to_string(), "3/4");
    for bad in ["0/4", "5/4", "1/0", "x/4", "2", "2/y", "", "-1/4"] {
        let err = bad.parse::<Shard>().expect_err(bad).to_string();
        assert!(err.contains(&format!("`{bad}`")), "{bad}: {err}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]
    #[test]
    fn any_shard_count_partitions_the_smoke_tier(n in 1usize..40) {
        let cases = load_tier("smoke").unwrap().expand().unwrap().cases;
        let mut seen = BTreeSet::new();
        for k in 1..=n {
            let s: Shard = format!("{k}/{n}").parse().unwrap();
            for c in s.select(&cases) {
                prop_assert!(seen.insert(c.id));
            }
        }
        prop_assert_eq!(seen.len(), cases.len());
    }
}
