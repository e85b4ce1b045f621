//! `relattn run`: the main job. Routing checks for every architecture, the reference
//! self-checks of the matrix (or case folder) and, with a usable GPU, the GPU trials; one report
//! directory. This module reads the arguments and sets the run up; the engine runs the trials
//! and tells the run's reporters, the report (`report_life`) and the console (`console`).

use crate::engine::memory_gate::MemoryGate;
use crate::engine::Engine;
use crate::exit;
use crate::gpu_status::GpuStatus;
use crate::progress::{Tally, Ticker};
use crate::runner::ExecutorFactory;
use crate::session::Session;
use relattn_kernels::capability::{CapabilitySource, NvmlSource};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

mod compile_checks;
mod console;
mod environment;
pub mod out;
mod report_life;
mod select;
mod setup;
use console::Console;
use report_life::ReportLife;
use setup::{check_processes, sanitized_devices, session_options};

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
    check_processes(args.processes)?;
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
        .map(select::failed_trials)
        .transpose()?;
    if rerun.as_ref().is_some_and(|(_, names)| names.is_empty()) {
        return Ok(());
    }
    let sanitizer = crate::sanitize::find(args.sanitize)?;
    if sanitizer.is_some() {
        sanitized_devices(&args)?;
    }
    let opts = session_options(&args, rerun.as_ref(), sanitizer.as_ref())?;
    let report_out = out::resolve(args.out.as_deref(), args.resume).map_err(exit::usage)?;
    // At once, before anything slow: a second run into this --out stops here naming the first.
    let _lock = crate::run_lock::RunLock::acquire(&report_out.dir).map_err(exit::usage)?;
    crate::trace::init().map_err(exit::usage)?;
    let run_started = Instant::now();
    let tally = Arc::new(Mutex::new(Tally {
        phase: "setup (matrix, devices, kernels, workers)",
        ..Tally::default()
    }));
    let ticker = Ticker::start(tally.clone());
    let session = Session::open_with(&opts, source, libs_present, factory)
        .map_err(|e| exit::usage(format!("{e:#}")))?;
    let arch = setup::arch(&session, args.require_gpu)?;
    console::header(&session, &arch, sanitizer.as_ref());
    let env = environment::run_environment(&session, &args, sanitizer.as_ref());
    let Some(mut report) = ReportLife::open(&report_out, &arch, env, &session.trials, args.resume)?
    else {
        return Ok(());
    };
    let failures = report.failures();
    let engine = Engine {
        keep: Some(&failures),
        processes: args.processes,
        tally: tally.clone(),
        max_fail: args.max_fail,
        memory_gate: MemoryGate::for_machine(),
        ..Engine::new(&session)
    };
    let mut console = Console::new(tally);
    let checks = compile_checks::start(&args, session.executor_ref().is_some());
    let stop = engine.run_reporting(&report.done(), &mut [&mut console, &mut report])?;
    console.trials_over();
    // A failed compile check counts like a failing trial. A run stopped early does not wait for
    // them (its report is INCOMPLETE anyway).
    if let Some(checks) = checks.filter(|_| stop.is_none() && !crate::engine::stopping()) {
        engine.phase("compile checks", &mut [&mut console, &mut report])?;
        report.record_compile_checks(checks.wait());
    }
    // The trials are over: no progress line after this point.
    drop(ticker);
    if let Some(x) = &session.xfail {
        console.unmatched(&report.record_xfail(x));
    }
    let split = crate::phases::split(run_started.elapsed().as_secs_f64());
    let finished = report.finish(&split)?;
    console.closing(&split, &finished.dir);
    finished.verdict()
}

#[cfg(test)]
mod tests;
