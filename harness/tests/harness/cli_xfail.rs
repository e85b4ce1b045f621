//! Triage and expected failures without a GPU, through the leaky test worker (a kernel that
//! leaks NaN from pre-window pages, docs/operator.md section 5 class 7, like vLLM's ops on local
//! layers): a known bug stays green under `--xfail`, and a second defect in the same trials
//! (windows one key short) turns the run red, and `report diff` red, even though the same trials
//! fail.

use crate::common::{text, worker_rows};
use crate::python::relattn_with_numpy;
use std::path::{Path, PathBuf};
use std::process::Output;

const KNOWN: &str = r#"
[[xfail]]
filter = "path=leaky/leaky & layer=local"
cause = "nan_leak"
reason = "the leaky worker multiplies zero weights by NaN from pre-window pages (docs/operator.md section 5, class 7)"
"#;

fn leaky(dir: &Path, name: &str, args: &[&str], env: &[(&str, &str)]) -> (Output, PathBuf) {
    let out = dir.join(name);
    let mut all = vec![
        "run", "--matrix", "smoke", "--paths", "none", "--impl", "leaky",
    ];
    all.extend(["--out", out.to_str().unwrap()]);
    all.extend(args);
    let o = relattn_with_numpy(&all, env);
    assert!(!text(&o.stderr).contains("panicked"), "{}", text(&o.stderr));
    (o, out)
}

fn file(dir: &Path, name: &str, body: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, body).unwrap();
    path.to_string_lossy().into_owned()
}

fn count(rows: &[serde_json::Value], status: &str) -> usize {
    rows.iter().filter(|r| r["status"] == status).count()
}

#[test]
fn a_known_bug_stays_green_and_a_new_one_in_the_same_trials_turns_red() {
    let dir = tempfile::tempdir().unwrap();
    let known = file(dir.path(), "known.toml", KNOWN);
    let short = [("RELATTN_LEAKY_WINDOW_SHORT", "1")];

    // Triage alone: every failing trial is a NaN leak on a local layer.
    let (plain, plain_dir) = leaky(dir.path(), "plain", &[], &[]);
    assert_eq!(plain.status.code(), Some(1));
    let rows = worker_rows(&plain_dir);
    let failing: Vec<_> = rows.iter().filter(|r| r["status"] == "fail").collect();
    assert!(failing.len() >= 10, "{}", failing.len());
    for r in &failing {
        assert_eq!(r["params"]["cause"], "nan_leak", "{}", r["message"]);
        assert!(r["params"]["layer"].as_str().unwrap().starts_with("local"));
        assert!(r["params"]["triage"]
            .as_str()
            .unwrap()
            .contains("finite_unread pass"));
        assert!(r["message"].as_str().unwrap().contains("cause: nan_leak"));
    }
    assert!(text(&plain.stderr).contains("cause: nan_leak"));

    // Under the known-bug file: green, the failures expected.
    let (green, green_dir) = leaky(dir.path(), "green", &["--xfail", &known], &[]);
    assert_eq!(green.status.code(), Some(0), "{}", text(&green.stderr));
    let rows = worker_rows(&green_dir);
    assert_eq!(count(&rows, "xfail"), failing.len());
    assert_eq!(count(&rows, "fail"), 0);
    let summary = std::fs::read_to_string(green_dir.join("cpu/summary.md")).unwrap();
    assert!(summary.contains("Expected failures (--xfail)"), "{summary}");
    let junit = std::fs::read_to_string(green_dir.join("cpu/junit.xml")).unwrap();
    assert!(junit.contains("expected failure (nan_leak)"));
    // The failing run kept its cases; an expected failure keeps none (room for new ones).
    let kept = |dir: &Path| {
        std::fs::read_dir(dir.join("cpu/failures"))
            .map(|d| d.count())
            .unwrap_or(0)
    };
    assert!(kept(&plain_dir) >= failing.len(), "{}", kept(&plain_dir));
    assert_eq!(kept(&green_dir), 0);

    // A second defect in the same trials: red under the same file, for the new cause.
    let (red, red_dir) = leaky(dir.path(), "red", &["--xfail", &known], &short);
    assert_eq!(red.status.code(), Some(1), "{}", text(&red.stderr));
    let rows = worker_rows(&red_dir);
    let new: Vec<_> = rows.iter().filter(|r| r["status"] == "fail").collect();
    assert!(new.len() > failing.len() / 2, "{}", new.len());
    for r in &new {
        assert_eq!(r["params"]["cause"], "wrong");
        assert!(r["message"]
            .as_str()
            .unwrap()
            .contains("not the expected failure"));
    }

    // Without the file, the two runs fail the same trials; report diff names the new cause.
    let (short_run, short_dir) = leaky(dir.path(), "short", &[], &short);
    assert_eq!(short_run.status.code(), Some(1));
    let diff = crate::binary::relattn_command()
        .args(["report", "diff"])
        .args([&plain_dir, &short_dir])
        .output()
        .unwrap();
    let said = text(&diff.stdout) + &text(&diff.stderr);
    assert_eq!(diff.status.code(), Some(1), "{said}");
    assert!(
        said.contains(&format!("{} new causes", new.len())),
        "{said}"
    );
    assert!(said.contains("(nan_leak -> wrong)"), "{said}");
    let trial = new[0]["trial"].as_str().unwrap();
    assert!(said.contains(trial), "{said}");
}

#[test]
fn a_strict_unexpected_pass_fails_and_an_entry_that_matched_nothing_is_listed() {
    let dir = tempfile::tempdir().unwrap();
    let strict = file(
        dir.path(),
        "strict.toml",
        r#"
[[xfail]]
filter = "path=leaky/leaky & layer=global"
cause = "nan_leak"
reason = "global layers are expected to leak too (they do not)"
strict = true

[[xfail]]
filter = "path=leaky/leaky & mix=no_such_mix"
cause = "wrong"
reason = "names no trial"
"#,
    );
    let (o, out) = leaky(
        dir.path(),
        "strict",
        &["--xfail", &strict, "--no-triage"],
        &[],
    );
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("XPASS(strict)"), "{err}");
    assert!(
        err.contains(
            "entry 2 (filter \"path=leaky/leaky & mix=no_such_mix\", cause wrong) matched no trial"
        ),
        "{err}"
    );
    let rows = worker_rows(&out);
    // --no-triage: the local failures have no cause, so they are not the expected failure.
    assert!(rows
        .iter()
        .filter(|r| r["status"] == "fail")
        .all(|r| r["params"].get("cause").is_none()));
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("cpu/summary.json")).unwrap())
            .unwrap();
    let unmatched = &summary["environment"]["extra"]["xfail"]["unmatched"];
    assert_eq!(unmatched.as_array().unwrap().len(), 1, "{summary}");
}

#[test]
fn a_bad_xfail_file_exits_2_naming_what_to_change() {
    let dir = tempfile::tempdir().unwrap();
    for (body, says) in [
        ("[[xfail]]\nfilter = \"colour=red\"\ncause = \"wrong\"\nreason = \"x\"\n", "unknown key `colour`"),
        ("[[xfail]]\nfilter = \"layer=local\"\ncause = \"leak\"\nreason = \"x\"\n", "cause \"leak\" is not one triage finds"),
        ("[[xfail]]\nfilter = \"layer=local\"\ncause = \"wrong\"\nreason = \" \"\n", "give a reason"),
        ("[[xfail]]\nfilter = \"layer=local\"\ncause = \"wrong\"\nreason = \"x\"\nstrickt = true\n", "unknown field"),
        ("", "no [[xfail]] entry"),
    ] {
        let f = file(dir.path(), "bad.toml", body);
        let (o, _) = leaky(dir.path(), "bad", &["--xfail", &f], &[]);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(err.contains(says), "{says}: {err}");
        assert!(!dir.path().join("bad/cpu/results.jsonl").exists());
    }
}
