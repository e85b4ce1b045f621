//! `relattn run --cases DIR`: a folder of case files as a tier. The files are written by
//! `adapters/tests/make_case_folder.py`, numpy written from the format's documentation and
//! independent of relattn's generator; the numpy worker and the reference self-checks run them
//! without a GPU. Ids are hashes of the files' bytes, invalid files refuse the run unless
//! `--keep-going`, and a failure's reproduce line works when pasted.
//!
//! These need `python3` with numpy (installed into the target folder when python3 lacks it).

use crate::common::{no_panic, report_rows as rows, str_or_empty as s, text, worker_rows};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use crate::python::{relattn_with_numpy as relattn, repo};

/// `count` case files from the independent numpy script, in `dir`.
fn make_folder(dir: &Path, count: usize) {
    let out = Command::new("python3")
        .arg(repo().join("adapters/tests/make_case_folder.py"))
        .arg(dir)
        .args(["--count", &count.to_string()])
        .env("PYTHONPATH", crate::python::numpy_path())
        .output()
        .expect("python3 runs");
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// `c` and the first 10 hex digits of the file's SHA-256 (what `sha256sum` prints).
fn sha_id(path: &Path) -> String {
    let digest = Sha256::digest(std::fs::read(path).unwrap());
    format!("c{}", &hex::encode(digest)[..10])
}

/// The worker trials' case ids by file stem.
fn ids_by_name(rows: &[Value]) -> BTreeMap<String, String> {
    rows.iter()
        .filter(|r| s(&r["trial"]).starts_with("impl::"))
        .map(|r| {
            let name = s(&r["trial"]).split("::").nth(3).unwrap().to_string();
            (name, s(&r["case_id"]).to_string())
        })
        .collect()
}

#[test]
fn twenty_independent_case_files_pass_and_keep_their_ids_across_renames() {
    let dir = tempfile::tempdir().unwrap();
    let cases = dir.path().join("cases");
    make_folder(&cases, 20);
    let run = |out: &Path| {
        let o = relattn(
            &[
                "run",
                "--cases",
                cases.to_str().unwrap(),
                "--paths",
                "none",
                "--impl",
                "numpy",
                "--out",
                out.to_str().unwrap(),
            ],
            &[],
        );
        no_panic(&o);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
        rows(out)
    };
    let first = run(&dir.path().join("a"));
    let ids = ids_by_name(&first);
    assert_eq!(ids.len(), 20, "{ids:?}");
    let mut by_file = BTreeMap::new();
    for entry in std::fs::read_dir(&cases).unwrap() {
        let path = entry.unwrap().path();
        let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
        assert_eq!(ids[&stem], sha_id(&path), "{stem}");
        by_file.insert(stem, sha_id(&path));
    }
    // Every case's worker trial passed the judge, and so did every self-check that ran.
    for r in &first {
        let trial = s(&r["trial"]);
        match s(&r["path"]) {
            "numpy/numpy" | "reference" | "routing" => {
                assert!(
                    s(&r["status"]) == "pass"
                        || (s(&r["status"]) == "skip" && trial.starts_with("reference::")),
                    "{r}"
                )
            }
            other => panic!("unexpected path {other}: {r}"),
        }
        if !trial.starts_with("routing::") {
            assert!(r["seed"].is_u64(), "{r}");
            assert_eq!(
                s(&r["params"]["tier"]),
                format!("cases:{}", cases.display()),
                "{r}"
            );
            assert!(s(&r["params"]["file"]).ends_with(".safetensors"), "{r}");
        }
    }
    let summary: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("a/cpu/summary.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        s(&summary["environment"]["matrix"]),
        format!("cases:{}", cases.display())
    );
    // Renamed and moved files keep their ids; their names follow the files.
    let names: Vec<String> = by_file.keys().cloned().collect();
    std::fs::rename(
        cases.join(format!("{}.safetensors", names[0])),
        cases.join("renamed.safetensors"),
    )
    .unwrap();
    std::fs::create_dir(cases.join("sub")).unwrap();
    std::fs::rename(
        cases.join(format!("{}.safetensors", names[1])),
        cases.join("sub/moved.safetensors"),
    )
    .unwrap();
    let again = ids_by_name(&run(&dir.path().join("b")));
    let before: BTreeSet<&String> = ids.values().collect();
    let after: BTreeSet<&String> = again.values().collect();
    assert_eq!(before, after);
    assert_eq!(again["renamed"], by_file[&names[0]]);
    assert_eq!(again["moved"], by_file[&names[1]]);
}

#[test]
fn invalid_files_refuse_the_run_each_named_unless_keep_going() {
    let dir = tempfile::tempdir().unwrap();
    let cases = dir.path().join("cases");
    make_folder(&cases, 2);
    let good = std::fs::read_dir(&cases)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let bytes = std::fs::read(&good).unwrap();
    std::fs::write(cases.join("cut.safetensors"), &bytes[..bytes.len() - 100]).unwrap();
    std::fs::write(cases.join("notes.safetensors"), "not a case").unwrap();
    std::os::unix::fs::symlink(&good, cases.join("link.safetensors")).unwrap();
    std::fs::write(cases.join("README.md"), "ignored: not *.safetensors").unwrap();
    let out = dir.path().join("out");
    let o = relattn(
        &[
            "run",
            "--cases",
            cases.to_str().unwrap(),
            "--paths",
            "none",
            "--out",
            out.to_str().unwrap(),
        ],
        &[],
    );
    no_panic(&o);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("3 of 5 case files are not valid"), "{err}");
    for (file, why) in [
        ("cut.safetensors", "safetensors"),
        ("link.safetensors", "symbolic link"),
        ("notes.safetensors", "safetensors"),
    ] {
        let line = err
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{file}: ")))
            .unwrap_or_else(|| panic!("no line for {file} in {err}"));
        assert!(line.contains(why), "{line}");
    }
    assert!(!out.join("cpu").exists(), "nothing runs, no report");
    let o = relattn(
        &[
            "run",
            "--cases",
            cases.to_str().unwrap(),
            "--keep-going",
            "--paths",
            "none",
            "--out",
            out.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let rows = rows(&out);
    let bad: Vec<&Value> = rows
        .iter()
        .filter(|r| s(&r["path"]) == "case_file")
        .collect();
    let names: Vec<&str> = bad.iter().map(|r| s(&r["trial"])).collect();
    assert_eq!(
        names,
        [
            "case_file::cut.safetensors",
            "case_file::link.safetensors",
            "case_file::notes.safetensors"
        ]
    );
    for r in bad {
        assert_eq!(s(&r["status"]), "skip", "{r}");
        assert!(s(&r["message"]).contains("not a valid case file"), "{r}");
    }
    let checked: BTreeSet<&str> = rows
        .iter()
        .filter(|r| s(&r["path"]) == "reference")
        .map(|r| s(&r["case_id"]))
        .collect();
    assert_eq!(checked.len(), 2, "the two valid files ran");
}

/// The command after `(or ` in a failing worker row's message, as arguments.
fn reproduce_args(message: &str) -> Vec<String> {
    let line = message.rsplit("(or ").next().unwrap().trim_end_matches(')');
    let words = shlex::split(line).unwrap();
    assert_eq!(words[0], "relattn", "{line}");
    words[1..].to_vec()
}

#[test]
fn a_failure_in_a_case_folder_is_reproduced_by_its_printed_command_and_rerun() {
    let dir = tempfile::tempdir().unwrap();
    let cases = dir.path().join("my cases");
    make_folder(&cases, 4);
    std::fs::write(cases.join("broken.safetensors"), "x").unwrap();
    // The faulty worker writes a wrong value on every trial of the case file `02_...`.
    let faulty = [("RELATTN_FAULTY_WRONG", "::02_chunked")];
    let out = dir.path().join("first");
    let o = relattn(
        &[
            "run",
            "--cases",
            cases.to_str().unwrap(),
            "--keep-going",
            "--splits",
            "policy,3",
            "--paths",
            "none",
            "--impl",
            "faulty",
            "--out",
            out.to_str().unwrap(),
        ],
        &faulty,
    );
    no_panic(&o);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    let failed: Vec<Value> = rows(&out)
        .into_iter()
        .filter(|r| s(&r["status"]) == "fail")
        .collect();
    assert_eq!(failed.len(), 1, "{failed:?}");
    let message = s(&failed[0]["message"]);
    assert!(message.contains("--splits policy"), "{message}");
    // Pasted as printed (a shell would unquote the folder): the one trial fails again, alone,
    // though the folder holds an invalid file and the run has no --keep-going.
    let mut args = reproduce_args(message);
    let again = dir.path().join("again");
    args.extend(["--out".into(), again.to_str().unwrap().into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = relattn(&args, &faulty);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    let worker = worker_rows(&again);
    assert_eq!(worker.len(), 1, "{worker:?}");
    assert_eq!(worker[0]["trial"], failed[0]["trial"]);
    assert_eq!(s(&worker[0]["status"]), "fail");
    // --rerun-failed takes the folder from the report (given the run's own --splits and
    // --keep-going): the failed trial runs again, alone.
    let rerun = dir.path().join("rerun");
    let o = relattn(
        &[
            "run",
            "--rerun-failed",
            out.to_str().unwrap(),
            "--keep-going",
            "--splits",
            "policy,3",
            "--paths",
            "none",
            "--impl",
            "faulty",
            "--out",
            rerun.to_str().unwrap(),
        ],
        &faulty,
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    let trials: Vec<String> = rows(&rerun)
        .iter()
        .map(|r| s(&r["trial"]).to_string())
        .collect();
    assert_eq!(trials, [s(&failed[0]["trial"])]);
}

#[test]
fn filters_shards_max_fail_and_resume_work_on_a_case_folder() {
    let dir = tempfile::tempdir().unwrap();
    let cases = dir.path().join("cases");
    make_folder(&cases, 6);
    let base = |out: &Path| {
        vec![
            "run".to_string(),
            "--cases".into(),
            cases.to_str().unwrap().into(),
            "--paths".into(),
            "none".into(),
            "--impl".into(),
            "numpy".into(),
            "--out".into(),
            out.to_str().unwrap().into(),
        ]
    };
    let run = |out: &Path, extra: &[&str], env: &[(&str, &str)]| {
        let mut args = base(out);
        args.extend(extra.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = relattn(&args, env);
        no_panic(&o);
        o
    };
    let worker_cases = |out: &Path| -> BTreeSet<String> {
        worker_rows(out)
            .iter()
            .map(|r| s(&r["case_id"]).to_string())
            .collect()
    };
    let all = dir.path().join("all");
    assert_eq!(run(&all, &[], &[]).status.code(), Some(0));
    let every = worker_cases(&all);
    assert_eq!(every.len(), 6);
    // -k and --filter select by name and parameters.
    let k = dir.path().join("k");
    assert_eq!(
        run(&k, &["-k", "03_prefill_decode"], &[]).status.code(),
        Some(0)
    );
    assert_eq!(worker_cases(&k).len(), 1);
    let f = dir.path().join("f");
    let o = run(&f, &["--filter", "dtype=fp16 & path=numpy/numpy"], &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(worker_cases(&f).len(), 3, "cases 1, 3 and 5 are fp16");
    // Two shards are disjoint and cover the folder.
    let (s1, s2) = (dir.path().join("s1"), dir.path().join("s2"));
    assert_eq!(run(&s1, &["--shard", "1/2"], &[]).status.code(), Some(0));
    assert_eq!(run(&s2, &["--shard", "2/2"], &[]).status.code(), Some(0));
    let (a, b) = (worker_cases(&s1), worker_cases(&s2));
    assert!(a.is_disjoint(&b));
    assert_eq!(a.union(&b).cloned().collect::<BTreeSet<_>>(), every);
    // --max-fail stops early (INCOMPLETE, exit 1); --resume with the same arguments finishes.
    let wrong = [("RELATTN_FAULTY_WRONG", "::0")];
    let m = dir.path().join("m");
    let o = run(&m, &["--impl", "faulty", "--max-fail", "1"], &wrong);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stderr).contains("INCOMPLETE"),
        "{}",
        text(&o.stderr)
    );
    // (--max-fail is not part of a run's identity: the resume runs the rest without it.)
    let o = run(&m, &["--impl", "faulty", "--resume"], &wrong);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(m.join("cpu/summary.json")).unwrap())
            .unwrap();
    assert_eq!(summary["complete"], true);
    // Resuming a finished report runs nothing.
    let o = run(&all, &["--resume"], &[]);
    assert_eq!(o.status.code(), Some(0));
    assert!(
        text(&o.stderr).contains("nothing to resume"),
        "{}",
        text(&o.stderr)
    );
}

#[test]
fn case_folder_usage_errors_exit_2_with_one_message() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let e = empty.to_str().unwrap();
    for (args, expected) in [
        (
            vec!["--cases", e, "--matrix", "smoke"],
            "cannot be used with",
        ),
        (vec!["--splits", "3"], "are for case folders"),
        (
            vec!["--keep-going", "--matrix", "smoke"],
            "are for case folders",
        ),
        (vec!["--cases", e, "--splits", "0"], "at least 1"),
        (vec!["--cases", e], "holds no valid case file"),
        (vec!["--cases", "/nonexistent/folder"], "No such file"),
    ] {
        let mut full = vec!["run", "--paths", "none"];
        full.extend(args.iter().copied());
        let o = relattn(&full, &[]);
        no_panic(&o);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(expected), "{args:?}: {err}");
    }
}
