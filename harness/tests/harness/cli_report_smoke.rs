//! `relattn report diff` on real rows: `tests/data/smoke_numpy/{a,b}` hold the
//! numpy worker's 77 rows of two runs of `relattn run --matrix smoke --impl numpy --paths
//! none` by one build (same verdicts and errors, throughputs 20% to 98% apart), error ratios
//! from 9.6e-6 to 1.4e-4.

use crate::common::{relattn, text};
use relattn_reports::{Row, TIMING_NOT_JUDGED};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Output;

fn fixture(run: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/data/smoke_numpy/{run}"))
}

/// A copy of a fixture run, to edit or to draw into.
fn copy(run: &str, to: &Path) -> PathBuf {
    let dir = to.join(run);
    fs::create_dir_all(dir.join("cpu")).unwrap();
    for f in ["results.jsonl", "summary.json"] {
        fs::copy(fixture(run).join("cpu").join(f), dir.join("cpu").join(f)).unwrap();
    }
    dir
}

fn diff(base: &Path, new: &Path, extra: &[&str]) -> Output {
    let (b, n) = (base.to_str().unwrap(), new.to_str().unwrap());
    relattn(&[&["report", "diff", b, n], extra].concat())
}

fn code(out: &Output) -> i32 {
    out.status.code().unwrap_or(-1)
}

#[test]
fn two_runs_of_one_build_diff_clean_by_default() {
    let (a, b) = (fixture("a"), fixture("b"));
    let out = diff(&a, &b, &[]);
    let stdout = text(&out.stdout);
    assert_eq!(code(&out), 0, "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.starts_with("no regression: 77 trials compared"),
        "{stdout}"
    );
    // Timing is left out in one line that says why.
    assert_eq!(stdout.lines().nth(1), Some(TIMING_NOT_JUDGED), "{stdout}");
    assert_eq!(stdout.lines().count(), 2, "{stdout}");

    // The old throughput check is still there when asked for, and the fixture holds exactly
    // the drops that made it cry wolf.
    let out = diff(&a, &b, &["--timing"]);
    assert_eq!(code(&out), 1, "{}", text(&out.stdout));
    assert!(
        text(&out.stdout).contains("Slowdowns ("),
        "{}",
        text(&out.stdout)
    );
    let out = diff(&a, &b, &["--timing", "--throughput-drop", "100"]);
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    // Without --timing the threshold is accepted (scripts that passed it keep working) and
    // said to do nothing.
    let out = diff(&a, &b, &["--throughput-drop", "100"]);
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("apply with --timing only"),
        "{}",
        text(&out.stderr)
    );
    let out = diff(&a, &b, &["--timing", "--throughput-drop", "101"]);
    assert_eq!(code(&out), 2, "{}", text(&out.stderr));
}

#[test]
fn a_planted_correctness_regression_exits_1_and_is_listed_first() {
    let tmp = tempfile::tempdir().unwrap();
    let worse = copy("b", tmp.path());
    let jsonl = worse.join("cpu/results.jsonl");
    let mut lines: Vec<String> = fs::read_to_string(&jsonl)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    // The last trial in name order fails; the first one is gone.
    let (failed, gone) = (lines.len() - 1, 0);
    let trial = |line: &str| serde_json::from_str::<Row>(line).unwrap().trial;
    let (failed_trial, gone_trial) = (trial(&lines[failed]), trial(&lines[gone]));
    assert_eq!(lines[failed].matches("\"status\":\"pass\"").count(), 1);
    lines[failed] = lines[failed].replace("\"status\":\"pass\"", "\"status\":\"fail\"");
    lines.remove(gone);
    fs::write(&jsonl, lines.join("\n") + "\n").unwrap();

    let out = diff(&fixture("a"), &worse, &[]);
    let stdout = text(&out.stdout);
    assert_eq!(code(&out), 1, "{stdout}");
    assert!(
        stdout.starts_with("REGRESSION: 76 trials compared, 1 new failures"),
        "{stdout}"
    );
    let first_section = stdout.lines().find(|l| l.ends_with("):")).unwrap();
    assert_eq!(first_section, "New failures (1):", "{stdout}");
    assert!(
        stdout.contains(&format!("{failed_trial} (pass -> fail)")),
        "{stdout}"
    );

    // With timing judged too, both correctness findings come before any timing line.
    let out = diff(&fixture("a"), &worse, &["--timing"]);
    let stdout = text(&out.stdout);
    assert_eq!(code(&out), 1, "{stdout}");
    let slow = stdout
        .find("Slowdowns (")
        .expect("the fixture's drops are listed");
    for trial in [&failed_trial, &gone_trial] {
        let at = stdout.find(trial.as_str()).expect("listed");
        assert!(at < slow, "{trial} after the slowdowns:\n{stdout}");
    }
}
