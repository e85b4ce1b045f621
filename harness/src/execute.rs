//! Running trials: each case is generated and its reference computed once, then shared by every
//! trial (self-checks, paths, split counts, bounds-check variants) that uses it.

use crate::case_cache::CaseCache;
use crate::phases::{self, Phase};
use crate::plan::{check_routing_row, check_unknown_capabilities, Trial, TrialKind};
use crate::runner::{forced_splits, Kept, RunError, RunOutput, RunRequest, Runner, Target};
use crate::selfcheck;
use ndarray::Array3;
use relattn_matrices::Case;
use relattn_reference::judge::judge;
use relattn_reference::{emulate, fast, gen, Problem, RefOutput};
use relattn_reports::{Row, Status};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

/// A generated case with its references, computed on first use.
pub struct CaseData {
    pub problem: Problem,
    /// Sampled rows (None: every row).
    pub rows: Option<Vec<usize>>,
    ref64: OnceLock<RefOutput>,
    ref_lp: OnceLock<RefOutput>,
}

impl CaseData {
    pub fn new(case: &Case) -> Result<CaseData, String> {
        CaseData::cached(case, None)
    }

    /// The case from `cache` when it holds it, else generated (and kept there).
    pub fn cached(case: &Case, cache: Option<&CaseCache>) -> Result<CaseData, String> {
        let problem = match cache.and_then(|c| c.load(case)) {
            Some(p) => p,
            None => {
                let p = phases::time(Phase::Generate, || gen::generate(&case.spec))
                    .map_err(|e| format!("generating case {}: {e}", case.id))?;
                if let Some(c) = cache {
                    c.store(case, &p);
                }
                p
            }
        };
        let rows = case
            .sample_rows
            .map(|n| relattn_reference::sample::sample_rows(&problem, n, case.spec.seed));
        Ok(CaseData {
            problem,
            rows,
            ref64: OnceLock::new(),
            ref_lp: OnceLock::new(),
        })
    }

    pub fn ref64(&self) -> &RefOutput {
        self.ref64.get_or_init(|| {
            phases::time(Phase::Reference, || match &self.rows {
                Some(rows) => fast::attention_rows(&self.problem, rows),
                None => fast::attention(&self.problem),
            })
        })
    }

    pub fn ref_lp(&self) -> &RefOutput {
        self.ref_lp.get_or_init(|| {
            phases::time(Phase::Reference, || match &self.rows {
                Some(rows) => emulate::attention_rows(&self.problem, rows),
                None => emulate::attention(&self.problem),
            })
        })
    }
}

/// A case's data, built by the first trial that needs it.
type CaseCell = Arc<OnceLock<Result<Arc<CaseData>, String>>>;

/// Cases by id, each built once and dropped when its last trial has run.
#[derive(Default)]
pub struct CaseStore {
    /// Per case: its cell and how many trials still need it.
    inner: Mutex<HashMap<String, (CaseCell, usize)>>,
    /// Never drop a case (for runs that revisit cases, like `relattn mutants`).
    keep: bool,
    /// Cases kept on disk between processes (the `cargo test` harness under nextest).
    disk: Option<CaseCache>,
}

impl CaseStore {
    /// A store expecting these trials (used to know when a case can be dropped).
    pub fn for_trials(trials: &[Trial]) -> CaseStore {
        let mut map = HashMap::new();
        for t in trials.iter().filter(|t| t.ignore.is_none()) {
            if let Some(case) = t.case() {
                map.entry(case.id.clone())
                    .or_insert_with(|| (Arc::new(OnceLock::new()), 0))
                    .1 += 1;
            }
        }
        CaseStore {
            inner: Mutex::new(map),
            keep: false,
            disk: None,
        }
    }

    /// The same store, reading and keeping generated cases in `cache`.
    pub fn with_disk_cache(mut self, cache: Option<CaseCache>) -> CaseStore {
        self.disk = cache;
        self
    }

    /// A store that keeps every case it builds.
    pub fn keep_all() -> CaseStore {
        CaseStore {
            inner: Mutex::new(HashMap::new()),
            keep: true,
            disk: None,
        }
    }

    /// The case's data; the caller must call `release` once done with it.
    pub fn get(&self, case: &Case) -> Result<Arc<CaseData>, String> {
        let cell = {
            let mut map = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            map.entry(case.id.clone())
                .or_insert_with(|| (Arc::new(OnceLock::new()), 1))
                .0
                .clone()
        };
        self.build(&cell, case).clone()
    }

    /// The cell's case, built from the disk cache or generated on first use.
    fn build<'c>(&self, cell: &'c CaseCell, case: &Case) -> &'c Result<Arc<CaseData>, String> {
        cell.get_or_init(|| CaseData::cached(case, self.disk.as_ref()).map(Arc::new))
    }

    /// Build the case and both references ahead of its trials (a device thread prepares the
    /// next case while the GPU runs this one). Its trials' `release` calls still drop it.
    /// A case whose trials have all finished (another device thread ran them) is left alone.
    pub fn prepare(&self, case: &Case) {
        let cell = {
            let map = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            match map.get(&case.id) {
                Some((cell, _)) => cell.clone(),
                None => return,
            }
        };
        if let Ok(data) = self.build(&cell, case) {
            let _ = (data.ref64(), data.ref_lp());
        }
    }

    /// One trial of `case` finished; the last one drops the case's data.
    pub fn release(&self, case: &Case) {
        if self.keep {
            return;
        }
        let mut map = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = map.get_mut(&case.id) {
            entry.1 = entry.1.saturating_sub(1);
            if entry.1 == 0 {
                map.remove(&case.id);
            }
        }
    }
}

/// The implementations trials run on: the native paths (with the device slot of this thread)
/// and the session's workers, by index.
#[derive(Clone, Copy, Default)]
pub struct Runners<'a> {
    pub native: Option<(&'a dyn Runner, usize)>,
    pub workers: &'a [Arc<dyn Runner>],
    /// Where failing worker trials keep their case and output files (a report's `failures/`).
    pub keep: Option<&'a std::path::Path>,
}

impl<'a> Runners<'a> {
    /// Only the native paths (or nothing).
    pub fn native(native: Option<(&'a dyn Runner, usize)>) -> Runners<'a> {
        Runners {
            native,
            workers: &[],
            keep: None,
        }
    }

    fn for_target(&self, target: &Target) -> Option<(&'a dyn Runner, usize)> {
        match target {
            Target::Native { .. } => self.native,
            Target::Worker { worker, .. } => self.workers.get(*worker).map(|w| (&**w, 0)),
        }
    }
}

/// The command that reruns one case alone.
pub fn reproduce_command(matrix: &str, case_id: &str, target: Option<&Target>) -> String {
    match target {
        Some(Target::Native { path, .. }) => {
            format!("relattn run --matrix {matrix} --case {case_id} --paths {path}")
        }
        Some(Target::Worker { label, .. }) => {
            format!("relattn run --matrix {matrix} --case {case_id} --paths none {label}")
        }
        None => format!("relattn run --matrix {matrix} --case {case_id}"),
    }
}

/// A failing or erroring row as a person reads it, on `relattn run`'s console and under
/// `cargo test`: `FAIL <trial>: <message>` (the message ends with the reproduce line).
pub fn failure_text(row: &Row) -> String {
    format!(
        "{} {}: {}",
        row.status.as_str().to_uppercase(),
        row.trial,
        row.message
    )
}

/// Run one trial (not ignored) to a report row.
pub fn run_trial(trial: &Trial, store: &CaseStore, runners: &Runners<'_>, matrix: &str) -> Row {
    start_trial(trial, store, runners).finish(trial, store, runners, matrix)
}

/// Where a trial stands after `start_trial`: its row is complete but for the last touches, or
/// its GPU run is done and the judge is left to do (on any thread: the case's references are
/// computed already).
pub enum Step {
    Done {
        row: Box<Row>,
        started: Option<Instant>,
    },
    Ran(Box<Ran>),
}

/// A GPU trial's run, waiting for the judge.
pub struct Ran {
    row: Row,
    started: Instant,
    data: Arc<CaseData>,
    result: Result<RunOutput, RunError>,
}

/// Start a trial: everything but the judging of a GPU run. A device thread hands the `Step` of
/// a GPU trial to another thread to judge and finish, and runs the next trial meanwhile.
pub fn start_trial(trial: &Trial, store: &CaseStore, runners: &Runners<'_>) -> Step {
    let case_id = trial.case().map_or(String::new(), |c| c.id.clone());
    let mut row = Row::new(case_id, trial.name.clone(), trial.path(), Status::Pass);
    if let Some(case) = trial.case() {
        row.seed = Some(case.spec.seed);
        row.params = case
            .params()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
    }
    if let Some(why) = &trial.ignore {
        row.status = Status::Skip;
        row.message = why.clone();
        return Step::Done {
            row: Box::new(row),
            started: None,
        };
    }
    let started = Instant::now();
    match &trial.kind {
        TrialKind::Routing(r) => finish_check(&mut row, check_routing_row(r)),
        TrialKind::RoutingUnknown => finish_check(&mut row, check_unknown_capabilities()),
        TrialKind::Reference { case, check } => {
            match store.get(case) {
                Ok(data) => {
                    let ref64 = data.ref64();
                    let c = phases::time(Phase::SelfChecks, || {
                        selfcheck::run(*check, &data.problem, Some(ref64))
                    });
                    row.status = if c.pass { Status::Pass } else { Status::Fail };
                    row.max_abs = Some(c.max_abs);
                    row.rel_l2 = Some(c.rel);
                    row.message = c.message;
                }
                Err(e) => error(&mut row, e),
            }
            store.release(case);
        }
        TrialKind::Gpu {
            case,
            target,
            split,
        } => {
            match (store.get(case), runners.for_target(target)) {
                (Ok(data), Some((runner, slot))) => {
                    let req = RunRequest {
                        trial: &trial.name,
                        case_id: &case.id,
                        problem: &data.problem,
                        case_file: None,
                        target,
                        split: *split,
                        timing: None,
                    };
                    let result = phases::time(Phase::Gpu, || runner.run(slot, &req));
                    // The references first, so the judge's time is the judge's alone (and a
                    // judging thread never waits for a case being built).
                    if result.is_ok() {
                        let _ = (data.ref64(), data.ref_lp());
                    }
                    return Step::Ran(Box::new(Ran {
                        row,
                        started,
                        data,
                        result,
                    }));
                }
                (Err(e), _) => error(&mut row, e),
                (_, None) => {
                    row.status = Status::Skip;
                    row.message = "no GPU".into();
                }
            }
            store.release(case);
        }
    }
    Step::Done {
        row: Box::new(row),
        started: Some(started),
    }
}

impl Step {
    /// Judge a GPU run (releasing its case) and give the row its wall time and, when it failed,
    /// the command that reproduces it.
    pub fn finish(
        self,
        trial: &Trial,
        store: &CaseStore,
        runners: &Runners<'_>,
        matrix: &str,
    ) -> Row {
        let (mut row, started) = match self {
            Step::Done { row, started: None } => return *row,
            Step::Done {
                row,
                started: Some(started),
            } => (*row, started),
            Step::Ran(ran) => {
                let Ran {
                    mut row,
                    started,
                    data,
                    result,
                } = *ran;
                if let TrialKind::Gpu { case, target, .. } = &trial.kind {
                    phases::time(Phase::Judge, || {
                        record_run(&mut row, case, &data, target, result)
                    });
                    drop(data);
                    store.release(case);
                }
                (row, started)
            }
        };
        finish_row(&mut row, started, trial, runners, matrix);
        row
    }
}

/// The last touches of a row: wall time, and for a failure the command that reproduces it.
fn finish_row(row: &mut Row, started: Instant, trial: &Trial, runners: &Runners<'_>, matrix: &str) {
    let wall_ms = started.elapsed().as_secs_f64() * 1e3;
    row.wall_ms = Some(wall_ms);
    if row.ms.is_none() && !matches!(trial.kind, TrialKind::Gpu { .. }) {
        row.ms = Some(wall_ms);
    }
    if row.status.is_bad() {
        let target = match &trial.kind {
            TrialKind::Gpu { target, .. } => Some(target),
            _ => None,
        };
        let kept = match (target, runners.keep) {
            (Some(t @ Target::Worker { .. }), Some(dir)) => runners
                .for_target(t)
                .and_then(|(r, _)| r.keep(&trial.name, dir)),
            _ => None,
        };
        let exec = match (&kept, target, &trial.kind) {
            (
                Some(Kept {
                    case: Some(file), ..
                }),
                Some(Target::Worker { label, path, .. }),
                TrialKind::Gpu { split, .. },
            ) => {
                let splits =
                    forced_splits(*split).map_or(String::new(), |n| format!(" --splits {n}"));
                Some(format!(
                    "relattn exec {label} --path {path} --input {}{splits} --output out.safetensors",
                    file.display()
                ))
            }
            _ => None,
        };
        if let Some(k) = &kept {
            if let Some(o) = &k.output {
                row.message = format!("{}; the worker's output: {}", row.message, o.display());
            }
            if !k.left_out.is_empty() {
                row.message = format!("{}; not kept: {}", row.message, k.left_out.join(", "));
            }
        }
        let cmd = match trial.case() {
            Some(c) => {
                let run = reproduce_command(matrix, &c.id, target);
                match exec {
                    Some(e) => format!("{e} (or {run})"),
                    None => run,
                }
            }
            None => format!("cargo test --test trials -- --exact {}", trial.name),
        };
        row.message = format!("{}; reproduce: {cmd}", row.message);
    }
}

fn finish_check(row: &mut Row, result: Result<usize, String>) {
    match result {
        Ok(n) => row.message = format!("{n} shapes checked"),
        Err(e) => {
            row.status = Status::Fail;
            row.message = e;
        }
    }
}

fn error(row: &mut Row, message: String) {
    row.status = Status::Error;
    row.message = message;
}

/// A run's result into the row: judged by SPEC section 6 when there is an output.
fn record_run(
    row: &mut Row,
    case: &Case,
    data: &CaseData,
    target: &Target,
    result: Result<RunOutput, RunError>,
) {
    let run = match result {
        Ok(run) => run,
        Err(RunError::Unsupported(why)) | Err(RunError::NoGpu(why)) => {
            row.status = Status::Skip;
            row.message = why;
            return;
        }
        Err(RunError::Fault(why)) => {
            row.status = Status::Fail;
            row.message = why;
            return;
        }
        Err(RunError::Other(why)) => return error(row, why),
    };
    let v = judge(
        &data.problem,
        &run.out,
        data.ref64(),
        data.ref_lp(),
        &case.tolerance,
        run.padding_intact,
        run.counters_left,
    );
    row.status = if v.pass { Status::Pass } else { Status::Fail };
    row.max_abs = Some(v.max_abs);
    row.mean_abs = Some(v.mean_abs);
    row.rel_l2 = Some(v.rel_l2);
    row.bound = Some(v.bound);
    row.first_bad = v.first_bad;
    row.message = v.reason;
    row.ms = run.ms;
    if let Some(ms) = run.ms.filter(|&ms| ms > 0.0) {
        let secs = ms * 1e-3;
        row.tflops = Some(data.problem.flops() / secs / 1e12);
        row.gbps = Some(kv_bytes(&data.problem) / secs / 1e9);
    }
    row.params
        .insert("num_splits_run".into(), run.num_splits.to_string());
    row.params
        .insert("out_hash".into(), format!("{:016x}", output_hash(&run.out)));
    if let Target::Native { bounds_check, .. } = target {
        row.params
            .insert("bounds_check".into(), bounds_check.to_string());
    }
}

/// K/V bytes the requests must read: every visible key of every request once, K and V, all KV heads.
pub fn kv_bytes(p: &Problem) -> f64 {
    let mut keys = 0usize;
    for r in p.requests().filter(|r| r.q_len > 0) {
        let (first, _) = p.visible_keys(&r, 0);
        keys += r.kv_len - first;
    }
    (keys * 2 * p.num_kv_heads * p.head_dim * p.dtype.size_bytes()) as f64
}

/// FNV-1a over the output's bits: equal hashes across runs mean bit-identical outputs.
pub fn output_hash(out: &Array3<f32>) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for x in out.iter() {
        for b in x.to_bits().to_le_bytes() {
            h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}
