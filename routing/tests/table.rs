//! The routing table against docs/operator.md section 3, written out by hand here (not derived from
//! the table under test), plus the capability and path-id values and each path's constraints.

use relattn_routing::{
    check_path, decide, lookup, path_spec, route, table, Capability, Outcome, PathCase, PathId,
    PathLimit, Shape, FALLBACK_MAX_SPLITS,
};
use rstest::rstest;

/// The twelve rows of docs/operator.md section 3, each a case below.
#[test]
fn the_table_has_twelve_rows() {
    assert_eq!(table().len(), 12, "table rows");
}

/// Path (None = rejected), then paged_kv_forward, split_kv, split_kv_decode, sheared_bias.
#[rstest]
// Below SM80: rejected, nothing available.
#[case::sm70(7, 0, None, false, false, false, false)]
#[case::sm75(7, 5, None, false, false, false, false)]
// Ampere/Ada: fallback, paged, no main split-KV, two-stage decode.
#[case::sm80(8, 0, Some("fallback"), true, false, true, false)]
#[case::sm86(8, 6, Some("fallback"), true, false, true, false)]
#[case::sm87(8, 7, Some("fallback"), true, false, true, false)]
#[case::sm89(8, 9, Some("fallback"), true, false, true, false)]
// Hopper: score_mod, paged, no split-KV at all.
#[case::sm90(9, 0, Some("score_mod"), true, false, false, false)]
// Blackwell datacenter: sheared_bias with split-KV.
#[case::sm100(10, 0, Some("sheared_bias"), true, true, false, true)]
#[case::sm103(10, 3, Some("sheared_bias"), true, true, false, true)]
#[case::sm110(11, 0, Some("sheared_bias"), true, true, false, true)]
// SM12x: rejected, no paged-KV forward.
#[case::sm120(12, 0, None, false, false, false, false)]
#[case::sm121(12, 1, None, false, false, false, false)]
fn every_row_matches_spec_section_3(
    #[case] major: u32,
    #[case] minor: u32,
    #[case] path: Option<&str>,
    #[case] paged: bool,
    #[case] split: bool,
    #[case] decode: bool,
    #[case] sheared: bool,
) {
    let cc = Capability::new(major, minor);
    let row = lookup(cc).unwrap_or_else(|| panic!("no row for {cc}"));
    assert_eq!(row.cc, cc);
    let got_path = match row.outcome {
        Outcome::Route(p) => Some(p.as_str()),
        Outcome::Reject(_) => None,
    };
    assert_eq!(got_path, path, "path of {cc}");
    assert_eq!(row.paged_kv_forward, paged, "paged_kv_forward of {cc}");
    assert_eq!(row.split_kv, split, "split_kv of {cc}");
    assert_eq!(row.split_kv_decode, decode, "split_kv_decode of {cc}");
    assert_eq!(row.sheared_bias, sheared, "sheared_bias of {cc}");
    assert_eq!(route(cc).ok().map(|p| p.as_str()), path, "route of {cc}");
}

#[test]
fn families_are_named() {
    let family = |major, minor| lookup(Capability::new(major, minor)).unwrap().family;
    assert_eq!(family(7, 0), "Volta");
    assert_eq!(family(8, 0), "Ampere");
    assert_eq!(family(8, 9), "Ada");
    assert_eq!(family(9, 0), "Hopper");
    assert!(family(10, 0).starts_with("Blackwell"));
    assert!(family(12, 1).starts_with("Blackwell"));
    assert_ne!(
        family(10, 0),
        family(12, 1),
        "SM12x is a different family from SM10x"
    );
}

#[rstest]
fn sm12x_rejection_says_why(#[values(0, 1)] minor: u32) {
    let cc = Capability::new(12, minor);
    let err = route(cc).unwrap_err();
    assert!(err.reason.contains("FA4"), "{err}");
    assert!(err.reason.contains("no paged-KV forward"), "{err}");
    assert!(err.to_string().contains(&format!("SM 12.{minor}")), "{err}");
}

#[rstest]
fn pre_ampere_rejection_says_why(#[values(0, 5)] minor: u32) {
    let err = route(Capability::new(7, minor)).unwrap_err();
    assert!(err.reason.contains("SM80"), "{err}");
}

#[rstest]
#[case::sm60(6, 0, "6.0")]
#[case::sm130(13, 0, "13.0")]
#[case::sm101(10, 1, "10.1")]
#[case::sm99(9, 9, "9.9")]
fn unknown_capabilities_have_no_route(#[case] major: u32, #[case] minor: u32, #[case] text: &str) {
    let cc = Capability::new(major, minor);
    assert!(lookup(cc).is_none(), "{cc} must not be in the table");
    let err = route(cc).unwrap_err();
    assert_eq!(err.reason, format!("no route for SM {text}"));
    let shape = Shape {
        batch: 1,
        max_query_len: 1,
        num_heads: 8,
        num_kv_heads: 1,
        max_kv_len: 1 << 20,
        page_size: 16,
        window_left: -1,
        is_local: false,
    };
    let d = decide(cc, &shape);
    assert!(d.rejected);
    assert_eq!(d.path, None);
    assert_eq!(
        d.reason.as_deref(),
        Some(format!("no route for SM {text}").as_str())
    );
    assert_eq!(d.num_splits, None);
    assert_eq!(d.decode_splits, None);
    assert!(!d.split_kv_decode);
}

#[rstest]
#[case::dotted("9.0", 9, 0)]
#[case::dotted_two_digits("12.1", 12, 1)]
#[case::digits("90", 9, 0)]
#[case::digits_two_digits("121", 12, 1)]
#[case::digits_ten("100", 10, 0)]
#[case::sm_name("sm_90", 9, 0)]
#[case::sm_name_two_digits("sm_121", 12, 1)]
#[case::upper_case("SM103", 10, 3)]
#[case::spaces(" 8.6 ", 8, 6)]
fn capability_parses(#[case] text: &str, #[case] major: u32, #[case] minor: u32) {
    let cc: Capability = text.parse().unwrap_or_else(|e| panic!("{text}: {e}"));
    assert_eq!(cc, Capability::new(major, minor), "{text}");
}

#[rstest]
#[case::empty("")]
#[case::no_minor("9")]
#[case::empty_minor("9.")]
#[case::empty_major(".0")]
#[case::letters("x.y")]
#[case::three_parts("9.0.1")]
#[case::negative("-9.0")]
#[case::sm_alone("sm_")]
#[case::comma("9,0")]
#[case::too_large("99999.0")]
fn bad_capability_text_does_not_parse(#[case] bad: &str) {
    assert!(bad.parse::<Capability>().is_err(), "{bad:?} must not parse");
}

#[test]
fn capability_displays_and_serialises_as_text() {
    assert_eq!(Capability::new(12, 1).to_string(), "12.1");
    assert_eq!(Capability::new(9, 0).sm_name(), "sm_90");
    assert_eq!(
        serde_json::to_string(&Capability::new(9, 0)).unwrap(),
        "\"9.0\""
    );
    let back: Capability = serde_json::from_str("\"10.3\"").unwrap();
    assert_eq!(back, Capability::new(10, 3));
    assert!(
        serde_json::from_str::<Capability>("9.0").is_err(),
        "a number is not a capability"
    );
}

#[test]
fn path_ids_round_trip() {
    let names = ["sheared_bias", "score_mod", "fallback"];
    assert_eq!(PathId::ALL.map(|p| p.as_str()), names);
    for (p, name) in PathId::ALL.into_iter().zip(names) {
        assert_eq!(p.to_string(), name);
        assert_eq!(name.parse::<PathId>().unwrap(), p);
        assert_eq!(serde_json::to_string(&p).unwrap(), format!("\"{name}\""));
        assert_eq!(
            serde_json::from_str::<PathId>(&format!("\"{name}\"")).unwrap(),
            p
        );
    }
    assert!("Fallback".parse::<PathId>().is_err());
    let err = "flash".parse::<PathId>().unwrap_err().to_string();
    assert_eq!(
        err,
        "unknown path \"flash\": expected one of sheared_bias, score_mod, fallback"
    );
}

/// (path, main split-KV, decode kernel, extent multiple, window + 1 == E, max splits)
#[rstest]
#[case::sheared_bias(PathId::ShearedBias, true, false, Some(128), true, 128)]
#[case::score_mod(PathId::ScoreMod, false, false, None, false, 1)]
#[case::fallback(PathId::Fallback, false, true, None, false, FALLBACK_MAX_SPLITS)]
fn path_specs_are_the_spec_constraints(
    #[case] path: PathId,
    #[case] main: bool,
    #[case] decode: bool,
    #[case] multiple: Option<usize>,
    #[case] window: bool,
    #[case] max: usize,
) {
    let s = path_spec(path);
    assert_eq!(s.path, path);
    assert_eq!(
        (s.main_split_kv, s.split_kv_decode, s.extent_multiple_of),
        (main, decode, multiple),
        "{path}"
    );
    assert_eq!(s.requires_window_equals_extent, window, "{path}");
    assert_eq!(s.max_splits, max, "{path}");
    // The kernels are built for the model's head dim only (docs/operator.md section 1: D = 128).
    assert_eq!(s.head_dim, 128, "{path}");
    // A path with split-KV of either kind takes more than one split; one without takes one.
    assert_eq!(
        s.max_splits > 1,
        s.main_split_kv || s.split_kv_decode,
        "{path}"
    );
}

fn case(rel_extent: usize, window_left: i64) -> PathCase {
    PathCase {
        rel_extent,
        window_left,
        head_dim: 128,
    }
}

#[test]
fn check_path_says_why_a_case_does_not_fit() {
    use PathId::*;
    // Model layers fit every path without splits.
    for path in PathId::ALL {
        assert_eq!(
            check_path(path, &case(1024, -1), 1),
            Ok(()),
            "{path} global"
        );
        assert_eq!(check_path(path, &case(512, 511), 1), Ok(()), "{path} local");
    }
    assert_eq!(check_path(ShearedBias, &case(1024, -1), 128), Ok(()));
    assert_eq!(check_path(Fallback, &case(1024, -1), 32), Ok(()));
    assert_eq!(check_path(Fallback, &case(1024, -1), 64), Ok(()));
    let err = |path, c: PathCase, s| check_path(path, &c, s).unwrap_err().to_string();
    assert_eq!(
        err(ScoreMod, case(1024, -1), 2),
        "score_mod has no split-KV (SM90 contract): num_splits must be 1 (2 splits)"
    );
    assert_eq!(
        err(ShearedBias, case(1000, -1), 1),
        "sheared_bias lays the bias out in 128-key tiles, so E must be a multiple of 128 (E = 1000)"
    );
    assert_eq!(
        err(ShearedBias, case(512, 255), 1),
        "sheared_bias carries the window in the bias buffer, so a local layer needs \
         window_left + 1 == E (window_left = 255, E = 512)"
    );
    assert_eq!(
        err(ShearedBias, case(1024, -1), 129),
        "sheared_bias combines at most 128 KV splits (129 splits)"
    );
    assert_eq!(
        err(Fallback, case(1024, -1), FALLBACK_MAX_SPLITS + 1),
        format!(
            "fallback's split-KV decode kernel takes at most {FALLBACK_MAX_SPLITS} splits ({} splits)",
            FALLBACK_MAX_SPLITS + 1
        )
    );
    assert!(err(Fallback, case(1024, -1), 0).contains("at least 1"));
    assert!(err(Fallback, case(0, -1), 1).contains("rel_extent >= 1"));
    assert!(err(Fallback, case(1024, -2), 1).contains("window_left"));
    let d64 = PathCase {
        head_dim: 64,
        ..case(1024, -1)
    };
    for path in PathId::ALL {
        assert_eq!(
            err(path, d64, 1),
            "the GPU kernels are built for the model's head dim, 128 (head_dim 64)"
        );
    }
    // Paths without the sheared layout take any extent and any window.
    assert_eq!(check_path(ScoreMod, &case(1000, 255), 1), Ok(()));
    assert_eq!(check_path(Fallback, &case(1000, 255), 4), Ok(()));
}

#[test]
fn a_limit_is_its_rule_and_the_cases_values() {
    let limit = check_path(PathId::ShearedBias, &case(1000, -1), 1).unwrap_err();
    assert_eq!(
        limit,
        PathLimit::ExtentMultiple {
            path: PathId::ShearedBias,
            multiple: 128,
            rel_extent: 1000
        }
    );
    assert_eq!(limit.detail(), "E = 1000");
    assert_eq!(limit.to_string(), format!("{} (E = 1000)", limit.rule()));
    // Case limits come before split limits, and the case limits keep a fixed order.
    let both = check_path(PathId::ShearedBias, &case(1000, 255), 0).unwrap_err();
    assert!(matches!(both, PathLimit::ExtentMultiple { .. }), "{both}");
}

/// fallback's decode kernel takes every count its grid holds: more than its policy's 32 (the GPU
/// tests force 64 on it), up to the 2^31 - 1 CTAs of a grid's x dimension, one per split.
#[test]
fn fallback_takes_as_many_splits_as_its_decode_grid_holds() {
    assert_eq!(FALLBACK_MAX_SPLITS, (1 << 31) - 1);
    assert_eq!(path_spec(PathId::Fallback).max_splits, FALLBACK_MAX_SPLITS);
    let global = PathCase {
        rel_extent: 1024,
        window_left: -1,
        head_dim: 128,
    };
    for n in [32, 33, 64, 128, 1024, FALLBACK_MAX_SPLITS] {
        assert_eq!(check_path(PathId::Fallback, &global, n), Ok(()), "{n}");
    }
    assert!(check_path(PathId::Fallback, &global, FALLBACK_MAX_SPLITS + 1).is_err());
}
