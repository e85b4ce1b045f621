//! summary.json: counts, worst error-to-bound ratios and timing aggregates, per path.

use crate::env::Environment;
use crate::row::{Row, Status};
use serde::{Deserialize, Serialize};
use std::cmp::Ordering;
use std::collections::BTreeMap;

/// Version of the summary.json layout; bumped when a field changes meaning.
pub const SCHEMA_VERSION: u32 = 1;

/// Trials per status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusCounts {
    pub pass: usize,
    pub fail: usize,
    pub skip: usize,
    pub error: usize,
    /// Expected failures (`--xfail`); absent in reports written before they existed.
    #[serde(default)]
    pub xfail: usize,
    /// Unexpected passes under non-strict `--xfail` entries.
    #[serde(default)]
    pub xpass: usize,
}

impl StatusCounts {
    pub fn add(&mut self, status: Status) {
        *self.get_mut(status) += 1;
    }

    pub fn get(&self, status: Status) -> usize {
        match status {
            Status::Pass => self.pass,
            Status::Fail => self.fail,
            Status::Skip => self.skip,
            Status::Error => self.error,
            Status::XFail => self.xfail,
            Status::XPass => self.xpass,
        }
    }

    fn get_mut(&mut self, status: Status) -> &mut usize {
        match status {
            Status::Pass => &mut self.pass,
            Status::Fail => &mut self.fail,
            Status::Skip => &mut self.skip,
            Status::Error => &mut self.error,
            Status::XFail => &mut self.xfail,
            Status::XPass => &mut self.xpass,
        }
    }

    pub fn total(&self) -> usize {
        self.pass + self.fail + self.skip + self.error + self.xfail + self.xpass
    }
}

/// The trial that used the largest share of its error bound.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorstRatio {
    pub trial: String,
    /// `max_abs / bound`; NaN when the output was not finite.
    #[serde(with = "crate::row::float")]
    pub ratio: f64,
    #[serde(with = "crate::row::float")]
    pub max_abs: f64,
    #[serde(with = "crate::row::float")]
    pub bound: f64,
}

/// Timing aggregates over the rows of a path that carry a time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Timing {
    pub timed_trials: usize,
    pub total_ms: f64,
    pub median_ms: f64,
    pub max_ms: f64,
    pub slowest_trial: String,
    pub median_tflops: Option<f64>,
    pub best_tflops: Option<f64>,
    pub median_gbps: Option<f64>,
    pub best_gbps: Option<f64>,
    /// `best_tflops` as a percentage of the device's measured peak, when the environment
    /// carries one (`extra.peak_tflops`, as `relattn bench` measures it).
    #[serde(default)]
    pub best_tflops_pct_of_peak: Option<f64>,
    /// `best_gbps` as a percentage of `extra.peak_gbps` (measured copy bandwidth).
    #[serde(default)]
    pub best_gbps_pct_of_peak: Option<f64>,
}

/// Everything summary.json says about one path.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PathSummary {
    pub counts: StatusCounts,
    /// Counts per value of the `layer` parameter ("-" where a row has none).
    pub by_layer: BTreeMap<String, StatusCounts>,
    pub worst: Option<WorstRatio>,
    pub timing: Option<Timing>,
}

/// The content of summary.json.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub schema_version: u32,
    /// Directory name of the architecture: "sm90", "sm100", "cpu".
    pub arch: String,
    /// False while the run is going on, or when it was interrupted before the report was finished.
    pub complete: bool,
    pub environment: Environment,
    pub counts: StatusCounts,
    pub by_path: BTreeMap<String, PathSummary>,
    pub compile_checks_failed: usize,
}

impl Summary {
    /// Computes the summary of `rows`.
    pub fn of(arch: &str, environment: Environment, rows: &[Row], complete: bool) -> Summary {
        let mut counts = StatusCounts::default();
        let mut groups: BTreeMap<&str, Vec<&Row>> = BTreeMap::new();
        for r in rows {
            counts.add(r.status);
            groups.entry(r.path.as_str()).or_default().push(r);
        }
        let peak = |key: &str| {
            environment
                .extra
                .get(key)
                .and_then(|v| v.as_f64())
                .filter(|p| *p > 0.0)
        };
        let (peak_tflops, peak_gbps) = (peak("peak_tflops"), peak("peak_gbps"));
        let by_path = groups
            .into_iter()
            .map(|(p, rs)| {
                let mut ps = path_summary(&rs);
                if let Some(t) = ps.timing.as_mut() {
                    t.best_tflops_pct_of_peak = pct(t.best_tflops, peak_tflops);
                    t.best_gbps_pct_of_peak = pct(t.best_gbps, peak_gbps);
                }
                (p.to_string(), ps)
            })
            .collect();
        let compile_checks_failed = environment.compile_checks.iter().filter(|c| !c.ok).count();
        Summary {
            schema_version: SCHEMA_VERSION,
            arch: arch.to_string(),
            complete,
            environment,
            counts,
            by_path,
            compile_checks_failed,
        }
    }

    /// Whether every trial that ran passed and every compile check succeeded.
    pub fn all_passed(&self) -> bool {
        self.counts.fail == 0 && self.counts.error == 0 && self.compile_checks_failed == 0
    }
}

/// Orders ratios with NaN above everything: a non-finite output is the worst result there is.
pub(crate) fn cmp_ratio(a: f64, b: f64) -> Ordering {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        (false, false) => a.total_cmp(&b),
    }
}

fn path_summary(rows: &[&Row]) -> PathSummary {
    let mut counts = StatusCounts::default();
    let mut by_layer: BTreeMap<String, StatusCounts> = BTreeMap::new();
    for r in rows {
        counts.add(r.status);
        by_layer
            .entry(r.layer().to_string())
            .or_default()
            .add(r.status);
    }
    PathSummary {
        counts,
        by_layer,
        worst: worst_ratio(rows),
        timing: timing(rows),
    }
}

pub(crate) fn worst_ratio(rows: &[&Row]) -> Option<WorstRatio> {
    rows.iter()
        .filter_map(|r| {
            let ratio = r.ratio()?;
            Some(WorstRatio {
                trial: r.trial.clone(),
                ratio,
                max_abs: r.max_abs.unwrap_or(f64::NAN),
                bound: r.bound.unwrap_or(f64::NAN),
            })
        })
        .max_by(|a, b| cmp_ratio(a.ratio, b.ratio))
}

fn pct(value: Option<f64>, peak: Option<f64>) -> Option<f64> {
    Some(value? / peak? * 100.0)
}

/// The median of a list (`relattn_common::stats::median`).
fn median(v: Vec<f64>) -> Option<f64> {
    relattn_common::stats::median(&v)
}

fn finite(rows: &[&Row], f: impl Fn(&Row) -> Option<f64>) -> Vec<f64> {
    rows.iter()
        .filter_map(|r| f(r))
        .filter(|v| v.is_finite())
        .collect()
}

fn timing(rows: &[&Row]) -> Option<Timing> {
    let timed: Vec<(&Row, f64)> = rows
        .iter()
        .filter_map(|r| r.ms.filter(|m| m.is_finite()).map(|m| (*r, m)))
        .collect();
    let (slowest, max_ms) = timed.iter().max_by(|a, b| a.1.total_cmp(&b.1))?;
    let tflops = finite(rows, |r| r.tflops);
    let gbps = finite(rows, |r| r.gbps);
    Some(Timing {
        timed_trials: timed.len(),
        total_ms: timed.iter().map(|t| t.1).sum(),
        median_ms: median(timed.iter().map(|t| t.1).collect()).unwrap_or(0.0),
        max_ms: *max_ms,
        slowest_trial: slowest.trial.clone(),
        best_tflops: tflops.iter().copied().max_by(f64::total_cmp),
        median_tflops: median(tflops),
        best_gbps: gbps.iter().copied().max_by(f64::total_cmp),
        median_gbps: median(gbps),
        best_tflops_pct_of_peak: None,
        best_gbps_pct_of_peak: None,
    })
}
