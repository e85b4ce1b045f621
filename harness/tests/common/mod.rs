//! Helpers shared by the command-line tests.
#![allow(dead_code)] // each test binary uses a subset

use serde_json::Value;
use std::path::Path;
use std::process::Output;

/// Run the `relattn` binary (`crate::binary::ENV`: no GPU visible, and RUST_BACKTRACE=1, so a
/// panic would show its backtrace: the error tests must never see one).
pub fn relattn(args: &[&str]) -> Output {
    crate::binary::relattn_command()
        .args(args)
        .output()
        .expect("the relattn binary runs")
}

/// `relattn` with extra environment variables.
pub fn relattn_env(args: &[&str], vars: &[(&str, &str)]) -> Output {
    crate::binary::relattn_command()
        .args(args)
        .envs(vars.iter().copied())
        .output()
        .expect("the relattn binary runs")
}

/// Output bytes as text.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Asserts that a command did not panic (its stderr shows no panic message).
pub fn no_panic(out: &Output) {
    let err = text(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
}

/// Every row of a CPU run's report (`REPORT/cpu/results.jsonl`).
pub fn report_rows(report: &Path) -> Vec<Value> {
    std::fs::read_to_string(report.join("cpu/results.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The rows of a CPU run's worker trials (`impl::...`).
pub fn worker_rows(report: &Path) -> Vec<Value> {
    report_rows(report)
        .into_iter()
        .filter(|r| r["trial"].as_str().unwrap().starts_with("impl::"))
        .collect()
}

/// A JSON string's text, or "" for anything else.
pub fn str_or_empty(v: &Value) -> &str {
    v.as_str().unwrap_or_default()
}
