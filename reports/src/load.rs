//! Reading reports back: one architecture directory, or a directory of them.

use crate::csv_io::read_csv;
use crate::env::Environment;
use crate::error::{io, ReportError};
use crate::row::Row;
use crate::summary::Summary;
use crate::writer::is_arch_name;
use crate::{RESULTS_CSV, RESULTS_JSONL, SUMMARY_JSON};
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};
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

/// Largest report file read (results.jsonl, results.csv, summary.json): 1 GiB, about 20 times
/// a merged nightly report.
pub const MAX_REPORT_FILE_BYTES: u64 = 1 << 30;

/// Refuse a file over [`MAX_REPORT_FILE_BYTES`] before reading it.
fn check_size(path: &Path) -> Result<(), ReportError> {
    let bytes = fs::metadata(path).map_err(io("read", path))?.len();
    if bytes > MAX_REPORT_FILE_BYTES {
        return Err(ReportError::TooLarge {
            path: path.to_path_buf(),
            bytes,
            limit: MAX_REPORT_FILE_BYTES,
        });
    }
    Ok(())
}

fn read_text(path: &Path) -> Result<String, ReportError> {
    check_size(path)?;
    fs::read_to_string(path).map_err(io("read", path))
}

/// Reads one architecture directory. Rows come from results.jsonl when present (exact, and
/// written row by row), else from results.csv; both give the same rows. The architecture
/// (summary.json's `arch`, else the directory's name) must be `sm<digits>` or `cpu`, and no
/// trial may appear twice.
pub fn load_arch(dir: &Path) -> Result<ArchReport, ReportError> {
    let summary_path = dir.join(SUMMARY_JSON);
    let header = if summary_path.is_file() {
        let text = read_text(&summary_path)?;
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
    let (rows, torn, rows_path) = if jsonl.is_file() {
        let (rows, torn) = read_jsonl(&jsonl)?;
        (rows, torn, jsonl)
    } else if csv.is_file() {
        check_size(&csv)?;
        (read_csv(&csv)?, false, csv)
    } else {
        (Vec::new(), false, jsonl)
    };
    let dir_name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let (arch, origin, arch_path) = match header.arch.filter(|a| !a.is_empty()) {
        Some(a) => (a, "summary.json's `arch`", summary_path),
        None => (dir_name, "the directory's name", dir.to_path_buf()),
    };
    if !is_arch_name(&arch) {
        return Err(ReportError::BadArch {
            path: arch_path,
            name: arch,
            origin,
        });
    }
    let rows = unique_trials(&rows_path, rows)?;
    Ok(ArchReport {
        arch,
        dir: dir.to_path_buf(),
        environment: header.environment,
        complete: header.complete && !torn,
        rows,
    })
}

/// The rows, refused if a trial appears twice (`show` would count both copies, `diff` would
/// use one of them).
pub(crate) fn unique_trials(path: &Path, rows: Vec<(u64, Row)>) -> Result<Vec<Row>, ReportError> {
    let mut seen: HashMap<&str, u64> = HashMap::with_capacity(rows.len());
    for (line, row) in &rows {
        if let Some(&first) = seen.get(row.trial.as_str()) {
            return Err(ReportError::DuplicateTrial {
                path: path.to_path_buf(),
                trial: row.trial.clone(),
                first,
                second: *line,
            });
        }
        seen.insert(row.trial.as_str(), *line);
    }
    drop(seen);
    Ok(rows.into_iter().map(|(_, row)| row).collect())
}

/// Reads results.jsonl, each row with its line. A last line without its newline that does not
/// parse is the row being written when the run was killed: it is dropped and reported as
/// `torn`. An empty `first_bad` reads as none, as results.csv gives it.
pub(crate) fn read_jsonl(path: &Path) -> Result<(Vec<(u64, Row)>, bool), ReportError> {
    let text = read_text(path)?;
    let ends_cleanly = text.is_empty() || text.ends_with('\n');
    let lines: Vec<&str> = text.lines().collect();
    let mut rows = Vec::with_capacity(lines.len());
    let mut torn = false;
    for (i, line) in lines.iter().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Row>(line) {
            Ok(mut r) => {
                r.first_bad = r.first_bad.filter(|s| !s.is_empty());
                rows.push((i as u64 + 1, r));
            }
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
