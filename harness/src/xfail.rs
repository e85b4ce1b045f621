//! Expected failures (`relattn run --xfail FILE`, `RELATTN_XFAIL` under `cargo test`): trials a
//! kernel is known to fail, each for a known cause, so CI stays green for the known failure and
//! turns red for anything new, including something new in the same trials.
//!
//! A TOML file of `[[xfail]]` entries:
//!
//! ```toml
//! [[xfail]]
//! filter = "path=vllm/vllm_op & layer=local"   # a --filter expression
//! cause = "nan_leak"                           # the cause triage must find (engine/triage.rs)
//! reason = "NaN from pre-window pages: https://github.com/vllm-project/vllm/issues/49049"
//! strict = false                               # whether an unexpected pass fails the run
//! ```
//!
//! The first entry whose filter selects a trial decides it: failing or erroring for the expected
//! cause it is `xfail`; for any other cause it stays a failure, saying so; passing it is `xpass`
//! (a `fail` under a strict entry, as pytest's strict xfail). Skipped trials are left alone.

use crate::filter::Filter;
use crate::trial_list::Trial;
use relattn_reports::{Row, Status};
use serde::Deserialize;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    xfail: Vec<Entry>,
}

/// One `[[xfail]]` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    pub filter: String,
    pub cause: String,
    pub reason: String,
    #[serde(default)]
    pub strict: bool,
}

/// The entries of an xfail file, with how many trials each decided.
#[derive(Debug)]
pub struct XFails {
    pub source: String,
    entries: Vec<(Entry, Filter)>,
    matched: Vec<AtomicUsize>,
}

/// Largest xfail file read (a list of known bugs, not a data set).
const MAX_BYTES: u64 = 1 << 20;

impl XFails {
    /// Read and check `path`: every filter parses, every cause is one triage names, every
    /// reason says something. A message for the user otherwise.
    pub fn load(path: &Path) -> Result<XFails, String> {
        let text = relattn_common::files::read_regular_text(path, MAX_BYTES)
            .map_err(|e| format!("--xfail {}: {e}", path.display()))?;
        XFails::parse(&text, &path.display().to_string())
    }

    pub fn parse(text: &str, source: &str) -> Result<XFails, String> {
        let file: File = toml::from_str(text).map_err(|e| format!("--xfail {source}: {e}"))?;
        let mut entries = Vec::new();
        for (i, e) in file.xfail.into_iter().enumerate() {
            let at = format!("--xfail {source}: entry {} (filter {:?})", i + 1, e.filter);
            let filter = Filter::parse(&e.filter).map_err(|m| format!("{at}: {m}"))?;
            if crate::engine::cause_meaning(&e.cause).is_none() {
                return Err(format!(
                    "{at}: cause {:?} is not one triage finds; the causes are {}",
                    e.cause,
                    crate::engine::CAUSES.map(|(word, _)| word).join(", ")
                ));
            }
            if e.reason.trim().is_empty() {
                return Err(format!("{at}: give a reason (with its link)"));
            }
            entries.push((e, filter));
        }
        if entries.is_empty() {
            return Err(format!("--xfail {source}: no [[xfail]] entry"));
        }
        let matched = entries.iter().map(|_| AtomicUsize::new(0)).collect();
        Ok(XFails {
            source: source.to_string(),
            entries,
            matched,
        })
    }

    /// Decide `row` of `trial` by the first entry that selects it (rows of skipped trials are
    /// left alone).
    pub fn apply(&self, trial: &Trial, row: &mut Row) {
        if row.status == Status::Skip {
            return;
        }
        let Some(i) = self.entries.iter().position(|(_, f)| f.matches(trial)) else {
            return;
        };
        self.matched[i].fetch_add(1, Ordering::Relaxed);
        let e = &self.entries[i].0;
        let cause = row.params.get("cause").cloned();
        match row.status {
            Status::Fail | Status::Error if cause.as_deref() == Some(e.cause.as_str()) => {
                row.status = Status::XFail;
                row.message = format!(
                    "expected failure ({}): {}; {}",
                    e.cause, e.reason, row.message
                );
            }
            Status::Fail | Status::Error => {
                let found = cause.map_or_else(
                    || "not triaged (--no-triage)".to_string(),
                    |c| format!("its cause is {c}"),
                );
                row.message = format!(
                    "{}; not the expected failure: --xfail expects cause {} ({}), {found}",
                    row.message, e.cause, e.reason
                );
            }
            Status::Pass if e.strict => {
                row.status = Status::Fail;
                row.message = format!(
                    "XPASS(strict): the trial passed, but --xfail expects it to fail ({}): {}",
                    e.cause, e.reason
                );
            }
            Status::Pass => {
                row.status = Status::XPass;
                row.message = format!(
                    "unexpected pass: --xfail expects it to fail ({}): {}",
                    e.cause, e.reason
                );
            }
            _ => {}
        }
        row.params.insert("xfail_entry".into(), (i + 1).to_string());
    }

    /// The entries that decided no trial, as lines for the user.
    pub fn unmatched(&self) -> Vec<String> {
        self.entries
            .iter()
            .zip(&self.matched)
            .enumerate()
            .filter(|(_, (_, n))| n.load(Ordering::Relaxed) == 0)
            .map(|(i, ((e, _), _))| {
                format!(
                    "--xfail {}: entry {} (filter {:?}, cause {}) matched no trial that ran",
                    self.source,
                    i + 1,
                    e.filter,
                    e.cause
                )
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The known-bug files shipped with the adapters parse, and name causes triage finds.
    #[test]
    fn the_shipped_known_bug_files_are_valid() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../adapters/known");
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "toml") {
                let x = XFails::load(&path).unwrap_or_else(|e| panic!("{e}"));
                assert!(x.entries.len() >= 5, "{}", path.display());
                n += 1;
            }
        }
        assert!(n >= 2, "vllm-0.33.0.toml and vllm-0.34.0.toml");
    }
}
