//! `--sanitize memcheck` without a GPU: the commands refuse at once (exit 3) when there is no
//! compute-sanitizer, and the worker side end to end with a stand-in sanitizer
//! (`tests/data/fake_sanitizer.py`) that passes the protocol through and writes a memcheck
//! report for the trials asked: that trial alone fails as an out-of-bounds access, early or
//! late in the log, every row says it ran sanitized, and so does the report.

use crate::common;
use common::{text, worker_rows};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Output;

fn fake() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/fake_sanitizer.py")
}

/// relattn with `vars` set and without RELATTN_SANITIZER unless `vars` sets it.
fn relattn(args: &[&str], vars: &[(&str, &str)]) -> Output {
    crate::binary::relattn_command()
        .args(args)
        .env("PYTHONPATH", crate::python::numpy_path())
        .env_remove("RELATTN_SANITIZER")
        .envs(vars.iter().copied())
        .output()
        .expect("the relattn binary runs")
}

#[test]
fn without_compute_sanitizer_every_sanitized_command_exits_3() {
    let dir = tempfile::tempdir().unwrap();
    let empty_path = dir.path().to_str().unwrap();
    let case = dir.path().join("case.safetensors");
    let out_file = dir.path().join("out.safetensors");
    let commands: [Vec<&str>; 4] = [
        vec!["run", "--matrix", "smoke", "--sanitize", "memcheck"],
        vec![
            "exec",
            "--path",
            "score_mod",
            "--input",
            case.to_str().unwrap(),
            "--output",
            out_file.to_str().unwrap(),
            "--sanitize",
            "memcheck",
        ],
        vec![
            "mutants",
            "--only",
            "rel_row_past_end",
            "--sanitize",
            "memcheck",
        ],
        vec![
            "run",
            "--paths",
            "none",
            "--impl",
            "numpy",
            "--sanitize",
            "memcheck",
        ],
    ];
    for args in &commands {
        let out = relattn(args, &[("PATH", empty_path)]);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{args:?}: {err}");
        assert!(
            err.contains("--sanitize memcheck needs NVIDIA's compute-sanitizer")
                && err.contains("there is no compute-sanitizer on PATH")
                && err.lines().count() == 1
                && !err.contains("panicked"),
            "{args:?}: {err}"
        );
    }
    // Named, but not a program.
    let out = relattn(
        &commands[0],
        &[("RELATTN_SANITIZER", out_file.to_str().unwrap())],
    );
    assert_eq!(out.status.code(), Some(3));
    assert!(
        text(&out.stderr).contains("is not an executable file"),
        "{}",
        text(&out.stderr)
    );
    // Other usage errors stay usage errors.
    let fake = fake();
    let out = relattn(
        &["run", "--devices", "0,1", "--sanitize", "memcheck"],
        &[("RELATTN_SANITIZER", fake.to_str().unwrap())],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("one GPU"),
        "{}",
        text(&out.stderr)
    );
}

/// The smoke tier's decode-mix cases through the numpy worker under the stand-in sanitizer
/// running `tool`, one of them reported; the report written `delay_ms` after the answer when
/// given.
fn sanitized_run(dir: &Path, tool: &str, delay_ms: Option<&str>) -> (Output, Vec<Value>, String) {
    let cases = relattn_matrices::load_tier("smoke")
        .unwrap()
        .expand()
        .unwrap()
        .cases;
    let decodes: Vec<&str> = cases
        .iter()
        .filter(|c| c.mix == "decode")
        .map(|c| c.id.as_str())
        .collect();
    assert!(decodes.len() >= 2, "{decodes:?}");
    let target = decodes[0].to_string();
    let fake = fake();
    let args_log = dir.join("args.jsonl");
    let out = dir.join("out");
    let mut vars = vec![
        ("RELATTN_SANITIZER", fake.to_str().unwrap()),
        ("FAKE_MEMCHECK_TRIAL", target.as_str()),
        ("FAKE_SANITIZER_ARGS", args_log.to_str().unwrap()),
    ];
    if let Some(d) = delay_ms {
        vars.push(("FAKE_MEMCHECK_DELAY_MS", d));
    }
    let o = relattn(
        &[
            "run",
            "--matrix",
            "smoke",
            "--filter",
            "mix=decode",
            "--impl",
            "numpy",
            "--paths",
            "none",
            "--sanitize",
            tool,
            "--out",
            out.to_str().unwrap(),
        ],
        &vars,
    );
    let rows = worker_rows(&out);
    (o, rows, target)
}

/// The first words of each tool's failure message in the stand-in's report.
fn expected_start(tool: &str) -> &'static str {
    match tool {
        "memcheck" => {
            "out-of-bounds access (docs/operator.md section 5, class 5): compute-sanitizer \
             memcheck reported 1 error(s) while this trial ran; the first: Invalid __global__ \
             read of size 2 bytes; at score_mod_rel_bias+0x1a30; by thread (5,0,0) in block \
             (0,3,1); Address 0x7f12c0000200 is out of bounds; and is 1 bytes after the nearest \
             allocation at 0x7f12c0000000 of size 511 bytes; the output passes docs/operator.md \
             section 6"
        }
        "initcheck" => {
            "read of memory never written (docs/operator.md section 5, class 7): \
             compute-sanitizer initcheck reported 1 error(s) while this trial ran; the first: \
             Uninitialized __global__ memory read of size 4 bytes; at combine+0x90"
        }
        "racecheck" => {
            "shared-memory race: compute-sanitizer racecheck reported 1 error(s) while this \
             trial ran; the first: Error: Race reported between Write access at combine+0x40; \
             and Read access at combine+0x80 [16 hazards]"
        }
        "synccheck" => {
            "barrier misuse: compute-sanitizer synccheck reported 1 error(s) while this trial \
             ran; the first: Barrier error detected. Divergent thread(s) in block; at \
             decode+0x10"
        }
        other => panic!("no such tool {other}"),
    }
}

fn check_verdicts(out: &Output, rows: &[Value], target: &str, tool: &str) {
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("relattn run: sanitized: every GPU trial runs under"),
        "{err}"
    );
    assert!(rows.len() >= 2);
    for r in rows {
        assert_eq!(r["params"]["sanitize"], tool, "{r}");
        let m = r["message"].as_str().unwrap();
        if r["case_id"] == target {
            assert_eq!(r["status"], "fail", "{r}");
            assert!(m.starts_with(expected_start(tool)), "{m}");
        } else {
            assert_eq!(r["status"], "pass", "{r}");
        }
    }
}

/// Each tool's report fails its trial alone, with the tool's class; the sanitizer's command
/// line names the tool, and memcheck's adds `--padding` (the others take none).
#[rstest::rstest]
fn each_tools_report_fails_its_trial_alone(
    #[values("initcheck", "racecheck", "synccheck")] tool: &str,
) {
    let dir = tempfile::tempdir().unwrap();
    let (out, rows, target) = sanitized_run(dir.path(), tool, None);
    check_verdicts(&out, &rows, &target, tool);
    for (argv, _) in sanitizer_starts(dir.path()) {
        assert_eq!(&argv[..2], ["--tool", tool], "{argv:?}");
        assert!(!argv.iter().any(|a| a == "--padding"), "{argv:?}");
    }
}

/// Each start of the stand-in sanitizer: its arguments, and the PYTORCH_NO_CUDA_MEMORY_CACHING
/// it was given.
fn sanitizer_starts(dir: &Path) -> Vec<(Vec<String>, Value)> {
    std::fs::read_to_string(dir.join("args.jsonl"))
        .unwrap()
        .lines()
        .map(|line| {
            let s: Value = serde_json::from_str(line).unwrap();
            let argv = s["argv"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a.as_str().unwrap().to_string())
                .collect();
            (argv, s["caching"].clone())
        })
        .collect()
}

#[test]
fn a_memcheck_report_fails_its_trial_alone() {
    let dir = tempfile::tempdir().unwrap();
    let (out, rows, target) = sanitized_run(dir.path(), "memcheck", None);
    check_verdicts(&out, &rows, &target, "memcheck");
    // The worker ran under the sanitizer with a log file and PyTorch's cache off, and was
    // started again after the trial with errors.
    let starts = sanitizer_starts(dir.path());
    assert_eq!(starts.len(), 2, "{starts:?}");
    for (argv, caching) in &starts {
        assert_eq!(&argv[..2], ["--tool", "memcheck"], "{argv:?}");
        let padding = argv.iter().position(|a| a == "--padding");
        assert_eq!(
            padding.map(|i| argv[i + 1].clone()),
            Some(relattn_harness::sanitize::PADDING.to_string()),
            "{argv:?}"
        );
        assert!(
            argv.iter().any(|a| a == "--log-file")
                && argv.iter().any(|a| a.ends_with("numpy_worker.py")),
            "{argv:?}"
        );
        assert_eq!(caching, "1");
    }
    let summary: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("out/cpu/summary.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        summary["environment"]["extra"]["sanitize"]["tool"],
        "memcheck"
    );
    let md = std::fs::read_to_string(dir.path().join("out/cpu/summary.md")).unwrap();
    assert!(
        md.contains("- **Sanitized** (`--sanitize memcheck`)"),
        "{md}"
    );
}

/// A report that reaches the log after the worker's answer is still the trial's: relattn waits
/// briefly for the log before it takes a trial as clean.
#[test]
fn a_report_written_just_after_the_answer_is_still_the_trials() {
    let dir = tempfile::tempdir().unwrap();
    let (out, rows, target) = sanitized_run(dir.path(), "memcheck", Some("40"));
    check_verdicts(&out, &rows, &target, "memcheck");
}
