//! Exclusion rules: skipped trials are reported with their reasons, never dropped.

use relattn_matrices::{Case, Expansion, Matrix, Requirement, Rules, SplitSetting};
use relattn_routing::{path_spec, PathCase, PathId};

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
                .map(|c| PathId::ALL.len() * c.splits.len())
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
        let excluded = c.excluded.get(&PathId::ShearedBias);
        if c.spec().unwrap().rel_extent == 1000 {
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
                (skip.path, skip.split),
                (PathId::ShearedBias, SplitSetting::Policy)
            );
            assert_eq!(&skip.reason, reason);
        } else {
            assert!(excluded.is_none());
        }
        assert!(
            !c.excluded.contains_key(&PathId::ScoreMod)
                && !c.excluded.contains_key(&PathId::Fallback)
        );
    }
    assert_eq!(x.skipped.len(), 2);
}

#[test]
fn sheared_bias_needs_the_window_to_match_the_extent_on_local_layers() {
    let c =
        one("[[group]]\nlayers = [\"local_e512_w300\"]\nheads = [[8, 1]]\nmixes = [\"decode\"]");
    let reason = &c.excluded[&PathId::ShearedBias];
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
    let skipped = |c: &Case, path: PathId| -> Vec<String> {
        c.splits
            .iter()
            .filter(|s| c.exclusion(path, **s).is_some())
            .map(|s| s.to_string())
            .collect()
    };
    assert_eq!(skipped(decode, PathId::ScoreMod), ["s2", "s64", "s128"]);
    // fallback's decode kernel takes more splits than its policy's 32.
    assert_eq!(skipped(decode, PathId::Fallback), Vec::<String>::new());
    assert_eq!(skipped(decode, PathId::ShearedBias), Vec::<String>::new());
    assert_eq!(
        skipped(mixed, PathId::Fallback),
        ["s1", "s2", "s64", "s128"]
    );
    let reason = mixed
        .exclusion(PathId::Fallback, SplitSetting::Forced(2))
        .unwrap();
    assert!(
        reason.contains("decode") && reason.contains("longest query 48"),
        "{reason}"
    );
    assert_eq!(
        decode
            .exclusion(PathId::ScoreMod, SplitSetting::Forced(2))
            .unwrap(),
        "score_mod has no split-KV (SM90 contract): num_splits must be 1 (2 splits)"
    );
    // Every one of those appears in the expansion's skip list.
    let count = |c: &Case| {
        PathId::ALL
            .iter()
            .map(|p| skipped(c, *p).len())
            .sum::<usize>()
    };
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
        let reason = &c.excluded[&PathId::Fallback];
        assert!(
            reason.contains("fp32") || reason.contains("head_dim 64"),
            "{reason}"
        );
    }
}

#[test]
fn the_builtin_rules_parse_and_bad_rules_are_errors() {
    // Only what is not a path's own limit: the kernels' dtypes, and what a forced count means.
    let rules = Rules::builtin().unwrap().0;
    let requirements: Vec<_> = rules.iter().map(|r| (&r.requirement, &r.paths)).collect();
    assert_eq!(requirements.len(), 2);
    assert!(matches!(requirements[0], (Requirement::DTypes(_), p) if p == &PathId::ALL));
    assert_eq!(
        requirements[1],
        (
            &Requirement::ForcedSplitsDecodeOnly,
            &vec![PathId::Fallback]
        )
    );
    let two = "[[rule]]\npaths = [\"fallback\"]\nreason = \"r\"\ndtypes = [\"bf16\"]\nforced_splits_decode_only = true";
    let err = Rules::parse(two, "p.toml").unwrap_err().to_string();
    assert!(err.contains("exactly one requirement"), "{err}");
    // An unknown path is an error, never a rule skipped.
    let unknown = "[[rule]]\npaths = [\"tensor_cores\"]\nreason = \"r\"\ndtypes = [\"bf16\"]";
    let err = Rules::parse(unknown, "p.toml").unwrap_err().to_string();
    assert!(
        err.contains("tensor_cores") && err.contains("unknown path"),
        "{err}"
    );
    let typo = "[[rule]]\npaths = [\"fallback\"]\nreason = \"r\"\ndtype = [\"bf16\"]";
    let err = Rules::parse(typo, "p.toml").unwrap_err().to_string();
    assert!(err.contains("dtype"), "{err}");
    // A path's own limits are PathSpec's: the file may not state them again.
    for key in [
        "extent_multiple_of = 128",
        "local_window_is_extent_minus_one = true",
        "head_dims = [128]",
        "max_forced_splits = 32",
    ] {
        let text = format!("[[rule]]\npaths = [\"fallback\"]\nreason = \"r\"\n{key}");
        let err = Rules::parse(&text, "p.toml").unwrap_err().to_string();
        let name = key.split(' ').next().unwrap();
        assert!(err.contains(name) && err.contains("PathSpec"), "{err}");
    }
}

/// The limits the matrices skip trials for are the ones the launch plans refuse: every runnable
/// trial of every tier passes its path's `PathSpec`, and every trial a limit skips breaks it.
#[test]
fn skips_follow_the_path_specs() {
    for tier in relattn_matrices::TIERS {
        let x = relattn_matrices::load_tier(tier).unwrap().expand().unwrap();
        for c in &x.cases {
            let facts = PathCase {
                rel_extent: c.spec().unwrap().rel_extent,
                window_left: c.spec().unwrap().window_left,
                head_dim: c.spec().unwrap().head_dim,
            };
            for t in c.trials() {
                let spec = path_spec(t.path);
                let fits = spec.check_case(&facts).is_ok()
                    && t.split
                        .forced()
                        .is_none_or(|n| spec.check_splits(n).is_ok());
                if t.skip.is_none() {
                    assert!(fits, "{tier}: {} runs past its path's limits", t.name);
                }
                if !fits {
                    assert!(t.skip.is_some(), "{tier}: {} is not skipped", t.name);
                }
            }
        }
    }
}

#[test]
fn fallback_takes_forced_splits_past_its_policy() {
    let c = one(
        "[[group]]\nlayers = [\"global_e1024\"]\nheads = [[8, 1]]\nmixes = [\"decode\"]\nsplits = [64, 128, 1024]",
    );
    for n in [64, 128, 1024] {
        assert_eq!(
            c.exclusion(PathId::Fallback, SplitSetting::Forced(n)),
            None,
            "{n}"
        );
    }
    assert_eq!(
        c.exclusion(PathId::ShearedBias, SplitSetting::Forced(1024)),
        Some("sheared_bias combines at most 128 KV splits (1024 splits)")
    );
}

#[test]
fn a_group_sets_the_row_layout_and_strided_rows_are_for_workers_only() {
    let group = |rows: &str| {
        format!(
            "[[group]]\nlayers = [\"global_e1024\"]\nheads = [[8, 1]]\nmixes = [\"decode\"]\n{rows}"
        )
    };
    let padded = one(&group(""));
    let exact = one(&group("rows = \"exact\""));
    let strided = one(&group("rows = \"strided\""));
    assert_eq!(padded.facts().rows, relattn_reference::RowLayout::Padded);
    assert_eq!(exact.facts().rows, relattn_reference::RowLayout::Exact);
    assert!(exact.name.ends_with("::rows_exact"), "{}", exact.name);
    assert!(!padded.name.contains("rows_"), "{}", padded.name);
    assert_ne!(padded.id, exact.id);
    assert_ne!(exact.id, strided.id);
    // The exact layout runs everywhere the padded one does; the strided one on no native path.
    assert_eq!(exact.excluded, padded.excluded);
    for path in PathId::ALL {
        assert_eq!(
            strided.excluded.get(&path).map(String::as_str),
            Some(relattn_matrices::STRIDED_NATIVE),
            "{path}"
        );
    }
    let params = exact.params();
    assert!(
        params.contains(&("rows", "exact".to_string())),
        "{params:?}"
    );
    let err = Matrix::parse(&group("rows = \"sideways\""), "test", "test.toml")
        .and_then(|m| m.expand().map(|_| m))
        .expect_err("an unknown row layout is an error");
    assert!(err.to_string().contains("unknown row layout"), "{err}");
}
