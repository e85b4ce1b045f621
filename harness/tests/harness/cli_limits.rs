//! What is refused and why (docs/limits.md), as a user meets it: write errors on standard
//! output and error, the address-space limit, a report folder another run holds, and a report
//! that only has its CSV.

use crate::common::{relattn, text};
use std::fs::File;
use std::path::Path;
use std::process::{Command, Output, Stdio};

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `relattn ARGS`, standard output and error each sent to a file opened as given (None: piped).
fn with_streams(args: &[&str], stdout: Option<File>, stderr: Option<File>) -> Output {
    let mut cmd = crate::binary::relattn_command();
    cmd.args(args);
    cmd.stdout(stdout.map_or(Stdio::piped(), Stdio::from));
    cmd.stderr(stderr.map_or(Stdio::piped(), Stdio::from));
    cmd.output().unwrap()
}

fn full() -> File {
    std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap()
}

/// A write error on standard output (`> /dev/full`) once panicked (exit 101): now one line and
/// exit 2.
#[test]
fn a_full_standard_output_is_one_message_and_exit_2() {
    let route = [
        "route",
        "--cc",
        "9.0",
        "--batch",
        "1",
        "--max-query-len",
        "9",
        "--heads",
        "8",
        "--kv-heads",
        "1",
        "--max-kv-len",
        "131072",
    ];
    for args in [
        &route[..],
        &["devices", "--json"],
        &["matrix", "--show", "smoke"],
        &["matrix", "--list"],
    ] {
        let out = with_streams(args, Some(full()), None);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains("cannot write to stdout")
                || err.contains("cannot write to standard output"),
            "{args:?}: {err}"
        );
        assert!(err.contains("No space left on device"), "{err}");
        assert!(!err.contains("panicked"), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }
}

/// Standard error full: no panic (exit 101) either, exit 2, and no report is left half made.
#[test]
fn a_full_standard_error_is_exit_2_without_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("out");
    let out = with_streams(
        &[
            "run",
            "--matrix",
            "smoke",
            "--case",
            "c97f5ebf67d",
            "--out",
            s(&out_dir),
        ],
        None,
        Some(full()),
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(!out_dir.join("cpu/summary.json").exists());
}

/// The memory budget counts the address-space limit: under `ulimit -v` of 2 GB, `run --matrix
/// ci` once aborted on an allocation. A case that does not fit is refused, naming the limit
/// (on a machine without a GPU, `run` skips such a case instead: see below).
#[test]
fn ulimit_v_sets_the_case_limit() {
    let dir = tempfile::tempdir().unwrap();
    let script = format!(
        "ulimit -v 2000000 && exec {} gen --case c431c8d070c --matrix ci --output {}",
        env!("CARGO_BIN_EXE_relattn"),
        s(&dir.path().join("case.safetensors"))
    );
    let out = Command::new("sh").args(["-c", &script]).output().unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("the address-space limit (ulimit -v)"), "{err}");
    assert!(err.contains("--max-case-bytes"), "{err}");
    assert!(
        !err.contains("memory allocation") && !err.contains("panicked"),
        "{err}"
    );
    assert!(!dir.path().join("case.safetensors").exists());
}

/// A machine that cannot give relattn its threads: under `ulimit -v` of 400 MB, 512 threads'
/// stacks alone do not fit (one malloc arena, so the failure is at the threads' start on any
/// machine). relattn starts its threads before the command, so this is one message and exit 2,
/// not rayon's panic at the first parallel loop (as it was).
#[test]
fn threads_that_cannot_start_are_one_message() {
    let dir = tempfile::tempdir().unwrap();
    let script = format!(
        "ulimit -v 400000 && exec {} gen --preset tiny --output {}",
        env!("CARGO_BIN_EXE_relattn"),
        s(&dir.path().join("case.safetensors"))
    );
    let out = Command::new("sh")
        .args(["-c", &script])
        .envs(crate::binary::ENV)
        .env("MALLOC_ARENA_MAX", "1")
        .env("RAYON_NUM_THREADS", "512")
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("could not start its 512 threads"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("RAYON_NUM_THREADS"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(!dir.path().join("case.safetensors").exists());
}

/// A run holds its folder with an OS file lock for its whole life: a second run finds it held
/// even before the pid is written (an empty lock file) and stops; a lock file nobody holds (left
/// by a killed run) is no lock.
#[test]
fn a_held_lock_stops_a_second_run_and_a_left_file_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("out");
    std::fs::create_dir(&out_dir).unwrap();
    let lock = File::create(out_dir.join("relattn.lock")).unwrap();
    lock.try_lock().unwrap();
    let args = [
        "run",
        "--matrix",
        "smoke",
        "--case",
        "c97f5ebf67d",
        "--out",
        s(&out_dir),
    ];
    let out = relattn(&args);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("is in use by another relattn run"), "{err}");
    assert!(!out_dir.join("cpu").exists());
    drop(lock);
    let out = relattn(&args);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(!out_dir.join("relattn.lock").exists());
}

/// A report with only its CSV (which `report show` reads) is a report: a run without --resume
/// once overwrote it.
#[test]
fn a_csv_only_report_is_never_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("out");
    let args = [
        "run",
        "--matrix",
        "smoke",
        "--case",
        "c97f5ebf67d",
        "--out",
        s(&out_dir),
    ];
    assert_eq!(relattn(&args).status.code(), Some(0));
    let arch = out_dir.join("cpu");
    for f in ["results.jsonl", "summary.json", "summary.md", "junit.xml"] {
        std::fs::remove_file(arch.join(f)).unwrap();
    }
    let csv = std::fs::read(arch.join("results.csv")).unwrap();
    let out = relattn(&args);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("already holds a report"), "{err}");
    assert_eq!(std::fs::read(arch.join("results.csv")).unwrap(), csv);
}

/// Without a GPU, a tier whose cases are too large for the machine runs what it can: those
/// cases' trials are skipped with the reason (a GPU host runs them) instead of the whole run
/// refusing with exit 2.
#[test]
fn without_a_gpu_too_large_cases_are_skipped_not_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = relattn(&[
        "--max-case-bytes",
        "256M",
        "run",
        "--matrix",
        "regressions",
        "--out",
        s(&dir.path().join("out")),
    ]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let summary = std::fs::read_to_string(dir.path().join("out/cpu/summary.md")).unwrap();
    assert!(
        summary.contains("x needs a host with more memory (a GPU host): case "),
        "{summary}"
    );
}
