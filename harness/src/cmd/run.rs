//! `relattn run`: the main job. Routing checks for every architecture, the reference
//! self-checks of the matrix (or case folder) and, with a usable GPU, the GPU trials; one report
//! directory.

use crate::case_set::CaseSet;
use crate::engine::{failure_text, Engine};
use crate::exit;
use crate::gpu_status::{DeviceSelection, GpuStatus};
use crate::progress::{Tally, Ticker};
use crate::session::{ExecutorFactory, Session, SessionOptions};
use crate::trial_list::{BoundsCheck, PathSelection};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use relattn_kernels::capability::{CapabilitySource, NvmlSource};
use relattn_matrices::Shard;
use relattn_reports::ReportWriter;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod compile_checks;
mod environment;
pub mod out;
mod select;
use compile_checks::{run_compile_checks, wants_compile_checks};
use environment::{check_identity, environment, run_identity, IDENTITY_KEY};
use select::{failed_trials, selection_filter};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Tier (smoke, ci, nightly, regressions) or a matrix file. Default: ci with a GPU, smoke without.
    #[arg(long, conflicts_with = "cases")]
    pub matrix: Option<String>,
    /// A case folder instead of a matrix: every *.safetensors case file under DIR, at any depth,
    /// is a case named after its file's stem, with the SHA-256 of its bytes as id (c and 10 hex
    /// digits, the same after a rename). Files that are not valid case files refuse the run,
    /// each named with why, unless --keep-going.
    #[arg(long, value_name = "DIR")]
    pub cases: Option<PathBuf>,
    /// Split settings of a case folder's cases (--cases, or the folder --rerun-failed names),
    /// each a trial per path that takes it: policy (the route's) and forced counts,
    /// comma-separated [default: policy,1,3].
    #[arg(long, value_name = "LIST")]
    pub splits: Option<String>,
    /// With a case folder: run the valid files when some are not; the others are listed and
    /// reported as skipped trials with the reason.
    #[arg(long)]
    pub keep_going: bool,
    /// Native GPU paths: routed (the device's production path), all, none, or a list like
    /// score_mod,fallback.
    #[arg(long, default_value = "all")]
    pub paths: String,
    /// Run shard K of N of the matrix (1-based), e.g. 2/8.
    #[arg(long)]
    pub shard: Option<String>,
    /// Report directory; the report goes to OUT/<arch> (sm90, sm100, ... or cpu), and a second
    /// run there refuses (or continues with --resume). Without it each run writes a folder of
    /// its own, reports-out/<run id>/<arch>, and reports-out/latest points to the newest.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// GPUs to use: all, or indices like 0 or 0,1.
    #[arg(long, default_value = "0")]
    pub devices: String,
    /// Compile kernels with RELATTN_BOUNDS_CHECK: off, on or both (default: both for ci and regressions).
    #[arg(long)]
    pub bounds_check: Option<String>,
    /// Only the case(s) whose id starts with this (ids as `relattn matrix --show` lists them, e.g.
    /// c1b24787ba2 or a prefix like c1b2).
    #[arg(long)]
    pub case: Option<String>,
    /// Only the trials this expression selects, e.g. 'layer=local & dtype=fp16 & path=fallback'
    /// (terms joined by &: key=a,b key!=a key~text; keys: name, path, case and the case
    /// parameters of the reports; values match whole, except layer's families: layer=local also
    /// matches local_e512).
    #[arg(long, value_name = "EXPR")]
    pub filter: Option<String>,
    /// Only the trials whose name contains TEXT (pytest's -k); with --filter, both.
    #[arg(short = 'k', value_name = "TEXT")]
    pub name: Option<String>,
    /// Stop starting trials after N failed or errored ones; the report is INCOMPLETE (exit 1).
    #[arg(long, value_name = "N")]
    pub max_fail: Option<usize>,
    /// Run exactly the failed and errored trials of REPORT (a report directory, or one of its
    /// <arch>/ folders), with this run's other arguments (give the run's own --matrix, --paths
    /// and workers; --matrix defaults to the report's).
    #[arg(long, value_name = "REPORT")]
    pub rerun_failed: Option<PathBuf>,
    /// Leave out the compile-only check of every program for every supported architecture
    /// (NVRTC time on a cold cache; for quick iterations on one GPU, not for CI).
    #[arg(long)]
    pub no_compile_checks: bool,
    #[arg(
        long = "impl",
        value_name = "NAME",
        help = crate::worker::impl_help("Also run a shipped worker's paths (repeatable or comma-separated)")
    )]
    pub impls: Vec<String>,
    /// Also run the paths of a worker speaking worker protocol v1 (repeatable), e.g.
    /// --worker "python3 my_worker.py".
    #[arg(long = "worker", value_name = "COMMAND")]
    pub workers: Vec<String>,
    /// Exit 3 (writing no report) unless a usable GPU runs the GPU trials: for CI jobs on GPU
    /// runners, where a CPU-only run would pass without testing anything on the device.
    #[arg(long)]
    pub require_gpu: bool,
    /// Continue an interrupted run into the same --out: trials whose rows are complete in
    /// results.jsonl are kept, the others run. The matrix, shard, paths and build must be the
    /// run's own (recorded in summary.json when it started).
    #[arg(long)]
    pub resume: bool,
    /// Seconds a worker may take to answer one request before it is killed and restarted.
    #[arg(long, default_value_t = crate::worker::DEFAULT_TIMEOUT_S)]
    pub worker_timeout_s: f64,
    /// Processes per worker (1 to 64), fed from one queue, trials of one kernel configuration
    /// to one process; default: with GPUs, half this run's cores, at most 8 per GPU and one per
    /// 4 GiB of its memory; without, this run's cores.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=64))]
    pub worker_processes: Option<u64>,
    /// Expected failures: a TOML file of `[[xfail]]` entries (filter, cause, reason, strict); a
    /// trial an entry selects that fails for the expected cause is `xfail`, for another cause it
    /// stays a failure; passing, `xpass` (a `fail` when strict). Exit 0 when nothing but xfail
    /// failed.
    #[arg(long, value_name = "FILE")]
    pub xfail: Option<PathBuf>,
    /// Do not run failing and erroring GPU trials again in the variants that tell their cause
    /// (same inputs, finite unread slots, one split: at most three more runs per failure).
    #[arg(long)]
    pub no_triage: bool,
    /// Also run the reference self-checks (oracle, paging, layouts, chunking, merge, sampling)
    /// on a machine with a usable GPU, or in a run of workers alone (--paths none); otherwise
    /// they run without a GPU.
    #[arg(long)]
    pub self_checks: bool,
    /// This run is one of N runs side by side on this machine (e.g. the nightly's shards on one
    /// GPU machine, `ci/nightly-machine.sh`): it takes 1/N of the cores (unless
    /// RAYON_NUM_THREADS says) and of the memory for cases prepared ahead.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub processes: usize,
    /// Run every GPU trial under NVIDIA's compute-sanitizer with this tool: memcheck (with
    /// padding after every allocation), initcheck, racecheck or synccheck. A trial the tool
    /// reports fails with the tool's class. Needs compute-sanitizer on PATH or in
    /// RELATTN_SANITIZER (else exit 3); one GPU; bounds checks off unless --bounds-check says;
    /// times are not comparable with unsanitized runs.
    #[arg(long, value_enum, value_name = "TOOL")]
    pub sanitize: Option<crate::sanitize::Tool>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    crate::engine::on_signals("run");
    share_machine(args.processes)?;
    let libs = crate::gpu_exec::libraries_present();
    // Before any GPU detection: no sanitizer, no run (exit 3).
    if let Some(sanitizer) = crate::sanitize::find(args.sanitize)? {
        let devices = sanitized_devices(&args)?;
        // The native paths run in this process: sanitized, it runs again under the sanitizer.
        let native = args.paths.trim() != "none";
        let ready = native
            && matches!(
                crate::gpu_status::detect(&NvmlSource::new(), libs, &devices),
                GpuStatus::Ready { .. }
            );
        crate::sanitize::run_natives_under(Some(&sanitizer), "run", ready)?;
    }
    let factory = factory(&args);
    run_with(args, &NvmlSource::new(), libs, &factory)
}

/// `--sanitize` runs the native paths on one GPU, one trial at a time (so every report in the
/// sanitizer's log between two trials is the trial's): `--devices` must name one.
fn sanitized_devices(args: &Args) -> anyhow::Result<DeviceSelection> {
    let devices = args
        .devices
        .parse::<DeviceSelection>()
        .map_err(exit::usage)?;
    match &devices {
        DeviceSelection::List(v) if v.len() == 1 => Ok(devices),
        _ => Err(exit::usage(format!(
            "--sanitize runs the native paths on one GPU, one trial at a time: give --devices \
             with one index (not {})",
            args.devices
        ))),
    }
}

/// One of `processes` runs on this machine: the global thread pool gets its share of the cores,
/// rounded up (a run spends part of its time waiting on the GPU, so the shares together may
/// exceed the cores by less than one each), before anything uses it, unless RAYON_NUM_THREADS
/// sets the count.
fn share_machine(processes: usize) -> anyhow::Result<()> {
    if processes == 0 {
        return Err(exit::usage("--processes must be at least 1"));
    }
    if processes == 1 || std::env::var_os("RAYON_NUM_THREADS").is_some() {
        return Ok(());
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    // Err only when the pool already exists (a second run in one process): keep that pool.
    let _ = rayon::ThreadPoolBuilder::new()
        .num_threads(cores.div_ceil(processes))
        .build_global();
    Ok(())
}

/// Where the run's cases come from: `--cases` (with `--splits` and `--keep-going`), else
/// `--matrix`, else what the report of `--rerun-failed` ran (`rerun`), else the default tier.
fn case_set(args: &Args, rerun: Option<&str>) -> anyhow::Result<Option<CaseSet>> {
    let splits = args
        .splits
        .as_deref()
        .map(relattn_matrices::parse_splits)
        .transpose()
        .map_err(exit::usage)?;
    let set = match (&args.cases, &args.matrix, rerun) {
        (Some(dir), _, _) => Some(CaseSet::folder(dir.clone())),
        (None, Some(m), _) => Some(CaseSet::Matrix(m.clone())),
        (None, None, Some(name)) => Some(CaseSet::from_name(name)),
        (None, None, None) => None,
    };
    match set {
        Some(CaseSet::Folder {
            dir,
            splits: default,
            ..
        }) => Ok(Some(CaseSet::Folder {
            dir,
            splits: splits.unwrap_or(default),
            keep_going: args.keep_going,
        })),
        _ if splits.is_some() || args.keep_going => Err(exit::usage(
            "--splits and --keep-going are for case folders (--cases DIR); a matrix states its \
             split settings per group",
        )),
        other => Ok(other),
    }
}

/// The executor factory of `run`: the production build.
fn factory(_args: &Args) -> crate::gpu_exec::RealFactory {
    crate::gpu_exec::RealFactory { mutant: None }
}

/// `run` with the capability source and executor factory given: a rejected device stops here
/// before the factory (the only code that compiles kernels or allocates device memory) is called.
pub fn run_with(
    args: Args,
    source: &dyn CapabilitySource,
    libs_present: bool,
    factory: &dyn ExecutorFactory,
) -> anyhow::Result<()> {
    let rerun = args
        .rerun_failed
        .as_deref()
        .map(failed_trials)
        .transpose()?;
    if rerun.as_ref().is_some_and(|(_, names)| names.is_empty()) {
        return Ok(());
    }
    let sanitizer = crate::sanitize::find(args.sanitize)?;
    if sanitizer.is_some() {
        sanitized_devices(&args)?;
    }
    let opts = SessionOptions {
        gpu_cases: case_set(&args, rerun.as_ref().and_then(|(m, _)| m.as_deref()))?,
        selfcheck_matrix: None,
        paths: args.paths.parse::<PathSelection>().map_err(exit::usage)?,
        // Sanitized, the plain build by default: memcheck, not a trap, is to see the accesses.
        bounds: args
            .bounds_check
            .as_deref()
            .map(str::parse::<BoundsCheck>)
            .transpose()
            .map_err(exit::usage)?
            .or(sanitizer.as_ref().map(|_| BoundsCheck::Off)),
        shard: args
            .shard
            .as_deref()
            .map(str::parse::<Shard>)
            .transpose()
            .map_err(|e| exit::usage(e.to_string()))?,
        devices: args
            .devices
            .parse::<DeviceSelection>()
            .map_err(exit::usage)?,
        case: args.case.clone(),
        filter: selection_filter(&args)?,
        only: rerun.as_ref().map(|(_, names)| names.clone()),
        workers: crate::worker::sanitized(
            crate::worker::specs(&args.impls, &args.workers).map_err(exit::usage)?,
            sanitizer.as_ref(),
        ),
        worker_timeout: crate::worker::timeout(args.worker_timeout_s).map_err(exit::usage)?,
        worker_processes: args.worker_processes.map(|n| n as usize),
        processes: args.processes,
        triage: !args.no_triage,
        xfail: args.xfail.clone(),
        self_checks: args.self_checks.then_some(true),
    };
    let report_out = out::resolve(args.out.as_deref(), args.resume).map_err(exit::usage)?;
    let out_dir = report_out.dir.clone();
    // At once, before anything slow: a second run into this --out stops here naming the first.
    let _lock = crate::run_lock::RunLock::acquire(&out_dir).map_err(exit::usage)?;
    let run_started = Instant::now();
    let tally = Arc::new(Mutex::new(Tally {
        phase: "setup (matrix, devices, kernels, workers)",
        ..Tally::default()
    }));
    let ticker = Ticker::start(tally.clone());
    let session = Session::open_with(&opts, source, libs_present, factory)
        .map_err(|e| exit::usage(format!("{e:#}")))?;
    if let GpuStatus::Rejected(why) = &session.status {
        return Err(exit::no_gpu(why.clone()));
    }
    // A failed GPU setup turns the status into Absent, so Ready means the device is in use.
    if args.require_gpu {
        if let Some(why) = session.status.unusable_reason() {
            return Err(exit::no_gpu(format!(
                "--require-gpu: {why}; nothing was run (drop --require-gpu to run the CPU part)"
            )));
        }
    }
    let arch = match &session.status {
        GpuStatus::Ready { devices, .. } => {
            format!("sm{}{}", devices[0].cc.major, devices[0].cc.minor)
        }
        _ => "cpu".to_string(),
    };
    eprintln!(
        "relattn run: {}, {} trials; {}",
        match &session.set {
            CaseSet::Matrix(m) => format!("matrix `{m}`"),
            CaseSet::Folder { dir, .. } => format!("case folder {}", dir.display()),
        },
        session.trials.len(),
        session.gpu_line()
    );
    if arch == "cpu" {
        let workers = session.workers.len();
        if workers == 0 {
            eprintln!(
                "relattn run: no usable GPU, running the CPU part (routing and reference checks) \
                 only"
            );
        } else {
            eprintln!(
                "relattn run: no usable GPU: the native paths do not run; the routing and \
                 reference checks and the trials of {workers} worker(s) do"
            );
        }
    }
    if let Some(s) = &sanitizer {
        eprintln!(
            "relattn run: sanitized: every GPU trial runs under {} --tool {} (times are not \
             comparable with unsanitized runs)",
            s.program.display(),
            s.tool.as_str()
        );
    }
    let mut env = environment(&session, &args);
    if let Some(s) = &sanitizer {
        env.extra.insert(
            "sanitize".into(),
            serde_json::json!({
                "tool": s.tool.as_str(),
                "sanitizer": s.program.display().to_string(),
                "native_paths": crate::sanitize::child_log().is_some(),
                "note": "every GPU trial ran under the sanitizer: times are not comparable with unsanitized runs",
            }),
        );
    }
    let identity = run_identity(&session, &args);
    env.extra.insert(IDENTITY_KEY.into(), identity.clone());
    let arch_dir = out_dir.join(&arch);
    // Any file `report show` reads as a report counts (a CSV-only report too): never overwritten.
    let has_report = ["results.jsonl", "summary.json", "results.csv"]
        .iter()
        .any(|f| arch_dir.join(f).is_file());
    let (mut writer, done) = if has_report && args.resume {
        let kept = relattn_reports::load_arch(&arch_dir)
            .map_err(|e| exit::usage(format!("--resume: {e}")))?;
        check_identity(&arch_dir, &kept.environment, &identity)?;
        // A finished report is left as it is (rewriting it would reset its wall time and
        // `finished`): the resume has nothing to run, and ends as the run did.
        if kept.complete && kept.rows.len() == session.trials.len() {
            let summary = kept.summary();
            eprintln!(
                "relattn run: {} is complete ({} trials): nothing to resume",
                arch_dir.display(),
                kept.rows.len()
            );
            return if summary.all_passed() {
                Ok(())
            } else {
                Err(exit::failed(format!(
                    "{} trial(s) failed or errored in {}",
                    summary.counts.fail + summary.counts.error,
                    arch_dir.display()
                )))
            };
        }
        env.started = kept.environment.started.clone();
        let mut resumed = kept
            .environment
            .extra
            .get("resumed")
            .and_then(|v| v.as_array().cloned())
            .unwrap_or_default();
        resumed.push(serde_json::json!(relattn_reports::now()));
        env.extra.insert("resumed".into(), resumed.into());
        let (writer, rows) = ReportWriter::resume(&out_dir, &arch, env)?;
        let names: std::collections::HashSet<&str> =
            session.trials.iter().map(|t| t.name.as_str()).collect();
        if let Some(r) = rows.iter().find(|r| !names.contains(r.trial.as_str())) {
            return Err(exit::usage(format!(
                "--resume: {} holds trial {}, which this run does not have: the matrix \
                 changed; give another --out",
                arch_dir.display(),
                r.trial
            )));
        }
        let done: std::collections::HashSet<String> = rows.into_iter().map(|r| r.trial).collect();
        eprintln!(
            "relattn run: resuming {}: {} of {} trials already done",
            arch_dir.display(),
            done.len(),
            session.trials.len()
        );
        (writer, done)
    } else if has_report {
        return Err(exit::usage(format!(
            "{} already holds a report: pass --resume to continue an interrupted run there, \
             or give another --out (or remove that directory)",
            arch_dir.display()
        )));
    } else {
        (
            ReportWriter::create(&out_dir, &arch, env)?,
            Default::default(),
        )
    };
    // `latest` moves only once this run has a report: a run refused before (bad arguments, a
    // bad case folder, no GPU with --require-gpu) leaves it at the previous run.
    if let Some(id) = &report_out.new_run {
        if let Err(why) = out::point_latest(Path::new(out::RUNS_ROOT), id) {
            eprintln!("relattn run: {why}");
        }
    }
    let started = Instant::now();
    let bar = ProgressBar::with_draw_target(
        Some(session.trials.len() as u64),
        ProgressDrawTarget::hidden(),
    );
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    let mut write_error = None;
    let failures = writer.dir().join("failures");
    bar.inc(done.len() as u64);
    {
        // The tally holds the run's counts, a resumed run's earlier rows included.
        let mut t = tally.lock().unwrap_or_else(|e| e.into_inner());
        t.phase = "trials";
        t.total = session.trials.len();
        t.resumed = done.len();
        t.to_run = session
            .trials
            .iter()
            .filter(|x| x.ignore.is_none() && !done.contains(&x.name))
            .count();
        for r in writer.rows() {
            *t.counts.entry(r.status.as_str()).or_default() += 1;
        }
        t.trials_started = Some(Instant::now());
    }
    // The compile-only checks of the other architectures run beside the trials, on half the
    // cores, after the device's own programs were compiled (the session did that): the trials
    // come first, the checks fill the cores the trials leave idle.
    let checks = wants_compile_checks(&args, session.executor_ref().is_some())
        .then(|| std::thread::spawn(run_compile_checks));
    let engine = Engine {
        keep: Some(&failures),
        processes: args.processes,
        tally: Some(tally.clone()),
        max_fail: args.max_fail,
        ..Engine::new(&session)
    };
    let max_failed = engine.run(&done, |row| {
        if bar.is_hidden() && started.elapsed() > Duration::from_secs(2) {
            bar.set_draw_target(ProgressDrawTarget::stderr());
        }
        // Failures, and an unexpected pass of a known bug (it may be fixed: its entry may go).
        if row.status.is_bad() || row.status == relattn_reports::Status::XPass {
            bar.suspend(|| eprintln!("{}", failure_text(&row)));
        }
        bar.inc(1);
        if let Err(e) = writer.push(row) {
            write_error.get_or_insert(e);
        }
    });
    if let Some(e) = write_error {
        return Err(e.into());
    }
    bar.finish_and_clear();
    // A failed compile check counts like a failing trial. An interrupted run does not wait for
    // them (its report is INCOMPLETE anyway).
    if let Some(checks) = checks.filter(|_| !crate::engine::stopping() && !max_failed) {
        tally.lock().unwrap_or_else(|e| e.into_inner()).phase = "compile checks";
        writer.environment_mut().compile_checks = checks.join().unwrap_or_else(|_| {
            vec![relattn_reports::CompileCheck {
                arch: "all".into(),
                program: "every program".into(),
                ok: false,
                message: "the compile check panicked".into(),
            }]
        });
    }
    // The trials are over: no progress line after this point.
    drop(ticker);
    // An entry of --xfail that decided no trial is listed: the bug it names may be fixed, or
    // its filter may have gone stale.
    if let Some(x) = &session.xfail {
        let unmatched = x.unmatched();
        for line in &unmatched {
            eprintln!("relattn run: {line}");
        }
        writer.environment_mut().extra.insert(
            "xfail".into(),
            serde_json::json!({ "file": x.source, "unmatched": unmatched }),
        );
    }
    let split = crate::phases::split(run_started.elapsed().as_secs_f64());
    writer
        .environment_mut()
        .extra
        .insert("phases".into(), split.json());
    let dir = writer.dir().to_path_buf();
    if crate::engine::stopping() || max_failed {
        let done = writer.rows().len();
        writer.finish_incomplete()?;
        let why = if max_failed {
            format!(
                "stopped after {} failed or errored trial(s) (--max-fail)",
                args.max_fail.unwrap_or(0)
            )
        } else {
            "interrupted".to_string()
        };
        return Err(exit::failed(format!(
            "{why} after {done} of {} trials; the report in {} is INCOMPLETE: continue it with \
             the same command and --resume",
            session.trials.len(),
            dir.display()
        )));
    }
    let summary = writer.finish()?;
    eprintln!("relattn run: time: {}", split.line());
    let line: Vec<String> = tally
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .counts
        .iter()
        .map(|(k, v)| format!("{v} {k}"))
        .collect();
    // One run, one total: the wall time of the timing line, setup included.
    eprintln!(
        "relattn run: {} in {:.1} s; report in {}",
        line.join(", "),
        split.wall_s,
        dir.display()
    );
    if !summary.all_passed() {
        return Err(exit::failed(format!(
            "{} trial(s) failed or errored, {} compile check(s) failed",
            summary.counts.fail + summary.counts.error,
            summary.compile_checks_failed
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
