//! The real GPU executor, over `relattn_kernels::gpu`: every program is compiled (for each
//! build variant the run needs) before any device is opened; then one slot per device keeps
//! the current case uploaded, so all trials of a case share one upload.

use crate::runner::ExecutorFactory;
use crate::runner::{RunError, RunOutput, RunRequest, Runner, Target};
use crate::trial_list::BoundsCheck;
use rayon::prelude::*;
use relattn_kernels::capability::DeviceInfo;
use relattn_kernels::gpu::{
    compile, compile_arch, compile_check, nvrtc_version, run_path_timed, CompilePlan, Compiled,
    DeviceProblem, Gpu, GpuError, Loaded, Mutant, Repeats, SplitSetting, Variant, CHECK_ARCHS,
};
use relattn_reports::{CompileCheck, Environment};
use relattn_routing::PathId;
use std::collections::HashMap;
use std::sync::Mutex;

/// Whether the CUDA driver library and NVRTC can be loaded on this machine.
pub fn libraries_present() -> bool {
    Gpu::available()
}

/// Builds the real executor. `mutant` plants a defect in every program (for `relattn mutants`).
#[derive(Debug, Clone, Copy, Default)]
pub struct RealFactory {
    pub mutant: Option<Mutant>,
}

/// The compile-only check of every program, in the builds given, for every supported
/// architecture (parallel on the current rayon pool; NVRTC's output cached on disk like every
/// compile): `relattn compile-check` (both builds), and `relattn run` beside its trials (the
/// plain build: the run compiled both for its own device). Err when NVRTC cannot be loaded.
pub fn compile_checks(variants: &[Variant]) -> Result<Vec<CompileCheck>, GpuError> {
    Ok(check_records(&CHECK_ARCHS, variants)?
        .into_iter()
        .map(report_check)
        .collect())
}

/// The compile-only check's records for `archs` (with the CUBINs).
pub fn check_records(
    archs: &[&str],
    variants: &[Variant],
) -> Result<Vec<relattn_kernels::gpu::CheckRecord>, GpuError> {
    crate::phases::time(crate::phases::Phase::Compile, || {
        compile_check(archs, variants)
    })
}

/// A check record as a report lists it.
pub fn report_check(c: relattn_kernels::gpu::CheckRecord) -> CompileCheck {
    CompileCheck {
        arch: c.arch,
        program: format!("{} ({})", c.program, c.variant),
        ok: c.ok,
        message: c.message,
    }
}

impl ExecutorFactory for RealFactory {
    fn create(
        &self,
        devices: &[DeviceInfo],
        bounds: BoundsCheck,
        paths: &[PathId],
    ) -> Result<Box<dyn Runner>, String> {
        let Some(first) = devices.first() else {
            return Err("no device".into());
        };
        let arch = compile_arch(first.cc);
        if devices.iter().any(|d| compile_arch(d.cc) != arch) {
            return Err(
                "devices of different architectures in one run: select one kind with --devices"
                    .into(),
            );
        }
        // Compile first: a compile failure is reported before any device memory is touched.
        // Both builds at once: every program of both is one parallel batch.
        let builds: Vec<Result<(Variant, Compiled), String>> = bounds
            .variants()
            .par_iter()
            .map(|&variant| {
                let build = Variant {
                    mutant: self.mutant,
                    ..variant
                };
                let plan = CompilePlan::new(&arch, build, paths).map_err(|e| e.to_string())?;
                Ok((variant, compile(&plan).map_err(|e| format!("{e}"))?))
            })
            .collect();
        let compiled: HashMap<Variant, Compiled> = builds.into_iter().collect::<Result<_, _>>()?;
        let mut slots = Vec::new();
        for d in devices {
            let gpu = Gpu::open(d.index as usize).map_err(|e| e.to_string())?;
            slots.push(Mutex::new(DeviceSlot {
                gpu: Some(gpu),
                loaded: HashMap::new(),
                current: None,
                lost: None,
            }));
        }
        let driver = slots
            .first()
            .and_then(|w| w.lock().ok()?.gpu.as_ref()?.driver_version().ok())
            .map(|v| format!("{}.{}", v / 1000, (v % 1000) / 10));
        let sanitized = crate::sanitize::child_log();
        if let Some((_, crate::sanitize::Tool::Initcheck)) = &sanitized {
            relattn_kernels::gpu::set_workspace_poison(false);
        }
        Ok(Box::new(RealExecutor {
            slots,
            sanitizer: sanitized
                .map(|(log, tool)| (Mutex::new(crate::sanitize::LogWatch::new(log)), tool)),
            compiled,
            cuda_version: driver,
            nvrtc: nvrtc_version().ok().map(|(a, b)| format!("{a}.{b}")),
        }))
    }
}

/// One device and what is loaded on it: a device thread of the engine runs its trials here
/// (`slot` of `Runner::run`).
struct DeviceSlot {
    gpu: Option<Gpu>,
    /// Loaded modules per bounds-check variant.
    loaded: HashMap<Variant, Loaded>,
    /// The uploaded case.
    current: Option<(String, DeviceProblem)>,
    /// Why the slot has no device any more.
    lost: Option<String>,
}

impl DeviceSlot {
    /// After a trap the context is dead: drop everything made on it and try a fresh one. The
    /// driver may refuse (the process keeps the sticky error); then the slot stays without a
    /// device and every later trial on it says which trial lost it.
    fn recover(&mut self, case_id: &str) -> Result<(), GpuError> {
        self.loaded.clear();
        self.current = None;
        if let Some(gpu) = self.gpu.take() {
            self.lost = Some(format!("a kernel trapped on case {case_id}"));
            self.gpu = Some(gpu.reopen()?);
            self.lost = None;
        }
        Ok(())
    }
}

struct RealExecutor {
    slots: Vec<Mutex<DeviceSlot>>,
    /// In a process `--sanitize` started under the sanitizer: its log, read after each trial,
    /// and the tool. One device slot runs then, one trial at a time.
    sanitizer: Option<(Mutex<crate::sanitize::LogWatch>, crate::sanitize::Tool)>,
    compiled: HashMap<Variant, Compiled>,
    cuda_version: Option<String>,
    nvrtc: Option<String>,
}

impl Runner for RealExecutor {
    fn run(&self, slot: usize, req: &RunRequest<'_>) -> Result<RunOutput, RunError> {
        let &Target::Native { path, variant } = req.target else {
            return Err(RunError::Other(
                "the native runner was handed a worker target".into(),
            ));
        };
        let device = self
            .slots
            .get(slot)
            .ok_or_else(|| RunError::Other(format!("no GPU slot {slot}")))?;
        let mut w = device.lock().unwrap_or_else(|e| e.into_inner());
        // Sanitized: one launch (memcheck's time says nothing), then the log of this trial.
        let repeats = if self.sanitizer.is_some() {
            Repeats::COLD
        } else {
            Repeats::TRIAL
        };
        let result = run_on(
            &mut w,
            &self.compiled,
            req,
            path,
            req.split,
            variant,
            repeats,
        );
        let checked = self.sanitizer.as_ref().map(|(watch, tool)| {
            let mut watch = watch.lock().unwrap_or_else(|e| e.into_inner());
            crate::sanitize::check(&mut watch, *tool)
        });
        let checked = match checked.transpose() {
            Ok(checked) => checked,
            Err(why) => {
                // The sanitizer's log could not be read: the trial is an error, and a trapped
                // run still leaves a device the next trial can use.
                if matches!(result, Err(GpuError::Trap { .. })) {
                    let _ = w.recover(req.case_id);
                }
                return Err(RunError::Other(why));
            }
        };
        // The sanitizer's reports of this trial, which a failed run's message begins with.
        let errors = checked.as_ref().and_then(|c| c.errors.clone());
        let fault = |e: &GpuError| match &errors {
            Some(errors) => format!("{errors}; the run: {e}"),
            None => e.to_string(),
        };
        match result {
            Ok(run) => Ok(RunOutput {
                sanitizer: checked,
                ..RunOutput::from(run)
            }),
            Err(e @ GpuError::Trap { .. }) => {
                let message = fault(&e);
                match w.recover(req.case_id) {
                    Ok(()) => Err(RunError::Fault(message)),
                    Err(again) => Err(RunError::Fault(format!(
                        "{message}; reopening failed: {again}"
                    ))),
                }
            }
            Err(e) if errors.is_some() => Err(RunError::Fault(fault(&e))),
            Err(e) => Err(classify(e)),
        }
    }

    fn describe(&self, env: &mut Environment) {
        env.cuda_version = self.cuda_version.clone();
        env.nvrtc_version = self.nvrtc.clone();
    }
}

/// The one classification of native GPU errors: a case the path cannot take is a skip, a kernel
/// that traps is a failure, a missing or lost device is "no GPU", anything else (compile,
/// allocation, driver) an error.
pub fn classify(e: GpuError) -> RunError {
    let message = e.to_string();
    match e {
        GpuError::Unsupported { reason, .. } => RunError::Unsupported(reason),
        GpuError::Trap { .. } => RunError::Fault(message),
        GpuError::NoDriver(_) | GpuError::NoDevice { .. } | GpuError::ContextLost { .. } => {
            RunError::NoGpu(message)
        }
        _ => RunError::Other(message),
    }
}

fn run_on(
    w: &mut DeviceSlot,
    compiled: &HashMap<Variant, Compiled>,
    req: &RunRequest<'_>,
    path: PathId,
    splits: SplitSetting,
    variant: Variant,
    repeats: Repeats,
) -> Result<relattn_kernels::gpu::GpuRun, GpuError> {
    let gpu = w.gpu.as_ref().ok_or_else(|| {
        let why = w.lost.clone().unwrap_or_else(|| "unknown".into());
        GpuError::NoDriver(format!(
            "the CUDA context of this GPU is unusable ({why}); rerun this case alone"
        ))
    })?;
    if w.current.as_ref().is_none_or(|(id, _)| id != req.case_id) {
        w.current = None; // free the previous case first
        w.current = Some((req.case_id.to_string(), gpu.upload(req.problem)?));
    }
    let loaded = match w.loaded.entry(variant) {
        std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
        std::collections::hash_map::Entry::Vacant(e) => {
            let c = compiled
                .get(&variant)
                .ok_or_else(|| GpuError::NoDriver(format!("no {} build", variant.label())))?;
            e.insert(gpu.load(c)?)
        }
    };
    let (_, dp) = w.current.as_ref().expect("uploaded above");
    run_path_timed(gpu, loaded, dp, path, splits, repeats)
}
