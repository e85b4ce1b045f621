//! Locked and resumable runs (CPU part of the smoke tier): a second run into a locked --out
//! exits 2 naming the holder; a run killed after some rows and resumed with --resume ends with
//! every trial exactly once and the verdicts of an uninterrupted run; a run into an --out that
//! holds a report refuses without --resume.

use crate::common;
use common::{relattn, text};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn verdicts(dir: &Path) -> BTreeMap<String, String> {
    let jsonl = std::fs::read_to_string(dir.join("cpu/results.jsonl")).unwrap();
    let mut map = BTreeMap::new();
    for line in jsonl.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let trial = v["trial"].as_str().unwrap().to_string();
        let status = v["status"].as_str().unwrap().to_string();
        assert!(map.insert(trial.clone(), status).is_none(), "{trial} twice");
    }
    map
}

#[test]
fn a_second_run_into_a_locked_out_exits_2_naming_the_holder() {
    let dir = tempfile::tempdir().unwrap();
    let pid = std::process::id();
    // A run holds the OS lock on the file, and writes its pid there for others' messages.
    let lock = std::fs::File::create(dir.path().join("relattn.lock")).unwrap();
    lock.try_lock().unwrap();
    std::fs::write(dir.path().join("relattn.lock"), format!("{pid}\n")).unwrap();
    let started = Instant::now();
    let out = relattn(&["run", "--out", dir.path().to_str().unwrap()]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains(&format!("pid {pid}")), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(
        !dir.path().join("cpu").exists(),
        "the locked run wrote nothing"
    );
}

#[test]
fn an_interrupted_run_resumed_gives_every_trial_once_with_the_same_verdicts() {
    let tmp = tempfile::tempdir().unwrap();
    let (whole, cut) = (tmp.path().join("whole"), tmp.path().join("cut"));
    let out = relattn(&["run", "--matrix", "smoke", "--out", whole.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let expected = verdicts(&whole);

    // Kill a run after some rows.
    let mut child = crate::binary::relattn_command()
        .args(["run", "--matrix", "smoke", "--out", cut.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let jsonl = cut.join("cpu/results.jsonl");
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let lines = std::fs::read_to_string(&jsonl)
            .map(|t| t.lines().count())
            .unwrap_or(0);
        if lines >= 5 || child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = child.kill();
    child.wait().unwrap();
    // The row being written when it died: a partial last line.
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&jsonl)
        .unwrap();
    std::io::Write::write_all(&mut f, b"{\"case_id\":\"torn").unwrap();
    drop(f);
    // A killed run may leave its lock file, but not its lock: the OS released it.
    let left_lock_file = cut.join("relattn.lock").exists();

    // Without --resume the report is not overwritten.
    let out = relattn(&["run", "--matrix", "smoke", "--out", cut.to_str().unwrap()]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--resume"), "{stderr}");
    assert!(
        !stderr.contains("in use"),
        "the lock file (left: {left_lock_file}) of a killed run holds nothing: {stderr}"
    );
    // Another matrix cannot resume it.
    let out = relattn(&[
        "run",
        "--matrix",
        "smoke",
        "--paths",
        "routed",
        "--resume",
        "--out",
        cut.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("paths"), "{}", text(&out.stderr));

    let out = relattn(&[
        "run",
        "--matrix",
        "smoke",
        "--resume",
        "--out",
        cut.to_str().unwrap(),
    ]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("resuming"), "{stderr}");
    assert_eq!(verdicts(&cut), expected);
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(cut.join("cpu/summary.json")).unwrap())
            .unwrap();
    assert_eq!(summary["complete"], true);
    assert!(!cut.join("relattn.lock").exists());
}

#[test]
fn sigint_stops_after_the_trials_in_flight_with_an_incomplete_report() {
    let tmp = tempfile::tempdir().unwrap();
    let out_dir = tmp.path().join("out");
    let child = crate::binary::relattn_command()
        .args([
            "run",
            "--matrix",
            "smoke",
            "--out",
            out_dir.to_str().unwrap(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let jsonl = out_dir.join("cpu/results.jsonl");
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let lines = std::fs::read_to_string(&jsonl)
            .map(|t| t.lines().count())
            .unwrap_or(0);
        if lines >= 3 {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let sent = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let out = child.wait_with_output().unwrap();
    let stderr = text(&out.stderr);
    if out.status.code() == Some(0) {
        eprintln!("the run finished before the interrupt arrived: nothing to check");
        return;
    }
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("interrupted after"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("cpu/summary.json")).unwrap())
            .unwrap();
    assert_eq!(summary["complete"], false);
    let rows = verdicts(&out_dir).len() as u64;
    let counts = &summary["counts"];
    let total: u64 = ["pass", "fail", "skip", "error"]
        .iter()
        .map(|k| counts[*k].as_u64().unwrap())
        .sum();
    assert_eq!(total, rows, "summary counts are the rows written");
    let md = std::fs::read_to_string(out_dir.join("cpu/summary.md")).unwrap();
    assert!(md.contains("INCOMPLETE") && !md.contains("PASS"), "{md}");
    assert!(!out_dir.join("relattn.lock").exists());
    let out = relattn(&[
        "run",
        "--matrix",
        "smoke",
        "--resume",
        "--out",
        out_dir.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}
