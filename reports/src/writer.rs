//! Writing a report: rows appended to results.jsonl as they finish, every file written at the end.

use crate::csv_io::write_csv;
use crate::env::Environment;
use crate::error::{io, ReportError};
use crate::report_files::{check_arch_name, write_atomic};
use crate::row::Row;
use crate::summary::Summary;
use crate::{junit, markdown, plot};
use crate::{JUNIT_XML, RESULTS_CSV, RESULTS_JSONL, SUMMARY_JSON, SUMMARY_MD};
use relattn_common::files;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Writes one architecture's report directory, `DIR/<arch>/`.
///
/// Each pushed row is appended to `results.jsonl` as one line with one `write` call, so a run
/// that is killed keeps every row it finished (the operating system holds the data even if the
/// process dies; a power loss may drop the last rows). `finish` then writes results.csv,
/// summary.json, summary.md, junit.xml and the plots from all rows: the CSV is written whole at the end
/// because its parameter columns are the union over rows, which is only known then.
/// An interrupted directory is still readable by [`crate::load`], and `relattn report merge`
/// over it writes the missing files.
#[derive(Debug)]
pub struct ReportWriter {
    dir: PathBuf,
    arch: String,
    env: Environment,
    rows: Vec<Row>,
    log: File,
}

impl ReportWriter {
    /// Creates `dir/<arch_dir_name>/` ("sm90", "sm100", "cpu"), replacing any report there, and
    /// records the environment at once so even an interrupted run says where it ran.
    pub fn create(
        dir: &Path,
        arch_dir_name: &str,
        env: Environment,
    ) -> Result<ReportWriter, ReportError> {
        check_arch_name(arch_dir_name)?;
        let arch_dir = dir.join(arch_dir_name);
        files::create_dir_nofollow(&arch_dir).map_err(io("create directory", &arch_dir))?;
        // Files of an earlier run in the same place would contradict the new rows.
        remove_final_files(&arch_dir)?;
        let started = Summary::of(arch_dir_name, env.clone(), &[], false);
        write_json(&arch_dir.join(SUMMARY_JSON), &started)?;
        let log_path = arch_dir.join(RESULTS_JSONL);
        let log = open_log(&log_path, true).map_err(io("create", &log_path))?;
        Ok(ReportWriter {
            dir: arch_dir,
            arch: arch_dir_name.to_string(),
            env,
            rows: Vec::new(),
            log,
        })
    }

    /// Reopens `dir/<arch_dir_name>/` of an interrupted run to continue it: the complete rows of
    /// its results.jsonl are kept (a partial last line, the row being written when the run was
    /// killed, is dropped), the files written at the end are removed, and summary.json says
    /// incomplete again until [`ReportWriter::finish`]. Returns the writer and the rows kept.
    pub fn resume(
        dir: &Path,
        arch_dir_name: &str,
        env: Environment,
    ) -> Result<(ReportWriter, Vec<Row>), ReportError> {
        check_arch_name(arch_dir_name)?;
        let arch_dir = dir.join(arch_dir_name);
        files::create_dir_nofollow(&arch_dir).map_err(io("open directory", &arch_dir))?;
        let log_path = arch_dir.join(RESULTS_JSONL);
        // The rows are rewritten in place: a link is refused before it is read.
        files::check_output_path(&log_path).map_err(io("open", &log_path))?;
        let rows = if log_path.is_file() {
            let (rows, _torn) = crate::load::read_jsonl(&log_path)?;
            crate::load::unique_trials(&log_path, rows)?
        } else {
            Vec::new()
        };
        remove_final_files(&arch_dir)?;
        // The kept rows, rewritten whole: the torn line goes, and appends start on a new line.
        let mut text = String::new();
        for r in &rows {
            let line = serde_json::to_string(r).map_err(|source| ReportError::Json {
                path: log_path.clone(),
                source,
            })?;
            text.push_str(&line);
            text.push('\n');
        }
        write_atomic(&log_path, text.as_bytes())?;
        let started = Summary::of(arch_dir_name, env.clone(), &rows, false);
        write_json(&arch_dir.join(SUMMARY_JSON), &started)?;
        let log = open_log(&log_path, false).map_err(io("open", &log_path))?;
        Ok((
            ReportWriter {
                dir: arch_dir,
                arch: arch_dir_name.to_string(),
                env,
                rows: rows.clone(),
                log,
            },
            rows,
        ))
    }

    /// The architecture directory being written.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Rows pushed so far.
    pub fn rows(&self) -> &[Row] {
        &self.rows
    }

    /// The environment, to add what is learnt during the run (compile checks, measured peaks).
    pub fn environment_mut(&mut self) -> &mut Environment {
        &mut self.env
    }

    /// Appends one finished row to results.jsonl and flushes it.
    pub fn push(&mut self, row: Row) -> Result<(), ReportError> {
        let mut line = serde_json::to_string(&row).map_err(|source| ReportError::Json {
            path: self.dir.join(RESULTS_JSONL),
            source,
        })?;
        line.push('\n');
        let path = || self.dir.join(RESULTS_JSONL);
        self.log
            .write_all(line.as_bytes())
            .map_err(io("append to", path()))?;
        self.log.flush().map_err(io("flush", path()))?;
        self.rows.push(row);
        Ok(())
    }

    /// Writes every file from the rows so far with `complete: false`: an interrupted run's
    /// consistent, INCOMPLETE report (`relattn run --resume` continues it).
    pub fn finish_incomplete(self) -> Result<Summary, ReportError> {
        write_outputs(&self.dir, &self.arch, self.env, &self.rows, false, false)
    }

    /// Writes results.csv, summary.json, summary.md, junit.xml and the plots; stamps `finished`
    /// if unset.
    pub fn finish(mut self) -> Result<Summary, ReportError> {
        if self.env.finished.is_none() {
            self.env.finished = Some(now());
        }
        write_outputs(&self.dir, &self.arch, self.env, &self.rows, true, false)
    }
}

/// Opens results.jsonl to append rows to, created if missing (and emptied when `truncate`). It
/// must be a regular file, and is never opened through a symbolic link (`O_NOFOLLOW`): a link
/// left in a report folder would send the rows elsewhere, or create a file at its target. A
/// FIFO is refused without waiting for a reader (`O_NONBLOCK`), and nothing is truncated before
/// the file is known to be a regular one.
fn open_log(path: &Path, truncate: bool) -> std::io::Result<File> {
    files::check_output_path(path)?;
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "it is a symbolic link: relattn writes only new files or regular files",
            ),
            _ => e,
        })?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "it is not a regular file: relattn writes only new files or regular files",
        ));
    }
    if truncate {
        file.set_len(0)?;
    }
    Ok(file)
}

/// Removes the files written when a run finishes (results.csv, summary.md, junit.xml, the plots).
fn remove_final_files(arch_dir: &Path) -> Result<(), ReportError> {
    for stale in [RESULTS_CSV, SUMMARY_MD, JUNIT_XML] {
        let p = arch_dir.join(stale);
        match fs::remove_file(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io("remove", &p)(e)),
        }
    }
    plot::remove_plots(arch_dir, |_| true)
}

/// Current time as RFC 3339 (UTC, seconds).
pub fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

pub(crate) fn write_json<T: serde::Serialize>(path: &Path, value: &T) -> Result<(), ReportError> {
    let text = serde_json::to_string_pretty(value).map_err(|source| ReportError::Json {
        path: path.to_path_buf(),
        source,
    })?;
    write_atomic(path, text.as_bytes())
}

/// Writes every file of one architecture directory from its rows, the plots included (and
/// results.jsonl too when `with_jsonl`, as merge does).
pub(crate) fn write_outputs(
    arch_dir: &Path,
    arch: &str,
    env: Environment,
    rows: &[Row],
    complete: bool,
    with_jsonl: bool,
) -> Result<Summary, ReportError> {
    files::create_dir_nofollow(arch_dir).map_err(io("create directory", arch_dir))?;
    if with_jsonl {
        let mut text = String::new();
        for r in rows {
            let line = serde_json::to_string(r).map_err(|source| ReportError::Json {
                path: arch_dir.join(RESULTS_JSONL),
                source,
            })?;
            text.push_str(&line);
            text.push('\n');
        }
        write_atomic(&arch_dir.join(RESULTS_JSONL), text.as_bytes())?;
    }
    write_csv(&arch_dir.join(RESULTS_CSV), rows)?;
    let summary = Summary::of(arch, env, rows, complete);
    let plots = plot::write_plots(arch_dir, rows)?;
    write_atomic(
        &arch_dir.join(SUMMARY_MD),
        markdown::render(&summary, rows, &plots).as_bytes(),
    )?;
    write_atomic(
        &arch_dir.join(JUNIT_XML),
        junit::render(&summary, rows).as_bytes(),
    )?;
    // summary.json last: once it says complete, every other file is in place.
    write_json(&arch_dir.join(SUMMARY_JSON), &summary)?;
    Ok(summary)
}
