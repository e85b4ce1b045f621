//! The timing half of a diff: throughput drops, judged only when asked for (`--timing`).
//!
//! A row stores one time per trial (`ms`, a median of a few launches) and the throughputs
//! derived from it, not the samples: nothing in a report says how much that time varies from
//! run to run, so a drop cannot be told from noise and two runs of the same build differ by
//! tens of percent. Timing is therefore no part of the default verdict.

use crate::row::{short_float, Row};
use serde::Serialize;

/// Why the default diff does not judge timing, said once in its output.
pub const NOT_JUDGED: &str = "Timing not judged: a row holds one time per trial (`ms`, a \
    median), not its samples, so no change can be told from run-to-run spread; --timing \
    compares TFLOP/s and GB/s against --throughput-drop";

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

/// The larger of the TFLOP/s and GB/s drops of a trial, when past `drop_pct_limit`.
pub(crate) fn slowdown(arch: &str, b: &Row, n: &Row, drop_pct_limit: f64) -> Option<Slowdown> {
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
            (drop_pct > drop_pct_limit).then(|| Slowdown {
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

/// The longer of the two times (NaN when neither was measured).
pub(crate) fn longer_ms(b: &Row, n: &Row) -> f64 {
    b.ms.unwrap_or(f64::NAN).max(n.ms.unwrap_or(f64::NAN))
}

pub(crate) fn slowdown_line(x: &Slowdown) -> String {
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
