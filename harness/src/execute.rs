//! Running trials: each case is generated and its reference computed once, then shared by every
//! trial (self-checks, paths, split counts, bounds-check variants) that uses it.

use crate::judge::{judge, Bounds};
use crate::plan::{check_routing_row, check_unknown_capabilities, Trial, TrialKind};
use crate::selfcheck;
use ndarray::Array3;
use relattn_kernels::routing::PathId;
use relattn_matrices::{Case, SplitSetting};
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
        let problem =
            gen::generate(&case.spec).map_err(|e| format!("generating case {}: {e}", case.id))?;
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
        self.ref64.get_or_init(|| match &self.rows {
            Some(rows) => fast::attention_rows(&self.problem, rows),
            None => fast::attention(&self.problem),
        })
    }

    pub fn ref_lp(&self) -> &RefOutput {
        self.ref_lp.get_or_init(|| match &self.rows {
            Some(rows) => emulate::attention_rows(&self.problem, rows),
            None => emulate::attention(&self.problem),
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
        }
    }

    /// A store that keeps every case it builds.
    pub fn keep_all() -> CaseStore {
        CaseStore {
            inner: Mutex::new(HashMap::new()),
            keep: true,
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
        cell.get_or_init(|| CaseData::new(case).map(Arc::new))
            .clone()
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

/// A finished GPU launch of one path.
#[derive(Debug, Clone)]
pub struct GpuRunResult {
    /// `[T, H, D]` as read back.
    pub out: Array3<f32>,
    /// Padding rows bit-identical to what they held before the launch.
    pub padding_intact: bool,
    /// Decode counters the launch left non-zero (each must be reset for the next launch).
    pub counters_left: usize,
    /// CUDA-event time of the path's launches.
    pub ms: f64,
    pub num_splits: usize,
}

/// Why a GPU trial produced no output.
#[derive(Debug, Clone)]
pub enum GpuTrialError {
    /// The path cannot take this case (reported as skip).
    Unsupported(String),
    /// A kernel trapped (bounds check) or faulted: a defect found (reported as fail).
    Fault(String),
    /// Compile, allocation or driver error (reported as error).
    Other(String),
}

/// What the harness needs from the GPU side (the real one wraps `relattn_kernels::gpu`).
pub trait GpuExecutor: Send + Sync {
    /// Run `path` on `problem` on worker `slot` (one per device).
    fn run(
        &self,
        slot: usize,
        case_id: &str,
        problem: &Problem,
        path: PathId,
        split: SplitSetting,
        bounds_check: bool,
    ) -> Result<GpuRunResult, GpuTrialError>;

    /// Add software versions and compile checks to a report's environment.
    fn describe(&self, _env: &mut relattn_reports::Environment) {}
}

/// The command that reruns one case alone.
pub fn reproduce_command(matrix: &str, case_id: &str, path: Option<&str>) -> String {
    match path {
        Some(p) => format!("relattn run --matrix {matrix} --case {case_id} --paths {p}"),
        None => format!("relattn run --matrix {matrix} --case {case_id}"),
    }
}

/// Run one trial (not ignored) to a report row.
pub fn run_trial(
    trial: &Trial,
    store: &CaseStore,
    gpu: Option<(&dyn GpuExecutor, usize)>,
    matrix: &str,
) -> Row {
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
        return row;
    }
    let started = Instant::now();
    match &trial.kind {
        TrialKind::Routing(r) => finish_check(&mut row, check_routing_row(r)),
        TrialKind::RoutingUnknown => finish_check(&mut row, check_unknown_capabilities()),
        TrialKind::Reference { case, check } => {
            match store.get(case) {
                Ok(data) => {
                    let c = selfcheck::run(*check, &data.problem, Some(data.ref64()));
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
            path,
            split,
            bounds_check,
        } => {
            match (store.get(case), gpu) {
                (Ok(data), Some((exec, slot))) => gpu_trial(
                    &mut row,
                    case,
                    &data,
                    exec,
                    slot,
                    *path,
                    *split,
                    *bounds_check,
                ),
                (Err(e), _) => error(&mut row, e),
                (_, None) => {
                    row.status = Status::Skip;
                    row.message = "no GPU".into();
                }
            }
            store.release(case);
        }
    }
    if row.ms.is_none() && !matches!(trial.kind, TrialKind::Gpu { .. }) {
        row.ms = Some(started.elapsed().as_secs_f64() * 1e3);
    }
    if row.status.is_bad() {
        let path = matches!(trial.kind, TrialKind::Gpu { .. }).then(|| row.path.clone());
        let cmd = match trial.case() {
            Some(c) => reproduce_command(matrix, &c.id, path.as_deref()),
            None => format!("cargo test --test trials -- --exact {}", trial.name),
        };
        row.message = format!("{}; reproduce: {cmd}", row.message);
    }
    row
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

#[allow(clippy::too_many_arguments)]
fn gpu_trial(
    row: &mut Row,
    case: &Case,
    data: &CaseData,
    exec: &dyn GpuExecutor,
    slot: usize,
    path: PathId,
    split: SplitSetting,
    bounds_check: bool,
) {
    let ref64 = data.ref64();
    let ref_lp = data.ref_lp();
    match exec.run(slot, &case.id, &data.problem, path, split, bounds_check) {
        Ok(run) => {
            let t = &case.tolerance;
            let bounds = Bounds {
                rtol: t.rtol,
                atol: t.atol,
                atol2: t.atol2,
                rtol2: t.rtol2,
            };
            let v = judge(
                &data.problem,
                &run.out,
                ref64,
                ref_lp,
                &bounds,
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
            row.ms = Some(run.ms);
            if run.ms > 0.0 {
                let secs = run.ms * 1e-3;
                row.tflops = Some(data.problem.flops() / secs / 1e12);
                row.gbps = Some(kv_bytes(&data.problem) / secs / 1e9);
            }
            row.params
                .insert("num_splits_run".into(), run.num_splits.to_string());
            row.params
                .insert("out_hash".into(), format!("{:016x}", output_hash(&run.out)));
            row.params
                .insert("bounds_check".into(), bounds_check.to_string());
        }
        Err(GpuTrialError::Unsupported(why)) => {
            row.status = Status::Skip;
            row.message = why;
        }
        Err(GpuTrialError::Fault(why)) => {
            row.status = Status::Fail;
            row.message = why;
        }
        Err(GpuTrialError::Other(why)) => error(row, why),
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
