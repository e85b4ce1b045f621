//! The nextest profile CI uses, and the CPU job that uses it.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn the_ci_profile_writes_junit_with_the_skipped_trials() {
    let text = std::fs::read_to_string(repo().join(".config/nextest.toml")).unwrap();
    let config: toml::Table = toml::from_str(&text).unwrap();
    let ci = &config["profile"]["ci"];
    assert_eq!(ci["fail-fast"].as_bool(), Some(false));
    assert_eq!(ci["junit"]["path"].as_str(), Some("junit.xml"));
    assert_eq!(ci["junit"]["report-skipped"].as_str(), Some("ignored"));
}

#[test]
fn the_cpu_job_runs_nextest_with_that_profile_or_falls_back_to_cargo_test() {
    let script = repo().join("ci/cpu.sh");
    let syntax = Command::new("bash")
        .arg("-n")
        .arg(&script)
        .output()
        .unwrap();
    assert!(
        syntax.status.success(),
        "{}",
        String::from_utf8_lossy(&syntax.stderr)
    );
    let text = std::fs::read_to_string(&script).unwrap();
    let commands: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .collect();
    let at = |needle: &str| {
        commands
            .iter()
            .position(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("ci/cpu.sh has no `{needle}`"))
    };
    let (probe, nextest, fallback) = (
        at("if cargo nextest --version"),
        at("cargo nextest run --release --workspace --profile ci"),
        at("cargo test --release --workspace"),
    );
    assert!(probe < nextest && nextest < fallback, "{text}");
    // GPU runs leave the reference self-checks to this job, on the GPU tiers too.
    let self_checks = at("--paths none --self-checks");
    assert!(fallback < self_checks, "{text}");
    assert!(
        text.contains("run --matrix ci --paths none --self-checks"),
        "{text}"
    );
    assert!(text.contains("target/nextest/ci/junit.xml"), "{text}");
}
