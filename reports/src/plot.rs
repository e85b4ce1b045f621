//! SVG plots of a report (plotters, SVG backend only: no fonts or system libraries; labels are
//! SVG text the viewer renders). Every plot has one series per path.
//!
//! - `headroom.svg`: the distribution (cumulative) of error / bound (`max_abs / bound`) over
//!   the judged trials of each path, with the bound at 1: how much tolerance is left;
//! - `ratio_by_kv_len.svg`, `ratio_by_splits.svg`, `ratio_by_layer.svg`: error / bound of each
//!   trial against the case's longest KV length, the split count it ran with, and its layer;
//!
//! The roofline of `relattn bench` (`crate::roofline`) is drawn with the same chart.
//!
//! Error ratios are drawn as they are, on a log axis fitted to them; ratios of 0 (exact
//! outputs) are drawn a decade below the smallest positive one, and the axis says how many;
//! non-finite ones are counted in the legend, not drawn. A plot against a parameter that
//! every judged trial shares (one split count, say) is not drawn: [`skipped_plots`] says why.

use crate::error::{io, ReportError};
use crate::row::{Row, Status};
use plotters::prelude::*;
use std::collections::BTreeMap;
use std::path::Path;

mod chart;
pub(crate) use chart::{chart, compact, err, log_range, log_tick, Lines, Points, Series};

/// The directory of an architecture report the plots go to.
pub const PLOTS_DIR: &str = "plots";
/// Where ratios of 0 are drawn when no ratio is positive (a log axis has no 0).
const NO_POSITIVE_FLOOR: f64 = 1e-4;
/// The bound (a ratio of 1) is on the ratio axis when the largest ratio is at least this:
/// within two decades the distance to the bound is what the plot shows; further below, the
/// bound would squeeze every point into a sliver of the plot (the axis then says where it is).
const BOUND_IN_VIEW: f64 = 1e-2;
/// Ratios drawn as they are; one beyond is drawn at the nearer end. Real ratios lie well
/// within (a kernel's error is not 1e-12 of a tolerance that is itself a rounding bound), and
/// plotters takes minutes to draw a log axis over hundreds of decades.
const DRAWN_RANGE: (f64, f64) = (1e-12, 1e12);

/// Each report plot: file name, title (the link text in summary.md), and the parameter its
/// x axis shows (none: the headroom distribution).
pub const REPORT_PLOTS: [(&str, &str, Option<&str>); 4] = [
    ("headroom.svg", "error / bound per path", None),
    (
        "ratio_by_kv_len.svg",
        "error / bound against KV length",
        Some("max_kv_len"),
    ),
    (
        "ratio_by_splits.svg",
        "error / bound against split count",
        Some("num_splits_run"),
    ),
    (
        "ratio_by_layer.svg",
        "error / bound against layer",
        Some("layer"),
    ),
];

/// The judged trials of one path: each row with its error ratio (0 raised to the floor), and
/// how many had a non-finite one.
#[derive(Default)]
struct Judged<'a> {
    points: Vec<(&'a Row, f64)>,
    non_finite: usize,
}

/// The judged trials (a bound, not skipped) of each path, and where their zeros are drawn.
struct Ratios<'a> {
    by_path: BTreeMap<&'a str, Judged<'a>>,
    /// A decade below the smallest positive ratio: where ratios of 0 are drawn.
    floor: f64,
    zeros: usize,
    /// Ratios outside [`DRAWN_RANGE`], drawn at its nearer end.
    clamped: usize,
    /// The largest finite ratio as drawn (0 when there is none).
    largest: f64,
}

impl Ratios<'_> {
    fn bound_in_view(&self) -> bool {
        self.largest >= BOUND_IN_VIEW
    }

    /// Values the ratio axis must hold besides the points: the bound when it is in view.
    fn also(&self) -> &'static [f64] {
        if self.bound_in_view() {
            &[1.0]
        } else {
            &[]
        }
    }

    /// The ratio axis' description: what is drawn where it is not the ratio itself, and where
    /// the bound is when it is off the axis.
    fn desc(&self) -> String {
        let mut notes = vec!["log axis".to_string()];
        if self.zeros > 0 {
            notes.push(format!("{} of 0 drawn at {:.1e}", self.zeros, self.floor));
        }
        if self.clamped > 0 {
            let (lowest, highest) = DRAWN_RANGE;
            notes.push(format!(
                "{} outside {lowest:e} to {highest:e} drawn at its ends",
                self.clamped
            ));
        }
        if !self.bound_in_view() {
            notes.push(format!(
                "the bound, 1, is off the axis: largest {:.2e}",
                self.largest
            ));
        }
        format!("max_abs / bound ({})", notes.join("; "))
    }
}

fn ratios(rows: &[Row]) -> Ratios<'_> {
    let (lowest, highest) = DRAWN_RANGE;
    let judged = || {
        rows.iter()
            .filter(|r| r.status != Status::Skip)
            .filter_map(|r| Some((r, r.ratio()?)))
    };
    // Each positive finite ratio as drawn: within the drawn range.
    let drawn = || {
        judged()
            .map(|(_, ratio)| ratio)
            .filter(|v| v.is_finite() && *v > 0.0)
            .map(|v| v.clamp(lowest, highest))
    };
    let smallest = drawn().fold(f64::INFINITY, f64::min);
    let floor = if smallest.is_finite() {
        smallest / 10.0
    } else {
        NO_POSITIVE_FLOOR
    };
    let mut out = Ratios {
        by_path: BTreeMap::new(),
        floor,
        zeros: 0,
        clamped: 0,
        largest: drawn().fold(0.0, f64::max),
    };
    for (r, ratio) in judged() {
        let entry = out.by_path.entry(r.path.as_str()).or_default();
        if !ratio.is_finite() {
            entry.non_finite += 1;
        } else if ratio > 0.0 {
            let shown = ratio.clamp(lowest, highest);
            out.clamped += usize::from(shown != ratio);
            entry.points.push((r, shown));
        } else {
            out.zeros += 1;
            entry.points.push((r, floor));
        }
    }
    out
}

fn legend(path: &str, n: usize, non_finite: usize) -> String {
    match non_finite {
        0 => format!("{path} ({n})"),
        k => format!("{path} ({n}, {k} non-finite)"),
    }
}

/// The cumulative distribution of error / bound per path.
fn headroom(rows: &[Row]) -> Option<Result<String, String>> {
    let judged = ratios(rows);
    let mut series = Series::new();
    for (path, j) in &judged.by_path {
        let mut v: Vec<f64> = j.points.iter().map(|p| p.1).collect();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let mut steps = Vec::with_capacity(2 * n);
        for (i, x) in v.iter().enumerate() {
            steps.push((*x, i as f64 / n as f64));
            steps.push((*x, (i + 1) as f64 / n as f64));
        }
        series.insert(legend(path, n, j.non_finite), steps);
    }
    if series.values().all(Vec::is_empty) {
        return None;
    }
    let x = log_range(series.values().flatten().map(|p| p.0), judged.also(), 2.0);
    Some(chart(
        "error / bound per path (cumulative; the bound is 1)",
        x.log_scale(),
        0.0..1.0,
        &judged.desc(),
        "fraction of judged trials at or below",
        &series,
        Lines,
        (&log_tick, &compact),
        |c| {
            if judged.bound_in_view() {
                c.draw_series(LineSeries::new(
                    [(1.0, 0.0), (1.0, 1.0)],
                    RED.stroke_width(1),
                ))
                .map_err(err)?;
            }
            Ok(())
        },
    ))
}

/// Where a value of parameter `param` goes on the x axis: log2 of a positive number (KV lengths
/// and split counts are mostly powers of two), or for `layer` its slot among `names`.
fn x_position(param: &str, names: &[String], value: &str) -> Option<f64> {
    if param == "layer" {
        names.iter().position(|c| c == value).map(|i| i as f64)
    } else {
        let v = value
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite() && *v > 0.0)?;
        Some(v.log2())
    }
}

/// The distinct values of `param` that the judged trials with a finite ratio can be drawn at,
/// sorted.
fn x_values(judged: &Ratios<'_>, param: &str) -> Vec<String> {
    let mut names: Vec<String> = judged
        .by_path
        .values()
        .flat_map(|j| j.points.iter().filter_map(|(r, _)| r.params.get(param)))
        .filter(|v| param == "layer" || x_position(param, &[], v).is_some())
        .cloned()
        .collect();
    names.sort();
    names.dedup();
    names
}

/// The report plots of `rows` that are not drawn although their trials were judged, each with
/// the reason: every judged trial has the same value of the plot's parameter, and points in
/// one column against it show nothing `headroom.svg` does not.
pub fn skipped_plots(rows: &[Row]) -> Vec<(&'static str, String)> {
    let judged = ratios(rows);
    REPORT_PLOTS
        .iter()
        .filter_map(|&(file, _, param)| {
            let param = param?;
            match x_values(&judged, param).as_slice() {
                [only] => Some((
                    file,
                    format!(
                        "every judged trial has {param} {}: one value is not a plot",
                        crate::text::one_line(only)
                    ),
                )),
                _ => None,
            }
        })
        .collect()
}

/// Error / bound of each judged trial against parameter `param` of its row, when the judged
/// trials hold two values of it or more: a numeric one on a log2 axis, `layer` as one slot per
/// value; the paths side by side within a slot.
fn ratio_by(rows: &[Row], title: &str, param: &str) -> Option<Result<String, String>> {
    let judged = ratios(rows);
    let numeric = param != "layer";
    let names = x_values(&judged, param);
    if names.len() < 2 {
        return None;
    }
    let position = |value: &str| x_position(param, &names, value);
    let by_path = &judged.by_path;
    let paths = by_path.len().max(1) as f64;
    let mut series = Series::new();
    for (i, (path, j)) in by_path.iter().enumerate() {
        let offset = (i as f64 - (paths - 1.0) / 2.0) * 0.5 / paths;
        let xy = j
            .points
            .iter()
            .filter_map(|(r, ratio)| Some((position(r.params.get(param)?)? + offset, *ratio)));
        series.insert(legend(path, j.points.len(), j.non_finite), xy.collect());
    }
    let xs: Vec<f64> = series.values().flatten().map(|p| p.0).collect();
    if xs.is_empty() {
        return None;
    }
    let lo = xs.iter().copied().fold(f64::INFINITY, f64::min).floor() - 0.5;
    let hi = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max).ceil() + 0.5;
    let label = move |v: &f64| {
        let k = v.round();
        if (v - k).abs() > 1e-6 {
            String::new()
        } else if numeric {
            power_of_two(k)
        } else {
            names.get(k as usize).cloned().unwrap_or_default()
        }
    };
    // Room above the points for the legend.
    let y = log_range(series.values().flatten().map(|p| p.1), judged.also(), 8.0);
    let x_desc = if numeric {
        format!("{param} (log2 axis)")
    } else {
        param.to_string()
    };
    let y_desc = judged.desc();
    Some(chart(
        title,
        lo..hi,
        y.log_scale(),
        &x_desc,
        &y_desc,
        &series,
        Points,
        (&label, &log_tick),
        |c| {
            if judged.bound_in_view() {
                c.draw_series(LineSeries::new([(lo, 1.0), (hi, 1.0)], RED.stroke_width(1)))
                    .map_err(err)?;
            }
            Ok(())
        },
    ))
}

/// `2^k` as `512`, `4k`, `1M` (binary thousands, as KV lengths are counted).
fn power_of_two(k: f64) -> String {
    let v = 2f64.powf(k);
    match v {
        _ if v >= 1048576.0 => format!("{}M", v / 1048576.0),
        _ if v >= 1024.0 => format!("{}k", v / 1024.0),
        _ => format!("{v}"),
    }
}

/// The report plots of `rows` that have something to show: (file name, SVG).
pub fn report_plots(rows: &[Row]) -> Result<Vec<(&'static str, String)>, String> {
    let mut out = Vec::new();
    for (file, title, param) in REPORT_PLOTS {
        let svg = match param {
            None => headroom(rows),
            Some(p) => ratio_by(rows, title, p),
        };
        if let Some(svg) = svg {
            out.push((file, svg?));
        }
    }
    Ok(out)
}

/// Writes the report plots of `rows` to `arch_dir/plots/` (each atomically), removes the ones
/// that have nothing to show any more, and returns the names of those written.
pub fn write_plots(arch_dir: &Path, rows: &[Row]) -> Result<Vec<&'static str>, ReportError> {
    let dir = arch_dir.join(PLOTS_DIR);
    let plots = report_plots(rows).map_err(|message| ReportError::Plot {
        path: dir.clone(),
        message,
    })?;
    if !plots.is_empty() {
        // Never a link: the plots would be written wherever it points.
        relattn_common::files::create_dir_nofollow(&dir).map_err(io("create directory", &dir))?;
    }
    for (file, svg) in &plots {
        crate::report_files::write_atomic(&dir.join(file), svg.as_bytes())?;
    }
    remove_plots(arch_dir, |f| !plots.iter().any(|(w, _)| *w == f))?;
    Ok(plots.iter().map(|(f, _)| *f).collect())
}

/// Removes the report plots of `arch_dir` that `stale` says are stale.
pub(crate) fn remove_plots(
    arch_dir: &Path,
    stale: impl Fn(&str) -> bool,
) -> Result<(), ReportError> {
    let dir = arch_dir.join(PLOTS_DIR);
    match std::fs::symlink_metadata(&dir) {
        Ok(m) if m.is_dir() => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        // A link (or anything else) named plots/: files are never removed through it.
        Ok(_) => {
            return relattn_common::files::create_dir_nofollow(&dir)
                .map_err(io("remove the plots in", &dir))
        }
        Err(e) => return Err(io("remove the plots in", &dir)(e)),
    }
    for (file, _, _) in REPORT_PLOTS.iter().filter(|p| stale(p.0)) {
        let p = dir.join(file);
        match std::fs::remove_file(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io("remove", &p)(e)),
        }
    }
    Ok(())
}

/// The report plots present in `arch_dir/plots/`, in [`REPORT_PLOTS`] order.
pub fn existing_plots(arch_dir: &Path) -> Vec<&'static str> {
    REPORT_PLOTS
        .iter()
        .map(|p| p.0)
        .filter(|f| {
            // Real files only: a link in plots/ is not a plot relattn drew.
            std::fs::symlink_metadata(arch_dir.join(PLOTS_DIR).join(f)).is_ok_and(|m| m.is_file())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_figures_draw_without_panicking() {
        let mut rows = Vec::new();
        for (i, (err, bound, kv)) in [
            (1e300, 1e-300, "inf"),
            (f64::NAN, 1.0, "1e308"),
            (0.0, 5e-324, "-4"),
            (1.0, f64::INFINITY, "NaN"),
            (1e-3, 2e-2, "512"),
            // A ratio of 5e-308: 300 decades below the others.
            (5.0, 1e308, "1024"),
            // And one of 1e300, 300 decades above.
            (1e300, 1.0, "2048"),
        ]
        .into_iter()
        .enumerate()
        {
            let mut r = Row::new("c", format!("t{i}"), "p<&\"'>", Status::Pass);
            (r.max_abs, r.bound) = (Some(err), Some(bound));
            r.params.insert("max_kv_len".into(), kv.into());
            r.params.insert("num_splits_run".into(), kv.into());
            r.params.insert("layer".into(), format!("<layer {i}>&"));
            rows.push(r);
        }
        let plots = report_plots(&rows).unwrap();
        // A plot whose parameter has one drawable value is skipped, with a reason.
        assert_eq!(plots.len() + skipped_plots(&rows).len(), REPORT_PLOTS.len());
        assert!(plots.iter().all(|(_, svg)| !svg.contains("<layer")));
        let (_, headroom) = &plots[0];
        assert!(
            headroom.contains("2 outside 1e-12 to 1e12 drawn at its ends"),
            "{headroom}"
        );
    }

    #[test]
    fn a_log_axis_labels_only_one_two_and_five_per_decade() {
        let labelled: Vec<String> = [
            1e-5,
            2e-5,
            3e-5,
            5e-5,
            8e-5,
            9e-5,
            1e-4,
            2e-4,
            3.0000000000000004e-5,
        ]
        .iter()
        .map(log_tick)
        .collect();
        assert_eq!(
            labelled,
            ["1e-5", "2e-5", "", "5e-5", "", "", "1e-4", "2e-4", ""]
        );
        assert_eq!(log_tick(&0.0), "");
        assert_eq!(log_tick(&f64::NAN), "");
        assert_eq!(log_tick(&20.0), "20");
    }

    #[test]
    fn tick_labels_are_short() {
        for (v, text) in [
            (3.0000000000000004e-5, "3e-5"),
            (1.5e-7, "1.5e-7"),
            (2e6, "2e6"),
            (0.25, "0.25"),
        ] {
            assert_eq!(compact(&v), text);
        }
    }
}
