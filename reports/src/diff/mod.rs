//! Comparing a report against a baseline.
//!
//! Two questions with different evidence: correctness (a status that got worse, an error that
//! grew or crossed its bound, a trial gone) is decided by the rows alone and is the default
//! verdict; timing ([`timing`]) is judged only when asked for.

mod render;
mod timing;

pub use timing::{Slowdown, TimingNoise, NOT_JUDGED as TIMING_NOT_JUDGED};

use crate::error::ReportError;
use crate::load::Report;
use crate::row::{Row, Status};
use serde::Serialize;
use std::collections::BTreeMap;

/// Thresholds of a regression.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct DiffOptions {
    /// max_abs growing by more than this factor is a regression (default 2).
    pub error_factor: f64,
    /// Judge timing too: throughput drops past `throughput_drop_pct` are regressions (default
    /// off: a row stores no spread to judge a drop against).
    pub timing: bool,
    /// With `timing`: TFLOP/s or GB/s dropping by more than this percentage is a regression
    /// (default 10).
    pub throughput_drop_pct: f64,
    /// Error growth only counts when the new error uses at least this share of its bound
    /// (default 0.1): an error that goes from 1% to 5% of the bound is rounding noise moving,
    /// not a regression, and bf16 errors jump by whole ulps.
    pub ratio_floor: f64,
    /// For rows without a bound: error growth only counts when the new max_abs is at least
    /// this (default 1e-3, about a bf16 ulp at 0.25).
    pub abs_floor: f64,
    /// Also count trials that went from pass to skip as regressions.
    pub strict_coverage: bool,
    /// Do not count trials missing from the new report (or an incomplete new report) as a
    /// regression; they are still listed.
    pub allow_missing: bool,
    /// With `timing`: throughput changes of trials whose base and new times are both under
    /// this many milliseconds are timing noise: listed as such, never a slowdown (default 0.2).
    pub time_floor_ms: f64,
}

impl Default for DiffOptions {
    fn default() -> Self {
        DiffOptions {
            error_factor: 2.0,
            timing: false,
            throughput_drop_pct: 10.0,
            ratio_floor: 0.1,
            abs_floor: 1e-3,
            strict_coverage: false,
            allow_missing: false,
            time_floor_ms: 0.2,
        }
    }
}

/// A trial named by architecture and trial name.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TrialRef {
    pub arch: String,
    pub trial: String,
    pub path: String,
    pub status: Status,
}

/// A trial whose status changed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StatusChange {
    pub arch: String,
    pub trial: String,
    pub path: String,
    pub base: Status,
    pub new: Status,
    pub message: String,
}

/// A trial failing (or erroring) in both reports for another cause (triage's `cause` column):
/// it still fails, but something new broke in it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CauseChange {
    pub arch: String,
    pub trial: String,
    pub path: String,
    pub base_cause: String,
    pub new_cause: String,
    pub message: String,
}

/// A trial whose error grew past the factor, or crossed its bound.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ErrorGrowth {
    pub arch: String,
    pub trial: String,
    pub path: String,
    #[serde(with = "crate::row::float")]
    pub base_max_abs: f64,
    /// NaN or infinite when the new output was not finite where the base's was.
    #[serde(with = "crate::row::float")]
    pub new_max_abs: f64,
    /// `new_max_abs / base_max_abs` (infinite when the base error was zero).
    #[serde(with = "crate::row::float")]
    pub factor: f64,
    pub new_ratio: Option<f64>,
    /// The error was within its bound (ratio at most 1) in BASE and is over it in NEW.
    pub crossed_bound: bool,
}

/// Everything `relattn report diff` finds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DiffResult {
    pub options: DiffOptions,
    /// Trials present in both reports.
    pub compared: usize,
    /// Passed in base, fail or error in new.
    pub new_failures: Vec<StatusChange>,
    /// Failing in both, for another cause in new (a trial triaged in both reports).
    pub new_causes: Vec<CauseChange>,
    pub error_growth: Vec<ErrorGrowth>,
    /// Architectures whose new report is INCOMPLETE (an interrupted run, or a merge of shards
    /// that do not cover the shard set).
    pub incomplete: Vec<String>,
    /// In base, not in new.
    pub missing: Vec<TrialRef>,
    /// In new, not in base.
    pub added: Vec<TrialRef>,
    /// Passed in base, skipped in new.
    pub newly_skipped: Vec<StatusChange>,
    /// Fail or error in base, pass in new.
    pub fixed: Vec<StatusChange>,
    /// With `options.timing` only (else empty): throughput drops past the percentage.
    pub slowdowns: Vec<Slowdown>,
    /// With `options.timing` only: drops past the percentage on trials under the time floor,
    /// not regressions.
    pub timing_noise: Vec<TimingNoise>,
}

impl DiffResult {
    /// A correctness regression, or with `options.timing` a slowdown.
    pub fn is_regression(&self) -> bool {
        self.is_correctness_regression() || !self.slowdowns.is_empty()
    }

    /// A new failure, error growth, or (unless allowed) lost coverage.
    pub fn is_correctness_regression(&self) -> bool {
        let missing = !self.missing.is_empty() || !self.incomplete.is_empty();
        !self.new_failures.is_empty()
            || !self.new_causes.is_empty()
            || !self.error_growth.is_empty()
            || (missing && !self.options.allow_missing)
            || (self.options.strict_coverage && !self.newly_skipped.is_empty())
    }
}

fn change(arch: &str, b: &Row, n: &Row) -> StatusChange {
    StatusChange {
        arch: arch.to_string(),
        trial: n.trial.clone(),
        path: n.path.clone(),
        base: b.status,
        new: n.status,
        message: n.message.clone(),
    }
}

fn trial_ref(arch: &str, r: &Row) -> TrialRef {
    TrialRef {
        arch: arch.to_string(),
        trial: r.trial.clone(),
        path: r.path.clone(),
        status: r.status,
    }
}

fn index(report: &Report) -> BTreeMap<(&str, &str), &Row> {
    let mut map = BTreeMap::new();
    for (arch, a) in &report.archs {
        for r in &a.rows {
            map.entry((arch.as_str(), r.trial.as_str())).or_insert(r);
        }
    }
    map
}

/// Refuses a comparison of reports of different architectures: both must hold the same set
/// (a `cpu` report against an `sm90` baseline would compare nothing and pass).
pub fn check_comparable(base: &Report, new: &Report) -> Result<(), ReportError> {
    let names = |r: &Report| r.archs.keys().cloned().collect::<Vec<_>>();
    let (b, n) = (names(base), names(new));
    if b == n {
        return Ok(());
    }
    Err(ReportError::ArchMismatch {
        base: base.root.clone(),
        base_archs: b.join(", "),
        new: new.root.clone(),
        new_archs: n.join(", "),
    })
}

/// Compares `new` against `base`, trial by trial within each architecture.
pub fn diff(base: &Report, new: &Report, options: &DiffOptions) -> DiffResult {
    let base_rows = index(base);
    let new_rows = index(new);
    let mut d = DiffResult {
        options: *options,
        compared: 0,
        new_failures: Vec::new(),
        new_causes: Vec::new(),
        error_growth: Vec::new(),
        incomplete: new
            .archs
            .values()
            .filter(|a| !a.complete)
            .map(|a| a.arch.clone())
            .collect(),
        missing: Vec::new(),
        added: Vec::new(),
        newly_skipped: Vec::new(),
        fixed: Vec::new(),
        slowdowns: Vec::new(),
        timing_noise: Vec::new(),
    };
    for (&(arch, trial), b) in &base_rows {
        let Some(n) = new_rows.get(&(arch, trial)) else {
            d.missing.push(trial_ref(arch, b));
            continue;
        };
        d.compared += 1;
        // An unexpected pass is a pass, and an expected failure a failure (a known one still
        // fails the trial that passed in BASE).
        let passed = |s: Status| matches!(s, Status::Pass | Status::XPass);
        let failed = |s: Status| s.is_bad() || s == Status::XFail;
        match (b.status, n.status) {
            (bs, ns) if passed(bs) && failed(ns) => d.new_failures.push(change(arch, b, n)),
            (bs, Status::Skip) if passed(bs) => d.newly_skipped.push(change(arch, b, n)),
            (bs, ns) if failed(bs) && passed(ns) => d.fixed.push(change(arch, b, n)),
            _ => {}
        }
        if let Some(c) = cause_change(arch, b, n) {
            d.new_causes.push(c);
        }
        // A skipped trial has no error; an expected failure's error is expected to be large.
        if [b.status, n.status]
            .iter()
            .any(|s| matches!(s, Status::Skip | Status::XFail))
        {
            continue;
        }
        let new_failure = passed(b.status) && failed(n.status);
        if !new_failure {
            if let Some(g) = error_growth(arch, b, n, options) {
                d.error_growth.push(g);
            }
        }
        if options.timing {
            judge_timing(&mut d, arch, b, n);
        }
    }
    for (&(arch, trial), n) in &new_rows {
        if !base_rows.contains_key(&(arch, trial)) {
            d.added.push(trial_ref(arch, n));
        }
    }
    d
}

/// The cause of a trial that failed in both reports, when it changed (a row triaged in one
/// report only has nothing to compare).
fn cause_change(arch: &str, b: &Row, n: &Row) -> Option<CauseChange> {
    if !(b.status.is_bad() || b.status == Status::XFail)
        || !(n.status.is_bad() || n.status == Status::XFail)
    {
        return None;
    }
    let (bc, nc) = (b.params.get("cause")?, n.params.get("cause")?);
    (bc != nc).then(|| CauseChange {
        arch: arch.to_string(),
        trial: n.trial.clone(),
        path: n.path.clone(),
        base_cause: bc.clone(),
        new_cause: nc.clone(),
        message: n.message.clone(),
    })
}

fn judge_timing(d: &mut DiffResult, arch: &str, b: &Row, n: &Row) {
    let o = d.options;
    let Some(s) = timing::slowdown(arch, b, n, o.throughput_drop_pct) else {
        return;
    };
    let ms = timing::longer_ms(b, n);
    if ms.is_finite() && ms < o.time_floor_ms {
        d.timing_noise.push(TimingNoise { drop: s, ms });
    } else {
        d.slowdowns.push(s);
    }
}

fn error_growth(arch: &str, b: &Row, n: &Row, o: &DiffOptions) -> Option<ErrorGrowth> {
    let (be, ne) = (b.max_abs?, n.max_abs?);
    if !be.is_finite() {
        return None;
    }
    let new_ratio = n.ratio();
    // Within the bound before, over it now: whatever the factor, the verdict's figure changed
    // sides (a row that still says pass is one the judge and the figures disagree on).
    let crossed_bound =
        matches!((b.ratio(), new_ratio), (Some(br), Some(nr)) if br <= 1.0 && nr > 1.0);
    // A NaN or infinite error where the base's was finite is the worst growth there is.
    let non_finite = !ne.is_finite();
    if !non_finite && !crossed_bound && ne <= be * o.error_factor {
        return None;
    }
    let significant = non_finite
        || crossed_bound
        || match new_ratio {
            Some(r) => r >= o.ratio_floor,
            None => ne >= o.abs_floor,
        };
    significant.then(|| ErrorGrowth {
        arch: arch.to_string(),
        trial: n.trial.clone(),
        path: n.path.clone(),
        base_max_abs: be,
        new_max_abs: ne,
        factor: if non_finite || be <= 0.0 {
            f64::INFINITY
        } else {
            ne / be
        },
        new_ratio,
        crossed_bound,
    })
}
