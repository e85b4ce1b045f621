//! Merging shards.

use crate::common::{row, trials, write};
use relattn_reports::{load, merge, ReportError, Row, Status};
use std::collections::BTreeSet;

fn trial_set(rows: &[Row]) -> BTreeSet<String> {
    rows.iter().map(|r| r.trial.clone()).collect()
}

#[test]
fn merge_of_two_shards_is_their_union() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b, out) = (
        tmp.path().join("a"),
        tmp.path().join("b"),
        tmp.path().join("out"),
    );
    let shard_a = trials("t", 0..6);
    let mut shard_b = trials("t", 6..10);
    // The same trial in both shards, timed differently: kept once.
    let mut again = shard_a[2].clone();
    again.ms = Some(9.0);
    shard_b.push(again);
    let cpu = vec![row("reference::smoke::r", "reference", Status::Pass)];
    write(&a, "sm90", "1/2", &shard_a);
    write(&b, "sm90", "2/2", &shard_b);
    write(&b, "cpu", "2/2", &cpu);

    let merged = merge(&[a, b], &out).unwrap();
    let sm90 = &merged.archs["sm90"];
    assert_eq!(sm90.rows.len(), 10);
    let expected: BTreeSet<String> = trial_set(&shard_a)
        .union(&trial_set(&shard_b))
        .cloned()
        .collect();
    assert_eq!(trial_set(&sm90.rows), expected);
    let kept = sm90
        .rows
        .iter()
        .find(|r| r.trial == shard_a[2].trial)
        .unwrap();
    assert_eq!(kept, &shard_a[2]);
    assert_eq!(merged.archs["cpu"].rows, cpu);
    assert_eq!(sm90.environment.shard.as_deref(), Some("1/2,2/2"));
    assert_eq!(
        sm90.environment.extra["merged_from"]
            .as_array()
            .unwrap()
            .len(),
        2
    );

    // What was written reads back as what merge returned, and is complete.
    let back = load(&out).unwrap();
    assert_eq!(back.archs["sm90"].rows, sm90.rows);
    assert!(back.archs["sm90"].complete);
    assert!(out.join("sm90/results.csv").is_file() && out.join("cpu/junit.xml").is_file());
    let summary = back.archs["sm90"].summary();
    assert_eq!(summary.counts.pass, 10);
}

#[test]
fn merge_rejects_conflicting_duplicates() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    let shard_a = trials("t", 0..3);
    let mut changed = shard_a[1].clone();
    changed.status = Status::Fail;
    write(&a, "sm90", "1/2", &shard_a);
    write(&b, "sm90", "2/2", &[changed]);
    let err = merge(&[a, b], &tmp.path().join("out")).unwrap_err();
    match &err {
        ReportError::Conflict { trial, field, .. } => {
            assert_eq!(trial, &shard_a[1].trial);
            assert_eq!(*field, "status");
        }
        other => panic!("expected a conflict, got {other}"),
    }
    assert!(!tmp.path().join("out").exists());
}

#[test]
fn a_trial_read_from_results_csv_merges_with_its_jsonl_copy() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    let mut rows = trials("t", 0..2);
    rows[0].params.insert("regression".into(), String::new());
    write(&a, "sm90", "1/1", &rows);
    write(&b, "sm90", "1/1", &rows);
    // b's rows come from results.csv, where the empty `regression` reads as absent.
    std::fs::remove_file(b.join("sm90/results.jsonl")).unwrap();
    let merged = merge(&[a, b], &tmp.path().join("out")).unwrap();
    assert_eq!(merged.archs["sm90"].rows.len(), 2);
}

#[test]
fn merge_needs_readable_inputs() {
    let tmp = tempfile::tempdir().unwrap();
    assert!(matches!(
        merge(&[], tmp.path()).unwrap_err(),
        ReportError::NoInputs
    ));
    let err = merge(&[tmp.path().join("missing")], &tmp.path().join("out")).unwrap_err();
    assert!(err.to_string().contains("missing"), "{err}");
}

#[test]
fn merge_with_a_missing_shard_is_incomplete_and_never_pass() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, c, out) = (
        tmp.path().join("a"),
        tmp.path().join("c"),
        tmp.path().join("out"),
    );
    write(&a, "sm90", "1/3", &trials("a", 0..2));
    write(&c, "sm90", "3/3", &trials("c", 0..2));
    let merged = merge(&[a.clone(), c.clone()], &out).unwrap();
    let m = &merged.archs["sm90"];
    assert!(!m.complete);
    let gap = m.environment.extra["shard_gap"].as_str().unwrap();
    assert!(gap.contains("1 of 3 shards missing (2/3)"), "{gap}");
    let back = load(&out).unwrap();
    assert!(!back.archs["sm90"].complete, "summary.json says incomplete");
    let md = std::fs::read_to_string(out.join("sm90").join("summary.md")).unwrap();
    assert!(md.contains("INCOMPLETE") && !md.contains("PASS"), "{md}");
    let shown = relattn_reports::show(&out).unwrap();
    assert!(!shown.contains("PASS"), "{shown}");
    // Shards of different counts cannot be shown to cover anything.
    let b = tmp.path().join("b");
    write(&b, "sm90", "2/4", &trials("b", 0..2));
    let merged = merge(&[a, b, c], &tmp.path().join("out2")).unwrap();
    assert!(!merged.archs["sm90"].complete);
}
