//! Reading reports back: one architecture directory, or a directory of them.

use crate::csv_io::read_csv;
use crate::env::Environment;
use crate::error::{io, ReportError};
use crate::report_files::is_arch_name;
use crate::row::Row;
use crate::summary::Summary;
use crate::{RESULTS_CSV, RESULTS_JSONL, SUMMARY_JSON};
use relattn_common::files;
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io::{BufRead, BufReader, Read};
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
        .any(|f| present(&dir.join(f)))
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

/// Longest line of results.jsonl: a row is a few kilobytes, its message included.
pub const MAX_ROW_LINE_BYTES: usize = 16 << 20;

/// Opens a report file: a regular file (a link to one is followed, as inputs may be links), at
/// most [`MAX_REPORT_FILE_BYTES`] long; a FIFO, device or directory is refused without being
/// read. The reader stops at the limit even if the file grows while it is read.
fn open_report_file(path: &Path) -> Result<std::io::Take<fs::File>, ReportError> {
    let (file, bytes) = files::open_regular(path).map_err(io("read", path))?;
    if bytes > MAX_REPORT_FILE_BYTES {
        return Err(ReportError::TooLarge {
            path: path.to_path_buf(),
            bytes,
            limit: MAX_REPORT_FILE_BYTES,
        });
    }
    Ok(file.take(MAX_REPORT_FILE_BYTES))
}

/// Whether anything (of any type, a dangling link included) is at `path`, so that a report
/// file that is not a regular file is refused by name instead of passed over.
fn present(path: &Path) -> bool {
    fs::symlink_metadata(path).is_ok()
}

/// Reads one architecture directory. Rows come from results.jsonl when present (exact, and
/// written row by row), else from results.csv; both give the same rows. The architecture
/// (summary.json's `arch`, else the directory's name) must be `sm<digits>` or `cpu`, and no
/// trial may appear twice.
pub fn load_arch(dir: &Path) -> Result<ArchReport, ReportError> {
    let summary_path = dir.join(SUMMARY_JSON);
    let header = if present(&summary_path) {
        let mut text = Vec::new();
        open_report_file(&summary_path)?
            .read_to_end(&mut text)
            .map_err(io("read", &summary_path))?;
        serde_json::from_slice::<Header>(&text).map_err(|source| ReportError::Json {
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
    let (rows, torn, rows_path) = if present(&jsonl) {
        let (rows, torn) = read_jsonl(&jsonl)?;
        (rows, torn, jsonl)
    } else if present(&csv) {
        (read_csv(&csv, open_report_file(&csv)?)?, false, csv)
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
                // Named in a message printed to a terminal.
                trial: crate::text::visible(&row.trial).into_owned(),
                first,
                second: *line,
            });
        }
        seen.insert(row.trial.as_str(), *line);
    }
    drop(seen);
    Ok(rows.into_iter().map(|(_, row)| row).collect())
}

/// Consumes the whitespace at the reader's position, a buffer at a time; returns the number of
/// newlines passed. Blank lines cost a byte scan each, not a line read.
fn skip_blank(reader: &mut impl BufRead) -> std::io::Result<usize> {
    let mut newlines = 0;
    loop {
        let buf = reader.fill_buf()?;
        let blank = buf.iter().take_while(|b| b.is_ascii_whitespace()).count();
        newlines += buf[..blank].iter().filter(|&&b| b == b'\n').count();
        let more = blank == buf.len() && blank > 0;
        reader.consume(blank);
        if !more {
            return Ok(newlines);
        }
    }
}

/// Reads results.jsonl, each row with its line, streaming: memory grows with the rows, not
/// with the file (blank lines are skipped without being kept, and a line longer than
/// [`MAX_ROW_LINE_BYTES`] is refused). A last line without its newline that does not parse is
/// the row being written when the run was killed: it is dropped and reported as `torn`. An
/// empty `first_bad` reads as none, as results.csv gives it.
pub(crate) fn read_jsonl(path: &Path) -> Result<(Vec<(u64, Row)>, bool), ReportError> {
    let mut reader = BufReader::new(open_report_file(path)?);
    let mut rows = Vec::new();
    let mut line = Vec::new();
    let mut number = 0usize;
    loop {
        number += skip_blank(&mut reader).map_err(io("read", path))?;
        line.clear();
        let read = (&mut reader)
            .take(MAX_ROW_LINE_BYTES as u64 + 1)
            .read_until(b'\n', &mut line)
            .map_err(io("read", path))?;
        if read == 0 {
            return Ok((rows, false));
        }
        number += 1;
        if line.len() > MAX_ROW_LINE_BYTES {
            return Err(ReportError::LongLine {
                path: path.to_path_buf(),
                line: number,
                limit: MAX_ROW_LINE_BYTES,
            });
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match serde_json::from_slice::<Row>(&line) {
            Ok(mut r) => {
                r.first_bad = r.first_bad.filter(|s| !s.is_empty());
                rows.push((number as u64, r));
            }
            // Only the file's last line can lack its newline.
            Err(_) if !line.ends_with(b"\n") => return Ok((rows, true)),
            Err(source) => {
                return Err(ReportError::JsonLine {
                    path: path.to_path_buf(),
                    line: number,
                    source,
                })
            }
        }
    }
}
