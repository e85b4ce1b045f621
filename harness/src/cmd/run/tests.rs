use super::compile_checks::{background_pool, wants_compile_checks};
use super::*;
use crate::exit;
use crate::runner::Runner;
use crate::session::SessionOptions;
use crate::trial_list::{BoundsCheck, TrialKind};
use relattn_kernels::capability::{DeviceInfo, MockSource};
use relattn_routing::Capability;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

#[test]
fn compile_checks_run_at_the_lowest_priority_and_the_caller_keeps_its_own() {
    let mine = rustix::process::getpriority_process(None).unwrap();
    let pool = background_pool(2).unwrap();
    let theirs =
        pool.install(|| rayon::broadcast(|_| rustix::process::getpriority_process(None).unwrap()));
    assert_eq!(theirs, vec![19, 19]);
    assert_eq!(rustix::process::getpriority_process(None).unwrap(), mine);
}

/// Counts every attempt to compile kernels or allocate device memory.
#[derive(Default)]
struct CountingFactory {
    attempts: AtomicUsize,
}

impl ExecutorFactory for CountingFactory {
    fn create(
        &self,
        _: &[DeviceInfo],
        _: BoundsCheck,
        _: &[relattn_routing::PathId],
    ) -> Result<Box<dyn Runner>, String> {
        self.attempts.fetch_add(1, Ordering::SeqCst);
        Err("counting double: no device work here".into())
    }
}

fn args(out: &std::path::Path) -> Args {
    Args {
        matrix: Some("smoke".into()),
        cases: None,
        splits: None,
        keep_going: false,
        paths: "all".into(),
        shard: None,
        out: Some(out.to_path_buf()),
        devices: "0".into(),
        bounds_check: None,
        case: None,
        filter: None,
        name: None,
        max_fail: None,
        rerun_failed: None,
        no_compile_checks: false,
        impls: Vec::new(),
        workers: Vec::new(),
        require_gpu: false,
        resume: false,
        worker_timeout_s: crate::worker::DEFAULT_TIMEOUT_S,
        worker_processes: None,
        no_triage: false,
        xfail: None,
        self_checks: false,
        processes: 1,
        sanitize: None,
    }
}

#[test]
fn require_gpu_without_a_driver_exits_3_before_any_report() {
    let dir = tempfile::tempdir().unwrap();
    let factory = CountingFactory::default();
    let mut a = args(dir.path());
    a.require_gpu = true;
    let err = run_with(a, &MockSource::new(Vec::new()), false, &factory).unwrap_err();
    assert_eq!(exit::code_of(&err), exit::Code::NoGpu, "{err}");
    assert!(err.to_string().contains("--require-gpu"), "{err}");
    assert!(
        !dir.path().join("cpu").exists(),
        "no report for a refused run"
    );
}

#[test]
fn compile_checks_run_after_gpu_trials_unless_left_out() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = args(dir.path());
    assert!(factory(&a).mutant.is_none());
    assert!(wants_compile_checks(&a, true));
    assert!(
        !wants_compile_checks(&a, false),
        "a CPU run compiles nothing"
    );
    a.no_compile_checks = true;
    assert!(!wants_compile_checks(&a, true));
}

#[test]
fn sm12x_stops_before_any_compile_or_allocation() {
    for (name, minor) in [("NVIDIA GB10", 1), ("NVIDIA RTX PRO 6000 Blackwell", 0)] {
        let dir = tempfile::tempdir().unwrap();
        let factory = CountingFactory::default();
        let source = MockSource::single(name, Capability::new(12, minor));
        let started = Instant::now();
        let err = run_with(args(dir.path()), &source, true, &factory).unwrap_err();
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "refusal took {:?}",
            started.elapsed()
        );
        assert_eq!(exit::code_of(&err), exit::Code::NoGpu);
        let msg = err.to_string();
        assert!(
            msg.contains(name) && msg.contains(&format!("12.{minor}")) && msg.contains("paged-KV"),
            "{msg}"
        );
        assert_eq!(
            factory.attempts.load(Ordering::SeqCst),
            0,
            "compile/allocation attempted"
        );
        assert!(
            !dir.path().join("sm121").exists() && !dir.path().join("cpu").exists(),
            "no report for a refused run"
        );
    }
}

#[test]
fn supported_gpu_reaches_the_factory() {
    let dir = tempfile::tempdir().unwrap();
    let factory = CountingFactory::default();
    let source = MockSource::single("NVIDIA H200", Capability::new(9, 0));
    let mut a = args(dir.path());
    let first = relattn_matrices::load_tier("smoke")
        .unwrap()
        .expand()
        .unwrap()
        .cases[0]
        .id
        .clone();
    a.case = Some(first);
    let _ = run_with(a, &source, true, &factory);
    assert_eq!(factory.attempts.load(Ordering::SeqCst), 1);
}

/// A factory whose runner never runs anything: enough for a session to count as a GPU run.
struct IdleFactory;

struct IdleRunner;

impl Runner for IdleRunner {
    fn run(
        &self,
        _: usize,
        _: &crate::runner::RunRequest<'_>,
    ) -> Result<crate::runner::RunOutput, crate::runner::RunError> {
        Err(crate::runner::RunError::Other("idle".into()))
    }
}

impl ExecutorFactory for IdleFactory {
    fn create(
        &self,
        _: &[DeviceInfo],
        _: BoundsCheck,
        _: &[relattn_routing::PathId],
    ) -> Result<Box<dyn Runner>, String> {
        Ok(Box::new(IdleRunner))
    }
}

#[test]
fn gpu_runs_leave_the_self_checks_to_cpu_ci_unless_asked() {
    let h200 = MockSource::single("NVIDIA H200", Capability::new(9, 0));
    let self_checks = |source: &MockSource, factory: &dyn ExecutorFactory, asked| {
        let mut opts = SessionOptions::for_cargo_test().unwrap();
        opts.gpu_cases = Some(crate::case_set::CaseSet::Matrix("smoke".into()));
        opts.self_checks = asked;
        let session = Session::open_with(&opts, source, true, factory).unwrap();
        session
            .trials
            .iter()
            .filter(|t| matches!(t.kind, TrialKind::Reference { .. }))
            .count()
    };
    assert_eq!(self_checks(&h200, &IdleFactory, None), 0);
    assert!(self_checks(&h200, &IdleFactory, Some(true)) > 100);
    // No GPU, or a GPU whose setup failed: the run is a CPU run and self-checks.
    let none = MockSource::new(Vec::new());
    assert!(self_checks(&none, &IdleFactory, None) > 100);
    assert!(self_checks(&h200, &CountingFactory::default(), None) > 100);
}

#[test]
fn device_threads_prepare_the_next_case_and_every_trial_gets_one_row() {
    // A mocked H200 whose runner answers every trial with an error: the device thread runs
    // case after case, preparing the next one on the side, and each trial ends in one row.
    let dir = tempfile::tempdir().unwrap();
    let h200 = MockSource::single("NVIDIA H200", Capability::new(9, 0));
    let mut a = args(dir.path());
    a.no_compile_checks = true;
    let err = run_with(a, &h200, true, &IdleFactory).unwrap_err();
    assert_eq!(exit::code_of(&err), exit::Code::Failed, "{err}");
    let text = std::fs::read_to_string(dir.path().join("sm90/results.jsonl")).unwrap();
    let names: Vec<String> = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["trial"].to_string())
        .collect();
    let unique: std::collections::HashSet<&String> = names.iter().collect();
    assert_eq!(unique.len(), names.len(), "a trial twice");
    let gpu = text.lines().filter(|l| l.contains("\"gpu::")).count();
    assert!(gpu > 100, "{gpu} GPU rows");
    assert!(text.contains("idle"));
    // No self-checks on a GPU run, and the time split says where the rest went.
    assert!(!text.contains("\"reference::"));
    let summary: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("sm90/summary.json")).unwrap(),
    )
    .unwrap();
    assert!(
        summary["environment"]["extra"]["phases"]["reference_s"]
            .as_f64()
            .unwrap()
            > 0.0
    );
}

#[test]
fn the_cargo_test_trials_take_a_case_folder_from_the_environment() {
    use crate::case_set::CaseSet;
    use relattn_matrices::SplitSetting;
    let vars = |pairs: &'static [(&'static str, &'static str)]| {
        move |name: &str| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    };
    let opts = SessionOptions::from_vars(vars(&[("RELATTN_CASES", "captured")])).unwrap();
    assert_eq!(opts.gpu_cases, Some(CaseSet::folder("captured".into())));
    let opts = SessionOptions::from_vars(vars(&[
        ("RELATTN_CASES", "captured"),
        ("RELATTN_SPLITS", "policy,7"),
        ("RELATTN_KEEP_GOING", "1"),
    ]))
    .unwrap();
    assert_eq!(
        opts.gpu_cases,
        Some(CaseSet::Folder {
            dir: "captured".into(),
            splits: vec![SplitSetting::Policy, SplitSetting::Forced(7)],
            keep_going: true,
        })
    );
    let opts = SessionOptions::from_vars(vars(&[("RELATTN_MATRIX", "ci")])).unwrap();
    assert_eq!(opts.gpu_cases, Some(CaseSet::Matrix("ci".into())));
    for bad in [
        &[("RELATTN_CASES", "a"), ("RELATTN_MATRIX", "ci")][..],
        &[("RELATTN_CASES", "a"), ("RELATTN_SPLITS", "0")][..],
    ] {
        let pairs: &'static [(&'static str, &'static str)] = bad;
        let e = SessionOptions::from_vars(vars(pairs)).unwrap_err();
        assert_eq!(exit::code_of(&e), exit::Code::Usage, "{e}");
    }
}
