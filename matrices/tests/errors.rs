//! Bad matrix files give errors that name the file, the key and the value.

use relattn_matrices::{load, load_file, load_tier, Matrix, MatrixError, SplitSetting};
use rstest::rstest;

const GOOD: &str =
    "[[group]]\nlayers = [\"global_e1024\"]\nheads = [[8, 1]]\nmixes = [\"decode\"]\n";

fn error(text: &str) -> MatrixError {
    match Matrix::parse(text, "mine", "mine.toml").and_then(|m| m.expand()) {
        Ok(x) => panic!("accepted, {} cases", x.cases.len()),
        Err(e) => e,
    }
}

/// `GOOD` with one line added to the group.
fn with(line: &str) -> MatrixError {
    error(&format!("{GOOD}{line}\n"))
}

fn assert_mentions(err: &MatrixError, parts: &[&str]) {
    let text = err.to_string();
    for p in parts {
        assert!(text.contains(p), "`{text}` does not mention `{p}`");
    }
}

#[test]
fn the_good_file_expands() {
    let x = Matrix::parse(GOOD, "mine", "mine.toml")
        .unwrap()
        .expand()
        .unwrap();
    assert_eq!(x.cases.len(), 1);
    assert_eq!(x.cases[0].splits, [SplitSetting::Policy]);
    assert_eq!(x.cases[0].tier, "mine");
}

#[test]
fn an_unknown_axis_is_named() {
    let err = with("page_size = [16]");
    assert!(matches!(err, MatrixError::Parse { .. }), "{err:?}");
    assert_mentions(
        &err,
        &["mine.toml", "unknown field `page_size`", "page_sizes"],
    );
    let err = error(&format!("groups = 1\n{GOOD}"));
    assert_mentions(&err, &["mine.toml", "unknown field `groups`"]);
}

#[rstest]
#[case::page_size_zero("page_sizes = [16, 0]", &["page_sizes", "= 0"])]
#[case::unknown_dtype("dtypes = [\"fp8\"]", &["dtypes", "\"fp8\"", "unknown dtype"])]
#[case::unknown_layout("layouts = [\"nchw\"]", &["layouts", "\"nchw\""])]
#[case::zero_splits("splits = [\"policy\", 0]", &["splits", "= 0"])]
#[case::unknown_splits("splits = [\"often\"]", &["splits", "\"often\""])]
#[case::unknown_bias("bias = [\"loud\"]", &["bias", "\"loud\""])]
#[case::empty_seeds("seeds = []", &["seeds", "[]", "empty axis"])]
#[case::head_dim_zero("head_dims = [0]", &["head_dims", "= 0"])]
#[case::sample_rows_zero("sample_rows = 0", &["sample_rows", "= 0"])]
#[case::negative_scale("scale = -1.0", &["scale", "-1"])]
#[case::unknown_bug_class(
    "regression = \"cosmic_rays\"",
    &["regression", "\"cosmic_rays\"", "unknown bug class"]
)]
fn bad_values_name_key_and_value(#[case] line: &str, #[case] parts: &[&str]) {
    let err = with(line);
    assert!(
        matches!(err, MatrixError::BadValue { .. }),
        "{line}: {err:?}"
    );
    assert_mentions(&err, &["mine.toml", "[[group]] #1."]);
    assert_mentions(&err, parts);
}

#[test]
fn bad_heads_layers_and_mixes_are_named() {
    let heads =
        error("[[group]]\nlayers = [\"global_e1024\"]\nheads = [[12, 8]]\nmixes = [\"decode\"]");
    assert_mentions(&heads, &["heads", "[12, 8]", "multiple"]);
    let layer =
        error("[[group]]\nlayers = [\"sliding_e512\"]\nheads = [[8, 1]]\nmixes = [\"decode\"]");
    assert_mentions(&layer, &["layers", "\"sliding_e512\"", "global_e<E>"]);
    let zero = error("[[group]]\nlayers = [\"global_e0\"]\nheads = [[8, 1]]\nmixes = [\"decode\"]");
    assert_mentions(&zero, &["layers", "\"global_e0\""]);
    // A window past i64 is refused (it used to wrap to -1, a global layer under a local name).
    let huge = error(
        "[[group]]\nlayers = [\"local_e512_w18446744073709551615\"]\nheads = [[8, 1]]\nmixes = [\"decode\"]",
    );
    assert_mentions(&huge, &["layers", "local_e512_w18446744073709551615"]);
    let mix =
        error("[[group]]\nlayers = [\"global_e1024\"]\nheads = [[8, 1]]\nmixes = [\"burst\"]");
    assert_mentions(
        &mix,
        &[
            "mixes",
            "\"burst\"",
            "unknown mix",
            "decode",
            "long_chunk_1m",
        ],
    );
    let missing = error("[[group]]\nlayers = [\"global_e1024\"]\nheads = [[8, 1]]");
    assert_mentions(&missing, &["mine.toml", "missing field `mixes`"]);
}

#[rstest]
#[case::empty_file("")]
#[case::description_only("description = \"nothing\"\n")]
fn a_matrix_without_cases_is_an_error(#[case] text: &str) {
    let err = error(text);
    assert!(matches!(err, MatrixError::Empty { .. }), "{err:?}");
    assert_mentions(&err, &["mine.toml", "zero cases"]);
}

#[test]
fn tolerances_can_be_overridden_and_are_checked() {
    let text = format!("[tolerance.bf16]\natol2 = 0.05\n{GOOD}");
    let c = &Matrix::parse(&text, "m", "m.toml")
        .unwrap()
        .expand()
        .unwrap()
        .cases[0];
    assert_eq!(c.tolerance.atol2, 0.05);
    assert_eq!(
        c.tolerance.rtol2, 2e-2,
        "the other fields keep their defaults"
    );
    let err = error(&format!("[tolerance.bf16]\natol = 0.0\n{GOOD}"));
    assert_mentions(&err, &["tolerance.bf16.atol", "> 0"]);
    let err = error(&format!("[tolerance.int8]\natol = 0.1\n{GOOD}"));
    assert_mentions(&err, &["tolerance", "int8"]);
    let err = error(&format!("[tolerance.bf16]\nslack = 0.1\n{GOOD}"));
    assert_mentions(&err, &["unknown field `slack`"]);
}

#[test]
fn groups_that_meet_merge_their_split_settings() {
    let text = format!("{GOOD}splits = [2]\n{GOOD}splits = [\"policy\", 3]\n");
    let x = Matrix::parse(&text, "m", "m.toml")
        .unwrap()
        .expand()
        .unwrap();
    assert_eq!(x.cases.len(), 1);
    let want = [
        SplitSetting::Forced(2),
        SplitSetting::Policy,
        SplitSetting::Forced(3),
    ];
    assert_eq!(x.cases[0].splits, want);
    let conflict = format!("{GOOD}regression = \"gqa_mapping\"\n{GOOD}");
    let err = error(&conflict);
    assert!(
        matches!(err, MatrixError::ConflictingDuplicate { .. }),
        "{err:?}"
    );
    assert_mentions(&err, &["gqa_mapping", "none"]);
}

#[test]
fn files_and_tier_names_load() {
    let dir = tempdir();
    let path = dir.join("mine.toml");
    std::fs::write(&path, GOOD).unwrap();
    let m = load_file(&path).unwrap();
    assert_eq!(m.name, "mine");
    assert_eq!(load(path.to_str().unwrap()).unwrap().name, "mine");
    assert_eq!(load("smoke").unwrap().name, "smoke");
    let err = load("weekly").unwrap_err();
    assert_mentions(&err, &["weekly", "smoke, ci, nightly, regressions"]);
    let err = load_tier("weekly").unwrap_err();
    assert!(matches!(err, MatrixError::UnknownTier { .. }));
    let missing = dir.join("absent.toml");
    let err = load(missing.to_str().unwrap()).unwrap_err();
    assert!(matches!(err, MatrixError::Io { .. }), "{err:?}");
    assert_mentions(&err, &["absent.toml"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

fn tempdir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("relattn-matrices-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
