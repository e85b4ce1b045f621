//! The engineer's loop as a user runs it in one checkout: run, run again, paste a printed
//! reproduce line, stop after N failures, resume, run the failures again, select by name or
//! parameters. Every step exits as documented; a pasted reproduce line never exits 2.

use crate::common::text;
use std::path::Path;
use std::process::Output;

fn adapters() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../adapters")
        .to_string_lossy()
        .into_owned()
}

/// `relattn ARGS` in `cwd`, with `vars`.
fn relattn_in(cwd: &Path, args: &[&str], vars: &[(&str, &str)]) -> Output {
    crate::binary::relattn_command()
        .args(args)
        .current_dir(cwd)
        .env("RELATTN_ADAPTERS", adapters())
        .envs(vars.iter().copied())
        .output()
        .expect("relattn runs")
}

fn latest(cwd: &Path) -> std::path::PathBuf {
    cwd.join("reports-out")
        .join(std::fs::read_link(cwd.join("reports-out/latest")).expect("latest is a link"))
}

/// The README's first example run twice in one checkout: each run gets its own folder and
/// `reports-out/latest` names the newest (a second run once exited 2, "already holds a report").
#[test]
fn the_same_run_twice_in_one_checkout_exits_0_both_times() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["run", "--matrix", "smoke", "-k", "c97f5ebf67d"];
    let first = relattn_in(dir.path(), &args, &[]);
    assert_eq!(first.status.code(), Some(0), "{}", text(&first.stderr));
    let one = latest(dir.path());
    let second = relattn_in(dir.path(), &args, &[]);
    assert_eq!(second.status.code(), Some(0), "{}", text(&second.stderr));
    let two = latest(dir.path());
    assert_ne!(one, two);
    // `report show`, `plot` and `diff BASE` read the latest run by default.
    let show = relattn_in(dir.path(), &["report", "show"], &[]);
    assert_eq!(show.status.code(), Some(0), "{}", text(&show.stderr));
    assert!(
        text(&show.stdout).contains("PASS"),
        "{}",
        text(&show.stdout)
    );
    let diff = relattn_in(dir.path(), &["report", "diff", one.to_str().unwrap()], &[]);
    assert_eq!(diff.status.code(), Some(0), "{}", text(&diff.stdout));
    let nothing = relattn_in(two.as_path(), &["report", "show"], &[]);
    assert_eq!(nothing.status.code(), Some(2));
    assert!(text(&nothing.stderr).contains("reports-out/latest does not exist"));
    assert!(one.join("cpu/summary.json").is_file() && two.join("cpu/summary.json").is_file());
    // An explicit --out stays exact: a second run there refuses, --resume of a finished report
    // changes nothing.
    let out = dir.path().join("exact");
    let exact = [
        "run",
        "--matrix",
        "smoke",
        "-k",
        "c97f5ebf67d",
        "--out",
        "exact",
    ];
    assert_eq!(relattn_in(dir.path(), &exact, &[]).status.code(), Some(0));
    let summary = std::fs::read(out.join("cpu/summary.json")).unwrap();
    assert_eq!(relattn_in(dir.path(), &exact, &[]).status.code(), Some(2));
    let mut resume = exact.to_vec();
    resume.push("--resume");
    let again = relattn_in(dir.path(), &resume, &[]);
    assert_eq!(again.status.code(), Some(0), "{}", text(&again.stderr));
    assert!(text(&again.stderr).contains("nothing to resume"));
    assert_eq!(
        std::fs::read(out.join("cpu/summary.json")).unwrap(),
        summary
    );
}

/// The reproduce line of a failure, pasted after the run (and pasted again), exits 1 as the
/// failure did, never 2; the `exec` line kept with it runs the kept case again (exit 0).
#[test]
fn a_pasted_reproduce_line_reproduces_the_failure() {
    let dir = tempfile::tempdir().unwrap();
    let fault = [("RELATTN_FAULTY_WRONG", "mixed")];
    let args = [
        "run", "--matrix", "smoke", "--paths", "none", "--impl", "faulty", "-k", "mixed",
    ];
    let out = relattn_in(dir.path(), &args, &fault);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("FAIL "))
        .expect("a failure is printed");
    let reproduce = line.split("reproduce: ").nth(1).expect("a reproduce line");
    let (exec, run) = reproduce
        .split_once(" (or ")
        .expect("the exec line, then the run line");
    // `exec` runs the kept case on the worker and writes its output (judging it is `relattn
    // judge`'s): exit 0. The run line judges: exit 1 again.
    for (command, code) in [(exec, 0), (run.trim_end_matches(')'), 1)] {
        let words = shlex::split(command).unwrap();
        assert_eq!(words[0], "relattn", "{command}");
        let words: Vec<&str> = words[1..].iter().map(String::as_str).collect();
        for _ in 0..2 {
            let again = relattn_in(dir.path(), &words, &fault);
            let err = text(&again.stderr);
            assert_eq!(again.status.code(), Some(code), "{command}: {err}");
        }
    }
}

/// `--max-fail` stops starting trials after N failures (INCOMPLETE, exit 1); `--resume` with no
/// --out continues the latest run; `--rerun-failed` runs exactly the failed trials of a report.
#[test]
fn max_fail_resume_and_rerun_failed() {
    let dir = tempfile::tempdir().unwrap();
    let fault = [("RELATTN_FAULTY_WRONG", "seed1")];
    let base = [
        "run",
        "--matrix",
        "smoke",
        "--paths",
        "none",
        "--impl",
        "faulty",
        "--filter",
        "path=faulty/faulty",
    ];
    let mut args = base.to_vec();
    args.extend(["--max-fail", "1"]);
    let out = relattn_in(dir.path(), &args, &fault);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("(--max-fail)") && err.contains("INCOMPLETE"),
        "{err}"
    );
    let stopped = latest(dir.path());
    let show = relattn_in(
        dir.path(),
        &["report", "show", stopped.to_str().unwrap()],
        &[],
    );
    assert!(text(&show.stdout).contains("INCOMPLETE"));
    args.push("--resume");
    let resumed = relattn_in(dir.path(), &args, &fault);
    assert_eq!(resumed.status.code(), Some(1), "{}", text(&resumed.stderr));
    assert!(text(&resumed.stderr).contains("resuming"));
    // The whole run, then its failures again: exactly those trials.
    let all = relattn_in(dir.path(), &base, &fault);
    assert_eq!(all.status.code(), Some(1));
    let failed = text(&all.stderr)
        .lines()
        .filter(|l| l.starts_with("FAIL "))
        .count();
    assert!(failed > 1);
    let report = latest(dir.path());
    let mut rerun = base.to_vec();
    rerun.extend(["--rerun-failed", report.to_str().unwrap()]);
    let again = relattn_in(dir.path(), &rerun, &fault);
    let err = text(&again.stderr);
    assert_eq!(again.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("matrix `smoke`, {failed} trials")),
        "{err}"
    );
    // Fixed (no fault): the same failures pass.
    let fixed = relattn_in(dir.path(), &rerun, &[]);
    assert_eq!(fixed.status.code(), Some(0), "{}", text(&fixed.stderr));
}

/// `--filter` selects by parameters, `-k` by name, in `run` and `matrix --show` alike.
#[test]
fn filters_select_by_parameters_and_name() {
    let dir = tempfile::tempdir().unwrap();
    let show = relattn_in(
        dir.path(),
        &[
            "matrix",
            "--show",
            "smoke",
            "--filter",
            "layer=local & dtype=fp16",
        ],
        &[],
    );
    let listed = text(&show.stdout);
    assert_eq!(show.status.code(), Some(0));
    let cases: Vec<&str> = listed.lines().filter(|l| l.starts_with('c')).collect();
    assert!(!cases.is_empty());
    assert!(
        cases
            .iter()
            .all(|l| l.contains("local_e") && l.contains("::fp16::")),
        "{listed}"
    );
    let run = relattn_in(
        dir.path(),
        &[
            "run",
            "--matrix",
            "smoke",
            "--filter",
            "layer=local & dtype=fp16 & path=reference",
        ],
        &[],
    );
    let err = text(&run.stderr);
    assert_eq!(run.status.code(), Some(0), "{err}");
    let rows = std::fs::read_to_string(latest(dir.path()).join("cpu/results.jsonl")).unwrap();
    assert!(rows.lines().count() > 0);
    assert!(rows
        .lines()
        .all(|l| l.contains("\"path\":\"reference\"") && l.contains("fp16")));
    let bad = relattn_in(dir.path(), &["run", "--filter", "colour=red"], &[]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(text(&bad.stderr).contains("unknown key `colour`"));
    let none = relattn_in(
        dir.path(),
        &["run", "--matrix", "smoke", "-k", "no-such-trial"],
        &[],
    );
    assert_eq!(none.status.code(), Some(2));
    assert!(text(&none.stderr).contains("no trial of matrix `smoke` is selected"));
}

/// A run refused after its folder was chosen (here `--require-gpu` on a machine without a GPU,
/// or a case folder with a bad file) leaves `reports-out/latest` at the last run that wrote a
/// report: `report show` still opens it.
#[test]
fn a_refused_run_leaves_latest_at_the_last_report() {
    let dir = tempfile::tempdir().unwrap();
    let ok = relattn_in(
        dir.path(),
        &["run", "--matrix", "smoke", "-k", "c97f5ebf67d"],
        &[],
    );
    assert_eq!(ok.status.code(), Some(0), "{}", text(&ok.stderr));
    let first = latest(dir.path());
    let bad = dir.path().join("bad-cases");
    std::fs::create_dir(&bad).unwrap();
    std::fs::write(bad.join("x.safetensors"), b"not a case").unwrap();
    let refused = relattn_in(dir.path(), &["run", "--cases", bad.to_str().unwrap()], &[]);
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused.stderr));
    assert_eq!(latest(dir.path()), first);
    let show = relattn_in(dir.path(), &["report", "show"], &[]);
    assert_eq!(show.status.code(), Some(0), "{}", text(&show.stderr));
}
