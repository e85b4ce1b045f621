//! Reading reports back: one architecture directory, or a directory of them.

use crate::csv_io::read_csv;
use crate::env::Environment;
use crate::error::{io, ReportError};
use crate::row::Row;
use crate::summary::Summary;
use crate::{RESULTS_CSV, RESULTS_JSONL, SUMMARY_JSON};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

/// One architecture's report as read from disk.
#[derive(Debug, Clone, PartialEq)]
pub struct ArchReport {
    /// "sm90", "sm100", "cpu".
    pub arch: String,
    /// Where it was read from.
    pub dir: PathBuf,
    pub environment: Environment,
    /// False when the run was interrupted (or is still going on).
    pub complete: bool,
    pub rows: Vec<Row>,
}

impl ArchReport {
    pub fn summary(&self) -> Summary {
        Summary::of(
            &self.arch,
            self.environment.clone(),
            &self.rows,
            self.complete,
        )
    }
}

/// A report directory: one entry per architecture.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    pub root: PathBuf,
    pub archs: BTreeMap<String, ArchReport>,
}

impl Report {
    /// Number of rows over all architectures.
    pub fn len(&self) -> usize {
        self.archs.values().map(|a| a.rows.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What load needs of summary.json; anything else in it is ignored, so newer files still load.
#[derive(Deserialize)]
struct Header {
    #[serde(default)]
    arch: Option<String>,
    #[serde(default)]
    complete: bool,
    #[serde(default)]
    environment: Environment,
}

fn is_arch_dir(dir: &Path) -> bool {
    [RESULTS_JSONL, RESULTS_CSV, SUMMARY_JSON]
        .iter()
        .any(|f| dir.join(f).is_file())
}

/// Reads a report: either `dir` is one architecture directory (it holds results.jsonl,
/// results.csv or summary.json), or its subdirectories are.
pub fn load(dir: &Path) -> Result<Report, ReportError> {
    let meta = fs::metadata(dir).map_err(io("read report directory", dir))?;
    if !meta.is_dir() {
        return Err(ReportError::NotAReport {
            path: dir.to_path_buf(),
        });
    }
    let mut archs = BTreeMap::new();
    if is_arch_dir(dir) {
        let a = load_arch(dir)?;
        archs.insert(a.arch.clone(), a);
    } else {
        let mut subdirs: Vec<PathBuf> = fs::read_dir(dir)
            .map_err(io("list", dir))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_dir() && is_arch_dir(p))
            .collect();
        subdirs.sort();
        for sub in subdirs {
            let a = load_arch(&sub)?;
            archs.insert(a.arch.clone(), a);
        }
    }
    if archs.is_empty() {
        return Err(ReportError::NotAReport {
            path: dir.to_path_buf(),
        });
    }
    Ok(Report {
        root: dir.to_path_buf(),
        archs,
    })
}

/// Reads one architecture directory. Rows come from results.jsonl when present (exact, and
/// written row by row), else from results.csv.
pub fn load_arch(dir: &Path) -> Result<ArchReport, ReportError> {
    let summary_path = dir.join(SUMMARY_JSON);
    let header = if summary_path.is_file() {
        let text = fs::read_to_string(&summary_path).map_err(io("read", &summary_path))?;
        serde_json::from_str::<Header>(&text).map_err(|source| ReportError::Json {
            path: summary_path.clone(),
            source,
        })?
    } else {
        Header {
            arch: None,
            complete: false,
            environment: Environment::default(),
        }
    };
    let jsonl = dir.join(RESULTS_JSONL);
    let csv = dir.join(RESULTS_CSV);
    let (rows, torn) = if jsonl.is_file() {
        read_jsonl(&jsonl)?
    } else if csv.is_file() {
        (read_csv(&csv)?, false)
    } else {
        (Vec::new(), false)
    };
    let dir_name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    Ok(ArchReport {
        arch: header.arch.filter(|a| !a.is_empty()).unwrap_or(dir_name),
        dir: dir.to_path_buf(),
        environment: header.environment,
        complete: header.complete && !torn,
        rows,
    })
}

/// Reads results.jsonl. A last line without its newline that does not parse is the row being
/// written when the run was killed: it is dropped and reported as `torn`.
fn read_jsonl(path: &Path) -> Result<(Vec<Row>, bool), ReportError> {
    let text = fs::read_to_string(path).map_err(io("read", path))?;
    let ends_cleanly = text.is_empty() || text.ends_with('\n');
    let lines: Vec<&str> = text.lines().collect();
    let mut rows = Vec::with_capacity(lines.len());
    let mut torn = false;
    for (i, line) in lines.iter().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Row>(line) {
            Ok(r) => rows.push(r),
            Err(_) if i + 1 == lines.len() && !ends_cleanly => torn = true,
            Err(source) => {
                return Err(ReportError::JsonLine {
                    path: path.to_path_buf(),
                    line: i + 1,
                    source,
                })
            }
        }
    }
    Ok((rows, torn))
}
