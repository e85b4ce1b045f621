//! Reading reports back: architecture names, duplicate trials, and the CSV and JSONL readers
//! agreeing on every row (issue 19, items 5 and 6).

use crate::common::{row, trials, write};
use proptest::prelude::*;
use relattn_reports::{load, merge, ReportError, Row, Status, ABSENT_CELL};
use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

/// Every path under `root`, relative to it.
fn tree(root: &Path) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                todo.push(path.clone());
            }
            out.insert(path.strip_prefix(root).unwrap().to_path_buf());
        }
    }
    out
}

/// Set summary.json's `arch` of an architecture directory.
fn set_arch(arch_dir: &Path, arch: &str) {
    let path = arch_dir.join("summary.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
    v["arch"] = serde_json::Value::String(arch.to_string());
    fs::write(&path, serde_json::to_string(&v).unwrap()).unwrap();
}

#[test]
fn merge_never_writes_outside_out_whatever_an_input_calls_its_architecture() {
    for arch in [
        "../../escaped",
        "/tmp/relattn-escaped",
        "sm90/../../x",
        "SM90",
        "sm",
        "sm9a",
        ".",
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let input = tmp.path().join("in");
        write(&input, "sm90", "1/1", &trials("t", 0..2));
        set_arch(&input.join("sm90"), arch);
        let before = tree(tmp.path());
        let out = tmp.path().join("deep/out");
        let err = merge(std::slice::from_ref(&input), &out).unwrap_err();
        assert!(
            matches!(&err, ReportError::BadArch { name, .. } if name == arch),
            "{arch}: {err:?}"
        );
        let msg = err.to_string();
        assert!(
            msg.contains("summary.json") && msg.contains("sm<digits>"),
            "{msg}"
        );
        assert_eq!(tree(tmp.path()), before, "{arch}: something was written");
        assert!(!Path::new("/tmp/relattn-escaped").exists());
        // `show` and `diff` read through the same check.
        assert!(matches!(load(&input), Err(ReportError::BadArch { .. })));
    }
}

#[test]
fn known_architecture_names_are_accepted() {
    for arch in ["cpu", "sm80", "sm90", "sm100", "sm121"] {
        let tmp = tempfile::tempdir().unwrap();
        write(tmp.path(), arch, "1/1", &trials("t", 0..1));
        let merged = merge(&[tmp.path().to_path_buf()], &tmp.path().join("out")).unwrap();
        assert_eq!(merged.archs[arch].dir, tmp.path().join("out").join(arch));
    }
}

#[test]
fn a_directory_without_summary_is_named_by_its_directory() {
    let tmp = tempfile::tempdir().unwrap();
    write(tmp.path(), "sm90", "1/1", &trials("t", 0..2));
    let odd = tmp.path().join("shard-1");
    fs::rename(tmp.path().join("sm90"), &odd).unwrap();
    fs::remove_file(odd.join("summary.json")).unwrap();
    let err = load(&odd).unwrap_err();
    assert!(err.to_string().contains("the directory's name"), "{err}");
    let good = tmp.path().join("sm100");
    fs::rename(&odd, &good).unwrap();
    assert_eq!(load(&good).unwrap().archs["sm100"].rows.len(), 2);
}

#[test]
fn a_trial_twice_in_one_report_is_an_error_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let mut rows = trials("t", 0..3);
    let mut copy = rows[1].clone();
    copy.status = Status::Fail;
    rows.push(copy);
    write(tmp.path(), "sm90", "1/1", &rows);
    let dir = tmp.path().join("sm90");
    // Lines of the file: results.csv has its header on line 1.
    for (file, lines) in [("results.jsonl", (2, 4)), ("results.csv", (3, 5))] {
        let err = load(tmp.path()).unwrap_err();
        match &err {
            ReportError::DuplicateTrial {
                path,
                trial,
                first,
                second,
            } => {
                assert!(path.ends_with(file), "{path:?}");
                assert_eq!(trial, &rows[1].trial);
                assert_eq!((*first, *second), lines, "{file}");
            }
            other => panic!("{file}: expected a duplicate, got {other:?}"),
        }
        assert!(err.to_string().contains(&rows[1].trial), "{err}");
        // Merge reads through the same check, so a report that contradicts itself is never
        // merged into one that hides it.
        assert!(merge(std::slice::from_ref(&dir), &tmp.path().join("out")).is_err());
        fs::remove_file(dir.join("results.jsonl")).unwrap_or(());
    }
}

/// Rows as JSON values, so NaN figures compare equal.
fn as_json(rows: &[Row]) -> Vec<serde_json::Value> {
    rows.iter()
        .map(|r| serde_json::to_value(r).unwrap())
        .collect()
}

/// `rows` as results.csv gives them back: a parameter with an empty value is an empty cell,
/// as an absent one is, and reads back as absent.
fn through_csv(rows: &[Row]) -> Vec<Row> {
    let mut rows = rows.to_vec();
    for r in &mut rows {
        r.params.retain(|_, v| !v.is_empty());
    }
    rows
}

#[test]
fn absent_parameters_are_empty_csv_cells() {
    let tmp = tempfile::tempdir().unwrap();
    let mut a = row("gpu::a", "fallback", Status::Pass);
    a.params.insert("regression".into(), String::new());
    a.params.insert("note".into(), "\\N".into());
    a.params.insert("path".into(), "\\\\server\\share".into());
    let mut b = Row::new("id_b", "routing::sm_90", "routing", Status::Pass);
    b.first_bad = None;
    write(tmp.path(), "cpu", "1/1", &[a, b]);
    let dir = tmp.path().join("cpu");
    let from_jsonl = load(&dir).unwrap().archs["cpu"].rows.clone();
    let csv = fs::read_to_string(dir.join("results.csv")).unwrap();
    // pandas reads the file with no options: an absent parameter is an empty cell, no `\N`
    // marks one, and a value starting with a backslash has one more in front.
    assert_eq!(ABSENT_CELL, "");
    let routing = csv.lines().find(|l| l.contains("routing::sm_90")).unwrap();
    assert!(routing.ends_with(",,,,,"), "{csv}");
    assert!(!csv.contains(",\\N,") && csv.contains(",\\\\N,"), "{csv}");
    fs::remove_file(dir.join("results.jsonl")).unwrap();
    let from_csv = load(&dir).unwrap().archs["cpu"].rows.clone();
    assert_eq!(as_json(&from_csv), as_json(&through_csv(&from_jsonl)));
    assert!(!from_csv[0].params.contains_key("regression"));
    assert_eq!(from_csv[0].params["note"], "\\N");
    assert_eq!(from_csv[0].params["path"], "\\\\server\\share");
    assert!(!from_csv[1].params.contains_key("layer"));
}

#[test]
fn csv_files_marking_absent_parameters_with_backslash_n_still_read() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("sm90");
    fs::create_dir(&dir).unwrap();
    let header = relattn_reports::FIXED_COLUMNS.join(",");
    let old = format!(
        "{header},layer,note\n\
         c,gpu::fallback::a,fallback,pass,0.001,,,0.02,,1.5,10,100,1,,2.5,\\N,\\\\N\n"
    );
    fs::write(dir.join("results.csv"), old).unwrap();
    let rows = load(&dir).unwrap().archs["sm90"].rows.clone();
    assert!(
        !rows[0].params.contains_key("layer"),
        "{:?}",
        rows[0].params
    );
    assert_eq!(rows[0].params["note"], "\\N");
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just("\\N".to_string()),
        Just("\\".to_string()),
        Just("\\\\N".to_string()),
        Just("a,b\n\"c\"".to_string()),
        "[ -~]{0,8}",
        any::<String>(),
    ]
}

fn figure() -> impl Strategy<Value = Option<f64>> {
    prop_oneof![
        Just(None),
        Just(Some(f64::NAN)),
        Just(Some(f64::INFINITY)),
        Just(Some(-0.0)),
        any::<f64>().prop_map(Some),
    ]
}

fn any_row() -> impl Strategy<Value = Row> {
    let status = prop_oneof![
        Just(Status::Pass),
        Just(Status::Fail),
        Just(Status::Skip),
        Just(Status::Error)
    ];
    let figures = proptest::collection::vec(figure(), 8);
    let params = proptest::collection::btree_map("[a-z_]{1,6}", text(), 0..5);
    (
        text(),
        "[ -~]{1,12}",
        text(),
        status,
        figures,
        text(),
        any::<Option<u64>>(),
        text(),
        params,
    )
        .prop_map(
            |(case_id, trial, path, status, f, first_bad, seed, message, params)| {
                let mut r = Row::new(case_id, trial, path, status);
                (r.max_abs, r.mean_abs, r.rel_l2, r.bound) = (f[0], f[1], f[2], f[3]);
                (r.ms, r.tflops, r.gbps, r.wall_ms) = (f[4], f[5], f[6], f[7]);
                r.first_bad = Some(first_bad).filter(|s| !s.is_empty());
                r.seed = seed;
                r.message = message;
                r.params = params;
                r
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 64,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// The two readers give the same rows, for any rows a worker could write (but for empty
    /// parameter values, which results.csv holds as absent).
    #[test]
    fn csv_and_jsonl_readers_give_the_same_rows(rows in proptest::collection::vec(any_row(), 0..6)) {
        let mut seen = BTreeSet::new();
        let rows: Vec<Row> = rows.into_iter().filter(|r| seen.insert(r.trial.clone())).collect();
        let tmp = tempfile::tempdir().unwrap();
        write(tmp.path(), "sm90", "1/1", &rows);
        let dir = tmp.path().join("sm90");
        let from_jsonl = load(&dir).unwrap().archs["sm90"].rows.clone();
        fs::remove_file(dir.join("results.jsonl")).unwrap();
        let from_csv = load(&dir).unwrap().archs["sm90"].rows.clone();
        prop_assert_eq!(as_json(&from_csv), as_json(&through_csv(&from_jsonl)));
        prop_assert_eq!(as_json(&from_jsonl), as_json(&rows));
    }
}
