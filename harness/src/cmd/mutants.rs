//! `relattn mutants`: build the kernels with each planted defect (`gpu::Mutant::patches`) and check
//! that the matrix catches it on every path whose kernels contain it. Each (defect, path) stops
//! at its first failing trial; cheap cases run first. Exit 1 if any defect survives.

use crate::engine::{CaseStore, Done, Engine, Event, Reporter};
use crate::exit;
use crate::gpu_exec::RealFactory;
use crate::gpu_status::{DeviceSelection, GpuStatus};
use crate::session::{Session, SessionOptions};
use crate::trial_list::{BoundsCheck, PathSelection, TrialKind};
use relattn_kernels::capability::NvmlSource;
use relattn_kernels::gpu::{Gpu, Mutant};
use relattn_reports::{Row, Status};
use relattn_routing::PathId;
use std::time::Instant;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Tier or matrix file whose GPU trials must catch the defects.
    #[arg(long, default_value = "ci")]
    pub matrix: String,
    /// Only these defects (comma-separated names, e.g. kv_head_modulo,window_strict).
    #[arg(long)]
    pub only: Option<String>,
    /// GPU to use.
    #[arg(long, default_value = "0")]
    pub device: u32,
    /// Only this path (then the defects run in this process; otherwise each (defect, path) runs
    /// in a child process, because a trapped kernel leaves its CUDA context unusable).
    #[arg(long)]
    pub path: Option<String>,
    /// Run each (defect, path) under NVIDIA's compute-sanitizer with this tool (memcheck,
    /// initcheck, racecheck or synccheck), every defect built without the bounds check: a defect
    /// is caught when the tool reports an error in a trial (or the output fails). Needs
    /// compute-sanitizer (else exit 3).
    #[arg(long, value_enum, value_name = "TOOL")]
    pub sanitize: Option<crate::sanitize::Tool>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    // Before any GPU detection: no sanitizer, no run (exit 3).
    let sanitizer = crate::sanitize::find(args.sanitize)?;
    let selected: Vec<Mutant> = match &args.only {
        None => Mutant::ALL.to_vec(),
        Some(list) => list
            .split(',')
            .map(|s| {
                s.trim()
                    .parse::<Mutant>()
                    .map_err(|e| exit::usage(e.to_string()))
            })
            .collect::<Result<_, _>>()?,
    };
    // A defect only a sanitizer tool sees runs only under that tool (else it would "survive"
    // by chance): without it, it is listed as not run.
    let tool = args.sanitize.map(|t| t.as_str());
    let (selected, unseen): (Vec<Mutant>, Vec<Mutant>) = selected
        .into_iter()
        .partition(|m| m.seen_by_tool().is_none_or(|t| Some(t) == tool));
    if selected.is_empty() {
        let names: Vec<String> = unseen
            .iter()
            .map(|m| format!("{m} (--sanitize {})", m.seen_by_tool().unwrap_or_default()))
            .collect();
        return Err(exit::usage(format!(
            "only compute-sanitizer sees these defects: {}",
            names.join(", ")
        )));
    }
    if args.path.is_none() {
        for m in &unseen {
            println!(
                "{:<22} not run: only compute-sanitizer sees it (--sanitize {})",
                m.as_str(),
                m.seen_by_tool().unwrap_or_default()
            );
        }
    }
    let only_path = match &args.path {
        Some(p) => Some(
            p.parse::<PathId>()
                .map_err(|e| exit::usage(e.to_string()))?,
        ),
        None => return run_children(&args, &selected),
    };
    // One (defect, path) in this process: sanitized, it runs again under the sanitizer.
    if sanitizer.is_some() {
        let selection = DeviceSelection::List(vec![args.device]);
        let status = crate::gpu_status::detect(&NvmlSource::new(), Gpu::available(), &selection);
        let ready = matches!(status, GpuStatus::Ready { .. });
        crate::sanitize::run_natives_under(sanitizer.as_ref(), "mutants", ready)?;
    }
    let store = CaseStore::keep_all();
    let mut survived = Vec::new();
    for mutant in selected {
        for &path in mutant.paths().iter().filter(|&&p| Some(p) == only_path) {
            let started = Instant::now();
            let opts = SessionOptions {
                gpu_cases: Some(crate::case_set::CaseSet::Matrix(args.matrix.clone())),
                selfcheck_matrix: Some("smoke".into()),
                paths: PathSelection::List(vec![path]),
                bounds: Some(if mutant.needs_bounds_check() && sanitizer.is_none() {
                    BoundsCheck::On
                } else {
                    BoundsCheck::Off
                }),
                shard: None,
                devices: DeviceSelection::List(vec![args.device]),
                case: None,
                filter: None,
                only: None,
                workers: Vec::new(),
                worker_timeout: std::time::Duration::from_secs(1),
                worker_processes: None,
                processes: 1,
                triage: false,
                xfail: None,
                self_checks: Some(false),
            };
            let factory = RealFactory {
                mutant: Some(mutant),
            };
            let mut session =
                Session::open(&opts, &factory).map_err(|e| exit::usage(format!("{e:#}")))?;
            match &session.status {
                GpuStatus::Ready { .. } => {}
                GpuStatus::Rejected(why) => return Err(exit::no_gpu(why.clone())),
                GpuStatus::Absent(why) => {
                    return Err(exit::no_gpu(format!("no usable GPU: {why}")))
                }
            }
            cheapest_gpu_trials_first(&mut session);
            let engine = Engine {
                in_order: Some(&store),
                ..Engine::new(&session)
            };
            let mut verdict = FirstFailure::default();
            engine.run_reporting(&Done::default(), &mut [&mut verdict])?;
            let ran = engine.tally.lock().unwrap_or_else(|e| e.into_inner()).done;
            let caught = verdict.caught;
            let secs = started.elapsed().as_secs_f64();
            match caught {
                Some(row) => println!(
                    "{:<22} {:<13} {:<9} {:>7}  {} ({:.1}s): {}",
                    mutant.as_str(),
                    path.as_str(),
                    "caught",
                    ran,
                    row.trial,
                    secs,
                    row.message.split("; reproduce").next().unwrap_or_default()
                ),
                None => {
                    println!(
                        "{:<22} {:<13} {:<9} {:>7}  - ({secs:.1}s)",
                        mutant.as_str(),
                        path.as_str(),
                        "SURVIVED",
                        ran
                    );
                    survived.push(format!("{mutant} on {path}"));
                }
            }
        }
    }
    if survived.is_empty() {
        Ok(())
    } else {
        Err(exit::failed(format!(
            "planted defects not caught: {}",
            survived.join(", ")
        )))
    }
}

/// Keep the session's GPU trials that run on this machine, the cheapest first (a defect is
/// usually caught by a small case).
fn cheapest_gpu_trials_first(session: &mut Session) {
    session
        .trials
        .retain(|t| matches!(t.kind, TrialKind::Gpu { .. }) && t.ignore.is_none());
    session.trials.sort_by(|a, b| {
        let fa = a.case().map_or(0.0, |c| c.flops());
        let fb = b.case().map_or(0.0, |c| c.flops());
        fa.total_cmp(&fb).then_with(|| a.name.cmp(&b.name))
    });
}

/// The verdict on one (defect, path): the first trial that failed, which is enough.
#[derive(Default)]
struct FirstFailure {
    caught: Option<Row>,
}

impl Reporter for FirstFailure {
    fn event(&mut self, event: &Event<'_>) -> anyhow::Result<()> {
        if let Event::Row(row) = event {
            if row.status == Status::Fail && self.caught.is_none() {
                self.caught = Some((*row).clone());
            }
        }
        Ok(())
    }

    fn enough(&self) -> bool {
        self.caught.is_some()
    }
}

/// Run every (defect, path) pair in its own child process and collect the verdicts.
fn run_children(args: &Args, selected: &[Mutant]) -> anyhow::Result<()> {
    let exe = std::env::current_exe().map_err(|e| exit::usage(format!("locating relattn: {e}")))?;
    precompile(args, selected);
    println!(
        "{:<22} {:<13} {:<9} {:>7}  first failing trial",
        "defect", "path", "result", "trials"
    );
    let mut survived = Vec::new();
    for &mutant in selected {
        for &path in mutant.paths() {
            let out = std::process::Command::new(&exe)
                .args([
                    "mutants",
                    "--matrix",
                    &args.matrix,
                    "--device",
                    &args.device.to_string(),
                ])
                .args(["--only", mutant.as_str(), "--path", path.as_str()])
                .args(
                    args.sanitize
                        .map(|t| vec!["--sanitize".to_string(), t.as_str().to_string()])
                        .unwrap_or_default(),
                )
                .stderr(std::process::Stdio::inherit())
                .output()
                .map_err(|e| exit::usage(format!("running {}: {e}", exe.display())))?;
            print!("{}", String::from_utf8_lossy(&out.stdout));
            match out.status.code() {
                Some(0) => {}
                Some(1) => survived.push(format!("{mutant} on {path}")),
                Some(3) => return Err(exit::no_gpu("no usable GPU for the planted-defect builds")),
                code => {
                    return Err(exit::usage(format!(
                        "{mutant} on {path}: child exited with {code:?}"
                    )))
                }
            }
        }
    }
    if survived.is_empty() {
        println!("every planted defect was caught");
        Ok(())
    } else {
        Err(exit::failed(format!(
            "planted defects not caught: {}",
            survived.join(", ")
        )))
    }
}

/// Compile every defect's programs at once, in parallel, into the disk cache, so the child
/// processes (one per defect and path) only load them. Failures are left for the children to
/// report.
fn precompile(args: &Args, selected: &[Mutant]) {
    use rayon::prelude::*;
    use relattn_kernels::gpu::{compile, CompilePlan, Variant};
    let selection = DeviceSelection::List(vec![args.device]);
    let GpuStatus::Ready { devices, .. } =
        crate::gpu_status::detect(&NvmlSource::new(), Gpu::available(), &selection)
    else {
        return;
    };
    let arch = relattn_kernels::gpu::compile_arch(devices[0].cc);
    let plans: Vec<CompilePlan> = selected
        .iter()
        .filter_map(|&m| {
            let variant = Variant {
                bounds_check: m.needs_bounds_check() && args.sanitize.is_none(),
                mutant: Some(m),
            };
            CompilePlan::new(&arch, variant, m.paths()).ok()
        })
        .collect();
    plans.par_iter().for_each(|plan| {
        let _ = compile(plan);
    });
}
