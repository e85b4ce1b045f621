//! The trial engine: every command that runs trials (`run`, `mutants`, the `cargo test`
//! trials) hands them here and gets report rows back. It owns the threads (`schedule`), the
//! cases and their references (`cases`), one trial's steps (`trial`), the one place a row is
//! written (`row`), the triage of failing trials (`triage`), stopping on a signal (`cancel`), the tally a progress line reads, and the
//! resume filter (trials a report already holds are not run). What a command does with the rows
//! (a report's lifecycle, a console table, a test verdict) stays with the command.

mod ahead;
mod cancel;
pub mod case_cache;
mod cases;
pub mod compile_key;
mod row;
mod schedule;
mod triage;
mod trial;

pub use cancel::{on_signals, stopping};
pub use cases::{CaseData, CaseStore};
pub use row::{failure_text, kv_bytes, output_hash, reproduce_command};
pub use triage::{meaning as cause_meaning, CAUSES};
pub use trial::{run_trial, start_trial, Ran, Runners, Step};

use crate::progress::Tally;
use crate::session::Session;
use relattn_reports::Row;
use std::collections::HashSet;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// How a session's trials run.
pub struct Engine<'s> {
    pub session: &'s Session,
    /// Where failing worker trials keep their case and output files (a report's `failures/`).
    pub keep: Option<&'s Path>,
    /// This run is one of `processes` on the machine (its share of the memory for cases
    /// prepared ahead).
    pub processes: usize,
    /// Counts by status as rows arrive, for the progress line.
    pub tally: Option<Arc<Mutex<Tally>>>,
    /// Start no trial after this many failed or errored ones (`--max-fail`).
    pub max_fail: Option<usize>,
}

impl<'s> Engine<'s> {
    pub fn new(session: &'s Session) -> Engine<'s> {
        Engine {
            session,
            keep: None,
            processes: 1,
            tally: None,
            max_fail: None,
        }
    }

    /// Run every trial of the session but those in `done` (a resumed report's), handing each
    /// row to `on_row` on this thread as soon as it finishes. No trial starts once a stop was
    /// asked for (`stopping`) or `max_fail` trials failed or errored; the trials in flight
    /// finish. Returns whether `max_fail` stopped it.
    pub fn run(&self, done: &HashSet<String>, mut on_row: impl FnMut(Row)) -> bool {
        let bad = AtomicUsize::new(0);
        let limit = self.max_fail.unwrap_or(usize::MAX);
        let stop = || stopping() || bad.load(Ordering::SeqCst) >= limit;
        // Rows of trials listed as ignored come back at once: the ETA does not count them.
        let ignored: HashSet<&str> = self
            .session
            .trials
            .iter()
            .filter(|t| t.ignore.is_some())
            .map(|t| t.name.as_str())
            .collect();
        schedule::run_all(self, done, &stop, |row| {
            if row.status.is_bad() {
                bad.fetch_add(1, Ordering::SeqCst);
            }
            if let Some(tally) = &self.tally {
                let mut t = tally.lock().unwrap_or_else(|e| e.into_inner());
                t.done += 1;
                if !ignored.contains(row.trial.as_str()) {
                    t.ran += 1;
                }
                *t.counts.entry(row.status.as_str()).or_default() += 1;
            }
            on_row(row);
        });
        bad.load(Ordering::SeqCst) >= limit
    }

    /// Run `trials` one after the other on this thread, in their order, until `enough` says
    /// so after a row (`relattn mutants` stops at the first failure); the rows run.
    pub fn run_in_order<'t>(
        &self,
        trials: impl IntoIterator<Item = &'t crate::trial_list::Trial>,
        store: &CaseStore,
        mut enough: impl FnMut(&Row) -> bool,
    ) -> Vec<Row> {
        let runners = Runners {
            keep: self.keep,
            ..self.session.runners(0)
        };
        let mut rows = Vec::new();
        for t in trials {
            if stopping() {
                break;
            }
            let row = run_trial(t, store, &runners, &self.session.set);
            let stop = enough(&row);
            rows.push(row);
            if stop {
                break;
            }
        }
        rows
    }
}
