//! Diffing against a baseline.

use crate::common::{trials, write};
use approx::assert_abs_diff_eq;
use relattn_reports::{check_comparable, diff, load, DiffOptions, Report, Row, Status};
use std::path::Path;

/// The old default: throughput drops past 10% are regressions.
const TIMING: DiffOptions = DiffOptions {
    error_factor: 2.0,
    timing: true,
    throughput_drop_pct: 10.0,
    ratio_floor: 0.1,
    abs_floor: 1e-3,
    strict_coverage: false,
    allow_missing: false,
    time_floor_ms: 0.2,
};

fn report(dir: &Path, rows: &[Row]) -> Report {
    write(dir, "sm90", "1/1", rows);
    load(dir).unwrap()
}

#[test]
fn identical_reports_are_not_a_regression() {
    let tmp = tempfile::tempdir().unwrap();
    let rows = trials("t", 0..8);
    let base = report(&tmp.path().join("base"), &rows);
    let new = report(&tmp.path().join("new"), &rows);
    let d = diff(&base, &new, &DiffOptions::default());
    assert!(!d.is_regression(), "{}", d.render());
    assert_eq!(d.compared, 8);
    assert!(d.new_failures.is_empty() && d.error_growth.is_empty() && d.slowdowns.is_empty());
    assert!(d.missing.is_empty() && d.added.is_empty());
}

#[test]
fn planted_regressions_are_each_flagged() {
    let tmp = tempfile::tempdir().unwrap();
    let rows = trials("t", 0..6);
    let mut changed = rows.clone();
    changed[0].status = Status::Fail;
    changed[1].max_abs = Some(rows[1].max_abs.unwrap() * 10.0);
    changed[2].tflops = Some(70.0);
    changed[3].gbps = Some(700.0);
    let base = report(&tmp.path().join("base"), &rows);
    let new = report(&tmp.path().join("new"), &changed);
    // By default the throughput drops are not judged at all.
    let d = diff(&base, &new, &DiffOptions::default());
    assert!(d.slowdowns.is_empty() && d.timing_noise.is_empty());
    assert_eq!((d.new_failures.len(), d.error_growth.len()), (1, 1));
    let d = diff(&base, &new, &TIMING);
    assert!(d.is_regression());
    let names = |v: Vec<&String>| v.into_iter().cloned().collect::<Vec<_>>();
    assert_eq!(
        names(d.new_failures.iter().map(|c| &c.trial).collect()),
        vec![rows[0].trial.clone()]
    );
    assert_eq!(
        names(d.error_growth.iter().map(|g| &g.trial).collect()),
        vec![rows[1].trial.clone()]
    );
    assert_abs_diff_eq!(d.error_growth[0].factor, 10.0, epsilon = 1e-9);
    let slow: Vec<(&str, &'static str)> = d
        .slowdowns
        .iter()
        .map(|s| (s.trial.as_str(), s.metric))
        .collect();
    assert_eq!(
        slow,
        vec![
            (rows[2].trial.as_str(), "tflops"),
            (rows[3].trial.as_str(), "gbps")
        ]
    );
    assert_abs_diff_eq!(d.slowdowns[0].drop_pct, 30.0, epsilon = 1e-9);
    let text = d.render();
    assert!(text.starts_with("REGRESSION"), "{text}");
    let json = serde_json::to_value(&d).unwrap();
    assert_eq!(json["new_failures"][0]["new"], "fail");
}

#[test]
fn changes_under_the_thresholds_are_not_flagged() {
    let tmp = tempfile::tempdir().unwrap();
    let rows = trials("t", 0..3);
    let mut changed = rows.clone();
    changed[0].max_abs = Some(1.9e-3); // 1.9x: under the factor
    changed[1].tflops = Some(95.0); // -5%
    changed[2].max_abs = Some(1e-3);
    let mut tiny = rows.clone();
    tiny[2].max_abs = Some(1e-5);
    // 100x growth, but to 5% of the bound: under the ratio floor.
    let base = report(&tmp.path().join("base"), &tiny);
    let new = report(&tmp.path().join("new"), &changed);
    let d = diff(&base, &new, &DiffOptions::default());
    assert!(!d.is_regression(), "{}", d.render());
    // The same reports with stricter thresholds do regress: the data above is what decided.
    let strict = DiffOptions {
        error_factor: 1.5,
        throughput_drop_pct: 4.0,
        ratio_floor: 0.01,
        ..TIMING
    };
    let d = diff(&base, &new, &strict);
    assert_eq!(
        (d.error_growth.len(), d.slowdowns.len()),
        (2, 1),
        "{}",
        d.render()
    );
}

#[test]
fn missing_trials_regress_unless_allowed_and_added_ones_are_listed() {
    let tmp = tempfile::tempdir().unwrap();
    let base = report(&tmp.path().join("base"), &trials("t", 0..4));
    let new = report(&tmp.path().join("new"), &trials("t", 1..5));
    let d = diff(&base, &new, &DiffOptions::default());
    assert_eq!(d.missing.len(), 1);
    assert_eq!(d.added.len(), 1);
    assert!(d.is_regression(), "{}", d.render());
    assert!(d.render().contains("--allow-missing"), "{}", d.render());
    let allowed = DiffOptions {
        allow_missing: true,
        ..DiffOptions::default()
    };
    assert!(!diff(&base, &new, &allowed).is_regression());
}

#[test]
fn newly_skipped_trials_regress_under_strict_coverage() {
    let tmp = tempfile::tempdir().unwrap();
    let rows = trials("t", 0..3);
    let mut skipped = rows.clone();
    skipped[0].status = Status::Skip;
    let base = report(&tmp.path().join("base"), &rows);
    let new = report(&tmp.path().join("new"), &skipped);
    assert!(!diff(&base, &new, &DiffOptions::default()).is_regression());
    let strict = DiffOptions {
        strict_coverage: true,
        ..DiffOptions::default()
    };
    assert!(diff(&base, &new, &strict).is_regression());
}

#[test]
fn a_non_finite_error_where_the_base_was_finite_regresses() {
    let tmp = tempfile::tempdir().unwrap();
    let rows = trials("t", 0..3);
    let mut broken = rows.clone();
    broken[0].max_abs = Some(f64::NAN);
    broken[1].max_abs = Some(f64::INFINITY);
    // Status left at fail in base: not a new failure, so only the error decides.
    let mut base_rows = rows.clone();
    base_rows[1].status = Status::Fail;
    broken[1].status = Status::Fail;
    let base = report(&tmp.path().join("base"), &base_rows);
    let new = report(&tmp.path().join("new"), &broken);
    let d = diff(&base, &new, &DiffOptions::default());
    assert!(d.is_regression(), "{}", d.render());
    let grown: Vec<&str> = d.error_growth.iter().map(|g| g.trial.as_str()).collect();
    assert_eq!(grown, vec![rows[0].trial.as_str(), rows[1].trial.as_str()]);
    assert!(d.error_growth.iter().all(|g| g.factor.is_infinite()));
    let json = serde_json::to_value(&d).unwrap();
    assert_eq!(json["error_growth"][0]["new_max_abs"], "NaN");
}

#[test]
fn throughput_drops_under_the_time_floor_are_noise() {
    let tmp = tempfile::tempdir().unwrap();
    let mut rows = trials("t", 0..2);
    for r in &mut rows {
        r.ms = Some(0.05);
    }
    let mut slower = rows.clone();
    slower[0].tflops = Some(50.0);
    slower[1].ms = Some(0.5); // over the floor in new: a real slowdown
    slower[1].tflops = Some(50.0);
    let base = report(&tmp.path().join("base"), &rows);
    let new = report(&tmp.path().join("new"), &slower);
    let d = diff(&base, &new, &TIMING);
    assert_eq!(d.timing_noise.len(), 1, "{}", d.render());
    assert_eq!(d.timing_noise[0].drop.trial, rows[0].trial);
    assert_eq!(d.slowdowns.len(), 1);
    assert_eq!(d.slowdowns[0].trial, rows[1].trial);
    assert!(d.render().contains("Timing noise"), "{}", d.render());
    let no_floor = DiffOptions {
        time_floor_ms: 0.0,
        ..TIMING
    };
    assert_eq!(diff(&base, &new, &no_floor).slowdowns.len(), 2);
}

#[test]
fn reports_of_different_architectures_are_not_compared() {
    let tmp = tempfile::tempdir().unwrap();
    let rows = trials("t", 0..2);
    let (b, n) = (tmp.path().join("base"), tmp.path().join("new"));
    write(&b, "sm90", "1/1", &rows);
    write(&n, "cpu", "1/1", &rows);
    let (base, new) = (load(&b).unwrap(), load(&n).unwrap());
    let err = check_comparable(&base, &new).unwrap_err().to_string();
    assert!(err.contains("sm90") && err.contains("cpu"), "{err}");
    assert!(check_comparable(&base, &base).is_ok());
}

#[test]
fn an_incomplete_new_report_regresses_unless_allowed() {
    let tmp = tempfile::tempdir().unwrap();
    let rows = trials("t", 0..2);
    let base = report(&tmp.path().join("base"), &rows);
    let mut new = report(&tmp.path().join("new"), &rows);
    new.archs.get_mut("sm90").unwrap().complete = false;
    let d = diff(&base, &new, &DiffOptions::default());
    assert_eq!(d.incomplete, vec!["sm90".to_string()]);
    assert!(d.is_regression());
    assert!(d.render().contains("INCOMPLETE"));
    let allowed = DiffOptions {
        allow_missing: true,
        ..DiffOptions::default()
    };
    assert!(!diff(&base, &new, &allowed).is_regression());
}

/// Two runs of one build: the same verdicts and errors, throughputs anywhere from -96% to +50%.
fn rerun(rows: &[Row]) -> Vec<Row> {
    let mut again = rows.to_vec();
    for (i, r) in again.iter_mut().enumerate() {
        let f = [0.04, 0.5, 1.5, 0.8][i % 4];
        (r.tflops, r.gbps) = (r.tflops.map(|t| t * f), r.gbps.map(|g| g * f));
        r.ms = r.ms.map(|ms| ms / f);
    }
    again
}

#[test]
fn timing_changes_alone_are_not_a_regression_by_default() {
    let tmp = tempfile::tempdir().unwrap();
    let rows = trials("t", 0..8);
    let base = report(&tmp.path().join("base"), &rows);
    let new = report(&tmp.path().join("new"), &rerun(&rows));
    let d = diff(&base, &new, &DiffOptions::default());
    assert!(!d.is_regression(), "{}", d.render());
    assert!(d.slowdowns.is_empty() && d.timing_noise.is_empty());
    let text = d.render();
    assert!(text.starts_with("no regression"), "{text}");
    // One line says why timing was left out, and nothing else mentions it.
    assert_eq!(
        text.lines().nth(1),
        Some(relattn_reports::TIMING_NOT_JUDGED)
    );
    assert_eq!(text.lines().count(), 2, "{text}");
    // Asked for, the old throughput check still finds the drops.
    let d = diff(&base, &new, &TIMING);
    assert!(d.is_regression() && !d.is_correctness_regression());
    assert_eq!(d.slowdowns.len(), 6, "{}", d.render());
    let all = DiffOptions {
        throughput_drop_pct: 100.0,
        ..TIMING
    };
    assert!(!diff(&base, &new, &all).is_regression());
}

#[test]
fn correctness_is_listed_before_timing() {
    let tmp = tempfile::tempdir().unwrap();
    let rows = trials("t", 0..40);
    let mut worse = rerun(&rows);
    worse[39].status = Status::Fail;
    let base = report(&tmp.path().join("base"), &rows);
    let new = report(&tmp.path().join("new"), &worse);
    let d = diff(&base, &new, &TIMING);
    let text = d.render();
    let failure = text.find("New failures (1)").expect("listed");
    let slow = text.find("Slowdowns (").expect("listed");
    assert!(failure < slow, "{text}");
    assert!(text[..slow].contains(&rows[39].trial), "{text}");
}

#[test]
fn an_error_crossing_its_bound_regresses_whatever_the_factor() {
    let tmp = tempfile::tempdir().unwrap();
    let mut rows = trials("t", 0..2);
    rows[0].max_abs = Some(0.018); // 0.9 of the bound 0.02
    let mut over = rows.clone();
    over[0].max_abs = Some(0.022); // 1.1 of it: 1.22x, under the factor
    let base = report(&tmp.path().join("base"), &rows);
    let new = report(&tmp.path().join("new"), &over);
    let d = diff(&base, &new, &DiffOptions::default());
    assert!(d.is_correctness_regression(), "{}", d.render());
    assert!(d.error_growth[0].crossed_bound);
    assert!(d.render().contains("crossed the bound"), "{}", d.render());
}
