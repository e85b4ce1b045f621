//! Comparing a report against a baseline.

use crate::error::ReportError;
use crate::load::Report;
use crate::row::{short_float, Row, Status};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write;

/// Thresholds of a regression.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct DiffOptions {
    /// max_abs growing by more than this factor is a regression (default 2).
    pub error_factor: f64,
    /// TFLOP/s or GB/s dropping by more than this percentage is a regression (default 10).
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
    /// Throughput changes of trials whose base and new times are both under this many
    /// milliseconds are timing noise: listed as such, never a slowdown (default 0.2).
    pub time_floor_ms: f64,
}

impl Default for DiffOptions {
    fn default() -> Self {
        DiffOptions {
            error_factor: 2.0,
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

/// A trial whose error grew past the factor.
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
}

/// A trial whose throughput dropped past the percentage.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Slowdown {
    pub arch: String,
    pub trial: String,
    pub path: String,
    /// "tflops" or "gbps".
    pub metric: &'static str,
    pub base: f64,
    pub new: f64,
    pub drop_pct: f64,
}

/// A throughput drop past the percentage on a trial too short to time reliably.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TimingNoise {
    #[serde(flatten)]
    pub drop: Slowdown,
    /// The longer of the two times, under `time_floor_ms`.
    pub ms: f64,
}

/// Everything `relattn report diff` finds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DiffResult {
    pub options: DiffOptions,
    /// Trials present in both reports.
    pub compared: usize,
    /// Passed in base, fail or error in new.
    pub new_failures: Vec<StatusChange>,
    pub error_growth: Vec<ErrorGrowth>,
    pub slowdowns: Vec<Slowdown>,
    /// Drops past the percentage on trials under the time floor: not regressions.
    pub timing_noise: Vec<TimingNoise>,
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
}

impl DiffResult {
    pub fn is_regression(&self) -> bool {
        let missing = !self.missing.is_empty() || !self.incomplete.is_empty();
        !self.new_failures.is_empty()
            || !self.error_growth.is_empty()
            || !self.slowdowns.is_empty()
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
        error_growth: Vec::new(),
        slowdowns: Vec::new(),
        timing_noise: Vec::new(),
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
    };
    for (&(arch, trial), b) in &base_rows {
        let Some(n) = new_rows.get(&(arch, trial)) else {
            d.missing.push(trial_ref(arch, b));
            continue;
        };
        d.compared += 1;
        match (b.status, n.status) {
            (Status::Pass, s) if s.is_bad() => d.new_failures.push(change(arch, b, n)),
            (Status::Pass, Status::Skip) => d.newly_skipped.push(change(arch, b, n)),
            (s, Status::Pass) if s.is_bad() => d.fixed.push(change(arch, b, n)),
            _ => {}
        }
        if b.status == Status::Skip || n.status == Status::Skip {
            continue;
        }
        let new_failure = b.status == Status::Pass && n.status.is_bad();
        if !new_failure {
            if let Some(g) = error_growth(arch, b, n, options) {
                d.error_growth.push(g);
            }
        }
        if let Some(s) = slowdown(arch, b, n, options) {
            let ms = b.ms.unwrap_or(f64::NAN).max(n.ms.unwrap_or(f64::NAN));
            if ms.is_finite() && ms < options.time_floor_ms {
                d.timing_noise.push(TimingNoise { drop: s, ms });
            } else {
                d.slowdowns.push(s);
            }
        }
    }
    for (&(arch, trial), n) in &new_rows {
        if !base_rows.contains_key(&(arch, trial)) {
            d.added.push(trial_ref(arch, n));
        }
    }
    d
}

fn error_growth(arch: &str, b: &Row, n: &Row, o: &DiffOptions) -> Option<ErrorGrowth> {
    let (be, ne) = (b.max_abs?, n.max_abs?);
    if !be.is_finite() {
        return None;
    }
    // A NaN or infinite error where the base's was finite is the worst growth there is.
    let non_finite = !ne.is_finite();
    if !non_finite && ne <= be * o.error_factor {
        return None;
    }
    let new_ratio = n.ratio();
    let significant = non_finite
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
    })
}

fn slowdown(arch: &str, b: &Row, n: &Row, o: &DiffOptions) -> Option<Slowdown> {
    let metrics: [(&'static str, Option<f64>, Option<f64>); 2] =
        [("tflops", b.tflops, n.tflops), ("gbps", b.gbps, n.gbps)];
    metrics
        .into_iter()
        .filter_map(|(metric, bv, nv)| {
            let (bv, nv) = (bv?, nv?);
            if !(bv.is_finite() && nv.is_finite()) || bv <= 0.0 {
                return None;
            }
            let drop_pct = (bv - nv) / bv * 100.0;
            (drop_pct > o.throughput_drop_pct).then(|| Slowdown {
                arch: arch.to_string(),
                trial: n.trial.clone(),
                path: n.path.clone(),
                metric,
                base: bv,
                new: nv,
                drop_pct,
            })
        })
        .max_by(|a, c| a.drop_pct.total_cmp(&c.drop_pct))
}

fn slowdown_line(x: &Slowdown) -> String {
    format!(
        "[{}] {}: {} {} -> {} (-{}%)",
        x.arch,
        x.trial,
        x.metric,
        short_float(x.base),
        short_float(x.new),
        short_float(x.drop_pct)
    )
}

/// Entries listed per section before "and N more".
const LISTED: usize = 30;

fn section<T>(s: &mut String, title: &str, items: &[T], line: impl Fn(&T) -> String) {
    if items.is_empty() {
        return;
    }
    let _ = writeln!(s, "\n{title} ({}):", items.len());
    for it in items.iter().take(LISTED) {
        let _ = writeln!(s, "  {}", line(it));
    }
    if items.len() > LISTED {
        let _ = writeln!(
            s,
            "  ... and {} more (use --json for all)",
            items.len() - LISTED
        );
    }
}

impl DiffResult {
    /// Text for a terminal or a CI log.
    pub fn render(&self) -> String {
        let o = &self.options;
        let mut s = format!(
            "{}: {} trials compared, {} new failures, {} error growths (> {}x), {} slowdowns \
             (> {}%), {} timing noise (under {} ms), {} missing, {} added, {} newly skipped, \
             {} fixed\n",
            if self.is_regression() {
                "REGRESSION"
            } else {
                "no regression"
            },
            self.compared,
            self.new_failures.len(),
            self.error_growth.len(),
            o.error_factor,
            self.slowdowns.len(),
            o.throughput_drop_pct,
            self.timing_noise.len(),
            o.time_floor_ms,
            self.missing.len(),
            self.added.len(),
            self.newly_skipped.len(),
            self.fixed.len()
        );
        if !self.incomplete.is_empty() {
            let _ = writeln!(
                s,
                "\nINCOMPLETE new report ({}): an interrupted run or a merge of shards that do \
                 not cover the shard set{}",
                self.incomplete.join(", "),
                if o.allow_missing {
                    " (allowed by --allow-missing)"
                } else {
                    ""
                }
            );
        }
        if !self.missing.is_empty() && !o.allow_missing {
            let _ = writeln!(
                s,
                "\n{} trial(s) of the baseline are missing from the new report: a regression \
                 unless --allow-missing",
                self.missing.len()
            );
        }
        let first_line = |m: &str| m.lines().next().unwrap_or("").to_string();
        section(&mut s, "New failures", &self.new_failures, |c| {
            format!(
                "[{}] {} ({} -> {}): {}",
                c.arch,
                c.trial,
                c.base,
                c.new,
                first_line(&c.message)
            )
        });
        section(&mut s, "Error growth", &self.error_growth, |g| {
            let ratio = g
                .new_ratio
                .map(|r| format!(", {} of bound", short_float(r)))
                .unwrap_or_default();
            format!(
                "[{}] {}: max_abs {} -> {} ({}x{ratio})",
                g.arch,
                g.trial,
                short_float(g.base_max_abs),
                short_float(g.new_max_abs),
                short_float(g.factor)
            )
        });
        section(&mut s, "Slowdowns", &self.slowdowns, slowdown_line);
        section(
            &mut s,
            "Timing noise (not regressions)",
            &self.timing_noise,
            |x| format!("{} at {} ms", slowdown_line(&x.drop), short_float(x.ms)),
        );
        section(&mut s, "Missing from the new report", &self.missing, |t| {
            format!("[{}] {} ({})", t.arch, t.trial, t.status)
        });
        section(&mut s, "Newly skipped", &self.newly_skipped, |c| {
            format!("[{}] {}: {}", c.arch, c.trial, first_line(&c.message))
        });
        section(&mut s, "Added", &self.added, |t| {
            format!("[{}] {} ({})", t.arch, t.trial, t.status)
        });
        section(&mut s, "Fixed", &self.fixed, |c| {
            format!("[{}] {} ({} -> pass)", c.arch, c.trial, c.base)
        });
        s
    }
}
