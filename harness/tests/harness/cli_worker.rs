//! The worker protocol end to end, without a GPU: the smoke tier through the numpy worker, the
//! fault rules through the faulty worker, bad worker commands, `exec` on a worker, and
//! `route --check` against vLLM 0.33.0's released wheel (fetched by
//! `adapters/tools/fetch_vllm.sh` into relattn's cache folder; not run, saying why, when it cannot
//! be downloaded).
//!
//! These need `python3` with numpy: without numpy in python3, they install it with pip into the
//! target folder; when that fails they fail and say why.

use crate::common;
use approx::abs_diff_eq;
use common::{no_panic, report_rows as rows, text, worker_rows};

use relattn_reference::casefile::{read_impl_output, write_case, CaseMeta};
use relattn_reference::fast;
use relattn_reference::gen::{generate, GenSpec};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// python3 with numpy, checked once (`python::numpy_path`): the workers need both.
fn python_ready() -> &'static str {
    crate::python::numpy_path()
}

fn relattn_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = crate::binary::relattn_command();
    c.args(args).env("PYTHONPATH", python_ready());
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("the relattn binary runs")
}

/// `relattn exec --impl NAME --path PATH --input IN --output OUT [extra]`.
fn exec_worker(name: &str, path: &str, input: &str, output: &str, extra: &[&str]) -> Output {
    let mut args = vec!["exec", "--impl", name, "--path", path];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--input", input, "--output", output]);
    relattn_env(&args, &[])
}

/// `relattn run` of `tests/data/faulty.toml` on the faulty worker only, into `out`.
fn run_faulty(out: &Path, extra: &[&str], env: &[(&str, &str)]) -> Output {
    let matrix = repo().join("harness/tests/data/faulty.toml");
    let mut args = vec![
        "run",
        "--matrix",
        matrix.to_str().unwrap(),
        "--impl",
        "faulty",
        "--paths",
        "none",
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    relattn_env(&args, env)
}

#[test]
fn the_smoke_tier_passes_through_the_numpy_worker() {
    python_ready();
    let dir = tempfile::tempdir().unwrap();
    let out = relattn_env(
        &[
            "run",
            "--matrix",
            "smoke",
            "--impl",
            "numpy",
            "--paths",
            "none",
            "--out",
            dir.path().to_str().unwrap(),
        ],
        &[],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let rows = worker_rows(dir.path());
    let cases = relattn_matrices::load_tier("smoke")
        .unwrap()
        .expand()
        .unwrap()
        .cases
        .len();
    // One trial per case: the numpy path takes no forced splits.
    assert_eq!(rows.len(), cases);
    for r in &rows {
        assert_eq!(r["status"], "pass", "{r}");
        assert_eq!(r["path"], "numpy/numpy");
        assert!(r["max_abs"].as_f64().unwrap() <= r["bound"].as_f64().unwrap());
        assert!(r["seed"].as_u64().is_some());
    }
    let summary: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("cpu/summary.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        summary["environment"]["extra"]["workers"][0]["name"],
        "numpy"
    );
}

/// The fault planted on each mix of `tests/data/faulty.toml`, and the status it must cost.
const FAULTS: [(&str, &str, &str); 8] = [
    ("RELATTN_FAULTY_CRASH", "decode", "error"),
    ("RELATTN_FAULTY_HANG", "mixed", "error"),
    ("RELATTN_FAULTY_GARBAGE", "zero_len_middle", "error"),
    ("RELATTN_FAULTY_SHAPE", "spec_verify9", "error"),
    ("RELATTN_FAULTY_PADDING", "padding", "fail"),
    ("RELATTN_FAULTY_NAN", "extent_edges", "fail"),
    ("RELATTN_FAULTY_WRONG", "decode8_prefill9", "fail"),
    ("RELATTN_FAULTY_CLOSE", "all_zero_table", "error"),
];

#[test]
fn each_worker_fault_costs_exactly_its_trial() {
    python_ready();
    let dir = tempfile::tempdir().unwrap();
    let planted: Vec<(String, String)> = FAULTS
        .iter()
        .map(|(var, mix, _)| (var.to_string(), format!("::{mix}::")))
        .collect();
    let env: Vec<(&str, &str)> = planted
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let started = std::time::Instant::now();
    let out = run_faulty(dir.path(), &["--worker-timeout-s", "3"], &env);
    no_panic(&out);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    // Two timeouts (hang, close) of 3 s, the rest fast.
    assert!(started.elapsed().as_secs() < 40, "{:?}", started.elapsed());
    let rows = worker_rows(dir.path());
    assert_eq!(rows.len(), 9, "one trial per case");
    for r in &rows {
        let trial = r["trial"].as_str().unwrap();
        let expected = FAULTS
            .iter()
            .find(|(_, mix, _)| trial.contains(&format!("::{mix}::")))
            .map_or("pass", |f| f.2);
        assert_eq!(r["status"], expected, "{trial}: {}", r["message"]);
        let msg = r["message"].as_str().unwrap();
        if expected != "pass" {
            // The case file is kept with the report, and the first reproduce line replays it.
            let case = dir
                .path()
                .join("cpu/failures")
                .join(format!("{}.case.safetensors", trial.replace("::", "-")));
            assert!(case.is_file(), "{trial}: {msg}");
            assert!(
                msg.contains(&format!(
                    "reproduce: relattn exec --impl faulty --path faulty --input {}",
                    case.display()
                )) && msg.contains("(or relattn run --matrix")
                    && msg.contains("--paths none --impl faulty)"),
                "{msg}"
            );
        }
    }
    let by = |mix: &str| {
        rows.iter()
            .find(|r| r["trial"].as_str().unwrap().contains(&format!("::{mix}::")))
            .unwrap()["message"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert!(
        by("decode").contains("closed its stdout"),
        "{}",
        by("decode")
    );
    assert!(
        by("mixed").contains("did not answer within 3 s"),
        "{}",
        by("mixed")
    );
    assert!(by("zero_len_middle").contains("outside the protocol"));
    assert!(
        by("spec_verify9").contains("shape"),
        "{}",
        by("spec_verify9")
    );
    assert!(by("padding").contains("padding"), "{}", by("padding"));
    // The worker's stderr tail comes with an error (the faulty worker says what it planted).
    assert!(by("decode").contains("worker stderr"), "{}", by("decode"));
    // A kept failure replays with exec, outside the matrix (the fault was planted by mix name,
    // which exec's request id does not carry, so the worker behaves).
    let kept = dir
        .path()
        .join("cpu/failures")
        .read_dir()
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.to_string_lossy().contains("-padding-")
                && p.to_string_lossy().ends_with(".case.safetensors")
        })
        .expect("the padding trial's case file is kept");
    assert!(dir
        .path()
        .join("cpu/failures")
        .read_dir()
        .unwrap()
        .any(|e| e
            .unwrap()
            .path()
            .to_string_lossy()
            .ends_with("-padding-normal-seed1-policy-c13b03ffa11.out.safetensors")));
    let replay = dir.path().join("replay.safetensors");
    let out = exec_worker(
        "faulty",
        "faulty",
        kept.to_str().unwrap(),
        replay.to_str().unwrap(),
        &[],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    // The report is complete.
    let summary: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("cpu/summary.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(summary["complete"], true);
    assert!(dir.path().join("cpu/results.csv").is_file());
    assert!(dir.path().join("cpu/junit.xml").is_file());
}

#[test]
fn a_worker_that_keeps_dying_is_given_up_after_three_deaths() {
    python_ready();
    let dir = tempfile::tempdir().unwrap();
    // One process: the rule is per process of a pool (each is given up after its own three).
    let out = run_faulty(
        dir.path(),
        &["--worker-processes", "1"],
        &[("RELATTN_FAULTY_CRASH", "impl::")],
    );
    no_panic(&out);
    assert_eq!(out.status.code(), Some(1));
    let rows = worker_rows(dir.path());
    assert_eq!(rows.len(), 9);
    let given_up = rows
        .iter()
        .filter(|r| {
            r["message"]
                .as_str()
                .unwrap()
                .contains("worker keeps dying")
        })
        .count();
    assert!(rows.iter().all(|r| r["status"] == "error"));
    assert_eq!(
        given_up, 6,
        "three deaths, then the remaining six are given up"
    );
    // The run goes on: the routing checks passed.
    assert!(rows_of_path(dir.path(), "routing")
        .iter()
        .all(|r| r["status"] == "pass"));
}

fn rows_of_path(report: &Path, path: &str) -> Vec<Value> {
    rows(report)
        .into_iter()
        .filter(|r| r["path"] == path)
        .collect()
}

/// Arguments, environment, and what the error must say.
type BadWorker<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);

#[test]
fn bad_workers_are_usage_errors() {
    python_ready();
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().to_str().unwrap();
    // Another command (`-B`) for the same worker: whichever adapters/ `--impl` finds (a binary
    // built outside the tree finds the source tree's), the two commands differ.
    let numpy_again = format!(
        "python3 -B {}",
        repo().join("adapters/numpy_worker.py").display()
    );
    let cases: [BadWorker; 10] = [
        (&["--impl", "cudnn"], &[], "unknown --impl `cudnn`"),
        (
            &["--worker", "/nonexistent/worker --x"],
            &[],
            "cannot start worker",
        ),
        (
            &["--impl", "numpy"],
            &[("RELATTN_PYTHON", "/nonexistent/python3")],
            "cannot start worker",
        ),
        (
            &["--impl", "faulty"],
            &[("RELATTN_FAULTY_PROTOCOL", "2")],
            "protocol 2",
        ),
        (
            &["--worker", "sh -c 'read l; echo hello'"],
            &[],
            "outside the protocol",
        ),
        (
            &["--worker", "python3 'unbalanced"],
            &[],
            "not a command line",
        ),
        // Duplicate names would give two trials one name: refused before any trial.
        (
            &["--impl", "numpy,numpy"],
            &[],
            "--impl numpy is given twice: name each worker once",
        ),
        (
            &["--impl", "numpy", "--worker", &numpy_again],
            &[],
            "both call themselves `numpy`: the names of workers must differ",
        ),
        (
            &["--impl", "faulty"],
            &[("RELATTN_FAULTY_HELLO", "dup_paths")],
            "hello lists path `faulty` twice",
        ),
        (
            &["--impl", "faulty"],
            &[("RELATTN_FAULTY_HELLO", "many_paths")],
            "hello lists 100000 paths: a worker may list at most 256",
        ),
    ];
    for (args, env, expected) in cases {
        let mut a = vec![
            "run", "--matrix", "smoke", "--paths", "none", "--out", out_dir,
        ];
        a.extend_from_slice(args);
        let started = std::time::Instant::now();
        let out = relattn_env(&a, env);
        no_panic(&out);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(expected), "{args:?}: {err}");
        assert!(started.elapsed().as_secs() < 10, "{args:?}");
    }
}

#[test]
fn worker_trials_count_towards_the_trial_limit() {
    python_ready();
    let dir = tempfile::tempdir().unwrap();
    // 256 paths on every case of the nightly tier: millions of trials, refused before any (its
    // largest cases pass the case-size limit of this machine, but none is generated).
    let out = relattn_env(
        &[
            "--max-case-bytes",
            "64G",
            "run",
            "--matrix",
            "nightly",
            "--impl",
            "faulty",
            "--paths",
            "none",
            "--out",
            dir.path().to_str().unwrap(),
        ],
        &[("RELATTN_FAULTY_HELLO", "paths:256")],
    );
    no_panic(&out);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("trials (") && err.contains("over the limit of 1000000: select fewer cases"),
        "{err}"
    );
    assert!(!dir.path().join("cpu/results.jsonl").exists());
}

#[test]
fn exec_hands_the_worker_a_copy_of_the_case_file() {
    python_ready();
    let dir = tempfile::tempdir().unwrap();
    let problem = generate(&GenSpec::global(4, 2, vec![(5, 40), (0, 7)], 3)).unwrap();
    let case = dir.path().join("case.safetensors");
    write_case(&case, &problem, &CaseMeta::of(&problem)).unwrap();
    let before = std::fs::read(&case).unwrap();
    let out_file = dir.path().join("out.safetensors");
    let out = relattn_env(
        &[
            "exec",
            "--impl",
            "faulty",
            "--path",
            "faulty",
            "--input",
            case.to_str().unwrap(),
            "--output",
            out_file.to_str().unwrap(),
        ],
        &[("RELATTN_FAULTY_OVERWRITE", "exec::")],
    );
    no_panic(&out);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        std::fs::read(&case).unwrap(),
        before,
        "the worker wrote to the user's case file"
    );
}

#[test]
fn a_worker_that_ends_its_process_group_ends_only_itself() {
    python_ready();
    let dir = tempfile::tempdir().unwrap();
    // `kill 0` from the worker's exit trap, when relattn says bye: in relattn's process group
    // this ended relattn (exit 143) before it wrote its report.
    let wrapper = format!(
        "bash -c 'trap \"kill 0\" EXIT; python3 {}'",
        repo().join("adapters/faulty_worker.py").display()
    );
    let matrix = repo().join("harness/tests/data/faulty.toml");
    let out = relattn_env(
        &[
            "run",
            "--matrix",
            matrix.to_str().unwrap(),
            "--worker",
            &wrapper,
            "--paths",
            "none",
            "--out",
            dir.path().to_str().unwrap(),
        ],
        // And one trial ends the worker's group mid-run.
        &[("RELATTN_FAULTY_KILL0", "::decode::")],
    );
    no_panic(&out);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let rows = worker_rows(dir.path());
    assert_eq!(rows.len(), 9);
    for r in &rows {
        let trial = r["trial"].as_str().unwrap();
        if trial.contains("::decode::") {
            assert_eq!(r["status"], "error");
            assert!(
                r["message"].as_str().unwrap().contains("closed its stdout"),
                "{r}"
            );
        } else {
            assert_eq!(r["status"], "pass", "{r}");
        }
    }
    let summary: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("cpu/summary.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(summary["complete"], true);
}

#[test]
fn exec_runs_a_case_file_on_a_worker() {
    python_ready();
    let dir = tempfile::tempdir().unwrap();
    let mut spec = GenSpec::global(4, 2, vec![(5, 40), (0, 7), (1, 300)], 3);
    spec.rel_extent = 256;
    spec.padding_rows = 2;
    let problem = generate(&spec).unwrap();
    let case = dir.path().join("case.safetensors");
    write_case(&case, &problem, &CaseMeta::of(&problem)).unwrap();
    let out_file = dir.path().join("out.safetensors");
    let out = exec_worker(
        "numpy",
        "numpy",
        case.to_str().unwrap(),
        out_file.to_str().unwrap(),
        &[],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("numpy/numpy on worker numpy"),
        "{}",
        text(&out.stdout)
    );
    let got = read_impl_output(&out_file, [problem.total_rows(), 4, problem.head_dim]).unwrap();
    let reference = fast::attention(&problem);
    for ((t, h, c), r) in reference.out.indexed_iter() {
        if reference.row(t) >= problem.real_rows() {
            continue;
        }
        let g = got[[reference.row(t), h, c]] as f64;
        assert!(
            abs_diff_eq!(g, *r, epsilon = 1e-4),
            "{t}:{h}:{c}: {g} vs {r}"
        );
    }
    // Padding rows come back as the worker's NaN poison.
    assert!(got
        .outer_iter()
        .skip(problem.real_rows())
        .all(|r| r.iter().all(|x| x.is_nan())));
    // A path the worker does not have.
    let out = exec_worker(
        "numpy",
        "vllm_op",
        case.to_str().unwrap(),
        out_file.to_str().unwrap(),
        &[],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("has no path `vllm_op`"),
        "{}",
        text(&out.stderr)
    );
    // The bounds check builds this project's kernels: not a worker's.
    let out = exec_worker(
        "numpy",
        "numpy",
        case.to_str().unwrap(),
        out_file.to_str().unwrap(),
        &["--bounds-check"],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("applies to native paths"),
        "{}",
        text(&out.stderr)
    );
}

/// vLLM 0.33.0's files for routing (`RELATTN_VLLM_ROOT`, or fetched once into relattn's cache
/// folder, outside `target/`, so a fresh clone or `cargo clean` does not download the 336 MB
/// wheel again). None, with the reason printed, when the wheel cannot be downloaded (no network):
/// the test then says it did not run, instead of failing on the machine's connection.
pub(crate) fn vllm_root() -> Option<PathBuf> {
    if let Ok(root) = std::env::var("RELATTN_VLLM_ROOT") {
        return Some(PathBuf::from(root));
    }
    let cache = relattn_kernels::gpu::cache_dir()
        .unwrap_or_else(|| Path::new(env!("CARGO_TARGET_TMPDIR")).to_path_buf());
    let dest = cache.join("vllm-0.33.0");
    let out = Command::new("bash")
        .arg(repo().join("adapters/tools/fetch_vllm.sh"))
        .arg(&dest)
        .output()
        .expect("bash runs");
    let err = text(&out.stderr);
    if !out.status.success() && err.contains("cannot download") {
        eprintln!(
            "not run: vLLM 0.33.0's wheel cannot be downloaded ({}); set RELATTN_VLLM_ROOT to \
             an unpacked copy to run this test offline",
            err.trim()
        );
        return None;
    }
    assert!(
        out.status.success(),
        "vLLM 0.33.0's wheel is needed for the routing check and could not be fetched: {err}"
    );
    Some(dest)
}

#[test]
fn vllm_0_33_0_routing_shows_the_released_defect() {
    python_ready();
    let Some(root) = vllm_root() else {
        return;
    };
    let out = relattn_env(
        &["route", "--check", "--impl", "vllm", "--json"],
        &[("RELATTN_VLLM_ROOT", root.to_str().unwrap())],
    );
    no_panic(&out);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["worker"]["name"], "vllm");
    let caps = v["capabilities"].as_array().unwrap();
    let get = |cc: &str| caps.iter().find(|c| c["cc"] == cc).unwrap();
    for cc in ["9.0", "10.0", "10.3", "11.0"] {
        let c = get(cc);
        assert_eq!(c["shapes"], 2160, "{cc}");
        assert_eq!(c["agree"], 2160, "SM {cc} must agree on every shape: {c}");
    }
    for cc in ["8.0", "8.6", "8.7", "8.9"] {
        let c = get(cc);
        assert_eq!(c["disagree"], 2160, "SM {cc}: {c}");
        assert_eq!(c["classes"]["family_misclassified"], 2160, "{cc}");
        assert!(
            c["classes"]["split_kv_without_support"].as_u64().unwrap() > 0,
            "{cc}"
        );
    }
    for cc in ["12.0", "12.1"] {
        let c = get(cc);
        assert_eq!(c["disagree"], 2160, "SM {cc}: {c}");
        assert_eq!(c["classes"]["unsupported_not_rejected"], 2160, "{cc}");
        assert!(c["example"]["shape"].is_object());
    }
}

/// The triton worker answers the route vLLM PR #55078 proposes for SM8x, marked proposed, and
/// nothing for the other capabilities (which keep their released route): SM8x agrees with the
/// model but for the split-KV decode policy of 72 local decodes at page 16 (vLLM checks the
/// window before the KV length), every other capability is unanswered, and the check exits 1.
#[test]
fn triton_route_check_answers_the_proposed_sm8x_route() {
    python_ready();
    let Some(root) = vllm_root() else {
        return;
    };
    let env = [("RELATTN_VLLM_ROOT", root.to_str().unwrap())];
    let out = relattn_env(&["route", "--check", "--impl", "triton", "--json"], &env);
    no_panic(&out);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["worker"]["name"], "triton");
    for c in v["capabilities"].as_array().unwrap() {
        let cc = c["cc"].as_str().unwrap();
        assert_eq!(c["shapes"], 2160, "{cc}");
        if cc.starts_with("8.") {
            assert_eq!(
                (c["agree"].as_u64(), c["disagree"].as_u64()),
                (Some(2088), Some(72)),
                "{c}"
            );
            assert_eq!(
                c["classes"],
                serde_json::json!({"decode_splits_differ": 72}),
                "{c}"
            );
            assert!(c["proposed"].as_str().unwrap().contains("#55078"), "{c}");
            assert_eq!(c["example"]["worker"]["decode_splits"], 1, "{c}");
            assert_eq!(c["example"]["relattn"]["decode_splits"], 4, "{c}");
        } else {
            assert_eq!(c["unanswered"], 2160, "{c}");
            assert!(c["proposed"].is_null(), "{c}");
            assert!(
                c["unanswered_reason"]
                    .as_str()
                    .unwrap()
                    .contains("only SM8x"),
                "{c}"
            );
        }
    }
    let out = relattn_env(&["route", "--check", "--impl", "triton"], &env);
    let table = text(&out.stdout);
    assert!(
        table.contains("split-KV decode differs from docs/operator.md section 4.3: 72 [proposed]")
            && table.contains("[proposed] SM 8.0, 8.6, 8.7, 8.9: a proposed route, not in a release: vLLM PR #55078")
            && table.contains("not routed by the worker: vLLM PR #55078 moves only SM8x"),
        "{table}"
    );
}

/// Without its op (no RELATTN_VLLM_ROOT, no vLLM installed), the triton worker still greets and
/// every trial is a skip that says why; `route --check` has nothing to check (exit 2).
#[test]
fn the_triton_worker_without_its_op_skips_every_trial() {
    python_ready();
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-vllm");
    let env = [("RELATTN_VLLM_ROOT", missing.to_str().unwrap())];
    let out = relattn_env(
        &[
            "run",
            "--matrix",
            "smoke",
            "-k",
            "decode",
            "--impl",
            "triton",
            "--paths",
            "none",
            "--out",
            dir.path().join("out").to_str().unwrap(),
        ],
        &env,
    );
    no_panic(&out);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let rows = worker_rows(&dir.path().join("out"));
    assert!(!rows.is_empty());
    for r in &rows {
        assert_eq!(r["path"], "triton/triton_op", "{r}");
        assert_eq!(r["status"], "skip", "{r}");
        assert!(
            r["message"]
                .as_str()
                .unwrap()
                .contains("fa4_rel_attention.py does not exist"),
            "{r}"
        );
    }
    let out = relattn_env(&["route", "--check", "--impl", "triton"], &env);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("has no routing to check"),
        "{}",
        text(&out.stderr)
    );
}

/// adapters/tests/no_poison.toml, the matrix that tells the Triton op's NaN from unread pages
/// from its own errors (adapters/FINDINGS.md cites its case ids): the same six cases, three of
/// them without the poison, and the numpy worker passes all six.
#[test]
fn the_no_poison_matrix_keeps_its_cases() {
    python_ready();
    let dir = tempfile::tempdir().unwrap();
    let file = repo().join("adapters/tests/no_poison.toml");
    let out = relattn_env(
        &[
            "run",
            "--matrix",
            file.to_str().unwrap(),
            "--paths",
            "none",
            "--impl",
            "numpy",
            "--out",
            dir.path().join("out").to_str().unwrap(),
        ],
        &[],
    );
    no_panic(&out);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let rows = worker_rows(&dir.path().join("out"));
    let mut ids: Vec<&str> = rows
        .iter()
        .map(|r| r["case_id"].as_str().unwrap())
        .collect();
    ids.sort_unstable();
    let mut expected = [
        "cb91624af9b",
        "c4c7ce7813b",
        "c7959a7663b",
        "cd54f7a2019",
        "c525240e01f",
        "c050898e397",
    ];
    expected.sort_unstable();
    assert_eq!(ids, expected);
    assert!(rows.iter().all(|r| r["status"] == "pass"), "{rows:?}");
    let unpoisoned = rows
        .iter()
        .filter(|r| r["trial"].as_str().unwrap().contains("::no_poison::"))
        .count();
    assert_eq!(unpoisoned, 3);
}

#[test]
fn route_check_needs_a_worker_with_routing() {
    python_ready();
    let out = relattn_env(&["route", "--check", "--impl", "numpy"], &[]);
    no_panic(&out);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("has no routing"),
        "{}",
        text(&out.stderr)
    );
    let out = relattn_env(&["route", "--check"], &[]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn the_workers_own_tests_pass() {
    let out = crate::python::adapters_unittest(&["discover", "-s", "tests", "-t", "."], &[]);
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
}
