//! The trial engine: every command that runs trials (`run`, `mutants`, the `cargo test`
//! trials) hands them here and gets report rows back. It owns the threads (`schedule`), the
//! cases and their references (`cases`), one trial's steps (`trial`), the one place a row is
//! written (`row`), the triage of failing trials (`triage`), stopping on a signal (`cancel`),
//! the tally a progress line reads, and the resume filter (trials a report already holds are
//! not run). What a command does with the rows (a report's life cycle, a console, a test
//! verdict) stays with the command: its reporters get the run's events (`events`).

mod ahead;
mod cancel;
pub mod case_cache;
mod cases;
pub mod causes;
pub mod compile_key;
mod events;
pub mod memory_gate;
mod row;
pub mod runners;
mod schedule;
mod triage;
mod trial;

pub use cancel::{on_signals, stopping};
pub use cases::{CaseData, CaseStore};
pub use causes::{meaning as cause_meaning, CAUSES};
pub use events::{Event, Reporter, Stop};
pub use row::{failure_text, kv_bytes, output_hash, reproduce_command};
pub use runners::Runners;
pub use trial::{run_trial, start_trial, Ran, Step};

use crate::progress::Tally;
use crate::session::Session;
use crate::trial_list::Trial;
use events::emit;
use relattn_reports::Row;
use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

/// The rows a resumed report already holds: their trials do not run again, and the tally
/// counts them.
#[derive(Debug, Default)]
pub struct Done {
    pub trials: HashSet<String>,
    pub counts: BTreeMap<&'static str, usize>,
}

impl Done {
    pub fn of(rows: &[Row]) -> Done {
        let mut done = Done::default();
        for r in rows {
            done.trials.insert(r.trial.clone());
            *done.counts.entry(r.status.as_str()).or_default() += 1;
        }
        done
    }
}

/// How a session's trials run.
pub struct Engine<'s> {
    pub session: &'s Session,
    /// Where failing worker trials keep their case and output files (a report's `failures/`).
    pub keep: Option<&'s Path>,
    /// This run is one of `processes` on the machine (its share of the memory for cases
    /// prepared ahead).
    pub processes: usize,
    /// The run's phase and counts by status as rows arrive, for the progress line: the engine
    /// writes it, a ticker and the reporters read it.
    pub tally: Arc<Mutex<Tally>>,
    /// The machine's memory ledger, shared with the other runs on it (`memory_gate`): None
    /// builds cases without asking it.
    pub memory_gate: Option<Arc<memory_gate::MemoryGate>>,
    /// Start no trial after this many failed or errored ones (`--max-fail`).
    pub max_fail: Option<usize>,
    /// Some: run the trials one after another on this thread, in the session's order, with
    /// the cases of this store, instead of on the scheduler's threads (`relattn mutants` runs
    /// the cheapest first, stops at the first that fails and keeps the cases for its next
    /// build).
    pub in_order: Option<&'s CaseStore>,
}

impl<'s> Engine<'s> {
    pub fn new(session: &'s Session) -> Engine<'s> {
        Engine {
            session,
            keep: None,
            processes: 1,
            tally: Arc::default(),
            max_fail: None,
            in_order: None,
            memory_gate: None,
        }
    }

    fn tally(&self) -> MutexGuard<'_, Tally> {
        self.tally.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Phase `name` of the command begins: the progress line says it, and `reporters` hear it.
    pub fn phase(
        &self,
        name: &'static str,
        reporters: &mut [&mut dyn Reporter],
    ) -> anyhow::Result<()> {
        self.tally().phase = name;
        emit(reporters, &Event::Phase(name))
    }

    /// Run every trial of the session but those `done` holds, telling `reporters` the plan,
    /// each row as it finishes (on this thread) and, when trials were left unstarted, why. The
    /// tally counts the rows, `done`'s included. A reporter's error stops no trial: every
    /// reporter still gets every row, and the first error is returned once the trials end. Once
    /// a reporter has heard enough (`Reporter::enough`) no trial starts, as at the end of the
    /// list: that is no `Stop`.
    pub fn run_reporting(
        &self,
        done: &Done,
        reporters: &mut [&mut dyn Reporter],
    ) -> anyhow::Result<Option<Stop>> {
        let trials = &self.session.trials;
        let (total, resumed) = (trials.len(), done.trials.len());
        let to_run = trials
            .iter()
            .filter(|t| t.ignore.is_none() && !done.trials.contains(&t.name))
            .count();
        {
            let mut t = self.tally();
            (t.phase, t.total, t.resumed, t.to_run) = ("trials", total, resumed, to_run);
            for (status, n) in &done.counts {
                *t.counts.entry(status).or_default() += n;
            }
            t.trials_started = Some(Instant::now());
        }
        emit(reporters, &Event::Phase("trials"))?;
        let planned = Event::Planned {
            total,
            resumed,
            to_run,
        };
        emit(reporters, &planned)?;
        let mut failed = None;
        let max_failed = self.run(&done.trials, |row| {
            if let Err(e) = emit(reporters, &Event::Row(&row)) {
                failed.get_or_insert(e);
            }
            reporters.iter().any(|r| r.enough())
        });
        if let Some(e) = failed {
            return Err(e);
        }
        let stop = if max_failed {
            Some(Stop::MaxFail(self.max_fail.unwrap_or(0)))
        } else {
            stopping().then_some(Stop::Interrupted)
        };
        if let Some(stop) = stop {
            emit(reporters, &Event::Stopped(stop))?;
        }
        Ok(stop)
    }

    /// Run every trial of the session but those in `done` (a resumed report's), handing each
    /// row to `on_row` on this thread as soon as it finishes; `on_row` says whether that is
    /// enough. No trial starts once a stop was asked for (`stopping`), `max_fail` trials failed
    /// or errored, or `on_row` said enough; the trials in flight finish. Returns whether
    /// `max_fail` stopped it.
    fn run(&self, done: &HashSet<String>, mut on_row: impl FnMut(Row) -> bool) -> bool {
        let bad = AtomicUsize::new(0);
        let enough = AtomicBool::new(false);
        let limit = self.max_fail.unwrap_or(usize::MAX);
        let stop =
            || stopping() || bad.load(Ordering::SeqCst) >= limit || enough.load(Ordering::SeqCst);
        // Rows of trials listed as ignored come back at once: the ETA does not count them.
        let ignored: HashSet<&str> = self
            .session
            .trials
            .iter()
            .filter(|t| t.ignore.is_some())
            .map(|t| t.name.as_str())
            .collect();
        let mut count = |row: Row| {
            if row.status.is_bad() {
                bad.fetch_add(1, Ordering::SeqCst);
            }
            {
                let mut t = self.tally();
                t.done += 1;
                if !ignored.contains(row.trial.as_str()) {
                    t.ran += 1;
                }
                *t.counts.entry(row.status.as_str()).or_default() += 1;
            }
            if on_row(row) {
                enough.store(true, Ordering::SeqCst);
            }
        };
        match self.in_order {
            None => schedule::run_all(self, done, &stop, count),
            Some(store) => {
                for t in self.session.trials.iter() {
                    if stop() {
                        break;
                    }
                    if !done.contains(&t.name) {
                        count(self.run_one(t, store, 0));
                    }
                }
            }
        }
        bad.load(Ordering::SeqCst) >= limit
    }

    /// Run one trial on this thread, on device slot 0 and process `worker_slot` of its
    /// worker's pool: the entry of a caller that runs trials one at a time itself (the
    /// `cargo test` trials, each a test of its own).
    pub fn run_one(&self, trial: &Trial, store: &CaseStore, worker_slot: usize) -> Row {
        let runners = Runners {
            keep: self.keep,
            worker_slot,
            ..self.session.runners(0)
        };
        run_trial(trial, store, &runners, &self.session.set)
    }
}
