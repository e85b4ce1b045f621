//! A session: the cases (a matrix or a case folder), the GPU decision and the trial list, shared
//! by `relattn run` and the `cargo test` harness. The GPU decision comes first and the executor (the only thing that
//! compiles kernels or touches device memory) is created last, only for a usable device.

use crate::case_set::CaseSet;
use crate::engine::runners::Runners;
use crate::gpu_status::{detect, DeviceSelection, GpuStatus};
use crate::runner::{ExecutorFactory, Runner};
use crate::trial_list::{
    bad_file_trials, check_trial_count, gpu_trials, reference_trials, routing_trials,
    worker_trial_count, worker_trials, BoundsCheck, PathSelection, Trial,
};
use crate::worker::{self, WorkerRunner, WorkerSpec};
use anyhow::Context;
use relattn_kernels::capability::{CapabilitySource, NvmlSource};
use relattn_matrices::{Case, Shard};
use relattn_routing::PathId;
use std::sync::Arc;

#[derive(Debug, Clone)]
pub struct SessionOptions {
    /// The cases of the GPU trials (a matrix or a case folder); None: the `ci` tier with a
    /// GPU, `smoke` without.
    pub gpu_cases: Option<CaseSet>,
    /// Tier or file of the reference self-checks; None: the GPU matrix.
    pub selfcheck_matrix: Option<String>,
    pub paths: PathSelection,
    /// None: the tier's default (`ci` and `regressions` run both).
    pub bounds: Option<BoundsCheck>,
    pub shard: Option<Shard>,
    pub devices: DeviceSelection,
    /// Keep only cases whose id starts with this.
    pub case: Option<String>,
    /// Keep only the trials this selects (`--filter`, `-k`, `RELATTN_FILTER`).
    pub filter: Option<crate::filter::Filter>,
    /// Keep only trials of these names (`--rerun-failed`).
    pub only: Option<std::collections::BTreeSet<String>>,
    /// Workers whose paths become trials too (`--impl`, `--worker`).
    pub workers: Vec<WorkerSpec>,
    pub worker_timeout: std::time::Duration,
    /// Processes per worker (`--worker-processes`); None: [`worker::default_pool_size`].
    pub worker_processes: Option<usize>,
    /// This run is one of this many side by side (`--processes`): its share of the machine.
    pub processes: usize,
    /// Run failing and erroring GPU trials again in variants that tell causes apart
    /// (`--no-triage` turns it off; `RELATTN_TRIAGE=0` under `cargo test`).
    pub triage: bool,
    /// The expected failures of `--xfail FILE` (`RELATTN_XFAIL` under `cargo test`).
    pub xfail: Option<std::path::PathBuf>,
    /// The reference self-checks: None runs them only where no GPU is usable (a GPU run leaves
    /// them to CPU CI), true always.
    pub self_checks: Option<bool>,
}

impl SessionOptions {
    /// `cargo test`: self-checks on smoke; GPU tier from `RELATTN_MATRIX`, or a case folder from
    /// `RELATTN_CASES` (with `RELATTN_SPLITS` and `RELATTN_KEEP_GOING=1` as `run`'s `--splits`
    /// and `--keep-going`); workers from `RELATTN_IMPL` (names, comma-separated) and
    /// `RELATTN_WORKER` (one command line).
    pub fn for_cargo_test() -> anyhow::Result<SessionOptions> {
        SessionOptions::from_vars(|name| std::env::var(name).ok())
    }

    /// `for_cargo_test` with the environment given (`lookup` of a variable's name).
    pub fn from_vars(lookup: impl Fn(&str) -> Option<String>) -> anyhow::Result<SessionOptions> {
        let var = |name| lookup(name).filter(|s: &String| !s.trim().is_empty());
        let impls: Vec<String> = var("RELATTN_IMPL").into_iter().collect();
        let commands: Vec<String> = var("RELATTN_WORKER").into_iter().collect();
        let workers = worker::specs(&impls, &commands).map_err(crate::exit::usage)?;
        let filter = var("RELATTN_FILTER")
            .map(|f| crate::filter::Filter::parse(&f))
            .transpose()
            .map_err(|e| crate::exit::usage(format!("RELATTN_FILTER: {e}")))?;
        let worker_timeout = match var("RELATTN_WORKER_TIMEOUT_S") {
            None => worker::timeout(worker::DEFAULT_TIMEOUT_S),
            Some(s) => s
                .trim()
                .parse::<f64>()
                .map_err(|_| format!("RELATTN_WORKER_TIMEOUT_S={s}: not a number"))
                .and_then(worker::timeout),
        }
        .map_err(crate::exit::usage)?;
        let worker_processes = var("RELATTN_WORKER_PROCESSES")
            .map(|s| {
                s.trim()
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=worker::MAX_POOL).contains(n))
                    .ok_or_else(|| {
                        crate::exit::usage(format!(
                            "RELATTN_WORKER_PROCESSES={s}: expected a number from 1 to {}",
                            worker::MAX_POOL
                        ))
                    })
            })
            .transpose()?;
        let gpu_cases = match (var("RELATTN_MATRIX"), var("RELATTN_CASES")) {
            (Some(_), Some(_)) => {
                return Err(crate::exit::usage(
                    "RELATTN_MATRIX and RELATTN_CASES are both set: a run takes a matrix or a \
                     case folder, not both",
                ))
            }
            (Some(m), None) => Some(CaseSet::Matrix(m)),
            (None, Some(dir)) => Some(CaseSet::Folder {
                dir: dir.into(),
                splits: match var("RELATTN_SPLITS") {
                    Some(s) => relattn_matrices::parse_splits(&s)
                        .map_err(|e| crate::exit::usage(format!("RELATTN_SPLITS: {e}")))?,
                    None => relattn_matrices::DEFAULT_FOLDER_SPLITS.to_vec(),
                },
                keep_going: var("RELATTN_KEEP_GOING").is_some_and(|v| v != "0"),
            }),
            (None, None) => None,
        };
        Ok(SessionOptions {
            gpu_cases,
            selfcheck_matrix: Some("smoke".into()),
            paths: PathSelection::All,
            bounds: None,
            shard: None,
            devices: DeviceSelection::default(),
            case: None,
            filter,
            only: None,
            workers,
            worker_timeout,
            worker_processes,
            processes: 1,
            triage: var("RELATTN_TRIAGE").is_none_or(|v| v.trim() != "0"),
            xfail: var("RELATTN_XFAIL").map(Into::into),
            self_checks: Some(true),
        })
    }
}

pub struct Session {
    pub status: GpuStatus,
    /// Where the GPU trials' cases come from.
    pub set: CaseSet,
    pub trials: Vec<Trial>,
    /// Cases of the GPU trials (after shard and filter).
    pub cases: Vec<Arc<Case>>,
    executor: Option<Box<dyn Runner>>,
    /// The workers, started and greeted, in `SessionOptions::workers` order.
    pub workers: Vec<Arc<WorkerRunner>>,
    worker_runners: Vec<Arc<dyn Runner>>,
    /// Failing GPU trials are triaged (`SessionOptions::triage`).
    pub triage: bool,
    /// Expected failures (`SessionOptions::xfail`).
    pub xfail: Option<crate::xfail::XFails>,
}

impl Session {
    /// The real machine's devices (NVML for capabilities, whether the CUDA libraries load),
    /// with the executor `factory` makes for them (the caller's: the production build, a
    /// planted defect's, a test's).
    pub fn open(opts: &SessionOptions, factory: &dyn ExecutorFactory) -> anyhow::Result<Session> {
        let libs = relattn_kernels::gpu::Gpu::available();
        Session::open_with(opts, &NvmlSource::new(), libs, factory)
    }

    /// `open` with the capability source given too (tests count calls).
    pub fn open_with(
        opts: &SessionOptions,
        source: &dyn CapabilitySource,
        libs_present: bool,
        factory: &dyn ExecutorFactory,
    ) -> anyhow::Result<Session> {
        // A bad xfail file is the user's to fix, before anything slow.
        let xfail = opts
            .xfail
            .as_deref()
            .map(crate::xfail::XFails::load)
            .transpose()
            .map_err(crate::exit::usage)?;
        let status = detect(source, libs_present, &opts.devices);
        let gpu_usable = matches!(status, GpuStatus::Ready { .. });
        let set = opts
            .gpu_cases
            .clone()
            .unwrap_or_else(|| CaseSet::Matrix(if gpu_usable { "ci" } else { "smoke" }.into()));
        let bounds = opts
            .bounds
            .unwrap_or_else(|| BoundsCheck::default_for(&set.name()));
        let (cases, mut too_large, bad_files) = match &set {
            CaseSet::Matrix(m) => {
                let (cases, too_large) = load_cases(m, opts, gpu_usable)?;
                (cases, too_large, Vec::new())
            }
            CaseSet::Folder {
                dir,
                splits,
                keep_going,
            } => {
                let (cases, bad) = load_folder(dir, splits, *keep_going, opts)?;
                (cases, TooLarge::new(), bad)
            }
        };
        let mut trials = routing_trials();
        let mut status = status;
        let mut executor = None;
        if let GpuStatus::Ready { devices, routed } = &status {
            let paths: Vec<PathId> = match &opts.paths {
                PathSelection::Routed => vec![*routed],
                PathSelection::All => PathId::ALL.to_vec(),
                PathSelection::List(v) => v.clone(),
            };
            if !paths.is_empty() {
                let created = crate::phases::time(crate::phases::Phase::Compile, || {
                    factory.create(devices, bounds, &paths)
                });
                match created {
                    Ok(e) => executor = Some(e),
                    Err(e) => status = GpuStatus::Absent(format!("GPU setup failed: {e}")),
                }
            }
        }
        // A run with a usable GPU leaves the self-checks to CPU CI unless asked for them, and so
        // does a run of workers alone (`--paths none`): it asked for their trials only.
        let gpu_run = matches!(status, GpuStatus::Ready { .. });
        let workers_only = matches!(&opts.paths, PathSelection::List(v) if v.is_empty())
            && !opts.workers.is_empty();
        if opts.self_checks.unwrap_or(!gpu_run && !workers_only) {
            let self_cases = match &opts.selfcheck_matrix {
                Some(m) if CaseSet::Matrix(m.clone()) != set => {
                    let (cases, more) = load_cases(m, opts, gpu_usable)?;
                    too_large.extend(more);
                    cases
                }
                _ => cases.clone(),
            };
            trials.extend(reference_trials(&self_cases));
        }
        trials.extend(gpu_trials(&cases, &status, &opts.paths, bounds));
        // Workers start after the device check: a rejected device stops the run before them.
        let workers = if matches!(status, GpuStatus::Rejected(_)) {
            Vec::new()
        } else {
            let gpus = match &status {
                GpuStatus::Ready { devices, .. } => devices.iter().map(|d| d.index).collect(),
                _ => Vec::new(),
            };
            let pool = worker::Pool {
                size: opts.worker_processes.unwrap_or_else(|| {
                    worker::default_pool_size(gpus.len(), opts.processes, opts.workers.len())
                }),
                devices: gpus,
            };
            worker::start_all(&opts.workers, opts.worker_timeout, &pool)
                .map_err(crate::exit::usage)?
        };
        let info: Vec<_> = workers
            .iter()
            .enumerate()
            .map(|(i, w)| (i, &w.hello, w.spec.label.as_str()))
            .collect();
        check_trial_count(trials.len() as u64, worker_trial_count(&cases, &info))
            .map_err(crate::exit::usage)?;
        trials.extend(worker_trials(&cases, &info));
        trials.extend(bad_file_trials(&bad_files));
        // Without a usable GPU, a case too large for this machine is not refused: its trials
        // (GPU ones skip anyway) say it needs a larger host.
        for t in &mut trials {
            if let Some(why) = t.case().and_then(|c| too_large.get(&c.id)) {
                t.ignore.get_or_insert_with(|| why.clone());
            }
        }
        crate::filter::retain(&mut trials, opts.filter.as_ref());
        if let Some(only) = &opts.only {
            trials.retain(|t| only.contains(&t.name));
        }
        if trials.is_empty() && (opts.filter.is_some() || opts.only.is_some()) {
            return Err(crate::exit::usage(format!(
                "no trial of {} is selected{}",
                match &set {
                    CaseSet::Matrix(m) => format!("matrix `{m}`"),
                    CaseSet::Folder { dir, .. } => format!("case folder {}", dir.display()),
                },
                if opts.only.is_some() {
                    ": none of the trials to run again is in this run (give the run's own \
                     --matrix or --cases, --splits, --paths and workers)"
                } else {
                    " by --filter"
                }
            )));
        }
        let worker_runners = workers
            .iter()
            .map(|w| w.clone() as Arc<dyn Runner>)
            .collect();
        Ok(Session {
            status,
            set,
            trials,
            cases,
            executor,
            workers,
            worker_runners,
            triage: opts.triage,
            xfail,
        })
    }

    /// The runners of this session's trials, the native one on device slot `slot`.
    pub fn runners(&self, slot: usize) -> Runners<'_> {
        Runners {
            native: self.executor.as_deref().map(|e| (e, slot)),
            workers: &self.worker_runners,
            keep: None,
            worker_slot: 0,
            triage: self.triage,
            xfail: self.xfail.as_ref(),
        }
    }

    pub fn executor_ref(&self) -> Option<&dyn Runner> {
        self.executor.as_deref()
    }

    /// Number of device workers.
    pub fn device_count(&self) -> usize {
        match &self.status {
            GpuStatus::Ready { devices, .. } if self.executor.is_some() => devices.len(),
            _ => 0,
        }
    }

    /// One line on the GPU situation.
    pub fn gpu_line(&self) -> String {
        match &self.status {
            GpuStatus::Ready { devices, routed } => {
                let names: Vec<String> = devices
                    .iter()
                    .map(|d| format!("GPU {} {} (SM {})", d.index, d.name, d.cc))
                    .collect();
                format!("{}; production path {routed}", names.join(", "))
            }
            other => other.unusable_reason().unwrap_or_default(),
        }
    }
}

/// Ids of cases too large for this machine, with why.
type TooLarge = std::collections::BTreeMap<String, String>;

/// The cases of `matrix` with the session's shard and case filter, and the ids of cases too
/// large for this machine with why. A case over the case limit refuses the run when a GPU would
/// run it (`gpu_usable`); without one it is only listed, and its trials are not run.
fn load_cases(
    matrix: &str,
    opts: &SessionOptions,
    gpu_usable: bool,
) -> anyhow::Result<(Vec<Arc<Case>>, TooLarge)> {
    let m = relattn_matrices::load(matrix).with_context(|| format!("loading matrix `{matrix}`"))?;
    let expansion = m
        .expand()
        .with_context(|| format!("expanding matrix `{matrix}`"))?;
    let mut cases = match opts.shard {
        Some(s) => s.select(&expansion.cases),
        None => expansion.cases.clone(),
    };
    if let Some(prefix) = &opts.case {
        cases.retain(|c| c.id.starts_with(prefix.as_str()));
        if cases.is_empty() {
            return Err(crate::exit::usage(crate::case_by_id::no_case_message(
                &format!("`{matrix}`"),
                prefix,
            )));
        }
    }
    // Before anything is generated: a case too large for this machine is refused with the limit.
    let limit = relattn_reference::limits::max_case_bytes();
    let mut too_large = std::collections::BTreeMap::new();
    for case in &cases {
        if let Err(e) = case.check_bytes(limit) {
            if gpu_usable {
                return Err(crate::exit::usage(format!("matrix `{matrix}`: {e}")));
            }
            too_large.insert(
                case.id.clone(),
                format!("needs a host with more memory (a GPU host): {e}"),
            );
        }
    }
    Ok((cases.into_iter().map(Arc::new).collect(), too_large))
}

/// The cases of the case folder `dir` with the session's shard and case selection, and its
/// invalid files. An invalid file refuses the run (naming every one, one a line) unless
/// `keep_going`; then each is listed here and becomes a skipped trial.
fn load_folder(
    dir: &std::path::Path,
    splits: &[relattn_matrices::SplitSetting],
    keep_going: bool,
    opts: &SessionOptions,
) -> anyhow::Result<(Vec<Arc<Case>>, Vec<relattn_matrices::BadFile>)> {
    let limit = relattn_reference::limits::max_case_bytes();
    let folder = relattn_matrices::load_folder(dir, splits, opts.case.as_deref(), limit)
        .map_err(|e| crate::exit::usage(e.to_string()))?;
    let shown = dir.display();
    for (file, first) in &folder.duplicates {
        eprintln!(
            "relattn: case folder {shown}: {file} holds the bytes of {first}: run once, as {first}"
        );
    }
    let lines: Vec<String> = folder
        .bad
        .iter()
        .map(|b| format!("  {}: {}", one_line(&b.relative), one_line(&b.reason)))
        .collect();
    if !folder.bad.is_empty() {
        let head = format!(
            "case folder {shown}: {} of {} case files are not valid",
            folder.bad.len(),
            folder.bad.len() + folder.cases.len() + folder.duplicates.len()
        );
        if !keep_going {
            return Err(crate::exit::usage(format!(
                "{head} (nothing was run; fix or remove them, or give --keep-going \
                 (RELATTN_KEEP_GOING=1 under cargo test) to run the \
                 others):\n{}",
                lines.join("\n")
            )));
        }
        eprintln!(
            "relattn: {head}; they are skipped (--keep-going):\n{}",
            lines.join("\n")
        );
    }
    if folder.cases.is_empty() {
        return Err(crate::exit::usage(match &opts.case {
            Some(prefix) => {
                crate::case_by_id::no_case_message(&format!("case folder {shown}"), prefix)
            }
            None => format!("case folder {shown} holds no valid case file (*.safetensors)"),
        }));
    }
    let (cases, bad) = match opts.shard {
        // The invalid files' trials go to the first shard only: merged, each is there once.
        Some(s) => (
            s.select(&folder.cases),
            if s.index == 1 { folder.bad } else { Vec::new() },
        ),
        None => (folder.cases, folder.bad),
    };
    Ok((cases.into_iter().map(Arc::new).collect(), bad))
}

/// `text` with its control characters escaped (`\n`, `\u{1b}`): a file name holding a newline
/// stays on its line.
fn one_line(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}
