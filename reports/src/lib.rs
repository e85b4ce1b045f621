//! relattn-reports: report rows, writers, merge and diff.
//!
//! A report directory holds one subdirectory per architecture (`sm90`, `sm100`, `cpu`), each
//! with:
//! - `results.jsonl`: one JSON row per line, appended as trials finish (survives interruption);
//! - `results.csv`: the same rows, columns [`FIXED_COLUMNS`] then one per parameter (sorted);
//! - `summary.json`: [`Summary`] (schema version, environment, counts, worst ratios, timings);
//! - `summary.md`: tables a person reads, linking the plots; `junit.xml`: for CI test views;
//! - `plots/*.svg`: error / bound per path and against KV length, split count and layer.
//!
//! This crate knows nothing of the other relattn crates (paths and parameters are strings); it
//! only writes its files through `relattn_common::files::write_atomic`, as every relattn
//! file is written.
#![deny(unsafe_code)]

mod csv_io;
mod diff;
mod env;
mod error;
mod junit;
mod load;
mod markdown;
mod merge;
mod plot;
mod roofline;
mod row;
mod summary;
mod text;
mod writer;

pub use csv_io::{ABSENT_CELL, FIXED_COLUMNS};
pub use diff::{
    check_comparable, diff, DiffOptions, DiffResult, ErrorGrowth, Slowdown, StatusChange,
    TimingNoise, TrialRef, TIMING_NOT_JUDGED,
};
pub use env::{CompileCheck, Environment};
pub use error::ReportError;
pub use load::{load, load_arch, ArchReport, Report, MAX_REPORT_FILE_BYTES, MAX_ROW_LINE_BYTES};
pub use merge::merge;
pub use plot::{existing_plots, report_plots, write_plots, PLOTS_DIR, RATIO_FLOOR, REPORT_PLOTS};
pub use roofline::{roofline, RooflinePoint};
pub use row::{Row, Status};
pub use summary::{PathSummary, StatusCounts, Summary, Timing, WorstRatio, SCHEMA_VERSION};
pub use text::{one_line, visible};
pub use writer::{now, ReportWriter};

use std::path::Path;

pub const RESULTS_JSONL: &str = "results.jsonl";
pub const RESULTS_CSV: &str = "results.csv";
pub const SUMMARY_JSON: &str = "summary.json";
pub const SUMMARY_MD: &str = "summary.md";
pub const JUNIT_XML: &str = "junit.xml";

/// summary.md of every architecture in `dir`, computed from the rows (so it also works on an
/// interrupted report).
pub fn show(dir: &Path) -> Result<String, ReportError> {
    let report = load(dir)?;
    Ok(render(&report))
}

/// summary.md of every architecture of a loaded report, separated by blank lines.
pub fn render(report: &Report) -> String {
    report
        .archs
        .values()
        .map(|a| markdown::render(&a.summary(), &a.rows, &existing_plots(&a.dir)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Draws the plots of every architecture of the report in `dir` into its `plots/` and rewrites
/// its summary.md to link them; returns each architecture directory with the plots written.
pub fn plot(dir: &Path) -> Result<Vec<(std::path::PathBuf, Vec<&'static str>)>, ReportError> {
    let report = load(dir)?;
    let mut out = Vec::new();
    for a in report.archs.values() {
        // The directory given may be a link; an architecture directory inside it may not.
        if a.dir != report.root {
            relattn_common::files::create_dir_nofollow(&a.dir)
                .map_err(error::io("write into", &a.dir))?;
        }
        let plots = write_plots(&a.dir, &a.rows)?;
        writer::write_atomic(
            &a.dir.join(SUMMARY_MD),
            markdown::render(&a.summary(), &a.rows, &plots).as_bytes(),
        )?;
        out.push((a.dir.clone(), plots));
    }
    Ok(out)
}
