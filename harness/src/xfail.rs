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
//! Every entry whose filter selects a trial counts for it, so a trial with two known bugs (a kernel
//! that drops the bias and leaks NaN: whichever shows) takes an entry for each. Failing or erroring
//! for the cause one of them expects, it is `xfail` (the first such entry decides); for any other
//! cause it stays a failure, saying so; passing it is `xpass` (a `fail` when one of them is strict,
//! as pytest's strict xfail). Skipped trials are left alone.

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
            if crate::engine::causes::meaning(&e.cause).is_none() {
                return Err(format!(
                    "{at}: cause {:?} is not one triage finds; the causes are {}",
                    e.cause,
                    crate::engine::causes::CAUSES
                        .map(|(word, _)| word)
                        .join(", ")
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

    /// Decide `row` of `trial` by the entries that select it (rows of skipped trials are left
    /// alone).
    pub fn apply(&self, trial: &Trial, row: &mut Row) {
        if row.status == Status::Skip {
            return;
        }
        let selecting: Vec<usize> = (0..self.entries.len())
            .filter(|&i| self.entries[i].1.matches(trial))
            .collect();
        let Some(&first) = selecting.first() else {
            return;
        };
        for &i in &selecting {
            self.matched[i].fetch_add(1, Ordering::Relaxed);
        }
        let cause = row.params.get("cause").cloned();
        let expecting = selecting
            .iter()
            .copied()
            .find(|&i| cause.as_deref() == Some(self.entries[i].0.cause.as_str()));
        let strict = selecting
            .iter()
            .copied()
            .find(|&i| self.entries[i].0.strict);
        let deciding = match row.status {
            Status::Fail | Status::Error => expecting.unwrap_or(first),
            Status::Pass => strict.unwrap_or(first),
            _ => first,
        };
        let e = &self.entries[deciding].0;
        match row.status {
            Status::Fail | Status::Error if expecting.is_some() => {
                row.status = Status::XFail;
                row.message = format!(
                    "expected failure ({}): {}; {}",
                    e.cause, e.reason, row.message
                );
            }
            Status::Fail | Status::Error => {
                let found = match (cause, row.params.get("triage")) {
                    (Some(c), _) => format!("its cause is {c}"),
                    (None, Some(why)) => format!("not triaged ({why})"),
                    (None, None) => "not triaged (--no-triage)".to_string(),
                };
                let expected: Vec<String> = selecting
                    .iter()
                    .map(|&i| {
                        let e = &self.entries[i].0;
                        format!("{} ({})", e.cause, e.reason)
                    })
                    .collect();
                row.message = format!(
                    "{}; not the expected failure: --xfail expects cause {}, {found}",
                    row.message,
                    expected.join(" or ")
                );
            }
            Status::Pass if strict.is_some() => {
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
        row.params
            .insert("xfail_entry".into(), (deciding + 1).to_string());
    }

    /// The entries that selected no trial, as lines for the user.
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

    const TWO_BUGS: &str = r#"
[[xfail]]
filter = "path=routing"
cause = "nan_leak"
reason = "one known bug"

[[xfail]]
filter = "path=routing"
cause = "wrong"
reason = "another known bug"
strict = true

[[xfail]]
filter = "path=fallback"
cause = "wrong"
reason = "selects nothing here"
"#;

    fn decided(x: &XFails, status: Status, cause: Option<&str>) -> Row {
        let params: Vec<(&str, &str)> = cause.map(|c| ("cause", c)).into_iter().collect();
        decided_with(x, status, &params)
    }

    /// A routing trial's row of `status` with `params`, after `x`.
    fn decided_with(x: &XFails, status: Status, params: &[(&str, &str)]) -> Row {
        let trial = Trial {
            name: "routing::unknown".into(),
            kind: crate::trial_list::TrialKind::RoutingUnknown,
            ignore: None,
        };
        let mut row = Row::new("", "routing::unknown", "routing", status);
        for (k, v) in params {
            row.params.insert(k.to_string(), v.to_string());
        }
        x.apply(&trial, &mut row);
        row
    }

    /// A trial selected by two entries is expected to fail for either cause; any other cause
    /// fails it, naming both; a pass is strict when one of them is.
    #[test]
    fn every_entry_that_selects_a_trial_counts() {
        let x = XFails::parse(TWO_BUGS, "two.toml").unwrap();
        let leak = decided(&x, Status::Fail, Some("nan_leak"));
        assert_eq!(
            (leak.status, leak.params["xfail_entry"].as_str()),
            (Status::XFail, "1")
        );
        let wrong = decided(&x, Status::Fail, Some("wrong"));
        assert_eq!(
            (wrong.status, wrong.params["xfail_entry"].as_str()),
            (Status::XFail, "2")
        );
        let other = decided(&x, Status::Error, Some("fault"));
        assert_eq!(other.status, Status::Error);
        assert!(
            other.message.contains("expects cause nan_leak (one known bug) or wrong (another known bug), its cause is fault"),
            "{}",
            other.message
        );
        let pass = decided(&x, Status::Pass, None);
        assert_eq!(
            (pass.status, pass.params["xfail_entry"].as_str()),
            (Status::Fail, "2")
        );
        assert!(
            pass.message.starts_with("XPASS(strict)"),
            "{}",
            pass.message
        );
        let unmatched = x.unmatched();
        assert_eq!(unmatched.len(), 1, "{unmatched:?}");
        assert!(unmatched[0].contains("entry 3"), "{unmatched:?}");
    }

    /// A failure with no cause says why it has none: triage was turned off, or the run was
    /// stopping when the trial ended (its triage is skipped, the row says so).
    #[test]
    fn a_failure_without_a_cause_says_why() {
        let x = XFails::parse(TWO_BUGS, "two.toml").unwrap();
        let off = decided(&x, Status::Fail, None);
        assert!(
            off.message.ends_with("not triaged (--no-triage)"),
            "{}",
            off.message
        );
        let row = decided_with(
            &x,
            Status::Fail,
            &[("triage", "not run: the run was stopping")],
        );
        assert_eq!(row.status, Status::Fail);
        assert!(
            row.message
                .ends_with("not triaged (not run: the run was stopping)"),
            "{}",
            row.message
        );
    }

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
