//! Report folders as a new user may hand them over: files that are not regular files, links
//! inside the report, files of blank lines, absurd shard counts, rows holding control
//! characters. Each is read in bounded memory, refused by name, or rendered inert.

use crate::common::{env, row, trials, write};
use relattn_reports::{
    load, merge, plot, show, ReportWriter, Status, MAX_ROW_LINE_BYTES, RESULTS_JSONL,
};
use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::time::{Duration, Instant};

fn mkfifo(path: &Path) {
    let ok = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap()
        .success();
    assert!(ok, "mkfifo {}", path.display());
}

fn refused_naming(dir: &Path, file: &Path, kind: &str) {
    let started = Instant::now();
    let e = load(dir).unwrap_err().to_string();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "waited on {file:?}"
    );
    assert!(e.contains(&file.display().to_string()), "{e}");
    assert!(e.contains(kind), "{e}");
}

#[test]
fn report_files_must_be_regular_files() {
    let tmp = tempfile::tempdir().unwrap();
    for (name, kind) in [
        (RESULTS_JSONL, "FIFO"),
        ("results.csv", "FIFO"),
        ("summary.json", "FIFO"),
    ] {
        let dir = tmp.path().join(format!("fifo-{name}/cpu"));
        fs::create_dir_all(&dir).unwrap();
        mkfifo(&dir.join(name));
        refused_naming(dir.parent().unwrap(), &dir.join(name), kind);
    }
    // A link is followed for reading, and the device it names refused, never read.
    let dir = tmp.path().join("zero/cpu");
    fs::create_dir_all(&dir).unwrap();
    symlink("/dev/zero", dir.join(RESULTS_JSONL)).unwrap();
    refused_naming(&dir, &dir.join(RESULTS_JSONL), "character device");
    // A directory named results.csv, and a dangling link, are named too.
    let dir = tmp.path().join("odd/cpu");
    fs::create_dir_all(dir.join("results.csv")).unwrap();
    refused_naming(&dir, &dir.join("results.csv"), "directory");
    fs::remove_dir(dir.join("results.csv")).unwrap();
    symlink("nowhere", dir.join(RESULTS_JSONL)).unwrap();
    refused_naming(&dir, &dir.join(RESULTS_JSONL), "No such file");
}

#[test]
fn blank_lines_are_skipped_and_still_counted() {
    let tmp = tempfile::tempdir().unwrap();
    write(tmp.path(), "cpu", "1/1", &trials("a", 0..2));
    let log = tmp.path().join("cpu").join(RESULTS_JSONL);
    let rows = fs::read_to_string(&log).unwrap();
    let (first, second) = rows.split_once('\n').unwrap();
    // Two million blank lines (and blanks of spaces, CRLF) between the rows.
    let blank = "\n".repeat(2_000_000);
    fs::write(&log, format!("{first}\n{blank}  \r\n\t\n{second}")).unwrap();
    let report = load(tmp.path()).unwrap();
    assert_eq!(report.archs["cpu"].rows.len(), 2);
    assert!(report.archs["cpu"].complete);
    // A bad row after them is named by its line in the file.
    fs::write(&log, format!("{first}\n{blank}{{oops\n")).unwrap();
    let e = load(tmp.path()).unwrap_err().to_string();
    assert!(e.contains("line 2000002:"), "{e}");
    // A torn last row, after blank lines, is dropped and makes the report incomplete.
    fs::write(&log, format!("{first}\n{blank}{{\"case_id\": \"c\", \"tri")).unwrap();
    let report = load(tmp.path()).unwrap();
    assert_eq!(report.archs["cpu"].rows.len(), 1);
    assert!(!report.archs["cpu"].complete);
    // A line longer than any row is refused, not gathered.
    let long = format!(
        "{first}\n{{\"message\": \"{}\"}}\n",
        "x".repeat(MAX_ROW_LINE_BYTES)
    );
    fs::write(&log, long).unwrap();
    let e = load(tmp.path()).unwrap_err().to_string();
    assert!(e.contains("line 2 is longer than"), "{e}");
}

#[test]
fn the_writer_never_follows_a_link_inside_the_report() {
    let tmp = tempfile::tempdir().unwrap();
    let elsewhere = tmp.path().join("elsewhere");
    fs::create_dir(&elsewhere).unwrap();
    // A dangling results.jsonl: not created at its target.
    let out = tmp.path().join("out");
    fs::create_dir_all(out.join("cpu")).unwrap();
    symlink(
        elsewhere.join("rows.jsonl"),
        out.join("cpu").join(RESULTS_JSONL),
    )
    .unwrap();
    let e = ReportWriter::create(&out, "cpu", env("1/1")).unwrap_err();
    assert!(e.to_string().contains("cpu/results.jsonl"), "{e}");
    assert!(e.to_string().contains("symbolic link"), "{e}");
    let e = ReportWriter::resume(&out, "cpu", env("1/1")).unwrap_err();
    assert!(e.to_string().contains("symbolic link"), "{e}");
    // A FIFO there: refused at once, not opened for a reader that never comes.
    fs::remove_file(out.join("cpu").join(RESULTS_JSONL)).unwrap();
    mkfifo(&out.join("cpu").join(RESULTS_JSONL));
    let e = ReportWriter::create(&out, "cpu", env("1/1")).unwrap_err();
    assert!(e.to_string().contains("FIFO"), "{e}");
    // The architecture directory a link: the report would go wherever it points.
    let out = tmp.path().join("out2");
    fs::create_dir(&out).unwrap();
    symlink(&elsewhere, out.join("sm90")).unwrap();
    let e = ReportWriter::create(&out, "sm90", env("1/1")).unwrap_err();
    assert!(e.to_string().contains("out2/sm90"), "{e}");
    assert!(e.to_string().contains("symbolic link"), "{e}");
    assert_eq!(fs::read_dir(&elsewhere).unwrap().count(), 0);
    // The folder the user names may be a link.
    let named = tmp.path().join("named");
    symlink(&elsewhere, &named).unwrap();
    write(&named, "sm90", "1/1", &trials("a", 0..2));
    assert_eq!(load(&elsewhere).unwrap().len(), 2);
}

#[test]
fn merge_and_plot_never_write_through_a_link() {
    let tmp = tempfile::tempdir().unwrap();
    let (input, elsewhere) = (tmp.path().join("in"), tmp.path().join("elsewhere"));
    write(&input, "sm90", "1/1", &trials("a", 0..3));
    fs::create_dir(&elsewhere).unwrap();
    fs::write(elsewhere.join("headroom.svg"), "keep").unwrap();
    let m = tmp.path().join("m");
    fs::create_dir(&m).unwrap();
    symlink(&elsewhere, m.join("sm90")).unwrap();
    let e = merge(std::slice::from_ref(&input), &m)
        .unwrap_err()
        .to_string();
    assert!(e.contains("m/sm90") && e.contains("symbolic link"), "{e}");
    // plots/ a link: nothing drawn there, nothing removed there.
    let plots = input.join("sm90/plots");
    fs::remove_dir_all(&plots).unwrap();
    symlink(&elsewhere, &plots).unwrap();
    let e = plot(&input).unwrap_err().to_string();
    assert!(
        e.contains("sm90/plots") && e.contains("symbolic link"),
        "{e}"
    );
    // An architecture directory that is a link inside the folder given.
    let outer = tmp.path().join("outer");
    fs::create_dir(&outer).unwrap();
    symlink(input.join("sm90"), outer.join("sm90")).unwrap();
    let e = plot(&outer).unwrap_err().to_string();
    assert!(
        e.contains("outer/sm90") && e.contains("symbolic link"),
        "{e}"
    );
    let names: Vec<_> = fs::read_dir(&elsewhere).unwrap().collect();
    assert_eq!(names.len(), 1, "{names:?}");
    assert_eq!(fs::read(elsewhere.join("headroom.svg")).unwrap(), b"keep");
}

#[test]
fn a_billion_shards_are_described_by_ranges() {
    let tmp = tempfile::tempdir().unwrap();
    let n = 1_000_000_000u64;
    let mut dirs = Vec::new();
    for k in [3, 7] {
        let d = tmp.path().join(format!("s{k}"));
        write(
            &d,
            "cpu",
            &format!("{k}/{n}"),
            &trials(&format!("s{k}_"), 0..1),
        );
        dirs.push(d);
    }
    let started = Instant::now();
    let merged = merge(&dirs, &tmp.path().join("out")).unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    let gap = merged.archs["cpu"].environment.extra["shard_gap"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        gap.starts_with(&format!(
            "999999998 of {n} shards missing (1/{n} to 2/{n}, 4/{n} to 6/{n}, 8/{n} to {n}/{n})"
        )),
        "{gap}"
    );
    assert!(!merged.archs["cpu"].complete);
}

#[test]
fn merged_seeds_notes_and_checks_are_deduplicated() {
    let tmp = tempfile::tempdir().unwrap();
    let mut dirs = Vec::new();
    for k in 0..2u64 {
        let d = tmp.path().join(format!("s{k}"));
        let mut e = env(&format!("{}/2", k + 1));
        e.seeds = (0..100_000).map(|i| i * 2 + k).chain([7, 7]).collect();
        e.notes = (0..100_000).map(|i| format!("note {i}")).collect();
        let mut w = ReportWriter::create(&d, "cpu", e).unwrap();
        w.push(row(&format!("t{k}"), "routing", Status::Pass))
            .unwrap();
        w.finish().unwrap();
        dirs.push(d);
    }
    let started = Instant::now();
    let merged = merge(&dirs, &tmp.path().join("out")).unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "quadratic merge"
    );
    let env = &merged.archs["cpu"].environment;
    assert_eq!(env.seeds.len(), 200_000);
    assert!(env.seeds.windows(2).all(|w| w[0] < w[1]));
    assert_eq!(env.notes.len(), 100_000);
    assert_eq!(env.notes[0], "note 0");
    assert_eq!(env.shard.as_deref(), Some("1/2,2/2"));
}

#[test]
fn control_characters_are_escaped_in_what_people_read() {
    let tmp = tempfile::tempdir().unwrap();
    let mut fail = row("gpu::fallback::t\x1b[2J", "fallback", Status::Fail);
    fail.message = "bad\x1b]0;owned\x07\rPASS\u{9b}31m | x\nnext".into();
    let mut skip = row("gpu::fallback::s", "fallback", Status::Skip);
    skip.message = "why\x1b[1A".into();
    let mut e = env("1/1");
    e.gpu_name = Some("H200\x1b[31m\n# PASS".into());
    e.notes = vec!["note\x08\x08".into()];
    let mut w = ReportWriter::create(tmp.path(), "sm90", e).unwrap();
    w.push(fail).unwrap();
    w.push(skip).unwrap();
    w.finish().unwrap();
    let dir = tmp.path().join("sm90");
    let md = fs::read_to_string(dir.join("summary.md")).unwrap();
    let shown = show(tmp.path()).unwrap();
    for text in [&md, &shown] {
        let raw: Vec<char> = text
            .chars()
            .filter(|c| c.is_control() && *c != '\n')
            .collect();
        assert!(raw.is_empty(), "{raw:?} in {text}");
        assert!(text.contains("t\\u{1b}[2J"), "{text}");
        assert!(text.contains("\\u{7}\\u{d}PASS\\u{9b}31m"), "{text}");
        assert!(text.contains("H200\\u{1b}[31m # PASS"), "{text}");
        assert!(!text.contains("\n# PASS"), "{text}");
    }
    let xml = fs::read_to_string(dir.join("junit.xml")).unwrap();
    assert!(xml.contains("why\\u{1b}[1A"), "{xml}");
    assert!(!xml.contains('\u{9b}') && !xml.contains('\r'), "{xml}");
    // The rows themselves are kept as they were.
    let back = load(tmp.path()).unwrap();
    assert!(back.archs["sm90"]
        .rows
        .iter()
        .any(|r| r.trial == "gpu::fallback::t\x1b[2J"));
}
