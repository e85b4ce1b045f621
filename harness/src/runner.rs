//! The one route from a case to a result: every implementation under test (the native CUDA
//! paths in this process, or a worker process speaking the worker protocol) is a `Runner`, and
//! every way a run can end is one `RunError`. The trial engine (`run`, `mutants`, the `cargo
//! test` trials), `exec` and `bench --impl` (the workers' rows) go through it, so judgement,
//! reports and exit codes cannot tell implementations apart; `bench` times the native paths
//! with `gpu::run_path` directly, its events bracketing the launches alone.

use crate::exit;
use ndarray::Array3;
use relattn_kernels::capability::DeviceInfo;
use relattn_kernels::gpu::{GpuRun, Variant};
use relattn_matrices::SplitSetting;
use relattn_reference::Problem;
use relattn_routing::PathId;
use std::path::Path;
use std::str::FromStr;

/// A case's life in a run: what a runner keeps for the case alone (a worker's case file) goes
/// when it ends (`on_end`), when the engine drops the case.
#[derive(Default)]
pub struct CaseLife {
    ends: std::sync::Mutex<Vec<Box<dyn FnOnce() + Send>>>,
}

impl CaseLife {
    /// Call `f` when the case's life ends.
    pub fn on_end(&self, f: impl FnOnce() + Send + 'static) {
        self.ends
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Box::new(f));
    }
}

impl std::fmt::Debug for CaseLife {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CaseLife")
    }
}

impl Drop for CaseLife {
    fn drop(&mut self) {
        let ends = std::mem::take(self.ends.get_mut().unwrap_or_else(|e| e.into_inner()));
        for f in ends {
            f();
        }
    }
}

/// What to run a case on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// One of this project's CUDA paths, with or without the bounds check compiled in.
    Native { path: PathId, variant: Variant },
    /// Path `path` (the worker's own name for it) of worker number `worker` of the session,
    /// whose `hello` gave the name `name`; `label` is how a command line asks for the worker
    /// (`--impl numpy`, `--worker '...'`).
    Worker {
        worker: usize,
        name: String,
        path: String,
        label: String,
    },
}

impl Target {
    /// The report's `path` column: the native path id, or `<worker name>/<worker path>`.
    pub fn label(&self) -> String {
        match self {
            Target::Native { path, .. } => path.as_str().to_string(),
            Target::Worker { name, path, .. } => format!("{name}/{path}"),
        }
    }
}

/// Timed launches: `warmup` untimed, then `reps` timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    pub warmup: usize,
    pub reps: usize,
}

/// One run of one case.
#[derive(Debug, Clone, Copy)]
pub struct RunRequest<'a> {
    /// The trial's name (a worker's request id).
    pub trial: &'a str,
    pub case_id: &'a str,
    pub problem: &'a Problem,
    /// The case as a file, when there is one already (`exec`): workers read it directly.
    pub case_file: Option<&'a Path>,
    /// The case's life (the engine's case data): workers keep one file of it for every process
    /// until it ends. None: the case is this request's alone (`exec`'s file).
    pub case_life: Option<&'a CaseLife>,
    pub target: &'a Target,
    pub split: SplitSetting,
    pub timing: Option<Timing>,
}

/// A finished run: what the judge and the reports need.
#[derive(Debug, Clone)]
pub struct RunOutput {
    /// `[T, H, D]` as read back, padding rows included.
    pub out: Array3<f32>,
    /// Padding rows still hold what they held before the run (bit-identical, or NaN for
    /// workers, which poison their own buffer).
    pub padding_intact: bool,
    /// Decode counters the launch left non-zero (each must be reset for the next launch).
    pub counters_left: usize,
    /// Time of the run in milliseconds: the median of the timed launches (`ms_all`), or the one
    /// launch when none was repeated.
    pub ms: Option<f64>,
    /// Every timed launch: a worker's `Timing::reps`, the native paths' warm repeats (empty when
    /// the run was one launch).
    pub ms_all: Vec<f64>,
    pub num_splits: usize,
    /// Kernels launched (native) or a description of what ran (workers).
    pub kernels: Vec<String>,
    /// The run was under a sanitizer (`--sanitize`): the tool, and its failure message when it
    /// reported errors while the run went on.
    pub sanitizer: Option<crate::sanitize::Checked>,
}

impl From<GpuRun> for RunOutput {
    /// A native run as the judge sees it; `unwritten` and its first index are not carried: the
    /// judge finds unwritten elements again in `out` itself.
    fn from(run: GpuRun) -> RunOutput {
        let GpuRun {
            out,
            padding_intact,
            unwritten: _,
            first_unwritten: _,
            counters_left,
            ms,
            cold_ms: _,
            warm_ms,
            num_splits,
            kernels,
        } = run;
        RunOutput {
            out,
            padding_intact,
            counters_left,
            ms: Some(f64::from(ms)),
            ms_all: warm_ms.into_iter().map(f64::from).collect(),
            num_splits,
            kernels,
            sanitizer: None,
        }
    }
}

impl RunOutput {
    /// Elements of the real rows (`t < cu_seqlens_q[B]`) that are not finite.
    pub fn non_finite_real(&self, problem: &Problem) -> usize {
        self.out
            .outer_iter()
            .take(problem.real_rows())
            .map(|r| r.iter().filter(|x| !x.is_finite()).count())
            .sum()
    }
}

/// Why a run produced no output, classified once for every command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunError {
    /// The implementation cannot take this case: a skip (`exec`: exit 2).
    Unsupported(String),
    /// A kernel trapped or faulted: a defect found, a failing trial (exit 1).
    Fault(String),
    /// Compile, allocation, driver or worker trouble: an erroring trial (exit 1).
    Other(String),
    /// No usable GPU (exit 3; under `run`, the trial is a skip).
    NoGpu(String),
}

impl RunError {
    pub fn message(&self) -> &str {
        match self {
            RunError::Unsupported(m)
            | RunError::Fault(m)
            | RunError::Other(m)
            | RunError::NoGpu(m) => m,
        }
    }

    /// The command-level error with its exit code (`exit::Code`).
    pub fn into_exit(self) -> anyhow::Error {
        match self {
            RunError::Unsupported(m) => exit::usage(m),
            RunError::Fault(m) | RunError::Other(m) => exit::failed(m),
            RunError::NoGpu(m) => exit::no_gpu(m),
        }
    }
}

/// An implementation under test.
pub trait Runner: Send + Sync {
    /// Run `req` on device worker `slot` (one per device; workers ignore it).
    fn run(&self, slot: usize, req: &RunRequest<'_>) -> Result<RunOutput, RunError>;

    /// Add software versions and compile checks to a report's environment.
    fn describe(&self, _env: &mut relattn_reports::Environment) {}

    /// Prepare what `req`'s run will need before it runs, where that takes long (a worker's
    /// case file of gigabytes), while something else runs; the run does it itself otherwise.
    fn stage(&self, _req: &RunRequest<'_>) {}

    /// Whether `target` takes a forced split count (triage runs a split trial with one split).
    fn takes_forced_splits(&self, _target: &Target) -> bool {
        true
    }

    /// Copy the files of `trial` (its case file and output, when this runner has them from its
    /// last run) into `dir`, so a failure can be replayed outside relattn.
    fn keep(&self, _trial: &str, _dir: &Path) -> Option<Kept> {
        None
    }
}

/// Files a failing trial left in the report directory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Kept {
    pub case: Option<std::path::PathBuf>,
    pub output: Option<std::path::PathBuf>,
    /// Files not kept, with why (size caps).
    pub left_out: Vec<String>,
}

impl Kept {
    /// Remove the kept files again (an expected failure's: the report's room is for new ones).
    pub fn discard(self) {
        for file in [self.case, self.output].into_iter().flatten() {
            let _ = std::fs::remove_file(file);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_error_has_its_exit_code() {
        use exit::{code_of, Code};
        let code = |e: RunError| code_of(&e.into_exit());
        assert_eq!(code(RunError::Unsupported("x".into())), Code::Usage);
        assert_eq!(code(RunError::Fault("x".into())), Code::Failed);
        assert_eq!(code(RunError::Other("x".into())), Code::Failed);
        assert_eq!(code(RunError::NoGpu("x".into())), Code::NoGpu);
    }
}

/// Whether GPU trials run with `RELATTN_BOUNDS_CHECK` compiled in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BoundsCheck {
    Off,
    On,
    Both,
}

impl FromStr for BoundsCheck {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "off" => Ok(BoundsCheck::Off),
            "on" => Ok(BoundsCheck::On),
            "both" => Ok(BoundsCheck::Both),
            _ => Err(format!("invalid --bounds-check `{s}`: use off, on or both")),
        }
    }
}

impl BoundsCheck {
    /// The default for a tier: `ci` and `regressions` run with and without the check.
    pub fn default_for(tier: &str) -> BoundsCheck {
        if tier == "ci" || tier == "regressions" {
            BoundsCheck::Both
        } else {
            BoundsCheck::Off
        }
    }

    /// The builds a run of this setting compiles and runs each native trial on.
    pub fn variants(self) -> &'static [Variant] {
        match self {
            BoundsCheck::Off => &[Variant::PLAIN],
            BoundsCheck::On => &[Variant::CHECKED],
            BoundsCheck::Both => &[Variant::PLAIN, Variant::CHECKED],
        }
    }
}

/// Creates the GPU executor: compiles every program the run needs, then opens the devices.
pub trait ExecutorFactory {
    fn create(
        &self,
        devices: &[DeviceInfo],
        bounds: BoundsCheck,
        paths: &[PathId],
    ) -> Result<Box<dyn Runner>, String>;
}
