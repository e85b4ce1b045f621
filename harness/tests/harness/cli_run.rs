//! `relattn run` on a machine without a GPU: it runs the routing checks and the smoke tier's
//! reference self-checks, writes a complete report under `cpu`, and exits 0. Bad arguments exit 2.
//! (relattn sees no GPU here, on a GPU machine too: `crate::binary::ENV`; the GPU trials are
//! `trials.rs`'s.)

use crate::common;
use common::{relattn, relattn_env, text};

#[test]
fn run_without_a_gpu_writes_a_complete_cpu_report() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().to_str().unwrap();
    // Captured stderr is not a terminal: progress comes as lines, here every 0.2 s.
    let out = relattn_env(&["run", "--out", out_dir], &[("RELATTN_PROGRESS_S", "0.2")]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("CPU part"), "{stderr}");
    let progress: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("relattn run: trials ") && l.contains(" elapsed"))
        .collect();
    assert!(!progress.is_empty(), "no progress line in {stderr}");
    assert!(
        progress
            .iter()
            .any(|l| l.contains(" pass") && l.contains("eta ")),
        "{progress:?}"
    );
    assert!(stderr.contains("relattn run: time: wall "), "{stderr}");
    // One run, one total: the final line's time is the timing line's wall time.
    let after = |marker: &str| -> String {
        let at = stderr
            .find(marker)
            .unwrap_or_else(|| panic!("no `{marker}`: {stderr}"));
        stderr[at + marker.len()..]
            .split(' ')
            .next()
            .unwrap()
            .to_string()
    };
    let wall = after("relattn run: time: wall ");
    let final_line = stderr
        .lines()
        .find(|l| l.contains("; report in "))
        .unwrap_or_else(|| panic!("no final line: {stderr}"));
    assert!(
        final_line.contains(&format!(" in {wall} s; report in ")),
        "the final line's time is not the wall time {wall} s: {final_line}"
    );
    let cpu = dir.path().join("cpu");
    for file in [
        "results.csv",
        "results.jsonl",
        "summary.json",
        "summary.md",
        "junit.xml",
    ] {
        assert!(cpu.join(file).is_file(), "missing {file}");
    }
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(cpu.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["complete"], true);
    let build = summary["environment"]["relattn_build"].as_str().unwrap();
    assert!(build.starts_with(env!("CARGO_PKG_VERSION")), "{build}");
    assert!(summary["environment"]["extra"]["run_identity"]["matrix"].is_string());
    // Where the time went: the CPU run generates cases, computes references and self-checks.
    let phases = &summary["environment"]["extra"]["phases"];
    for key in [
        "wall_s",
        "generate_s",
        "reference_s",
        "self_checks_s",
        "gpu_s",
        "judge_s",
        "compile_s",
    ] {
        assert!(phases[key].is_number(), "{key} in {phases}");
    }
    assert!(phases["self_checks_s"].as_f64().unwrap() > 0.0, "{phases}");
    assert!(phases["reference_s"].as_f64().unwrap() > 0.0, "{phases}");
    let md = std::fs::read_to_string(cpu.join("summary.md")).unwrap();
    assert!(md.contains("- Time: wall "), "{md}");
    assert_eq!(summary["counts"]["fail"], 0);
    assert_eq!(summary["counts"]["error"], 0);
    assert_eq!(
        summary["by_path"]["routing"]["counts"]["pass"], 13,
        "one trial per routing row + unknown"
    );
    assert!(
        summary["by_path"]["reference"]["counts"]["pass"]
            .as_u64()
            .unwrap()
            > 100
    );
    // GPU trials are in the report as skipped, with the reason.
    let csv = std::fs::read_to_string(cpu.join("results.csv")).unwrap();
    let gpu_row = csv
        .lines()
        .find(|l| l.contains(",score_mod,"))
        .expect("a score_mod row");
    assert!(
        gpu_row.contains(",skip,") && gpu_row.contains("no GPU"),
        "{gpu_row}"
    );
    assert!(csv.starts_with("case_id,trial,path,status,max_abs,mean_abs,rel_l2,bound,first_bad,ms,tflops,gbps,seed,message,"));
}

#[test]
fn bad_arguments_exit_2_with_one_message() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().to_str().unwrap();
    for args in [
        vec!["run", "--matrix", "no_such_tier", "--out", out_dir],
        vec!["run", "--shard", "3/2", "--out", out_dir],
        vec!["run", "--paths", "tensor_magic", "--out", out_dir],
        vec!["run", "--bounds-check", "maybe", "--out", out_dir],
        vec!["run", "--processes", "0", "--out", out_dir],
    ] {
        let out = relattn(&args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

#[test]
fn require_gpu_without_a_driver_exits_3() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().to_str().unwrap();
    let out = relattn(&["run", "--require-gpu", "--out", out_dir]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("--require-gpu"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        !dir.path().join("cpu").exists(),
        "no report for a refused run"
    );
}

#[test]
fn case_takes_the_id_with_its_prefix() {
    let listing = text(&relattn(&["matrix", "--show", "smoke"]).stdout);
    let id = listing.split_whitespace().next().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("r");
    let out = relattn(&["run", "--case", &id, "--out", out_dir.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let csv = std::fs::read_to_string(out_dir.join("cpu/results.csv")).unwrap();
    let cases: std::collections::BTreeSet<&str> = csv
        .lines()
        .skip(1)
        .filter(|l| !l.contains(",routing,"))
        .map(|l| l.split(',').next().unwrap())
        .collect();
    assert_eq!(cases, [id.as_str()].into(), "{csv}");
    // The digits alone (an id from before the prefix) select nothing, and the message says why.
    let bare = id.strip_prefix('c').unwrap();
    let out = relattn(&["run", "--case", bare, "--out", out_dir.to_str().unwrap()]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains(&format!("`c{bare}`")), "{stderr}");
}

#[test]
fn compile_check_without_nvrtc_exits_3_with_one_message() {
    if relattn_kernels::gpu::nvrtc_available() {
        eprintln!("NVRTC is present: this test is about machines without it");
        return;
    }
    let out = relattn(&["compile-check"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("NVRTC cannot be loaded"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn compile_check_refuses_a_bad_architecture_before_compiling() {
    let out = relattn(&["compile-check", "--arch", "sm_90a,gfx90a"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("gfx90a"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}

#[test]
fn the_nightly_machine_script_without_a_gpu_exits_3_and_runs_no_shard() {
    let dir = tempfile::tempdir().unwrap();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../ci/nightly-machine.sh");
    let out = std::process::Command::new("bash")
        .arg(&script)
        .args(["4", "2"])
        .env("RELATTN_BIN", env!("CARGO_BIN_EXE_relattn"))
        .envs(crate::binary::ENV)
        .env("RELATTN_OUT", dir.path())
        .output()
        .expect("bash runs");
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("--arch native"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!dir.path().join("nightly-shard-1-of-4").exists());
    assert!(!dir.path().join("nightly-merged").exists());
}
