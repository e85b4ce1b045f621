//! `relattn report` and `relattn run` on report folders a new user may hand over, run as the
//! binary under the memory limit of `bounded`: files of blank lines within the file limit,
//! absurd shard counts, long lists of seeds and notes, report files that are not regular files,
//! links inside a report, and rows holding control characters. Each ends in exit 0 or 2 with
//! its outcome checked, within seconds, writing nothing through a link.

use crate::bounded::{relattn, tree, Outcome};
use relattn_reports::{Environment, ReportWriter, Row, Status};
use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(30);

fn row(i: usize) -> Row {
    let mut r = Row::new(
        format!("c{i}"),
        format!("gpu::fallback::t{i}"),
        "fallback",
        Status::Pass,
    );
    (r.max_abs, r.bound) = (Some(1e-3), Some(2e-2));
    r.params.insert("max_kv_len".into(), "1024".into());
    r
}

fn write(dir: &Path, arch: &str, env: Environment, rows: &[Row]) {
    let mut w = ReportWriter::create(dir, arch, env).unwrap();
    for r in rows {
        w.push(r.clone()).unwrap();
    }
    w.finish().unwrap();
}

fn run(cwd: &Path, args: &[&str]) -> Outcome {
    relattn(cwd, args, LIMIT)
}

/// Exit `code`, no panic, stderr mentioning each of `mentions`.
fn ends(out: &Outcome, code: i32, mentions: &[&str]) {
    out.check(&[code]);
    for m in mentions {
        assert!(out.stderr.contains(m), "{:?}: {}", out.args, out.stderr);
    }
}

#[test]
fn blank_lines_within_the_file_limit_are_streamed() {
    let tmp = tempfile::tempdir().unwrap();
    write(
        tmp.path().join("r").as_path(),
        "sm90",
        Environment::default(),
        &[row(0)],
    );
    // 64 MiB of blank lines: the whole file and a slice per line did not fit the memory limit.
    let mut f = fs::OpenOptions::new()
        .append(true)
        .open(tmp.path().join("r/sm90/results.jsonl"))
        .unwrap();
    std::io::Write::write_all(&mut f, &vec![b'\n'; 64 << 20]).unwrap();
    drop(f);
    let out = run(tmp.path(), &["report", "show", "r"]);
    ends(&out, 0, &[]);
    assert!(
        out.stdout_text().contains("1 trials: 1 pass"),
        "{}",
        out.stdout_text()
    );
    ends(&run(tmp.path(), &["report", "diff", "r", "r"]), 0, &[]);
    ends(&run(tmp.path(), &["report", "plot", "r"]), 0, &[]);
    let out = run(tmp.path(), &["report", "merge", "r", "--out", "m"]);
    ends(&out, 0, &[]);
    assert!(
        out.stdout_text().contains("sm90: 1 trials"),
        "{}",
        out.stdout_text()
    );
    let merged = fs::read_to_string(tmp.path().join("m/sm90/results.jsonl")).unwrap();
    assert_eq!(merged.lines().count(), 1, "blank lines are not copied");
}

#[test]
fn a_billion_shards_merge_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let env = Environment {
        shard: Some("1/1000000000".into()),
        ..Environment::default()
    };
    write(&tmp.path().join("s"), "cpu", env, &[row(0)]);
    let out = run(tmp.path(), &["report", "merge", "s", "--out", "m"]);
    ends(
        &out,
        0,
        &["999999999 of 1000000000 shards missing (2/1000000000 to 1000000000/1000000000)"],
    );
    assert!(out.elapsed < Duration::from_secs(5), "{:?}", out.elapsed);
    assert!(
        out.stdout_text().contains("INCOMPLETE"),
        "{}",
        out.stdout_text()
    );
}

#[test]
fn merge_is_linear_in_seeds_and_notes() {
    let tmp = tempfile::tempdir().unwrap();
    for k in 0..2usize {
        let env = Environment {
            seeds: (0..100_000).map(|i| i * 2 + k as u64).collect(),
            notes: (0..100_000).map(|i| format!("note {k} {i}")).collect(),
            ..Environment::default()
        };
        write(&tmp.path().join(format!("s{k}")), "cpu", env, &[row(k)]);
    }
    // 100,000 of each took minutes when each was looked up in a list.
    let out = run(tmp.path(), &["report", "merge", "s0", "s1", "--out", "m"]);
    ends(&out, 0, &[]);
    assert!(out.elapsed < Duration::from_secs(10), "{:?}", out.elapsed);
    let summary = fs::read_to_string(tmp.path().join("m/cpu/summary.json")).unwrap();
    let summary: serde_json::Value = serde_json::from_str(&summary).unwrap();
    assert_eq!(
        summary["environment"]["seeds"].as_array().unwrap().len(),
        200_000
    );
    assert_eq!(
        summary["environment"]["notes"].as_array().unwrap().len(),
        200_000
    );
}

fn mkfifo(path: &Path) {
    let ok = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap()
        .success();
    assert!(ok);
}

#[test]
fn report_files_that_are_not_regular_files_exit_2_naming_them() {
    let tmp = tempfile::tempdir().unwrap();
    fs::create_dir_all(tmp.path().join("fifo/cpu")).unwrap();
    mkfifo(&tmp.path().join("fifo/cpu/results.jsonl"));
    fs::create_dir_all(tmp.path().join("zero/cpu")).unwrap();
    symlink("/dev/zero", tmp.path().join("zero/cpu/results.jsonl")).unwrap();
    fs::create_dir_all(tmp.path().join("sfifo/cpu")).unwrap();
    mkfifo(&tmp.path().join("sfifo/cpu/summary.json"));
    for (dir, file, kind) in [
        ("fifo", "fifo/cpu/results.jsonl", "FIFO"),
        ("zero", "zero/cpu/results.jsonl", "character device"),
        ("sfifo", "sfifo/cpu/summary.json", "FIFO"),
    ] {
        for args in [
            vec!["report", "show", dir],
            vec!["report", "diff", dir, dir],
            vec!["report", "plot", dir],
            vec!["report", "merge", dir, "--out", "m"],
        ] {
            let out = run(tmp.path(), &args);
            ends(&out, 2, &[file, kind]);
            assert!(out.elapsed < Duration::from_secs(5), "{:?}", out.elapsed);
        }
    }
    assert!(!tmp.path().join("m").exists());
}

#[test]
fn outputs_never_go_through_a_link_inside_a_report() {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path();
    fs::create_dir(p.join("elsewhere")).unwrap();
    fs::write(p.join("elsewhere/headroom.svg"), "keep").unwrap();
    write(
        &p.join("r"),
        "sm90",
        Environment::default(),
        &[row(0), row(1)],
    );
    // merge into m/sm90, a link.
    fs::create_dir(p.join("m")).unwrap();
    symlink("../elsewhere", p.join("m/sm90")).unwrap();
    let out = run(p, &["report", "merge", "r", "--out", "m"]);
    ends(&out, 2, &["m/sm90", "symbolic link"]);
    // plot through r/sm90/plots, a link.
    fs::remove_dir_all(p.join("r/sm90/plots")).unwrap();
    symlink("../../elsewhere", p.join("r/sm90/plots")).unwrap();
    ends(
        &run(p, &["report", "plot", "r"]),
        2,
        &["r/sm90/plots", "symbolic link"],
    );
    // plot into an architecture directory that is a link inside the folder given.
    fs::create_dir(p.join("outer")).unwrap();
    symlink("../r/sm90", p.join("outer/sm90")).unwrap();
    ends(
        &run(p, &["report", "plot", "outer"]),
        2,
        &["outer/sm90", "symbolic link"],
    );
    let before = tree(&p.join("elsewhere"));
    assert_eq!(before.len(), 1, "{before:?}");
    assert_eq!(fs::read(p.join("elsewhere/headroom.svg")).unwrap(), b"keep");
    // The --out given may itself be a link.
    symlink("elsewhere", p.join("named")).unwrap();
    fs::remove_file(p.join("r/sm90/plots")).unwrap();
    ends(&run(p, &["report", "merge", "r", "--out", "named"]), 0, &[]);
    assert!(p.join("elsewhere/sm90/results.jsonl").is_file());
}

#[test]
fn run_never_writes_through_a_link_inside_its_out() {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path();
    fs::create_dir_all(p.join("out/cpu")).unwrap();
    fs::create_dir(p.join("elsewhere")).unwrap();
    // A dangling results.jsonl: the rows would be written at its target.
    symlink(
        "../../elsewhere/rows.jsonl",
        p.join("out/cpu/results.jsonl"),
    )
    .unwrap();
    let out = run(p, &["run", "--out", "out"]);
    ends(&out, 2, &["out/cpu/results.jsonl", "symbolic link"]);
    assert!(!p.join("elsewhere/rows.jsonl").exists());
    // cpu/ a link: the whole report would go elsewhere.
    fs::remove_dir_all(p.join("out/cpu")).unwrap();
    symlink("../elsewhere", p.join("out/cpu")).unwrap();
    let out = run(p, &["run", "--out", "out"]);
    ends(&out, 2, &["out/cpu", "symbolic link"]);
    assert_eq!(fs::read_dir(p.join("elsewhere")).unwrap().count(), 0);
}

#[test]
fn control_characters_in_rows_never_reach_the_terminal_raw() {
    let tmp = tempfile::tempdir().unwrap();
    let mut bad = row(1);
    bad.status = Status::Fail;
    bad.trial = "gpu::fallback::t1\x1b[2J".into();
    bad.message = "over\x1b]0;title\x07\rPASS | \u{9b}1A".into();
    write(
        &tmp.path().join("base"),
        "sm90",
        Environment::default(),
        &[row(0), row(1)],
    );
    let mut base_bad = row(1);
    base_bad.trial = bad.trial.clone();
    write(
        &tmp.path().join("base2"),
        "sm90",
        Environment::default(),
        &[row(0), base_bad],
    );
    write(
        &tmp.path().join("new"),
        "sm90",
        Environment::default(),
        &[row(0), bad],
    );
    let show = run(tmp.path(), &["report", "show", "new"]);
    ends(&show, 0, &[]);
    let diff = run(tmp.path(), &["report", "diff", "base2", "new"]);
    ends(&diff, 1, &[]);
    let md = fs::read_to_string(tmp.path().join("new/sm90/summary.md")).unwrap();
    for text in [show.stdout_text(), diff.stdout_text(), md] {
        let raw: Vec<char> = text
            .chars()
            .filter(|c| c.is_control() && *c != '\n')
            .collect();
        assert!(raw.is_empty(), "{raw:?} in {text}");
        assert!(text.contains("t1\\u{1b}[2J"), "{text}");
    }
}
