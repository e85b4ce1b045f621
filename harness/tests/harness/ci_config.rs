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

/// The README's first code block: the main job's command and the test command.
fn readme_commands() -> (String, String) {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let block = readme
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("README.md has a ```sh block");
    let command = |l: &str| l.split('#').next().unwrap().trim().to_string();
    let lines: Vec<String> = block
        .lines()
        .map(command)
        .filter(|l| !l.is_empty())
        .collect();
    assert_eq!(
        lines.len(),
        2,
        "the README starts with two commands: {lines:?}"
    );
    (lines[0].clone(), lines[1].clone())
}

/// `.ci/run` runs exactly the README's test command, on a machine like a new user's: it
/// installs no Python package beforehand (the tests fetch what they need themselves), so a green
/// CI means a new user's run is green too.
#[test]
fn ci_runs_the_readmes_test_command_and_installs_no_python_package() {
    let (main_job, test_command) = readme_commands();
    assert!(main_job.starts_with("cargo run --release"), "{main_job}");
    assert!(test_command.starts_with("cargo test"), "{test_command}");
    let script = std::fs::read_to_string(repo().join(".ci/run")).unwrap();
    let commands: Vec<&str> = script
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    assert_eq!(
        commands.last().copied(),
        Some(test_command.as_str()),
        ".ci/run must end with the README's test command"
    );
    assert_eq!(
        commands.iter().filter(|l| l.contains("cargo ")).count(),
        1,
        ".ci/run runs one cargo command: {commands:#?}"
    );
    for l in &commands {
        let installs = l.contains("pip install")
            || l.contains("pip3 install")
            || l.contains("uv pip")
            || l.contains("apt-get install")
            || l.contains("ensurepip --upgrade");
        assert!(!installs, ".ci/run installs a package: `{l}`");
    }
}

/// The nightly sanitized tier's script: an unknown step is a usage error naming the steps, and
/// without a GPU every run it makes exits 3 (no usable GPU), which the script passes on, with
/// each command and its exit code in timings.tsv.
#[test]
fn the_nightly_sanitized_script_names_its_steps_and_passes_exit_codes_on() {
    let dir = tempfile::tempdir().unwrap();
    let script = repo().join("ci/nightly-sanitized.sh");
    let run = |steps: &[&str]| {
        Command::new("bash")
            .arg(&script)
            .args(steps)
            .env("RELATTN_BIN", env!("CARGO_BIN_EXE_relattn"))
            .env("OUT", dir.path())
            .envs(crate::binary::ENV)
            .output()
            .unwrap()
    };
    let bad = run(&["sideways"]);
    assert_eq!(bad.status.code(), Some(2));
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        err.contains("unknown step sideways") && err.contains("racecheck"),
        "{err}"
    );
    let out = run(&["plain"]);
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let timings = std::fs::read_to_string(dir.path().join("timings.tsv")).unwrap();
    let lines: Vec<&str> = timings.lines().collect();
    assert_eq!(lines.len(), 3, "{timings}");
    assert!(lines[1].starts_with("plain-native\trelattn run --require-gpu --matrix regressions"));
    assert!(
        lines[2].contains("--paths none --impl vllm,triton,fa4,flex"),
        "{timings}"
    );
    assert!(
        lines[1..].iter().all(|l| l.split('\t').nth(2) == Some("3")),
        "{timings}"
    );
}
