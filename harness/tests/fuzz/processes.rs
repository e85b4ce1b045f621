//! Runs against each other and against signals: two runs started together into one `--out`
//! (the lock race), and SIGTERM, SIGHUP and SIGINT in the middle of a run. A report is never
//! corrupted, a run never takes over a live lock, and a stopped run leaves an INCOMPLETE report
//! that `--resume` completes, no lock held and no temporary files.

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::path::Path;
use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};

/// Rounds of the lock race (`RELATTN_FUZZ_LOCK_ROUNDS`, default 50).
fn rounds() -> usize {
    std::env::var("RELATTN_FUZZ_LOCK_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50)
}

fn start(args: &[&str], tmp: &Path) -> Child {
    crate::binary::relattn_command()
        .args(args)
        .env("TMPDIR", tmp)
        // The `--impl numpy` runs need numpy, which a fresh machine's python3 lacks.
        .env("PYTHONPATH", crate::python::numpy_path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("relattn starts")
}

/// Wait for `child` at most `limit`; a child still running then is killed and reported.
fn finish(child: Child, limit: Duration) -> Output {
    let pid = child.id();
    let guard = std::thread::spawn(move || {
        let start = Instant::now();
        while start.elapsed() < limit {
            std::thread::sleep(Duration::from_millis(50));
            if !Path::new(&format!("/proc/{pid}")).exists() {
                return;
            }
        }
        let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
    });
    let out = child.wait_with_output().expect("wait for relattn");
    let _ = guard.join();
    out
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// One case of the smoke tier: a run of about half a second.
const ONE_CASE: [&str; 5] = ["run", "--matrix", "smoke", "--case", "c97f5ebf67d"];

#[test]
fn of_two_runs_into_one_out_one_writes_and_the_report_stays_readable() {
    let dir = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let (mut in_use, mut held) = (0, 0);
    for round in 0..rounds() {
        let out = dir.path().join(format!("out{round}"));
        let out_s = out.to_string_lossy().into_owned();
        let mut args = ONE_CASE.to_vec();
        args.extend(["--out", &out_s]);
        let a = start(&args, dir.path());
        let b = start(&args, dir.path());
        let outs = [a, b].map(|c| finish(c, Duration::from_secs(60)));
        let mut codes: Vec<Option<i32>> = outs.iter().map(|o| o.status.code()).collect();
        codes.sort();
        let stderr: Vec<String> = outs.iter().map(|o| text(&o.stderr)).collect();
        assert_eq!(codes, [Some(0), Some(2)], "round {round}: {stderr:#?}");
        let refused = stderr.iter().find(|e| e.contains("error:")).unwrap();
        if refused.contains("in use by another relattn run") {
            in_use += 1;
        } else {
            assert!(refused.contains("already holds a report"), "{refused}");
            held += 1;
        }
        assert!(
            stderr.iter().all(|e| !e.contains("panicked")),
            "{stderr:#?}"
        );
        let show = crate::binary::relattn_command()
            .args(["report", "show", &out_s])
            .output()
            .unwrap();
        assert_eq!(
            show.status.code(),
            Some(0),
            "round {round}: {}",
            text(&show.stderr)
        );
        assert!(!out.join("relattn.lock").exists(), "round {round}");
    }
    eprintln!(
        "fuzz lock race: {} rounds of two runs into one --out: each time one exit 0 and one exit \
         2 ({in_use} refused as in use, {held} as already holding a report), every report readable, \
         no lock left; {:.1} s",
        rounds(),
        started.elapsed().as_secs_f64()
    );
}

/// SIGTERM (a CI runner's timeout), SIGHUP (a closed terminal) and SIGINT in the middle of a
/// run: the trials in flight finish, the report is INCOMPLETE (exit 1), no lock is left, no
/// worker folder is left in TMPDIR, and `--resume` completes the report.
#[test]
fn a_signal_mid_run_leaves_an_incomplete_report_that_resume_completes() {
    let dir = tempfile::tempdir().unwrap();
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    for (signal, resume) in [
        (Signal::SIGTERM, true),
        (Signal::SIGHUP, false),
        (Signal::SIGINT, false),
    ] {
        let out = dir.path().join(format!("{signal}"));
        let out_s = out.to_string_lossy().into_owned();
        let args = [
            "run", "--matrix", "smoke", "--impl", "numpy", "--out", &out_s,
        ];
        let child = start(&args, &tmp);
        let rows = out.join("cpu/results.jsonl");
        let waited = Instant::now();
        while std::fs::metadata(&rows).map_or(0, |m| m.len()) == 0 {
            assert!(waited.elapsed() < Duration::from_secs(60), "no row written");
            std::thread::sleep(Duration::from_millis(20));
        }
        kill(Pid::from_raw(child.id() as i32), signal).unwrap();
        let ended = finish(child, Duration::from_secs(60));
        let err = text(&ended.stderr);
        assert_eq!(ended.status.code(), Some(1), "{signal}: {err}");
        assert!(err.contains("INCOMPLETE"), "{signal}: {err}");
        assert!(!err.contains("panicked"), "{err}");
        assert!(!out.join("relattn.lock").exists(), "{signal}");
        let left: Vec<_> = std::fs::read_dir(&tmp).unwrap().flatten().collect();
        assert!(left.is_empty(), "{signal} left {left:?} in TMPDIR");
        let summary = std::fs::read_to_string(out.join("cpu/summary.md")).unwrap();
        assert!(summary.contains("INCOMPLETE"), "{signal}");
        if resume {
            let mut again = args.to_vec();
            again.push("--resume");
            let done = finish(start(&again, &tmp), Duration::from_secs(120));
            assert_eq!(done.status.code(), Some(0), "{}", text(&done.stderr));
            let summary = std::fs::read_to_string(out.join("cpu/summary.md")).unwrap();
            assert!(!summary.contains("INCOMPLETE"));
        }
        eprintln!("fuzz signals: {signal} mid-run: exit 1, INCOMPLETE report, no lock, no temporary files");
    }
}

/// Processes whose environment names `needle` (a run's own TMPDIR, which its workers inherit).
fn processes_with_env(needle: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| String::from_utf8_lossy(&env).contains(needle))
        })
        .collect()
}

/// Start `args` in a fresh TMPDIR under `dir` and wait for its first row in `out`.
fn started_run(args: &[&str], tmp: &Path, out: &Path, env: &[(&str, &str)]) -> Child {
    std::fs::create_dir_all(tmp).unwrap();
    let mut command = crate::binary::relattn_command();
    command
        .args(args)
        .env("TMPDIR", tmp)
        .env("PYTHONPATH", crate::python::numpy_path())
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = command.spawn().expect("relattn starts");
    let rows = out.join("cpu/results.jsonl");
    let waited = Instant::now();
    while std::fs::metadata(&rows).map_or(0, |m| m.len()) == 0 {
        assert!(waited.elapsed() < Duration::from_secs(60), "no row written");
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

/// One CI timeout: GNU `timeout` sends SIGTERM to relattn and then to its process group, two
/// signals milliseconds apart. They count as one stop: one whole INCOMPLETE report (summary.md
/// and junit.xml written), exit 1, not the "stop at once" of a second interrupt.
#[test]
fn two_signals_together_are_one_stop_with_a_whole_incomplete_report() {
    let dir = tempfile::tempdir().unwrap();
    let tmp = dir.path().join("tmp");
    let out = dir.path().join("out");
    let out_s = out.to_string_lossy().into_owned();
    let args = [
        "run", "--matrix", "smoke", "--impl", "numpy", "--out", &out_s,
    ];
    let child = started_run(&args, &tmp, &out, &[]);
    let pid = Pid::from_raw(child.id() as i32);
    kill(pid, Signal::SIGTERM).unwrap();
    std::thread::sleep(Duration::from_millis(10));
    kill(pid, Signal::SIGTERM).unwrap();
    let ended = finish(child, Duration::from_secs(60));
    let err = text(&ended.stderr);
    assert_eq!(ended.status.code(), Some(1), "{err}");
    assert!(!err.contains("second interrupt"), "{err}");
    assert!(err.contains("INCOMPLETE"), "{err}");
    for file in ["summary.md", "junit.xml", "results.csv"] {
        assert!(
            out.join("cpu").join(file).is_file(),
            "{file} missing: {err}"
        );
    }
    let summary = std::fs::read_to_string(out.join("cpu/summary.md")).unwrap();
    assert!(summary.contains("INCOMPLETE"));
}

/// A second interrupt, two seconds after the first, ends the run at once (exit 130), and its
/// workers and their case folders with it: exiting skips the drops that end them otherwise. A
/// worker trial that never answers keeps the first stop waiting, as a slow kernel would.
#[test]
fn a_second_interrupt_ends_the_run_and_its_workers_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let tmp = dir.path().join("second-interrupt-tmp");
    let out = dir.path().join("out");
    let out_s = out.to_string_lossy().into_owned();
    let worker = format!(
        "python3 {}",
        crate::python::repo()
            .join("adapters/faulty_worker.py")
            .display()
    );
    let args = [
        "run", "--matrix", "smoke", "--worker", &worker, "--out", &out_s,
    ];
    let child = started_run(&args, &tmp, &out, &[("RELATTN_FAULTY_HANG", "::")]);
    let pid = Pid::from_raw(child.id() as i32);
    kill(pid, Signal::SIGINT).unwrap();
    std::thread::sleep(Duration::from_secs(2));
    kill(pid, Signal::SIGINT).unwrap();
    let ended = finish(child, Duration::from_secs(30));
    let err = text(&ended.stderr);
    assert_eq!(ended.status.code(), Some(130), "{err}");
    assert!(err.contains("second interrupt"), "{err}");
    let needle = tmp.to_string_lossy().into_owned();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !processes_with_env(&needle).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        processes_with_env(&needle),
        Vec::<u32>::new(),
        "workers outlived the run"
    );
    let left: Vec<_> = std::fs::read_dir(&tmp).unwrap().flatten().collect();
    assert!(left.is_empty(), "left {left:?} in TMPDIR");
}
