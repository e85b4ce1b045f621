//! Report folders with hazards in their files rather than their text: links inside a report
//! (a dangling results.jsonl, an architecture folder or plots/ that is a link, on the input or
//! the output side), report files that are FIFOs or a link to /dev/zero, results.jsonl padded
//! with megabytes of blank lines, and a shard count of a billion. Each input must end with the
//! outcome its hazard calls for (the file named on a refusal), never change anything behind a
//! link, and write nothing but its named outputs.

use crate::bounded::{relattn_in, tree, Outcome};
use crate::run::*;
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Hazard {
    /// The input's results.jsonl, summary.json or results.csv is a FIFO.
    Fifo(&'static str),
    /// The input's results.jsonl links to /dev/zero.
    Zero,
    /// The input's results.jsonl is a dangling link.
    DanglingInput,
    /// results.jsonl ends in this many MiB of blank lines.
    BlankMib(usize),
    /// summary.json says shard `K/1000000000`.
    BillionShards(u64),
    /// The architecture folder written to (merge's `--out`, plot's input) links elsewhere.
    ArchLink,
    /// results.jsonl in merge's `--out` is a dangling link into elsewhere/.
    DanglingOutput,
    /// plots/ of the folder written to links elsewhere.
    PlotsLink,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Command {
    Show,
    Diff,
    Merge,
    Plot,
}

#[derive(Debug, Clone)]
struct Input {
    arch: &'static str,
    /// The command is given the architecture folder itself.
    flat: bool,
    /// Rows with an error and a bound (drawn in plots), or without.
    judged: bool,
    hazard: Hazard,
    command: Command,
}

fn input() -> impl Strategy<Value = Input> {
    let hazard = prop_oneof![
        prop::sample::select(vec!["results.jsonl", "summary.json", "results.csv"])
            .prop_map(Hazard::Fifo),
        Just(Hazard::Zero),
        Just(Hazard::DanglingInput),
        prop::sample::select(vec![1usize, 8, 48]).prop_map(Hazard::BlankMib),
        prop::sample::select(vec![1u64, 7, 1_000_000_000]).prop_map(Hazard::BillionShards),
        Just(Hazard::ArchLink),
        Just(Hazard::DanglingOutput),
        Just(Hazard::PlotsLink),
    ];
    let command = prop::sample::select(vec![
        Command::Show,
        Command::Diff,
        Command::Merge,
        Command::Plot,
    ]);
    (
        prop::sample::select(vec!["sm90", "cpu"]),
        any::<bool>(),
        any::<bool>(),
        hazard,
        command,
    )
        .prop_map(|(arch, flat, judged, hazard, command)| Input {
            arch,
            flat,
            judged,
            hazard,
            command,
        })
}

fn rows(judged: bool) -> String {
    let figures = if judged {
        "\"max_abs\": 0.001, \"bound\": 0.02, "
    } else {
        ""
    };
    (0..3)
        .map(|i| {
            format!(
                "{{\"case_id\": \"c{i}\", \"trial\": \"gpu::fallback::t{i}\", \"path\": \
                 \"fallback\", \"status\": \"pass\", {figures}\"params\": {{\"max_kv_len\": \
                 \"{}\"}}}}\n",
                1024 << i
            )
        })
        .collect()
}

fn mkfifo(path: &Path) {
    let ok = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "mkfifo {}", path.display());
}

/// Writes `work/in/<arch>/` with the input's hazard, `work/elsewhere/` (a link's target, which
/// must never change), and returns the folder the command is given.
fn write(work: &Path, input: &Input) -> String {
    let arch_dir = work.join("in").join(input.arch);
    std::fs::create_dir_all(&arch_dir).unwrap();
    std::fs::create_dir(work.join("elsewhere")).unwrap();
    std::fs::write(work.join("elsewhere/headroom.svg"), "keep").unwrap();
    let shard = match input.hazard {
        Hazard::BillionShards(k) => format!("{k}/1000000000"),
        _ => "1/1".to_string(),
    };
    let summary = format!(
        "{{\"schema_version\": 1, \"arch\": \"{}\", \"complete\": true, \"environment\": \
         {{\"shard\": \"{shard}\"}}}}",
        input.arch
    );
    let mut jsonl = rows(input.judged).into_bytes();
    if let Hazard::BlankMib(mib) = input.hazard {
        jsonl.resize(jsonl.len() + (mib << 20), b'\n');
    }
    for (file, text) in [
        ("summary.json", summary.into_bytes()),
        ("results.jsonl", jsonl),
    ] {
        std::fs::write(arch_dir.join(file), text).unwrap();
    }
    match input.hazard {
        Hazard::Fifo(file) => {
            // results.csv is read only where results.jsonl is missing.
            if file == "results.csv" {
                std::fs::remove_file(arch_dir.join("results.jsonl")).unwrap();
            }
            let _ = std::fs::remove_file(arch_dir.join(file));
            mkfifo(&arch_dir.join(file));
        }
        Hazard::Zero => {
            std::fs::remove_file(arch_dir.join("results.jsonl")).unwrap();
            symlink("/dev/zero", arch_dir.join("results.jsonl")).unwrap();
        }
        Hazard::DanglingInput => {
            std::fs::remove_file(arch_dir.join("results.jsonl")).unwrap();
            symlink("../../elsewhere/none.jsonl", arch_dir.join("results.jsonl")).unwrap();
        }
        Hazard::ArchLink if input.command == Command::Merge => {
            std::fs::create_dir(work.join("out")).unwrap();
            symlink("../elsewhere", work.join("out").join(input.arch)).unwrap();
        }
        Hazard::ArchLink => {
            // The report's folder moved elsewhere, linked from where it was.
            let moved = work.join("elsewhere").join(input.arch);
            std::fs::rename(&arch_dir, &moved).unwrap();
            symlink(Path::new("../elsewhere").join(input.arch), &arch_dir).unwrap();
        }
        Hazard::DanglingOutput => {
            let out = work.join("out").join(input.arch);
            std::fs::create_dir_all(&out).unwrap();
            symlink("../../elsewhere/rows.jsonl", out.join("results.jsonl")).unwrap();
        }
        Hazard::PlotsLink if input.command == Command::Merge => {
            let out = work.join("out").join(input.arch);
            std::fs::create_dir_all(&out).unwrap();
            symlink("../../elsewhere", out.join("plots")).unwrap();
        }
        Hazard::PlotsLink => symlink("../../elsewhere", arch_dir.join("plots")).unwrap(),
        Hazard::BlankMib(_) | Hazard::BillionShards(_) => {}
    }
    if input.flat {
        format!("in/{}", input.arch)
    } else {
        "in".to_string()
    }
}

/// The exit code the input calls for, and what stderr must then say.
fn expected(input: &Input) -> (i32, Vec<String>) {
    let file = |f: &str| format!("{}/{f}", input.arch);
    let writes = matches!(input.command, Command::Merge | Command::Plot);
    match input.hazard {
        Hazard::Fifo(f) => (2, vec![file(f), "FIFO".into()]),
        Hazard::Zero => (2, vec![file("results.jsonl"), "character device".into()]),
        Hazard::DanglingInput => (2, vec![file("results.jsonl"), "No such file".into()]),
        Hazard::BlankMib(_) => (0, vec![]),
        Hazard::BillionShards(_) if input.command == Command::Merge => {
            (0, vec!["999999999 of 1000000000 shards missing".into()])
        }
        Hazard::BillionShards(_) => (0, vec![]),
        // A plot over a flat folder that is a link writes into the folder the user named.
        Hazard::ArchLink if input.command == Command::Plot && input.flat => (0, vec![]),
        Hazard::ArchLink if writes => (2, vec![input.arch.into(), "symbolic link".into()]),
        Hazard::DanglingOutput if input.command == Command::Merge => {
            (2, vec![file("results.jsonl"), "symbolic link".into()])
        }
        Hazard::PlotsLink if writes => (2, vec![file("plots"), "symbolic link".into()]),
        Hazard::ArchLink | Hazard::DanglingOutput | Hazard::PlotsLink => (0, vec![]),
    }
}

/// Whether a command may change `path` (relative to the temporary directory).
fn may_write(input: &Input, path: &Path) -> bool {
    // A plot of the architecture folder the user named writes into it, even when that name
    // is a link (here into elsewhere/); links inside the folder named are never followed.
    let linked = input.hazard == Hazard::ArchLink && input.flat;
    let arch = Path::new(if linked { "work/elsewhere" } else { "work/in" }).join(input.arch);
    match input.command {
        Command::Merge => path.starts_with("work/out"),
        Command::Plot => path.starts_with(arch.join("plots")) || path == arch.join("summary.md"),
        Command::Show | Command::Diff => false,
    }
}

fn run_input(input: &Input) -> (Outcome, Option<String>) {
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let dir = write(&work, input);
    let args = match input.command {
        Command::Show => with_limit(&["report", "show", &dir]),
        Command::Diff => with_limit(&["report", "diff", &dir, &dir]),
        Command::Merge => with_limit(&["report", "merge", &dir, "--out", "out"]),
        Command::Plot => with_limit(&["report", "plot", &dir]),
    };
    let before = tree(tmp.path());
    let out = relattn_in(&work, &os(&args), None, INPUT_TIMEOUT);
    let (code, mentions) = expected(input);
    let mut violation = out.violation(&[code]);
    if violation.is_none() {
        if let Some(m) = mentions.iter().find(|m| !out.stderr.contains(m.as_str())) {
            violation = Some(format!("stderr does not mention {m:?}: {}", out.stderr));
        }
    }
    let keep = |t: &BTreeMap<PathBuf, u64>, under: &str| -> BTreeMap<PathBuf, u64> {
        t.iter()
            .filter(|(p, _)| p.starts_with(under) && !may_write(input, p))
            .map(|(p, n)| (p.clone(), *n))
            .collect()
    };
    let after = tree(tmp.path());
    if violation.is_none() && keep(&after, "work/elsewhere") != keep(&before, "work/elsewhere") {
        violation = Some("something was written behind a link, in elsewhere/".into());
    }
    if violation.is_none() && keep(&after, "") != keep(&before, "") {
        violation = Some("written outside the command's outputs".into());
    }
    let left = leftovers(tmp.path());
    if violation.is_none() && !left.is_empty() {
        violation = Some(format!("temporary files left: {left:?}"));
    }
    (out, violation)
}

#[test]
fn fuzz_report_files() {
    let figures = Mutex::new(Figures::new("report files"));
    // About 700 distinct inputs; 150 draw each hazard and command many times over.
    fuzz_at_most(&figures, 5, 150, input(), run_input);
}
