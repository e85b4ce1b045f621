//! `relattn matrix`: listing the tiers, showing a shard, and exit 2 on a bad matrix file.

use crate::common;
use common::{relattn, text};

#[test]
fn list_prints_the_four_tiers_with_counts() {
    let out = relattn(&["matrix", "--list"]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    for tier in ["smoke", "ci", "nightly", "regressions"] {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(&format!("| {tier} ")))
            .unwrap_or_else(|| panic!("{stdout}"));
        let cases: usize = line.split('|').nth(2).unwrap().trim().parse().unwrap();
        assert!(cases > 0, "{line}");
    }
    for path in ["sheared_bias", "score_mod", "fallback", "skipped"] {
        assert!(stdout.contains(path), "{stdout}");
    }
}

#[test]
fn show_prints_ids_and_names_of_a_shard() {
    let whole = text(&relattn(&["matrix", "--show", "smoke"]).stdout);
    let out = relattn(&["matrix", "--show", "smoke", "--shard", "2/3"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let part = text(&out.stdout);
    let lines: Vec<&str> = part.lines().filter(|l| l.contains("::")).collect();
    assert!(!lines.is_empty(), "{part}");
    for l in &lines {
        let id = l.split_whitespace().next().unwrap();
        assert!(id.starts_with('c') && id.len() == 11, "{l}");
        assert!(whole.contains(l), "{l} is not in the whole tier");
    }
    assert!(lines.len() < whole.lines().count() - 1);
    assert!(part.contains("(shard 2/3)"), "{part}");
}

#[test]
fn a_bad_matrix_file_exits_2_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, "[[group]]\nlayers = [\"global_e1024\"]\nheads = [[8, 1]]\nmixes = [\"decode\"]\npage_sizes = [0]\n").unwrap();
    let out = relattn(&["matrix", "--show", path.to_str().unwrap()]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("bad.toml") && stderr.contains("page_sizes"),
        "{stderr}"
    );

    std::fs::write(&path, "[[group]]\nlayers = [\"global_e1024\"]\nheads = [[8, 1]]\nmixes = [\"decode\"]\nwindow = [1]\n").unwrap();
    let out = relattn(&["matrix", "--show", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("unknown field `window`"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn a_bad_shard_or_tier_exits_2() {
    for args in [
        &["matrix", "--show", "smoke", "--shard", "0/4"][..],
        &["matrix", "--show", "smoke", "--shard", "5/4"],
        &["matrix", "--show", "weekly"],
    ] {
        let out = relattn(args);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
}

#[test]
fn ci_reaches_every_supported_entry_and_feature() {
    let out = relattn(&["matrix", "--coverage", "ci"]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert!(!stdout.contains("no case:"), "{stdout}");
    // A table per path, a column per entry and dtype.
    for (path, column) in [
        ("fallback", "decode fp16"),
        ("score_mod", "windowed bf16"),
        ("sheared_bias", "combine fp16"),
    ] {
        let header = stdout
            .lines()
            .find(|l| l.starts_with(&format!("| {path} ")))
            .unwrap_or_else(|| panic!("{stdout}"));
        assert!(header.contains(&format!("| {column} |")), "{stdout}");
    }
    // The JSON has a row per entry and no gaps.
    let out = relattn(&["matrix", "--coverage", "ci", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["gaps"].as_array().map(Vec::len), Some(0), "{v}");
    assert_eq!(v["unplanned"].as_array().map(Vec::len), Some(0), "{v}");
    assert_eq!(v["rows"].as_array().map(Vec::len), Some(16), "{v}");
    assert!(v["rows"][0]["cases"]["peaked"].as_u64().unwrap() > 0, "{v}");
}

#[test]
fn a_tier_with_gaps_exits_1_and_names_them() {
    // smoke was not grown for coverage: it has cells no case reaches.
    let out = relattn(&["matrix", "--coverage", "smoke"]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains("no case: ") && stdout.contains("peaked"),
        "{stdout}"
    );
    assert!(text(&out.stderr).contains("have no case in smoke"));
}
