//! `relattn exec`: run one implementation on one case file and write `out` (F32 `[T, H, D]`, as
//! read back, padding rows included) as safetensors, so a case captured anywhere replays on any
//! path: a native GPU path (`--path score_mod`), or a worker's path (`--impl vllm --path
//! vllm_op`, `--worker "<command>" --path P`).
//!
//! Whether a native path can take the case is decided before any GPU work (exit 2 with the
//! reason, also on machines without a GPU); no usable driver exits 3; a kernel trap or fault, or
//! a worker that fails, exits 1; a worker that cannot take the case exits 2.

use crate::exit::{no_gpu, usage};
use crate::gpu_exec::{classify, RealFactory};
use crate::gpu_status::{detect, DeviceSelection, GpuStatus};
use crate::runner::ExecutorFactory;
use crate::runner::{RunOutput, RunRequest, Runner, Target};
use crate::trial_list::BoundsCheck;
use crate::worker::{self, WorkerRunner};
use relattn_common::files::same_file;
use relattn_kernels::capability::NvmlSource;
use relattn_kernels::gpu::{self, Geometry, Gpu};
use relattn_matrices::SplitSetting;
use relattn_reference::casefile::{read_case, write_impl_output};
use relattn_reference::transform::with_layout;
use relattn_reference::Problem;
use relattn_routing::PathId;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The path to run: sheared_bias, score_mod or fallback; with --impl or --worker, one of the
    /// worker's paths (e.g. vllm_op, numpy).
    #[arg(long)]
    pub path: String,
    /// Case file (safetensors, as written by `relattn gen`).
    #[arg(long)]
    pub input: PathBuf,
    /// Where to write `out` (safetensors, F32 `[T, H, D]`).
    #[arg(long)]
    pub output: PathBuf,
    /// Force this many KV splits (default: the path's production policy).
    #[arg(long)]
    pub splits: Option<usize>,
    /// GPU ordinal (native paths).
    #[arg(long, default_value_t = 0)]
    pub device: usize,
    /// Build the kernels with RELATTN_BOUNDS_CHECK (every index checked; a violation traps).
    #[arg(long)]
    pub bounds_check: bool,
    #[arg(
        long = "impl",
        value_name = "NAME",
        conflicts_with = "worker",
        help = crate::worker::impl_help("Run the path on a shipped worker")
    )]
    pub implementation: Option<String>,
    /// Run the path on a worker speaking worker protocol v1, e.g. "python3 my_worker.py".
    #[arg(long, value_name = "COMMAND")]
    pub worker: Option<String>,
    /// Seconds the worker may take to answer before it is killed.
    #[arg(long, default_value_t = worker::DEFAULT_TIMEOUT_S)]
    pub worker_timeout_s: f64,
    /// Run under NVIDIA's compute-sanitizer with this tool (memcheck, initcheck, racecheck or
    /// synccheck): a report is a failure (exit 1) with the tool's class. Needs
    /// compute-sanitizer on PATH or in RELATTN_SANITIZER (else exit 3).
    #[arg(long, value_enum, value_name = "TOOL")]
    pub sanitize: Option<crate::sanitize::Tool>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    // Before any GPU detection: no sanitizer, no run (exit 3).
    let sanitizer = crate::sanitize::find(args.sanitize)?;
    if same_file(&args.input, &args.output) {
        return Err(usage(format!(
            "--output {} is the input file: write the output to another file",
            args.output.display()
        )));
    }
    let case = read_case(&args.input).map_err(|e| usage(e.to_string()))?;
    let problem = if case.problem.layout == case.meta.cache_layout {
        case.problem
    } else {
        with_layout(&case.problem, case.meta.cache_layout)
    };
    if args.splits == Some(0) {
        return Err(usage("--splits 0: a run has at least 1 split"));
    }
    let split = args
        .splits
        .map_or(SplitSetting::Policy, SplitSetting::Forced);
    let case_id = case.meta.case_id.clone().unwrap_or_else(|| "exec".into());
    let (runner, target, what): (Box<dyn Runner>, Target, String) = match (
        &args.implementation,
        &args.worker,
    ) {
        (None, None) => native(&args, &problem, split, sanitizer.as_ref())?,
        (name, command) => {
            if args.bounds_check {
                return Err(usage(
                        "--bounds-check builds this project's kernels: it applies to native paths, not to --impl or --worker",
                    ));
            }
            let spec = match (name, command) {
                (Some(n), _) => worker::WorkerSpec::from_impl(n),
                (None, Some(c)) => worker::WorkerSpec::from_command(c),
                (None, None) => unreachable!("matched above"),
            }
            .map_err(usage)?;
            let spec = worker::WorkerSpec {
                sanitizer: sanitizer.clone(),
                ..spec
            };
            let timeout = worker::timeout(args.worker_timeout_s).map_err(usage)?;
            let w = WorkerRunner::start(spec, timeout).map_err(usage)?;
            if !w.hello.paths.contains(&args.path) {
                return Err(usage(format!(
                    "worker {} has no path `{}`: its paths are {}",
                    w.name(),
                    args.path,
                    w.hello.paths.join(", ")
                )));
            }
            let target = Target::Worker {
                worker: 0,
                name: w.name().to_string(),
                path: args.path.clone(),
                label: w.spec.label.clone(),
            };
            let what = format!(
                "worker {} {} ({})",
                w.name(),
                w.hello.version,
                w.hello.device.as_deref().unwrap_or("no GPU")
            );
            (Box::new(w), target, what)
        }
    };
    let trial = format!("exec::{}::{case_id}", target.label());
    let req = RunRequest {
        trial: &trial,
        case_id: &case_id,
        problem: &problem,
        case_file: Some(&args.input),
        case_life: None,
        target: &target,
        split,
        timing: None,
    };
    let run = runner.run(0, &req).map_err(|e| e.into_exit())?;
    write_impl_output(&args.output, &run.out).map_err(|e| usage(e.to_string()))?;
    print_summary(&target, &what, &run, &problem, &args.output);
    Ok(())
}

/// The native runner for `--path`, after every check that needs no GPU.
fn native(
    args: &Args,
    problem: &Problem,
    split: SplitSetting,
    sanitizer: Option<&crate::sanitize::Sanitizer>,
) -> anyhow::Result<(Box<dyn Runner>, Target, String)> {
    let path: PathId = args.path.parse().map_err(|e| usage(format!("{e}")))?;
    // Pure planning first: an unsupported combination is a usage error even without a GPU.
    gpu::plan_launches(path, &Geometry::of(problem), split).map_err(|e| classify(e).into_exit())?;
    // A device whose route is a rejection stops here, before anything is compiled or allocated.
    let selection = DeviceSelection::List(vec![args.device as u32]);
    let device = match detect(&NvmlSource::new(), Gpu::available(), &selection) {
        GpuStatus::Ready { devices, .. } => devices,
        GpuStatus::Rejected(why) => return Err(no_gpu(why)),
        GpuStatus::Absent(why) => {
            return Err(no_gpu(format!(
                "{why}: `relattn exec --path {path}` needs an NVIDIA GPU"
            )))
        }
    };
    // The kernels run in this process: sanitized, it runs again under the sanitizer.
    crate::sanitize::run_natives_under(sanitizer, "exec", true)?;
    let bounds = if args.bounds_check {
        BoundsCheck::On
    } else {
        BoundsCheck::Off
    };
    let runner = RealFactory::default()
        .create(&device, bounds, &[path])
        .map_err(crate::exit::failed)?;
    let what = device
        .first()
        .map(|d| format!("{} (SM {})", d.name, d.cc))
        .unwrap_or_default();
    let target = Target::Native {
        path,
        variant: bounds.variants()[0],
    };
    Ok((runner, target, what))
}

fn print_summary(
    target: &Target,
    what: &str,
    run: &RunOutput,
    problem: &Problem,
    output: &std::path::Path,
) {
    let unwritten = run.non_finite_real(problem);
    let ms = run.ms.map_or("-".to_string(), |m| format!("{m:.3} ms"));
    println!(
        "{} on {what}: [{}], num_splits {}, {ms}; non-finite real-row elements {unwritten}, padding {}, decode counters left {}; wrote {}",
        target.label(),
        run.kernels.join(", "),
        run.num_splits,
        if run.padding_intact { "intact" } else { "WRITTEN" },
        run.counters_left,
        output.display()
    );
}
