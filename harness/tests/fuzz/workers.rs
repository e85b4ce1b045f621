//! Workers that misbehave: each fault of `adapters/faulty_worker.py` (and a wrapper whose exit
//! trap does `kill 0`) run once through `relattn run` or `relattn exec` on a two-case matrix.
//! Besides the rules every kind keeps (exit code, time, no panic text), each must leave every
//! file outside `--out` as it was, put no control character and no byte of a file a worker
//! linked to into the report, leave no process the worker started, and end the way asserted.

use crate::bounded::{relattn_with_env, tree, Outcome};
use crate::run::{leftovers, Figures, INPUT_BOUND, INPUT_TIMEOUT};
use relattn_reference::casefile::{write_case, CaseMeta};
use relattn_reference::gen::{generate, GenSpec};
use serde_json::Value;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

const MATRIX: &str = r#"description = "fuzz workers: two small cases"
[[group]]
layers = ["global_e128"]
heads = [[4, 1]]
mixes = ["decode", "mixed"]
"#;

/// What a file a worker links its output to holds: it must not show up in a report.
const SECRET: &str = "secret-bytes-outside-the-report";

/// How the trials of a run must end: (trial substring, status, message substring).
type Rows = &'static [(&'static str, &'static str, &'static str)];

struct Fault {
    name: &'static str,
    /// `RELATTN_FAULTY_*` variables, without the prefix.
    env: &'static [(&'static str, &'static str)],
    code: i32,
    rows: Rows,
    /// Text relattn's stderr must hold.
    stderr: &'static str,
    /// `--worker-timeout-s`: long enough for a worker to start on a loaded machine, except
    /// where the fault is the timeout.
    timeout_s: &'static str,
}

const ALL_ERROR: &str = "impl::";

const FAULTS: [Fault; 15] = [
    Fault {
        name: "out_fifo",
        env: &[("FIFO", "impl::")],
        code: 1,
        rows: &[(ALL_ERROR, "error", "is a FIFO, not a regular file")],
        stderr: "",
        timeout_s: "20",
    },
    Fault {
        name: "out_link_outside",
        env: &[("LINK", "impl::")],
        code: 1,
        rows: &[(ALL_ERROR, "error", "symbolic link, not a regular file")],
        stderr: "",
        timeout_s: "20",
    },
    Fault {
        name: "out_link_dev_zero",
        env: &[("DEVZERO", "impl::")],
        code: 1,
        rows: &[(ALL_ERROR, "error", "symbolic link, not a regular file")],
        stderr: "",
        timeout_s: "20",
    },
    Fault {
        name: "answer_twice",
        env: &[("TWICE", "impl::")],
        code: 0,
        rows: &[(ALL_ERROR, "pass", "")],
        stderr: "",
        timeout_s: "20",
    },
    Fault {
        name: "ms_negative",
        env: &[("MS_NEG", "impl::")],
        code: 1,
        rows: &[(
            ALL_ERROR,
            "error",
            "`ms` must be null, a time or a list of times",
        )],
        stderr: "",
        timeout_s: "20",
    },
    Fault {
        name: "ms_huge",
        env: &[("MS_HUGE", "impl::")],
        code: 1,
        rows: &[(ALL_ERROR, "error", "each finite, from 0 to 3600000")],
        stderr: "",
        timeout_s: "20",
    },
    Fault {
        name: "num_splits_huge",
        env: &[("SPLITS", "impl::")],
        code: 1,
        rows: &[(
            ALL_ERROR,
            "error",
            "`num_splits` must be the split count used (an integer from 1 to 2147483647)",
        )],
        stderr: "",
        timeout_s: "20",
    },
    Fault {
        name: "control_characters",
        env: &[("CONTROL", "impl::")],
        code: 1,
        rows: &[(ALL_ERROR, "error", "planted\\x1b[2J\\x1b[31mred")],
        stderr: "",
        timeout_s: "20",
    },
    Fault {
        name: "hello_control_characters",
        env: &[("HELLO", "control")],
        code: 0,
        rows: &[(ALL_ERROR, "pass", "")],
        stderr: "",
        timeout_s: "20",
    },
    Fault {
        name: "hello_duplicate_paths",
        env: &[("HELLO", "dup_paths")],
        code: 2,
        rows: &[],
        stderr: "hello lists path `faulty` twice",
        timeout_s: "20",
    },
    Fault {
        name: "hello_100000_paths",
        env: &[("HELLO", "many_paths")],
        code: 2,
        rows: &[],
        stderr: "hello lists 100000 paths: a worker may list at most 256",
        timeout_s: "20",
    },
    Fault {
        name: "exit_mid_run",
        env: &[("CRASH", "::decode::")],
        code: 1,
        rows: &[
            ("::decode::", "error", "closed its stdout (exit status: 3)"),
            ("::mixed::", "pass", ""),
        ],
        stderr: "",
        timeout_s: "20",
    },
    Fault {
        name: "kill_0",
        env: &[("KILL0", "::decode::")],
        code: 1,
        rows: &[
            ("::decode::", "error", "closed its stdout (signal: 15"),
            ("::mixed::", "pass", ""),
        ],
        stderr: "",
        timeout_s: "20",
    },
    Fault {
        name: "fork_child",
        env: &[("FORK", "impl::")],
        code: 0,
        rows: &[(ALL_ERROR, "pass", "")],
        stderr: "",
        timeout_s: "20",
    },
    Fault {
        name: "never_answers",
        env: &[("HANG", "::decode::")],
        code: 1,
        rows: &[
            ("::decode::", "error", "did not answer within 1.5 s"),
            ("::mixed::", "pass", ""),
        ],
        stderr: "",
        timeout_s: "1.5",
    },
];

/// Everything under `root` but the report folders (`out-*`) and the pid files (`pid/`), with
/// sizes: what a run must not change.
fn outside(root: &Path) -> std::collections::BTreeMap<PathBuf, u64> {
    tree(root)
        .into_iter()
        .filter(|(p, _)| {
            let first = p
                .components()
                .next()
                .map(|c| c.as_os_str().to_string_lossy());
            !first.is_some_and(|f| f.starts_with("out-") || f == "pid")
        })
        .collect()
}

/// Whether `pid` runs no more (absent, or a zombie).
fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

/// The rules every fault keeps: no control character and no linked file's bytes in the report
/// or on the terminal, no temporary file left.
fn report_is_clean(out: &Outcome, report: &Path) -> Result<(), String> {
    let esc = |bytes: &[u8]| bytes.iter().any(|&b| b == 0x1b || b == 0x07);
    if esc(&out.stdout) || esc(out.stderr.as_bytes()) {
        return Err("a control character reached the terminal".into());
    }
    for rel in tree(report).into_keys() {
        let path = report.join(&rel);
        let Ok(bytes) = std::fs::read(&path) else {
            continue;
        };
        let text = rel.extension().is_some_and(|e| {
            ["md", "json", "jsonl", "csv", "xml", "txt"].contains(&&*e.to_string_lossy())
        });
        if text && esc(&bytes) {
            return Err(format!("{} holds a control character", rel.display()));
        }
        if bytes.windows(SECRET.len()).any(|w| w == SECRET.as_bytes()) {
            return Err(format!("{} holds a linked file's bytes", rel.display()));
        }
    }
    match leftovers(report).as_slice() {
        [] => Ok(()),
        left => Err(format!("temporary files left: {left:?}")),
    }
}

fn check_rows(report: &Path, rows: Rows) -> Result<(), String> {
    if rows.is_empty() {
        return Ok(());
    }
    let text = std::fs::read_to_string(report.join("cpu/results.jsonl"))
        .map_err(|e| format!("no results.jsonl: {e}"))?;
    let worker_rows: Vec<Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|r| r["trial"].as_str().is_some_and(|t| t.starts_with("impl::")))
        .collect();
    if worker_rows.len() != 2 {
        return Err(format!("{} worker rows, expected 2", worker_rows.len()));
    }
    for r in &worker_rows {
        let trial = r["trial"].as_str().unwrap_or_default();
        let message = r["message"].as_str().unwrap_or_default();
        let Some((_, status, text)) = rows.iter().find(|(t, _, _)| trial.contains(t)) else {
            return Err(format!("{trial}: no expectation"));
        };
        if r["status"] != *status || !message.contains(text) {
            return Err(format!(
                "{trial}: {} with {message:?}, expected {status} with {text:?}",
                r["status"]
            ));
        }
    }
    Ok(())
}

struct Setup {
    root: tempfile::TempDir,
    python: String,
    adapters: PathBuf,
}

impl Setup {
    fn new() -> Setup {
        let root = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join("m.toml"), MATRIX).unwrap();
        std::fs::create_dir(root.path().join("outside")).unwrap();
        std::fs::write(root.path().join("outside/secret.txt"), SECRET).unwrap();
        std::fs::create_dir(root.path().join("pid")).unwrap();
        let mut spec = GenSpec::global(4, 1, vec![(5, 40), (0, 7)], 3);
        spec.rel_extent = 64;
        let problem = generate(&spec).unwrap();
        let case = root.path().join("outside/case.safetensors");
        write_case(&case, &problem, &CaseMeta::of(&problem)).unwrap();
        Setup {
            root,
            python: crate::python::numpy_path().to_string(),
            adapters: Path::new(env!("CARGO_MANIFEST_DIR")).join("../adapters"),
        }
    }

    fn path(&self, rel: &str) -> String {
        self.root.path().join(rel).to_string_lossy().into_owned()
    }

    /// `relattn ARGS` with the faulty worker's variables, checked against the common rules.
    fn run(
        &self,
        figures: &mut Figures,
        args: &[String],
        faulty: &[(&str, &str)],
        code: i32,
        report: &Path,
    ) -> Outcome {
        let mut env = vec![
            ("PYTHONPATH".to_string(), self.python.clone()),
            (
                "RELATTN_ADAPTERS".to_string(),
                self.adapters.display().to_string(),
            ),
            (
                "RELATTN_FAULTY_LINK_TARGET".to_string(),
                self.path("outside/secret.txt"),
            ),
            ("RELATTN_FAULTY_PIDFILE".to_string(), self.path("pid/pids")),
            ("OPENBLAS_NUM_THREADS".to_string(), "1".to_string()),
        ];
        for (k, v) in faulty {
            env.push((format!("RELATTN_FAULTY_{k}"), v.to_string()));
        }
        let before = outside(self.root.path());
        let args: Vec<OsString> = args.iter().map(OsString::from).collect();
        let out = relattn_with_env(self.root.path(), &args, None, &env, INPUT_TIMEOUT);
        figures.record(&out, true);
        if let Some(v) = out.violation(&[code]) {
            panic!("{v}");
        }
        let what = format!("relattn {}", out.args.join(" "));
        assert!(out.elapsed < INPUT_BOUND, "{what}: took {:?}", out.elapsed);
        assert_eq!(
            outside(self.root.path()),
            before,
            "{what}: changed a file outside --out"
        );
        if let Err(e) = report_is_clean(&out, report) {
            panic!("{what}: {e}");
        }
        out
    }

    fn run_args(&self, report: &Path, worker: &[String], timeout_s: &str) -> Vec<String> {
        let mut args: Vec<String> = ["run", "--matrix", &self.path("m.toml"), "--paths", "none"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        args.extend(worker.iter().cloned());
        args.extend(["--worker-timeout-s".into(), timeout_s.into()]);
        args.extend(["--out".into(), report.display().to_string()]);
        args
    }
}

/// One fault's run and its checks; its figures line.
fn run_fault(s: &Setup, fault: &Fault) -> String {
    let mut figures = Figures::new(fault.name);
    let report = s.root.path().join(format!("out-{}", fault.name));
    let faulty = ["--impl".to_string(), "faulty".to_string()];
    let out = s.run(
        &mut figures,
        &s.run_args(&report, &faulty, fault.timeout_s),
        fault.env,
        fault.code,
        &report,
    );
    let what = fault.name;
    assert!(out.stderr.contains(fault.stderr), "{what}: {}", out.stderr);
    if let Err(e) = check_rows(&report, fault.rows) {
        panic!("{what}: {e}\nstderr:\n{}", out.stderr);
    }
    match fault.name {
        "fork_child" => {
            let pids = std::fs::read_to_string(s.path("pid/pids")).unwrap();
            for pid in pids.split_whitespace().map(|p| p.parse::<u32>().unwrap()) {
                let started = std::time::Instant::now();
                while !gone(pid) && started.elapsed().as_secs() < 3 {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                assert!(
                    gone(pid),
                    "{what}: the worker's child {pid} outlived the run"
                );
            }
        }
        "hello_control_characters" => {
            let summary = std::fs::read_to_string(report.join("cpu/summary.json")).unwrap();
            assert!(summary.contains("1.0\\\\x1b[2J"), "{what}: {summary}");
        }
        _ => {}
    }
    figures_line(&figures, fault.env)
}

#[test]
fn fuzz_workers() {
    let s = Setup::new();
    // Two at a time (most of a run is a Python worker starting); lines printed in order.
    let next = std::sync::atomic::AtomicUsize::new(0);
    let lines: Vec<std::sync::Mutex<String>> = FAULTS
        .iter()
        .map(|_| std::sync::Mutex::new(String::new()))
        .collect();
    std::thread::scope(|scope| {
        for _ in 0..2 {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let Some(fault) = FAULTS.get(i) else { break };
                *lines[i].lock().unwrap() = run_fault(&s, fault);
            });
        }
    });
    for line in &lines {
        eprintln!("{}", line.lock().unwrap());
    }

    // A wrapper whose exit trap ends its process group: only its own group, not relattn's.
    let mut figures = Figures::new("trap_kill_0_on_exit");
    let report = s.root.path().join("out-trap");
    let wrapper = format!(
        "bash -c 'trap \"kill 0\" EXIT; python3 {}/faulty_worker.py'",
        s.adapters.display()
    );
    s.run(
        &mut figures,
        &s.run_args(&report, &["--worker".into(), wrapper], "20"),
        &[],
        0,
        &report,
    );
    check_rows(&report, &[(ALL_ERROR, "pass", "")]).unwrap();
    assert!(report.join("cpu/summary.json").is_file());
    eprintln!("{}", figures_line(&figures, &[]));

    // exec hands the worker a copy: the user's case file survives a worker that overwrites it.
    let mut figures = Figures::new("overwrite_case_file");
    let case = s.root.path().join("outside/case.safetensors");
    let before = std::fs::read(&case).unwrap();
    let report = s.root.path().join("out-exec");
    std::fs::create_dir(&report).unwrap();
    let args: Vec<String> = [
        "exec",
        "--impl",
        "faulty",
        "--path",
        "faulty",
        "--input",
        &case.display().to_string(),
        "--output",
        &report.join("o.safetensors").display().to_string(),
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    s.run(&mut figures, &args, &[("OVERWRITE", "exec::")], 0, &report);
    assert_eq!(
        std::fs::read(&case).unwrap(),
        before,
        "the case file changed"
    );
    eprintln!("{}", figures_line(&figures, &[("OVERWRITE", "exec::")]));
}

fn figures_line(figures: &Figures, env: &[(&str, &str)]) -> String {
    let vars: Vec<String> = env
        .iter()
        .map(|(k, v)| format!("RELATTN_FAULTY_{k}={v}"))
        .collect();
    format!("workers [{}] {}", vars.join(" "), figures.line())
}
