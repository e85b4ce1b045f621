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

/// Every id starts with the same letter, so shards rank cases as by their hex digits alone:
/// the prefix moved no case to another shard.
#[test]
fn the_id_prefix_leaves_every_case_in_its_shard() {
    let cases = load_tier("ci").unwrap().expand().unwrap().cases;
    let mut digits: Vec<&str> = cases.iter().map(|c| &c.id[1..]).collect();
    digits.sort_unstable();
    for k in 1..=4 {
        let by_digits: BTreeSet<String> = digits
            .iter()
            .enumerate()
            .filter(|(r, _)| r % 4 == k - 1)
            .map(|(_, d)| format!("c{d}"))
            .collect();
        assert_eq!(ids(&shard(&cases, k, 4)), by_digits, "shard {k}/4");
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
