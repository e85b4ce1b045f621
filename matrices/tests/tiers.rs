//! The built-in tiers: sizes, budgets, coverage, and that every case generates.

use relattn_matrices::{
    load_tier, Case, Expansion, SplitSetting, MIXES, REGRESSION_CLASSES, REGRESSION_ONLY_MIXES,
    TIERS,
};
use relattn_reference::gen::generate;
use relattn_reference::RowLayout;
use std::collections::{BTreeMap, BTreeSet};

fn expand(tier: &str) -> Expansion {
    load_tier(tier)
        .unwrap_or_else(|e| panic!("{e}"))
        .expand()
        .unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn every_tier_loads_and_has_cases() {
    for tier in TIERS {
        let x = expand(tier);
        assert!(!x.cases.is_empty(), "{tier}");
        assert!(x.cases.iter().all(|c| c.tier == *tier), "{tier}");
        let ids: BTreeSet<&str> = x.cases.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(ids.len(), x.cases.len(), "{tier}: duplicate ids");
    }
}

#[test]
fn smoke_stays_small_enough_for_the_cpu() {
    let x = expand("smoke");
    let n = x.cases.len();
    // Enough cases to reach every cheap mix and layout, few enough for seconds on 2 cores.
    assert!((40..=100).contains(&n), "smoke has {n} cases");
    let total: f64 = x.cases.iter().map(Case::flops).sum();
    assert!(
        total <= 20e9,
        "smoke needs {:.2} GFLOP of reference work",
        total / 1e9
    );
    // The tier is sized for a 2-core CI machine that runs the naive oracle on every case.
    assert!(
        total <= 3e9,
        "smoke grew to {:.2} GFLOP; keep it under 3",
        total / 1e9
    );
    for c in &x.cases {
        assert!(
            c.spec().unwrap().num_heads <= 8,
            "{}: H = {}",
            c.name,
            c.spec().unwrap().num_heads
        );
        assert!(
            c.max_kv_len() <= 2048,
            "{}: Lk = {}",
            c.name,
            c.max_kv_len()
        );
        assert!(
            c.sample_rows.is_none(),
            "{}: smoke checks every row",
            c.name
        );
    }
}

#[test]
fn smoke_cases_generate_and_match_their_own_figures() {
    for c in expand("smoke").cases {
        let p = generate(c.spec().unwrap()).unwrap_or_else(|e| panic!("{}: {e}", c.name));
        assert_eq!(p.flops(), c.flops(), "{}", c.name);
        assert_eq!(p.max_kv_len(), c.max_kv_len(), "{}", c.name);
        assert_eq!(p.max_query_len(), c.max_query_len(), "{}", c.name);
        assert_eq!(p.total_rows(), c.total_rows(), "{}", c.name);
        assert_eq!(p.real_rows(), c.real_rows(), "{}", c.name);
        assert_eq!(p.kv.len() as u64, c.cache_elements().unwrap(), "{}", c.name);
    }
}

/// The values every axis must reach in the ci tier.
#[test]
fn ci_covers_every_axis_value() {
    let x = expand("ci");
    let n = x.cases.len();
    assert!((150..=500).contains(&n), "ci has {n} cases");
    let mut seen: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for c in &x.cases {
        let s = c.spec().unwrap();
        let mut add = |axis, v: String| seen.entry(axis).or_default().insert(v);
        add("layer", c.layer().to_string());
        add("heads", format!("{}/{}", s.num_heads, s.num_kv_heads));
        add("group", (s.num_heads / s.num_kv_heads).to_string());
        add("head_dim", s.head_dim.to_string());
        add("page_size", s.page_size.to_string());
        add("layout", s.layout.name().to_string());
        add("dtype", s.dtype.name().to_string());
        add("bias", format!("{:?}", s.bias).to_lowercase());
        add("mix", c.mix.clone());
        add("inputs", s.inputs.name().to_string());
        add("seed", s.seed.to_string());
        for split in &c.splits {
            add("split", split.to_string());
        }
    }
    let required: &[(&str, &[&str])] = &[
        (
            "layer",
            &[
                "global_e128",
                "global_e1024",
                "local_e128",
                "local_e256",
                "local_e512",
            ],
        ),
        ("layer", &["global_e64", "global_e1000"]),
        (
            "heads",
            &[
                "64/8", "32/4", "16/2", "8/1", "64/16", "32/8", "16/4", "8/2", "4/4", "16/1", "8/4",
            ],
        ),
        ("group", &["1", "2", "4", "8", "16"]),
        ("head_dim", &["128"]),
        ("page_size", &["16", "32", "64", "128", "256"]),
        ("layout", &["nhd_packed", "hnd_packed", "contiguous"]),
        ("dtype", &["bf16", "fp16"]),
        ("bias", &["normal", "distinct", "zero"]),
        (
            "inputs",
            &["rms1", "peaked", "sink", "diagonal", "large_logits"],
        ),
        ("split", &["policy", "s1", "s2", "s3", "s7", "s16", "s128"]),
    ];
    for (axis, values) in required {
        for v in *values {
            assert!(seen[axis].contains(*v), "ci lacks {axis} = {v}");
        }
    }
    for m in MIXES
        .iter()
        .filter(|m| !REGRESSION_ONLY_MIXES.contains(&m.name))
    {
        assert!(seen["mix"].contains(m.name), "ci lacks mix {}", m.name);
    }
    assert!(seen["seed"].len() >= 2, "ci uses one seed");
    // Long context reaches both lengths and is judged on sampled rows.
    for lk in [131072, 1 << 20] {
        assert!(
            x.cases
                .iter()
                .any(|c| c.max_kv_len() == lk && c.sample_rows.is_some()),
            "ci lacks sampled cases at Lk {lk}"
        );
    }
}

#[test]
fn nightly_is_large_and_has_long_context() {
    let x = expand("nightly");
    assert!(
        x.cases.len() >= 10_000,
        "nightly has {} cases",
        x.cases.len()
    );
    let long: Vec<&Case> = x
        .cases
        .iter()
        .filter(|c| c.max_kv_len() >= 131072)
        .collect();
    assert!(long.iter().any(|c| c.max_kv_len() == 1 << 20));
    assert!(long.iter().any(|c| !c.is_decode_only()), "no long chunks");
    for c in &long {
        assert!(
            c.sample_rows.is_some(),
            "{}: long case without sampled rows",
            c.name
        );
        assert!(
            c.max_query_len() <= 2048,
            "{}: chunk longer than 2048",
            c.name
        );
    }
}

/// One case per bug class in the padded row layout; other row layouts add variants of a class's
/// case (the exact-rows `rel_logits_padding_rows_read`), never a class of their own.
#[test]
fn regressions_have_one_case_per_bug_class() {
    let x = expand("regressions");
    let mut by_class: BTreeMap<&str, usize> = BTreeMap::new();
    let mut variants = Vec::new();
    for c in &x.cases {
        let class = c
            .regression
            .as_deref()
            .unwrap_or_else(|| panic!("{}: no class", c.name));
        assert!(c.name.starts_with(&format!("{class}::")), "{}", c.name);
        if c.facts().rows == RowLayout::Padded {
            *by_class.entry(class).or_default() += 1;
        } else {
            variants.push(class);
        }
    }
    for (class, _) in REGRESSION_CLASSES {
        assert_eq!(by_class.get(class), Some(&1), "class {class}");
    }
    assert_eq!(variants, ["rel_logits_padding_rows_read"]);
    assert_eq!(x.cases.len(), REGRESSION_CLASSES.len() + variants.len());
}

/// A mix the `ci` tier leaves out is a regression case's: it must name a mix and be used by the
/// `regressions` tier, and by no other built-in tier.
#[test]
fn regression_only_mixes_are_the_regression_tiers() {
    for name in REGRESSION_ONLY_MIXES {
        assert!(MIXES.iter().any(|m| m.name == *name), "{name} is no mix");
        for tier in TIERS {
            let used = expand(tier).cases.iter().any(|c| c.mix == *name);
            assert_eq!(used, *tier == "regressions", "{name} in tier {tier}");
        }
    }
}

/// docs/operator.md lists every regression class with its docs/operator.md section 5 class.
#[test]
fn the_operator_page_lists_every_regression_class() {
    let text = include_str!("../../docs/operator.md");
    for (class, _) in REGRESSION_CLASSES {
        assert!(
            text.lines()
                .any(|l| l.starts_with('|') && l.contains(&format!("`{class}`"))),
            "docs/operator.md does not list {class}"
        );
    }
}

#[test]
fn regression_classes_are_named_in_a_comment_of_the_file() {
    let text = include_str!("../tiers/regressions.toml");
    for (class, _) in REGRESSION_CLASSES {
        let comment = text
            .lines()
            .any(|l| l.starts_with('#') && l.contains(class));
        assert!(comment, "no comment names {class}");
    }
}

#[test]
fn split_settings_show_as_policy_and_counts() {
    assert_eq!(SplitSetting::Policy.to_string(), "policy");
    assert_eq!(SplitSetting::Forced(7).to_string(), "s7");
    assert_eq!("s7".parse::<SplitSetting>(), Ok(SplitSetting::Forced(7)));
    assert_eq!("16".parse::<SplitSetting>(), Ok(SplitSetting::Forced(16)));
    assert!("s0".parse::<SplitSetting>().is_err());
    assert!("fast".parse::<SplitSetting>().is_err());
}

#[test]
fn tolerances_come_from_the_matrix_data() {
    let x = expand("ci");
    let bf16 = x
        .cases
        .iter()
        .find(|c| c.spec().unwrap().dtype.name() == "bf16")
        .unwrap();
    let fp16 = x
        .cases
        .iter()
        .find(|c| c.spec().unwrap().dtype.name() == "fp16")
        .unwrap();
    assert_eq!(bf16.tolerance.atol, 2f64.powi(-7));
    assert_eq!((bf16.tolerance.atol2, bf16.tolerance.rtol2), (2e-2, 2e-2));
    assert_eq!(fp16.tolerance.atol, 2f64.powi(-10));
    assert_eq!((fp16.tolerance.atol2, fp16.tolerance.rtol2), (5e-3, 5e-3));
    assert_eq!((bf16.tolerance.rtol, fp16.tolerance.rtol), (2.0, 2.0));
}
