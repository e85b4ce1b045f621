//! Exclusion rules: skipped trials are reported with their reasons, never dropped.

use relattn_matrices::{Case, Expansion, Matrix, Rules, SplitSetting, PATHS};

fn expand(text: &str) -> Expansion {
    Matrix::parse(text, "test", "test.toml")
        .unwrap()
        .expand()
        .unwrap()
}

fn one(text: &str) -> Case {
    let mut x = expand(text);
    assert_eq!(x.cases.len(), 1);
    x.cases.remove(0)
}

#[test]
fn every_trial_either_runs_or_is_skipped_with_a_reason() {
    for tier in relattn_matrices::TIERS {
        let x = relattn_matrices::load_tier(tier).unwrap().expand().unwrap();
        let planned: usize = x.cases.iter().map(|c| c.trials().len()).sum();
        let runnable: usize = x.trials_per_path().values().sum();
        assert_eq!(runnable + x.skipped.len(), planned, "{tier}");
        assert_eq!(
            planned,
            x.cases
                .iter()
                .map(|c| PATHS.len() * c.splits.len())
                .sum::<usize>()
        );
        for s in &x.skipped {
            assert!(!s.reason.is_empty());
            assert!(s.trial_name.ends_with(&s.case_id), "{}", s.trial_name);
            assert!(
                s.trial_name.contains(&format!("::{}::", s.path)),
                "{}",
                s.trial_name
            );
        }
    }
}

#[test]
fn sheared_bias_needs_a_128_multiple_extent() {
    let text = r#"
        [[group]]
        layers = ["global_e1000", "local_e1000", "global_e1024"]
        heads = [[8, 1]]
        mixes = ["decode"]
    "#;
    let x = expand(text);
    for c in &x.cases {
        let excluded = c.excluded.get("sheared_bias");
        if c.spec.rel_extent == 1000 {
            let reason = excluded.expect("E = 1000 excluded");
            assert!(
                reason.contains("multiple of 128") && reason.contains("E = 1000"),
                "{reason}"
            );
            let skip = x
                .skipped
                .iter()
                .find(|s| s.case_id == c.id)
                .expect("reported");
            assert_eq!(
                (skip.path.as_str(), skip.split),
                ("sheared_bias", SplitSetting::Policy)
            );
            assert_eq!(&skip.reason, reason);
        } else {
            assert!(excluded.is_none());
        }
        assert!(!c.excluded.contains_key("score_mod") && !c.excluded.contains_key("fallback"));
    }
    assert_eq!(x.skipped.len(), 2);
}

#[test]
fn sheared_bias_needs_the_window_to_match_the_extent_on_local_layers() {
    let c =
        one("[[group]]\nlayers = [\"local_e512_w300\"]\nheads = [[8, 1]]\nmixes = [\"decode\"]");
    let reason = &c.excluded["sheared_bias"];
    assert!(reason.contains("window_left = 300"), "{reason}");
    let ok = one("[[group]]\nlayers = [\"local_e512\"]\nheads = [[8, 1]]\nmixes = [\"decode\"]");
    assert!(ok.excluded.is_empty());
}

#[test]
fn score_mod_takes_only_one_split_and_fallback_forces_splits_only_on_decodes() {
    let text = r#"
        [[group]]
        layers = ["global_e1024"]
        heads = [[8, 1]]
        splits = ["policy", 1, 2, 64, 128]
        mixes = ["decode", "mixed"]
    "#;
    let x = expand(text);
    let decode = x.cases.iter().find(|c| c.mix == "decode").unwrap();
    let mixed = x.cases.iter().find(|c| c.mix == "mixed").unwrap();
    let skipped = |c: &Case, path: &str| -> Vec<String> {
        c.splits
            .iter()
            .filter(|s| c.exclusion(path, **s).is_some())
            .map(|s| s.to_string())
            .collect()
    };
    assert_eq!(skipped(decode, "score_mod"), ["s2", "s64", "s128"]);
    assert_eq!(skipped(decode, "fallback"), ["s64", "s128"]);
    assert_eq!(skipped(decode, "sheared_bias"), Vec::<String>::new());
    assert_eq!(skipped(mixed, "fallback"), ["s1", "s2", "s64", "s128"]);
    let reason = mixed
        .exclusion("fallback", SplitSetting::Forced(2))
        .unwrap();
    assert!(
        reason.contains("decode") && reason.contains("longest query 48"),
        "{reason}"
    );
    assert!(decode
        .exclusion("score_mod", SplitSetting::Forced(2))
        .unwrap()
        .contains("split"));
    // Every one of those appears in the expansion's skip list.
    let count = |c: &Case| PATHS.iter().map(|p| skipped(c, p).len()).sum::<usize>();
    assert_eq!(x.skipped.len(), count(decode) + count(mixed));
}

#[test]
fn fp32_and_other_head_dims_are_reference_only() {
    let text = r#"
        [[group]]
        layers = ["global_e1024"]
        heads = [[8, 1]]
        dtypes = ["fp32"]
        head_dims = [128, 64]
        mixes = ["decode"]
    "#;
    for c in expand(text).cases {
        assert_eq!(c.excluded.len(), 3, "{}", c.name);
        let reason = &c.excluded["fallback"];
        assert!(
            reason.contains("fp32") || reason.contains("head_dim 64"),
            "{reason}"
        );
    }
}

#[test]
fn the_builtin_rules_parse_and_bad_rules_are_errors() {
    assert!(Rules::builtin().unwrap().0.len() >= 6);
    let two = "[[rule]]\npaths = [\"fallback\"]\nreason = \"r\"\nextent_multiple_of = 2\nmax_forced_splits = 4";
    let err = Rules::parse(two, "p.toml").unwrap_err().to_string();
    assert!(err.contains("exactly one requirement"), "{err}");
    let unknown = "[[rule]]\npaths = [\"tensor_cores\"]\nreason = \"r\"\nextent_multiple_of = 2";
    let err = Rules::parse(unknown, "p.toml").unwrap_err().to_string();
    assert!(
        err.contains("tensor_cores") && err.contains("unknown path"),
        "{err}"
    );
    let typo = "[[rule]]\npaths = [\"fallback\"]\nreason = \"r\"\nextent_multiple = 2";
    let err = Rules::parse(typo, "p.toml").unwrap_err().to_string();
    assert!(err.contains("extent_multiple"), "{err}");
}
