//! `relattn run`: the main job. Routing checks for every architecture, the reference
//! self-checks of the matrix and, with a usable GPU, the GPU trials; one report directory.

use crate::ahead::Ahead;
use crate::execute::{failure_text, run_trial, start_trial, CaseStore, Runners, Step};
use crate::exit;
use crate::gpu_status::{DeviceSelection, GpuStatus};
use crate::plan::{BoundsCheck, PathSelection, Trial, TrialKind};
use crate::progress::{Tally, Ticker};
use crate::runner::Target;
use crate::session::{ExecutorFactory, Session, SessionOptions};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use relattn_kernels::capability::{CapabilitySource, NvmlSource};
use relattn_matrices::{Case, Shard};
use relattn_reports::{ReportWriter, Row};
use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod compile_checks;
mod environment;
use compile_checks::{run_compile_checks, wants_compile_checks};
use environment::{check_identity, environment, run_identity, IDENTITY_KEY};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Tier (smoke, ci, nightly, regressions) or a matrix file. Default: ci with a GPU, smoke without.
    #[arg(long)]
    pub matrix: Option<String>,
    /// Native GPU paths: routed (the device's production path), all, none, or a list like
    /// score_mod,fallback.
    #[arg(long, default_value = "all")]
    pub paths: String,
    /// Run shard K of N of the matrix (1-based), e.g. 2/8.
    #[arg(long)]
    pub shard: Option<String>,
    /// Report directory; the report goes to OUT/<arch> (sm90, sm100, ... or cpu).
    #[arg(long, default_value = "reports-out")]
    pub out: PathBuf,
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
    /// Leave out the compile-only check of every program for every supported architecture
    /// (NVRTC time on a cold cache; for quick iterations on one GPU, not for CI).
    #[arg(long)]
    pub no_compile_checks: bool,
    /// Also run a shipped worker's paths (repeatable or comma-separated): numpy, vllm, fa4,
    /// flex, faulty (adapters/NAME_worker.py).
    #[arg(long = "impl", value_name = "NAME")]
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
    /// Also run the reference self-checks (oracle, paging, layouts, chunking, merge, sampling)
    /// on a machine with a usable GPU; without a GPU they always run.
    #[arg(long)]
    pub self_checks: bool,
    /// This run is one of N runs side by side on this machine (e.g. the nightly's shards on one
    /// GPU machine, `ci/nightly-machine.sh`): it takes 1/N of the cores (unless
    /// RAYON_NUM_THREADS says) and of the memory for cases prepared ahead.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub processes: usize,
}

/// Set by the first SIGINT, SIGTERM or SIGHUP: no trial starts after it; the run writes an
/// INCOMPLETE report.
static STOP: AtomicBool = AtomicBool::new(false);

/// Threads judging the GPU runs of each device thread.
const JUDGES_PER_DEVICE: usize = 2;

fn stopping() -> bool {
    STOP.load(Ordering::SeqCst)
}

/// SIGINT (Ctrl-C), SIGTERM (a CI runner's timeout or cancel) and SIGHUP (a closed terminal)
/// stop the run after the trials in flight and leave an INCOMPLETE report that `--resume`
/// continues; a second one ends the process at once (workers and their temporary files
/// included). Workers run in process groups of their own, so a terminal's Ctrl-C reaches this
/// process alone and the trials in flight finish.
fn handle_signals() {
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        let installed = ctrlc::set_handler(|| {
            if STOP.swap(true, Ordering::SeqCst) {
                eprintln!("relattn run: second interrupt, stopping now");
                crate::worker::end_all();
                std::process::exit(130);
            }
            eprintln!(
                "relattn run: interrupted (SIGINT, SIGTERM or SIGHUP): finishing the trials in \
                 flight, then writing an INCOMPLETE report (interrupt again to stop at once)"
            );
        });
        if let Err(e) = installed {
            eprintln!(
                "relattn run: cannot handle SIGINT, SIGTERM and SIGHUP ({e}); an interrupt ends \
                 the run at once"
            );
        }
    });
}

pub fn run(args: Args) -> anyhow::Result<()> {
    handle_signals();
    share_machine(args.processes)?;
    let libs = crate::gpu_exec::libraries_present();
    let factory = factory(&args);
    run_with(args, &NvmlSource::new(), libs, &factory)
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
    let opts = SessionOptions {
        gpu_matrix: args.matrix.clone(),
        selfcheck_matrix: None,
        paths: args.paths.parse::<PathSelection>().map_err(exit::usage)?,
        bounds: args
            .bounds_check
            .as_deref()
            .map(str::parse::<BoundsCheck>)
            .transpose()
            .map_err(exit::usage)?,
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
        workers: crate::worker::specs(&args.impls, &args.workers).map_err(exit::usage)?,
        worker_timeout: crate::worker::timeout(args.worker_timeout_s).map_err(exit::usage)?,
        self_checks: args.self_checks.then_some(true),
    };
    // At once, before anything slow: a second run into this --out stops here naming the first.
    let _lock = crate::run_lock::RunLock::acquire(&args.out).map_err(exit::usage)?;
    let run_started = Instant::now();
    let tally = Arc::new(Mutex::new(Tally {
        phase: "setup (matrix, devices, kernels, workers)",
        ..Tally::default()
    }));
    let _ticker = Ticker::start(tally.clone());
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
        "relattn run: matrix `{}`, {} trials; {}",
        session.gpu_matrix,
        session.trials.len(),
        session.gpu_line()
    );
    if arch == "cpu" {
        eprintln!(
            "relattn run: no usable GPU, running the CPU part (routing and reference checks) only"
        );
    }
    let mut env = environment(&session, &args);
    let identity = run_identity(&session, &args);
    env.extra.insert(IDENTITY_KEY.into(), identity.clone());
    let arch_dir = args.out.join(&arch);
    // Any file `report show` reads as a report counts (a CSV-only report too): never overwritten.
    let has_report = ["results.jsonl", "summary.json", "results.csv"]
        .iter()
        .any(|f| arch_dir.join(f).is_file());
    let (mut writer, done) = if has_report && args.resume {
        let kept = relattn_reports::load_arch(&arch_dir)
            .map_err(|e| exit::usage(format!("--resume: {e}")))?;
        check_identity(&arch_dir, &kept.environment, &identity)?;
        env.started = kept.environment.started.clone();
        let mut resumed = kept
            .environment
            .extra
            .get("resumed")
            .and_then(|v| v.as_array().cloned())
            .unwrap_or_default();
        resumed.push(serde_json::json!(relattn_reports::now()));
        env.extra.insert("resumed".into(), resumed.into());
        let (writer, rows) = ReportWriter::resume(&args.out, &arch, env)?;
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
            ReportWriter::create(&args.out, &arch, env)?,
            Default::default(),
        )
    };
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
    execute_all(&session, &done, Some(&failures), args.processes, |row| {
        if bar.is_hidden() && started.elapsed() > Duration::from_secs(2) {
            bar.set_draw_target(ProgressDrawTarget::stderr());
        }
        {
            let mut t = tally.lock().unwrap_or_else(|e| e.into_inner());
            t.done += 1;
            *t.counts.entry(row.status.as_str()).or_default() += 1;
        }
        if row.status.is_bad() {
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
    if let Some(checks) = checks.filter(|_| !stopping()) {
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
    let split = crate::phases::split(run_started.elapsed().as_secs_f64());
    writer
        .environment_mut()
        .extra
        .insert("phases".into(), split.json());
    let dir = writer.dir().to_path_buf();
    if stopping() {
        let done = writer.rows().len();
        writer.finish_incomplete()?;
        return Err(exit::failed(format!(
            "interrupted after {done} of {} trials; the report in {} is INCOMPLETE: continue \
             it with the same command and --resume",
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
    eprintln!(
        "relattn run: {} in {:.1}s; report in {}",
        line.join(", "),
        started.elapsed().as_secs_f64(),
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

/// Run every trial (CPU ones on threads of their own, native GPU ones on one thread per device,
/// each worker's on one thread) and hand each row to `on_row` (on this thread) as soon as it
/// finishes. Failing worker trials keep their case and output files under `keep`. The run is
/// one of `processes` on this machine (its share of the memory for cases prepared ahead).
fn execute_all(
    session: &Session,
    done: &std::collections::HashSet<String>,
    keep: Option<&std::path::Path>,
    processes: usize,
    mut on_row: impl FnMut(Row),
) {
    let (tx, rx) = mpsc::channel::<Row>();
    let trials: Vec<Trial> = session
        .trials
        .iter()
        .filter(|t| !done.contains(&t.name))
        .cloned()
        .collect();
    let store = Arc::new(CaseStore::for_trials(&trials));
    let (runs, cpu): (Vec<Trial>, Vec<Trial>) = trials
        .into_iter()
        .partition(|t| matches!(t.kind, TrialKind::Gpu { .. }) && t.ignore.is_none());
    // Native trials go to the device threads, each worker's to a thread of its own (a worker
    // process serves one request at a time).
    let mut per_worker: Vec<Vec<Trial>> = vec![Vec::new(); session.workers.len()];
    let mut gpu = Vec::new();
    for t in runs {
        match &t.kind {
            TrialKind::Gpu {
                target: Target::Worker { worker, .. },
                ..
            } if *worker < per_worker.len() => per_worker[*worker].push(t),
            _ => gpu.push(t),
        }
    }
    let matrix = session.gpu_matrix.clone();
    std::thread::scope(|scope| {
        // GPU trials grouped by case, so a case's reference and upload serve all its trials.
        let mut by_case: BTreeMap<String, Vec<Trial>> = BTreeMap::new();
        for t in gpu {
            let id = t.case().map(|c| c.id.clone()).unwrap_or_default();
            by_case.entry(id).or_default().push(t);
        }
        let groups: Vec<Vec<Trial>> = by_case.into_values().collect();
        // The queue's cases are generated and their references computed on CPU threads of
        // their own, ahead of the device threads, so the GPU rarely waits (bounded in memory).
        let cases: Vec<Arc<Case>> = groups
            .iter()
            .filter_map(|g| g.first().and_then(Trial::case).cloned())
            .collect();
        let (ahead, preparers) = Ahead::for_machine(cases, processes);
        let ahead = Arc::new(ahead);
        let queue = Arc::new(Mutex::new(
            groups.into_iter().enumerate().collect::<VecDeque<_>>(),
        ));
        if let Some(exec) = session.executor_ref() {
            for _ in 0..preparers {
                let (ahead, store) = (ahead.clone(), store.clone());
                scope.spawn(move || ahead.work(&store, stopping));
            }
            // Device threads run the kernels and leave the judging to threads of their own
            // (a short queue: a run waiting for its judge holds its output).
            let (to_judge, judged) = mpsc::sync_channel::<(Trial, Step)>(2 * JUDGES_PER_DEVICE);
            let judged = Arc::new(Mutex::new(judged));
            for _ in 0..JUDGES_PER_DEVICE * session.device_count() {
                let (judged, tx, store, matrix) =
                    (judged.clone(), tx.clone(), store.clone(), matrix.clone());
                scope.spawn(move || loop {
                    let next = judged.lock().unwrap_or_else(|e| e.into_inner()).recv();
                    let Ok((t, step)) = next else {
                        break;
                    };
                    let _ = tx.send(step.finish(&t, &store, &Runners::default(), &matrix));
                });
            }
            let mut devices = Vec::new();
            for slot in 0..session.device_count() {
                let (queue, to_judge, store, ahead) = (
                    queue.clone(),
                    to_judge.clone(),
                    store.clone(),
                    ahead.clone(),
                );
                devices.push(scope.spawn(move || loop {
                    let next = queue.lock().unwrap_or_else(|e| e.into_inner()).pop_front();
                    let Some((index, group)) = next.filter(|_| !stopping()) else {
                        break;
                    };
                    ahead.taken(index);
                    let runners = Runners::native(Some((exec, slot)));
                    for t in group {
                        if stopping() {
                            break;
                        }
                        let step = start_trial(&t, &store, &runners);
                        let _ = to_judge.send((t, step));
                    }
                }));
            }
            drop(to_judge);
            let ahead = ahead.clone();
            scope.spawn(move || {
                for d in devices {
                    let _ = d.join();
                }
                ahead.finish();
            });
        }
        for trials in per_worker {
            let (tx, store, matrix) = (tx.clone(), store.clone(), matrix.clone());
            let runners = Runners {
                keep,
                ..session.runners(0)
            };
            scope.spawn(move || {
                for t in &trials {
                    if stopping() {
                        break;
                    }
                    let _ = tx.send(run_trial(t, &store, &runners, &matrix));
                }
            });
        }
        // CPU trials on threads of their own, not as jobs of rayon's pool: a trial may wait
        // for a case another thread is building with the pool's parallel loops, and a pool
        // thread parked in that wait could leave those loops without threads (a deadlock).
        let cpu = Arc::new(Mutex::new(VecDeque::from(cpu)));
        for _ in 0..rayon::current_num_threads() {
            let (cpu, tx, store, matrix) = (cpu.clone(), tx.clone(), store.clone(), matrix.clone());
            scope.spawn(move || loop {
                let next = cpu.lock().unwrap_or_else(|e| e.into_inner()).pop_front();
                let Some(t) = next.filter(|_| !stopping()) else {
                    break;
                };
                let _ = tx.send(run_trial(&t, &store, &Runners::default(), &matrix));
            });
        }
        drop(tx);
        for row in rx {
            on_row(row);
        }
    });
}

#[cfg(test)]
mod tests;
