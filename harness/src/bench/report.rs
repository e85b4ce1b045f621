//! What `relattn bench` reports: one row per (shape, path) with its timing and derived rates as
//! percentages of the measured peaks, the fastest path per shape, a text table, JSON and the
//! roofline plot.

use super::shapes::Figures;
use relattn_kernels::gpu::{Peaks, Timing};
use relattn_reports::RooflinePoint;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

/// How a (shape, path) row ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RowStatus {
    /// Timed; every output element was written.
    Ok,
    /// The path cannot take the shape (the message says why); not an error.
    Unsupported,
    /// Not run: the --budget-s time was spent; not an error.
    Skipped,
    /// Generation, upload, launch failed, or the outputs were not all written.
    Error,
}

/// One (shape, path).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchRow {
    pub shape: String,
    pub path: String,
    pub status: RowStatus,
    /// Why a row is unsupported or failed; empty when ok.
    pub message: String,
    /// KV splits the path's policy used.
    pub num_splits: Option<usize>,
    /// Kernels of one launch of the path, in order.
    pub kernels: Vec<String>,
    /// Uploaded copies of the inputs the timed launches rotate through.
    pub input_sets: usize,
    pub figures: Figures,
    pub timing: Option<Timing>,
    /// At the median time.
    pub tflops: Option<f64>,
    pub tflops_pct_peak: Option<f64>,
    /// K/V bytes over the median time.
    pub gbps: Option<f64>,
    pub gbps_pct_peak: Option<f64>,
    /// The shortest time the work allows: max(FLOP / GEMM peak, fewest bytes / copy peak).
    pub floor_ms: Option<f64>,
    /// Which term of the floor is larger: "compute" or "memory".
    pub bound: Option<String>,
    /// Median time over the fastest native path's on the same shape (1.0: as fast).
    #[serde(default)]
    pub vs_native: Option<f64>,
}

impl BenchRow {
    /// A row that did not produce a timing.
    pub fn not_timed(
        shape: &str,
        path: &str,
        status: RowStatus,
        message: impl Into<String>,
        figures: Figures,
    ) -> BenchRow {
        BenchRow {
            shape: shape.to_string(),
            path: path.to_string(),
            status,
            message: message.into(),
            num_splits: None,
            kernels: Vec::new(),
            input_sets: 0,
            figures,
            timing: None,
            tflops: None,
            tflops_pct_peak: None,
            gbps: None,
            gbps_pct_peak: None,
            floor_ms: None,
            bound: None,
            vs_native: None,
        }
    }

    /// A timed row; rates from the median, percentages and floor from `peaks` when known.
    pub fn timed(
        shape: &str,
        path: &str,
        figures: Figures,
        timing: Timing,
        peaks: Option<&Peaks>,
    ) -> BenchRow {
        let secs = timing.median_ms * 1e-3;
        let rate = |x: f64| (secs > 0.0).then(|| x / secs);
        let tflops = rate(figures.flops / 1e12);
        let gbps = rate(figures.kv_bytes / 1e9);
        let pct = |x: Option<f64>, peak: f64| x.filter(|_| peak > 0.0).map(|x| 100.0 * x / peak);
        let (mut tflops_pct_peak, mut gbps_pct_peak, mut floor_ms, mut bound) =
            (None, None, None, None);
        if let Some(p) = peaks {
            tflops_pct_peak = pct(tflops, p.gemm.tflops);
            gbps_pct_peak = pct(gbps, p.copy.gbps);
            if p.gemm.tflops > 0.0 && p.copy.gbps > 0.0 {
                let compute = figures.flops / (p.gemm.tflops * 1e12) * 1e3;
                let memory = figures.min_bytes / (p.copy.gbps * 1e9) * 1e3;
                floor_ms = Some(compute.max(memory));
                bound = Some(
                    if compute >= memory {
                        "compute"
                    } else {
                        "memory"
                    }
                    .to_string(),
                );
            }
        }
        BenchRow {
            timing: Some(timing),
            tflops,
            tflops_pct_peak,
            gbps,
            gbps_pct_peak,
            floor_ms,
            bound,
            ..BenchRow::not_timed(shape, path, RowStatus::Ok, "", figures)
        }
    }

    pub fn median_ms(&self) -> Option<f64> {
        self.timing.as_ref().map(|t| t.median_ms)
    }

    /// One of this project's paths (worker rows are named `<worker>/<path>`).
    pub fn is_native(&self) -> bool {
        !self.path.contains('/')
    }
}

/// Set every timed row's `vs_native`: its median over the fastest native path's on its shape.
pub fn fill_vs_native(rows: &mut [BenchRow]) {
    let fastest = |shape: &str, rows: &[BenchRow]| {
        rows.iter()
            .filter(|r| r.shape == shape && r.is_native() && r.status == RowStatus::Ok)
            .filter_map(BenchRow::median_ms)
            .min_by(f64::total_cmp)
    };
    for i in 0..rows.len() {
        let best = fastest(&rows[i].shape, rows);
        let row = &mut rows[i];
        row.vs_native = match (row.status, row.median_ms(), best) {
            (RowStatus::Ok, Some(ms), Some(b)) if b > 0.0 => Some(ms / b),
            _ => None,
        };
    }
}

/// The device a report was measured on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceSummary {
    pub index: usize,
    pub name: String,
    /// e.g. "9.0".
    pub capability: String,
    /// e.g. "sm_90".
    pub arch: String,
    pub driver: String,
    pub cuda_version: Option<String>,
    pub nvrtc_version: Option<String>,
    pub memory_total_bytes: u64,
}

/// Everything one `relattn bench` measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchReport {
    /// The command line that produced the report.
    pub command: String,
    pub device: DeviceSummary,
    pub peaks: Option<Peaks>,
    /// Timed launches per row, after `warmup` untimed ones.
    pub reps: usize,
    pub warmup: usize,
    pub seed: u64,
    pub rows: Vec<BenchRow>,
}

impl BenchReport {
    /// Per shape (in the order of first appearance), the ok row with the smallest median.
    /// The fastest native path of each shape. Worker rows stand against it in their
    /// `vs_native` column instead: the bench does not judge outputs, and a worker path forced
    /// onto the wrong architecture can be fast and wrong.
    pub fn fastest(&self) -> Vec<&BenchRow> {
        let mut best: Vec<&BenchRow> = Vec::new();
        for row in self
            .rows
            .iter()
            .filter(|r| r.status == RowStatus::Ok && r.is_native())
        {
            let Some(ms) = row.median_ms() else { continue };
            match best.iter_mut().find(|b| b.shape == row.shape) {
                Some(b) if b.median_ms().is_some_and(|m| ms < m) => *b = row,
                Some(_) => {}
                None => best.push(row),
            }
        }
        best
    }

    pub fn to_json(&self) -> serde_json::Result<String> {
        serde_json::to_string_pretty(self).map(|s| s + "\n")
    }
}

/// The roofline of the table (`relattn bench --plot`): each timed row at its FLOP per fewest
/// byte and TFLOP/s, one series per path, under the measured roofs.
pub fn roofline_svg(r: &BenchReport) -> Result<String, String> {
    let points: Vec<RooflinePoint> = r
        .rows
        .iter()
        .filter(|row| row.status == RowStatus::Ok && row.figures.min_bytes > 0.0)
        .filter_map(|row| {
            Some(RooflinePoint {
                series: row.path.clone(),
                label: row.shape.clone(),
                intensity: row.figures.flops / row.figures.min_bytes,
                tflops: row.tflops?,
            })
        })
        .collect();
    let peaks = r.peaks.as_ref().map(|p| (p.gemm.tflops, p.copy.gbps));
    let title = format!("roofline: {} ({})", r.device.name, r.device.arch);
    relattn_reports::roofline(&title, &points, peaks)
}

fn opt(x: Option<f64>, decimals: usize) -> String {
    match x {
        Some(v) => format!("{v:.decimals$}"),
        None => "-".into(),
    }
}

/// The header lines: device and peaks.
pub fn format_header(r: &BenchReport) -> String {
    let mut s = String::new();
    let d = &r.device;
    let _ = writeln!(
        s,
        "relattn bench on GPU {} {} (capability {}, {}), driver {}; {} timed launches after {} warm-up per row, seed {}",
        d.index, d.name, d.capability, d.arch, d.driver, r.reps, r.warmup, r.seed
    );
    match &r.peaks {
        Some(p) => {
            let _ = writeln!(
                s,
                "peaks: copy {:.0} GB/s ({} MiB device to device, read + written, median {:.3} ms); \
                 cuBLAS bf16 {}x{}x{} {:.1} TFLOP/s (median {:.3} ms); L2 {} MiB",
                p.copy.gbps,
                p.copy.bytes >> 20,
                p.copy.time.median_ms,
                p.gemm.m,
                p.gemm.n,
                p.gemm.k,
                p.gemm.tflops,
                p.gemm.time.median_ms,
                p.l2_bytes >> 20
            );
        }
        None => {
            let _ = writeln!(s, "peaks: not measured (no percentages)");
        }
    }
    s
}

/// The table's columns; the ones after `path` are numbers.
const COLUMNS: [&str; 14] = [
    "shape",
    "path",
    "splits",
    "sets",
    "median ms",
    "min ms",
    "max ms",
    "TFLOP/s",
    "%peak",
    "GB/s",
    "%peak",
    "floor ms",
    "x native",
    "status",
];

/// A row's cells, in `COLUMNS` order (`-` where there is no figure).
fn cells(row: &BenchRow) -> Vec<String> {
    let t = row.timing.as_ref();
    let ms = |f: fn(&Timing) -> f64| t.map_or("-".into(), |t| format!("{:.3}", f(t)));
    let status = match (&row.timing, row.status) {
        (Some(_), RowStatus::Ok) if row.message.is_empty() => String::new(),
        (Some(_), RowStatus::Ok) => format!("note: {}", row.message),
        (Some(_), _) => format!("INVALID: {}", row.message),
        (None, RowStatus::Unsupported) => format!("unsupported: {}", row.message),
        (None, RowStatus::Skipped) => format!("skipped: {}", row.message),
        (None, _) => format!("ERROR: {}", row.message),
    };
    vec![
        row.shape.clone(),
        row.path.clone(),
        row.num_splits.map_or("-".to_string(), |n| n.to_string()),
        row.input_sets.to_string(),
        ms(|t| t.median_ms),
        ms(|t| t.min_ms),
        ms(|t| t.max_ms),
        opt(row.tflops, 1),
        opt(row.tflops_pct_peak, 1),
        opt(row.gbps, 0),
        opt(row.gbps_pct_peak, 1),
        opt(row.floor_ms, 3),
        opt(row.vs_native, 2),
        status,
    ]
}

/// The table of every row.
pub fn format_table(rows: &[BenchRow]) -> String {
    let mut t = crate::table::new(&COLUMNS, &(2..COLUMNS.len() - 1).collect::<Vec<_>>());
    for row in rows {
        t.add_row(cells(row));
    }
    crate::table::text(&t)
}

/// One row as a progress line, printed as soon as it is measured: `column value` pairs.
pub fn format_row(row: &BenchRow) -> String {
    let c = cells(row);
    let mut line = format!("{} {}:", c[0], c[1]);
    for (name, value) in COLUMNS.iter().zip(&c).skip(2).take(COLUMNS.len() - 3) {
        if value != "-" {
            let _ = write!(line, " {name} {value};");
        }
    }
    line.pop();
    if !c[COLUMNS.len() - 1].is_empty() {
        let _ = write!(line, " ({})", c[COLUMNS.len() - 1]);
    }
    line
}

/// The fastest path per shape, with where it stands against the floor.
pub fn format_fastest(r: &BenchReport) -> String {
    let mut s =
        String::from("fastest path per shape (native paths; workers: the x native column):\n");
    for row in r.fastest() {
        let ms = row.median_ms().unwrap_or(f64::NAN);
        let _ = write!(
            s,
            "  {:<16} {:<22} {:>9.3} ms  {} TFLOP/s ({}% of peak)  {} GB/s ({}% of peak)",
            row.shape,
            row.path,
            ms,
            opt(row.tflops, 1),
            opt(row.tflops_pct_peak, 1),
            opt(row.gbps, 0),
            opt(row.gbps_pct_peak, 1),
        );
        if let (Some(floor), Some(bound)) = (row.floor_ms, &row.bound) {
            let _ = write!(
                s,
                "  floor {floor:.3} ms ({bound}-bound), {:.1}x the floor",
                ms / floor
            );
        }
        s.push('\n');
    }
    s
}

/// Header, table and fastest paths.
pub fn format_report(r: &BenchReport) -> String {
    let mut s = format_header(r);
    s.push_str(&format_table(&r.rows));
    s.push_str(&format_fastest(r));
    s
}

#[cfg(test)]
#[path = "report_tests.rs"]
mod tests;
