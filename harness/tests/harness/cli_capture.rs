//! Capture (`adapters/tools/capture.py`) without torch or a GPU: a numpy stand-in of vLLM's op,
//! called as the attention layer calls it, writes case files that `relattn reference`, `judge`
//! and `run --cases` read; with vLLM 0.33.0's files, capture installs on the real op and through
//! the vllm worker (`adapters/tests/test_capture.py`, `OnVllm`).

use crate::common::{report_rows as rows, str_or_empty as s, text};
use serde_json::Value;
use std::process::{Command, Output};

use crate::python::{relattn_with_numpy as relattn, repo};

/// `python3 SCRIPT ARGS` from `adapters/` with numpy, with `env`.
fn python(script: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new("python3")
        .arg(script)
        .args(args)
        .current_dir(repo().join("adapters"))
        .env("PYTHONPATH", crate::python::numpy_path())
        .envs(env.iter().copied())
        .output()
        .expect("python3 runs")
}

#[test]
fn captured_calls_are_case_files_that_reference_judge_and_run_read() {
    let dir = tempfile::tempdir().unwrap();
    let captured = dir.path().join("captured");
    // A numpy stand-in of vLLM's op, called as the attention layer calls it, under capture.py.
    let o = python(
        "tests/capture_numpy.py",
        &["--count", "4"],
        &[
            ("RELATTN_CAPTURE_DIR", captured.to_str().unwrap()),
            ("RELATTN_CAPTURE_EVERY", "1"),
        ],
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let files: Vec<String> = text(&o.stdout).lines().map(str::to_string).collect();
    assert_eq!(files.len(), 4, "{}", text(&o.stdout));
    for file in &files {
        let reference = dir.path().join("ref.safetensors");
        let r = relattn(
            &[
                "reference",
                "--input",
                file,
                "--output",
                reference.to_str().unwrap(),
            ],
            &[],
        );
        assert_eq!(r.status.code(), Some(0), "{file}: {}", text(&r.stderr));
        // The op's output kept in the file is within the tolerance of relattn's reference.
        let out = dir.path().join("out.safetensors");
        let o = python(
            "tools/capture.py",
            &["output", file, "--output", out.to_str().unwrap()],
            &[],
        );
        assert!(o.status.success(), "{}", text(&o.stderr));
        let j = relattn(
            &["judge", "--input", file, "--output", out.to_str().unwrap()],
            &[],
        );
        assert_eq!(j.status.code(), Some(0), "{file}: {}", text(&j.stdout));
        assert!(text(&j.stdout).starts_with("PASS"), "{}", text(&j.stdout));
        // Run again on the captured inputs (the numpy worker computes as the stand-in op did),
        // the output is the captured one, float for float.
        let rerun = dir.path().join("rerun.safetensors");
        let e = relattn(
            &[
                "exec",
                "--impl",
                "numpy",
                "--path",
                "numpy",
                "--input",
                file,
                "--output",
                rerun.to_str().unwrap(),
            ],
            &[],
        );
        assert_eq!(e.status.code(), Some(0), "{file}: {}", text(&e.stderr));
        let c = python(
            "tools/capture.py",
            &["compare", file, rerun.to_str().unwrap()],
            &[],
        );
        assert_eq!(c.status.code(), Some(0), "{}", text(&c.stdout));
        assert!(
            text(&c.stdout).contains(": REPRODUCED: "),
            "{}",
            text(&c.stdout)
        );
    }
    let report = dir.path().join("report");
    let r = relattn(
        &[
            "run",
            "--cases",
            captured.to_str().unwrap(),
            "--paths",
            "none",
            "--impl",
            "numpy",
            "--out",
            report.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(r.status.code(), Some(0), "{}", text(&r.stderr));
    let worker: Vec<Value> = rows(&report)
        .into_iter()
        .filter(|r| s(&r["path"]) == "numpy/numpy")
        .collect();
    assert_eq!(worker.len(), 4);
    assert!(
        worker.iter().all(|r| s(&r["status"]) == "pass"),
        "{worker:?}"
    );
}

#[test]
fn capture_installs_on_vllm_0_33_0s_op_and_through_the_vllm_worker() {
    let Some(root) = crate::cli_worker::vllm_root() else {
        return;
    };
    let o = crate::python::adapters_unittest(
        &["-v", "tests.test_capture.OnVllm"],
        &[("RELATTN_VLLM_ROOT", &root)],
    );
    let err = text(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("Ran 2 tests") && !err.contains("skipped"),
        "{err}"
    );
}
