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
mod report_files;
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
pub use plot::{existing_plots, report_plots, skipped_plots, write_plots, PLOTS_DIR, REPORT_PLOTS};
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

/// What `plot` did in one architecture directory.
#[derive(Debug, Clone, PartialEq)]
pub struct ArchPlots {
    pub dir: std::path::PathBuf,
    /// The plots written, file names in `plots/`.
    pub drawn: Vec<&'static str>,
    /// The plots not drawn although trials were judged, each with the reason.
    pub skipped: Vec<(&'static str, String)>,
}

/// Draws the plots of every architecture of the report in `dir` into its `plots/` and rewrites
/// its summary.md to link them; says for each architecture directory what was drawn and what
/// was not, and why.
pub fn plot(dir: &Path) -> Result<Vec<ArchPlots>, ReportError> {
    let report = load(dir)?;
    let mut out = Vec::new();
    for a in report.archs.values() {
        // The directory given may be a link; an architecture directory inside it may not.
        if a.dir != report.root {
            relattn_common::files::create_dir_nofollow(&a.dir)
                .map_err(error::io("write into", &a.dir))?;
        }
        let drawn = write_plots(&a.dir, &a.rows)?;
        report_files::write_atomic(
            &a.dir.join(SUMMARY_MD),
            markdown::render(&a.summary(), &a.rows, &drawn).as_bytes(),
        )?;
        out.push(ArchPlots {
            dir: a.dir.clone(),
            drawn,
            skipped: skipped_plots(&a.rows),
        });
    }
    Ok(out)
}
