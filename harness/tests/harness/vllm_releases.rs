//! Any vLLM release or branch: `adapters/tools/fetch_vllm.sh`'s arguments (each usage error one
//! line and exit 2, before any download), `ci/nightly-vllm.sh`'s release check, and the vllm
//! worker loading the op from a source checkout (with vLLM 0.33.0's files standing in for a
//! clone).

use crate::common::text;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn bash(script: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new("bash")
        .arg(repo().join(script))
        .args(args)
        .envs(env.iter().copied())
        // Nothing may be downloaded: a usage error stops before pip or the network.
        .env("PYTHON", "/nonexistent/python3")
        .output()
        .expect("bash runs")
}

#[test]
fn fetch_vllm_usage_errors_are_one_line_and_exit_2_without_the_network() {
    let sha = "a".repeat(64);
    let cases: &[(&[&str], &str)] = &[
        (&["--version"], "--version needs a value"),
        (&["--version", "--kernels"], "--version needs a value"),
        (&["--sha256"], "--sha256 needs a value"),
        (&["--version", "0.3x"], "is not a release number"),
        (&["--version", "1..2"], "is not a release number"),
        (
            &["--version", "0.34.0; rm -rf x"],
            "is not a release number",
        ),
        (
            &["--version", "0.34.0", "--sha256", "abc"],
            "is not 64 hex digits",
        ),
        (
            &["--version", "0.34.0", "--sha256", &sha[1..]],
            "is not 64 hex digits",
        ),
        (&["--sha256", &sha], "--sha256 goes with --version"),
        (&["--frobnicate"], "unknown option --frobnicate"),
        (&["--version=0.34.0"], "not --version=VALUE"),
        (&["dest1", "dest2"], "one DEST only"),
    ];
    for (args, expected) in cases {
        let out = bash("adapters/tools/fetch_vllm.sh", args, &[]);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(
            err.starts_with("fetch_vllm.sh: ") && err.contains(expected),
            "{args:?}: {err}"
        );
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    // A valid request gets past the arguments: here it stops at the missing interpreter.
    let out = bash(
        "adapters/tools/fetch_vllm.sh",
        &["--version", "0.35.0rc1"],
        &[],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("/nonexistent/python3 not found"));
}

#[test]
fn the_nightly_vllm_job_refuses_a_release_that_is_no_version() {
    let out = bash(
        "ci/nightly-vllm.sh",
        &[],
        &[
            ("RELATTN_VLLM_VERSION", "main; echo"),
            ("RELATTN_BIN", "/nonexistent/relattn"),
        ],
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("is not a release number"), "{err}");
    for script in ["ci/nightly-vllm.sh", "ci/gpu-cases.sh"] {
        let syntax = Command::new("bash")
            .arg("-n")
            .arg(repo().join(script))
            .output()
            .unwrap();
        assert!(
            syntax.status.success(),
            "{script}: {}",
            text(&syntax.stderr)
        );
    }
}

#[test]
fn the_vllm_worker_loads_the_op_from_a_source_checkout() {
    let Some(root) = crate::cli_worker::vllm_root() else {
        return;
    };
    let o = crate::python::adapters_unittest(
        &["-v", "tests.test_vllm_worker.SourceCheckout"],
        &[("RELATTN_VLLM_ROOT", &root)],
    );
    let err = text(&o.stderr);
    assert!(o.status.success(), "{err}");
    if err.contains("skipped 'git is not installed'") {
        eprintln!("not run: git is not installed");
        return;
    }
    assert!(err.contains("Ran 1 test") && err.contains("OK"), "{err}");
}
