//! A worker's pool of processes (`--worker-processes`), without a GPU, through the faulty
//! worker's record of which process ran which trial and when: every trial runs exactly once,
//! processes run side by side, a process that dies restarts alone, and the verdicts do not
//! depend on the pool's size.

use crate::common::{text, worker_rows};
use crate::python::{relattn_with_numpy, repo};
use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::process::Output;

const ENV: &str = "RELATTN_CASE_FILES_DIR";

fn faulty() -> String {
    format!(
        "python3 {}",
        repo().join("adapters/faulty_worker.py").display()
    )
}

/// `relattn run --matrix smoke --paths none --worker <faulty> --worker-processes N`, with `env`.
fn pool_run(
    dir: &Path,
    name: &str,
    n: usize,
    env: &[(&str, &str)],
) -> (Output, std::path::PathBuf) {
    pool_run_beside(dir, name, n, &[], env)
}

/// `pool_run` with the workers of `beside` (`--impl` arguments) beside the faulty one.
fn pool_run_beside(
    dir: &Path,
    name: &str,
    n: usize,
    beside: &[&str],
    env: &[(&str, &str)],
) -> (Output, std::path::PathBuf) {
    let out = dir.join(name);
    let (worker, n) = (faulty(), n.to_string());
    let mut args = vec![
        "run",
        "--matrix",
        "smoke",
        "--paths",
        "none",
        "--worker",
        &worker,
        "--worker-processes",
        &n,
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(beside);
    let o = relattn_with_numpy(&args, env);
    assert!(!text(&o.stderr).contains("panicked"), "{}", text(&o.stderr));
    (o, out)
}

/// (pid, start, end, trial) per line of a record.
fn record(file: &Path) -> Vec<(u32, f64, f64, String)> {
    record_files(file)
        .into_iter()
        .map(|(pid, start, end, _, _, trial)| (pid, start, end, trial))
        .collect()
}

/// (pid, start, end, case file, case files in its folder, trial) per line of a record.
fn record_files(file: &Path) -> Vec<(u32, f64, f64, String, usize, String)> {
    std::fs::read_to_string(file)
        .unwrap()
        .lines()
        .map(|l| {
            let mut w = l.splitn(6, ' ');
            let mut next = || w.next().unwrap().to_string();
            let pid = next().parse().unwrap();
            let (start, end) = (next().parse().unwrap(), next().parse().unwrap());
            let (case, files) = (next(), next().parse().unwrap());
            (pid, start, end, case, files, next())
        })
        .collect()
}

#[test]
fn a_pool_runs_each_trial_once_with_its_processes_side_by_side() {
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("record");
    let (o, report) = pool_run(
        dir.path(),
        "pool",
        4,
        &[
            ("RELATTN_FAULTY_RECORD", rec.to_str().unwrap()),
            ("RELATTN_FAULTY_SLOW_MS", "40"),
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let rows = worker_rows(&report);
    let runs = record(&rec);
    let mut seen = HashSet::new();
    for (_, _, _, trial) in &runs {
        assert!(seen.insert(trial.clone()), "{trial} ran twice");
    }
    assert_eq!(runs.len(), rows.len(), "every worker trial ran once");
    let pids: HashSet<u32> = runs.iter().map(|r| r.0).collect();
    assert!(
        pids.len() >= 2 && pids.len() <= 4,
        "{} processes",
        pids.len()
    );
    // Two processes were busy at once: some runs of different processes overlap in time.
    let overlapping = runs
        .iter()
        .any(|a| runs.iter().any(|b| a.0 != b.0 && a.1 < b.2 && b.1 < a.2));
    assert!(overlapping, "the pool's processes never ran side by side");
}

/// A case's paths run side by side in the pool's processes (the faulty worker with three paths),
/// all reading the case's one file; the pool's case files are one folder, holding only the cases
/// in flight, and go with the run, from the folder `RELATTN_CASE_FILES_DIR` names.
#[test]
fn a_cases_paths_run_side_by_side_from_one_file() {
    let dir = tempfile::tempdir().unwrap();
    let (rec, tmp) = (dir.path().join("record"), dir.path().join("tmp"));
    std::fs::create_dir(&tmp).unwrap();
    let (o, _) = pool_run(
        dir.path(),
        "files",
        4,
        &[
            ("RELATTN_FAULTY_RECORD", rec.to_str().unwrap()),
            ("RELATTN_FAULTY_SLOW_MS", "20"),
            ("RELATTN_FAULTY_HELLO", "paths:3"),
            ("RELATTN_CASE_FILES_DIR", tmp.to_str().unwrap()),
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let runs = record_files(&rec);
    let pids: HashSet<u32> = runs.iter().map(|r| r.0).collect();
    assert!(pids.len() >= 2, "{} processes", pids.len());
    // Trial names end in the case id: every trial of a case read one file.
    let mut file_of: BTreeMap<String, String> = BTreeMap::new();
    for (_, _, _, case, _, trial) in &runs {
        let id = trial.rsplit("::").next().unwrap().to_string();
        let first = file_of.entry(id).or_insert_with(|| case.clone());
        assert_eq!(first, case, "{trial}: another file for the same case");
    }
    assert!(runs.len() >= 3 * file_of.len(), "{} trials", runs.len());
    let side_by_side = file_of.keys().any(|id| {
        let of_case: Vec<_> = runs.iter().filter(|r| r.5.ends_with(id.as_str())).collect();
        of_case
            .iter()
            .any(|a| of_case.iter().any(|b| a.0 != b.0 && a.1 < b.2 && b.1 < a.2))
    });
    assert!(side_by_side, "no case ran in two processes at once");
    let folders: HashSet<_> = runs
        .iter()
        .map(|r| Path::new(&r.3).parent().unwrap().to_path_buf())
        .collect();
    assert_eq!(folders.len(), 1, "{folders:?}");
    assert!(folders.iter().all(|f| f.starts_with(&tmp)), "{folders:?}");
    // Cases whose trials are done are not kept: the folder holds about the cases in flight.
    let most = runs.iter().map(|r| r.4).max().unwrap();
    assert!(
        most <= 8 && file_of.len() > 16,
        "{most} case files at once for {} cases",
        file_of.len()
    );
    let left: Vec<_> = std::fs::read_dir(&tmp).unwrap().flatten().collect();
    assert!(left.is_empty(), "left in {ENV}: {left:?}");
}

/// Triage runs a failing worker trial again on the case's own file (not another copy of it),
/// and each variant on a file of its own.
#[test]
fn triage_runs_a_case_again_from_its_file() {
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("record");
    let (o, _) = pool_run(
        dir.path(),
        "again",
        2,
        &[
            ("RELATTN_FAULTY_RECORD", rec.to_str().unwrap()),
            ("RELATTN_FAULTY_WRONG", "decode"),
        ],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    let mut by_trial: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (_, _, _, case, _, trial) in record_files(&rec) {
        by_trial.entry(trial).or_default().push(case);
    }
    let triaged: Vec<_> = by_trial.values().filter(|files| files.len() > 1).collect();
    assert!(!triaged.is_empty());
    for files in triaged {
        // The run, the run again (the same file), then the variants (files of their own).
        assert_eq!(files[0], files[1], "{files:?}");
        assert!(files[2..].iter().all(|f| f != &files[0]), "{files:?}");
    }
}

/// A worker that writes to the case file its pool reads fails that trial; the other worker's
/// trials read files of their own, as relattn wrote them.
#[test]
fn a_worker_that_writes_to_a_shared_case_file_fails_alone() {
    let dir = tempfile::tempdir().unwrap();
    let (o, out) = pool_run_beside(
        dir.path(),
        "overwrite",
        2,
        &["--impl", "numpy"],
        &[(
            "RELATTN_FAULTY_OVERWRITE",
            "faulty::faulty::global_e1024::h8_kv2",
        )],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    let rows = worker_rows(&out);
    let bad: Vec<_> = rows.iter().filter(|r| r["status"] != "pass").collect();
    assert!(!bad.is_empty());
    for r in &bad {
        let trial = r["trial"].as_str().unwrap();
        assert!(
            trial.contains("faulty::faulty::global_e1024::h8_kv2"),
            "{trial}"
        );
        assert_eq!(r["status"], "error", "{trial}");
        let message = r["message"].as_str().unwrap();
        assert!(
            message.contains("the worker wrote to its case file"),
            "{message}"
        );
    }
}

#[test]
fn a_process_that_dies_restarts_alone() {
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("record");
    // One trial of the smoke tier crashes its process.
    let victim = relattn_matrices::load_tier("smoke")
        .unwrap()
        .expand()
        .unwrap()
        .cases[3]
        .id
        .clone();
    let (o, report) = pool_run(
        dir.path(),
        "crash",
        4,
        &[
            ("RELATTN_FAULTY_RECORD", rec.to_str().unwrap()),
            ("RELATTN_FAULTY_CRASH", &victim),
        ],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    let rows = worker_rows(&report);
    let errors: Vec<_> = rows.iter().filter(|r| r["status"] == "error").collect();
    assert_eq!(errors.len(), 1, "only the crashing trial errors");
    assert!(errors[0]["trial"].as_str().unwrap().ends_with(&victim));
    assert!(rows
        .iter()
        .filter(|r| r["status"] != "error")
        .all(|r| r["status"] == "pass"));
    // The record holds every trial but the crashed one; the crashed process's successor is one
    // more process, and no other process was replaced.
    let runs = record(&rec);
    assert_eq!(runs.len(), rows.len() - 1);
    let pids: HashSet<u32> = runs.iter().map(|r| r.0).collect();
    assert!(
        pids.len() <= 5,
        "{} processes for a pool of 4 and one death",
        pids.len()
    );
}

/// Status and message of each worker trial of a `pool_run` that exits 1 (its report's folder in
/// the messages, the kept files' paths, named REPORT), by trial.
fn verdicts(
    dir: &Path,
    name: &str,
    n: usize,
    env: &[(&str, &str)],
) -> BTreeMap<String, (String, String)> {
    let (o, report) = pool_run(dir, name, n, env);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    worker_rows(&report)
        .iter()
        .map(|r| {
            let message = r["message"].as_str().unwrap_or_default();
            (
                r["trial"].as_str().unwrap().to_string(),
                (
                    r["status"].as_str().unwrap().to_string(),
                    message.replace(&format!("/{name}/"), "/REPORT/"),
                ),
            )
        })
        .collect()
}

#[test]
fn verdicts_do_not_depend_on_the_pools_size() {
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("RELATTN_FAULTY_WRONG", "seed1"),
        ("RELATTN_FAULTY_NAN", "decode"),
    ];
    let one = verdicts(dir.path(), "one", 1, &env);
    assert!(one.values().any(|(s, _)| s == "fail"));
    assert_eq!(one, verdicts(dir.path(), "four", 4, &env));
}

/// A failed trial's message quotes what its own request wrote to stderr (the worker marks it),
/// not an earlier trial's lines nor a part of its own read in time or not: the same with one
/// process and with four.
#[test]
fn a_failed_trials_message_quotes_its_own_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("RELATTN_FAULTY_RAISE", "window_edges"),
        ("RELATTN_FAULTY_NOISE", "impl::"),
    ];
    let one = verdicts(dir.path(), "one", 1, &env);
    let errors: Vec<_> = one.iter().filter(|(_, (s, _))| s == "error").collect();
    assert!(errors.len() >= 4, "{one:?}");
    for (trial, (_, message)) in errors {
        let (_, stderr) = message.split_once("worker stderr:\n").expect(message);
        assert!(
            stderr.contains(&format!("RuntimeError: planted error in {trial}")),
            "{trial}: {message}"
        );
        assert!(!stderr.contains("noise of"), "{trial}: {message}");
    }
    assert_eq!(one, verdicts(dir.path(), "four", 4, &env));
}

/// A worker that says in `hello` it cannot run here has its trials decided as skips with its
/// reason, without a case file written or a `run` sent.
#[test]
fn an_unavailable_worker_skips_without_work() {
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("record");
    let (o, report) = pool_run(
        dir.path(),
        "unavailable",
        2,
        &[
            ("RELATTN_FAULTY_RECORD", rec.to_str().unwrap()),
            ("RELATTN_FAULTY_UNAVAILABLE", "no kernel here"),
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let rows = worker_rows(&report);
    assert!(!rows.is_empty());
    for r in &rows {
        assert_eq!(r["status"], "skip");
        assert_eq!(r["message"], "no kernel here");
    }
    assert!(!rec.exists(), "a run was sent");
}

/// Two runs side by side share the machine's memory ledger: with a budget too small for two
/// cases at once, one run waits (and says so) while the other holds a case, their workers
/// never hold cases at the same time, and both finish with their whole report.
#[test]
fn runs_side_by_side_take_turns_with_their_cases() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger");
    let runs: Vec<_> = ["a", "b"]
        .into_iter()
        .map(|name| {
            let (dir, ledger) = (dir.path().to_path_buf(), ledger.clone());
            std::thread::spawn(move || {
                let rec = dir.join(format!("record-{name}"));
                let (o, report) = pool_run(
                    &dir,
                    name,
                    1,
                    &[
                        ("RELATTN_FAULTY_RECORD", rec.to_str().unwrap()),
                        ("RELATTN_FAULTY_SLOW_MS", "20"),
                        ("RELATTN_MEMORY_DIR", ledger.to_str().unwrap()),
                        ("RELATTN_MEMORY_BUDGET", "1"),
                    ],
                );
                (o, report, rec)
            })
        })
        .collect();
    let runs: Vec<_> = runs.into_iter().map(|t| t.join().unwrap()).collect();
    let mut waited = false;
    for (o, report, rec) in &runs {
        assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
        assert_eq!(worker_rows(report).len(), record(rec).len());
        waited |= text(&o.stderr).contains("waiting for memory");
    }
    assert!(waited, "neither run waited for the other's case");
    let (a, b) = (record(&runs[0].2), record(&runs[1].2));
    let overlap = a
        .iter()
        .find(|x| b.iter().any(|y| x.1 < y.2 && y.1 < x.2 && x.3 != y.3));
    assert!(
        overlap.is_none(),
        "both runs held a case at once: {overlap:?}"
    );
    // The ledger holds no entry of a run that ended.
    let left = std::fs::read_dir(&ledger)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "entry")
        })
        .count();
    assert_eq!(left, 0);
}

/// `RELATTN_TRACE=FILE`: a run's timeline, one JSON line per span (each worker process's start,
/// each trial's case and worker run, with the trial it served); a file that cannot be created
/// is a usage error said once.
#[test]
fn a_trace_shows_the_runs_spans() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.jsonl");
    let (o, report) = pool_run(
        dir.path(),
        "traced",
        3,
        &[("RELATTN_TRACE", trace.to_str().unwrap())],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let spans: Vec<serde_json::Value> = std::fs::read_to_string(&trace)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let named = |name: &'static str| spans.iter().filter(move |s| s["span"] == name);
    for s in &spans {
        let (start, end) = (s["start"].as_f64().unwrap(), s["end"].as_f64().unwrap());
        assert!(0.0 <= start && start <= end, "{s}");
    }
    // Every process of the pool started once (no death here), the first during setup.
    assert_eq!(named("worker_start").count(), 3, "{spans:?}");
    // Each worker trial's run is a span named after its trial.
    let trials: HashSet<&str> = named("workers")
        .map(|s| s["trial"].as_str().unwrap())
        .collect();
    let rows = worker_rows(&report);
    assert_eq!(trials.len(), rows.len());
    for r in &rows {
        assert!(trials.contains(r["trial"].as_str().unwrap()), "{r}");
    }
    assert!(named("generate").count() > 0 && named("case_file").count() > 0);

    let (o, _) = pool_run(
        dir.path(),
        "untraced",
        1,
        &[(
            "RELATTN_TRACE",
            dir.path().join("absent/trace").to_str().unwrap(),
        )],
    );
    assert_eq!(o.status.code(), Some(2));
    let err = text(&o.stderr);
    assert!(
        err.contains("RELATTN_TRACE=") && err.contains("cannot create the trace file"),
        "{err}"
    );
}
