//! What a run of the engine tells its reporters (a report's life cycle, a console): the plan,
//! each phase, every row as it finishes and why the run stopped early. The engine knows no
//! reporter; a command picks its own.

use relattn_reports::Row;

/// One thing that happened in a run. A run's trials give `Phase("trials")`, `Planned`, a `Row`
/// per trial that ran, and `Stopped` when trials were left unstarted.
#[derive(Debug)]
pub enum Event<'a> {
    /// The session's trials: all of them, those a resumed report already holds, and those that
    /// will run (the others, less the ones listed as ignored).
    Planned {
        total: usize,
        resumed: usize,
        to_run: usize,
    },
    /// A phase of the command began (the progress line names it).
    Phase(&'static str),
    /// A trial finished.
    Row(&'a Row),
    /// No more trials were started; the ones in flight finished.
    Stopped(Stop),
}

/// Why a run started no more trials.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// A signal asked it to stop.
    Interrupted,
    /// This many trials failed or errored (`--max-fail`).
    MaxFail(usize),
}

/// What follows a run's events: it writes a report, prints lines, collects a verdict.
pub trait Reporter {
    fn event(&mut self, event: &Event<'_>) -> anyhow::Result<()>;

    /// Whether this reporter has its verdict, so no more trials need start (asked after each
    /// row).
    fn enough(&self) -> bool {
        false
    }
}

/// Hands `event` to every reporter, each even when one before failed; the first error.
pub(super) fn emit(reporters: &mut [&mut dyn Reporter], event: &Event<'_>) -> anyhow::Result<()> {
    let mut first = None;
    for r in reporters.iter_mut() {
        if let Err(e) = r.event(event) {
            first.get_or_insert(e);
        }
    }
    first.map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use super::super::{Done, Engine};
    use super::*;
    use crate::session::{Session, SessionOptions};
    use relattn_kernels::capability::MockSource;
    use relattn_reports::Status;

    /// A CPU session of the five routing checks of sm_1xx.
    fn session() -> Session {
        let mut opts = SessionOptions::from_vars(|_| None).unwrap();
        opts.gpu_cases = Some(crate::case_set::CaseSet::Matrix("smoke".into()));
        opts.filter = Some(crate::filter::Filter::name_contains("routing::sm_1"));
        let factory = crate::gpu_exec::RealFactory { mutant: None };
        Session::open_with(&opts, &MockSource::new(Vec::new()), false, &factory).unwrap()
    }

    /// What a reporter heard, as text; it fails on the rows of `fail_on` and has heard enough
    /// after `enough_after` rows.
    #[derive(Default)]
    struct Heard {
        events: Vec<String>,
        fail_on: Option<&'static str>,
        enough_after: Option<usize>,
    }

    impl Heard {
        fn rows(&self) -> Vec<&str> {
            self.events
                .iter()
                .filter_map(|e| e.strip_prefix("row "))
                .collect()
        }
    }

    impl Reporter for Heard {
        fn event(&mut self, event: &Event<'_>) -> anyhow::Result<()> {
            self.events.push(match event {
                Event::Row(row) => format!("row {}", row.trial),
                other => format!("{other:?}"),
            });
            match (event, self.fail_on) {
                (Event::Row(row), Some(name)) if row.trial == name => anyhow::bail!("no space"),
                _ => Ok(()),
            }
        }

        fn enough(&self) -> bool {
            self.enough_after.is_some_and(|n| self.rows().len() >= n)
        }
    }

    #[test]
    fn reporters_hear_the_plan_every_row_and_the_tally_counts_the_resumed_rows_too() {
        let session = session();
        let engine = Engine::new(&session);
        let done = Done::of(&[Row::new("", "routing::sm_100", "routing", Status::Fail)]);
        let mut heard = Heard::default();
        let stop = engine.run_reporting(&done, &mut [&mut heard]).unwrap();
        assert_eq!(stop, None);
        assert_eq!(heard.events[0], "Phase(\"trials\")");
        assert_eq!(
            heard.events[1],
            "Planned { total: 5, resumed: 1, to_run: 4 }"
        );
        let mut rows = heard.events[2..].to_vec();
        rows.sort();
        assert_eq!(
            rows,
            ["sm_103", "sm_110", "sm_120", "sm_121"].map(|a| format!("row routing::{a}"))
        );
        let t = engine.tally.lock().unwrap();
        assert_eq!(
            (t.phase, t.total, t.resumed, t.done, t.ran),
            ("trials", 5, 1, 4, 4)
        );
        assert_eq!(t.counts.get("pass"), Some(&4));
        assert_eq!(t.counts.get("fail"), Some(&1));
    }

    #[test]
    fn a_run_stopped_by_max_fail_says_so_last() {
        let session = session();
        let engine = Engine {
            max_fail: Some(0),
            ..Engine::new(&session)
        };
        let mut heard = Heard::default();
        let stop = engine
            .run_reporting(&Done::default(), &mut [&mut heard])
            .unwrap();
        assert_eq!(stop, Some(Stop::MaxFail(0)));
        assert_eq!(heard.events.last().unwrap(), "Stopped(MaxFail(0))");
        assert!(!heard.events.iter().any(|e| e.starts_with("row ")));
    }

    #[test]
    fn a_failing_reporter_stops_no_trial_and_its_first_error_comes_back() {
        let session = session();
        let engine = Engine::new(&session);
        let mut failing = Heard {
            fail_on: Some("routing::sm_110"),
            ..Heard::default()
        };
        let mut other = Heard::default();
        let err = engine
            .run_reporting(&Done::default(), &mut [&mut failing, &mut other])
            .unwrap_err();
        assert_eq!(err.to_string(), "no space");
        for heard in [&failing, &other] {
            let rows = heard
                .events
                .iter()
                .filter(|e| e.starts_with("row "))
                .count();
            assert_eq!(rows, 5);
        }
    }

    #[test]
    fn in_order_the_trials_run_in_the_sessions_order_until_a_reporter_has_heard_enough() {
        let mut session = session();
        session.trials.reverse();
        let store = super::super::CaseStore::keep_all();
        let engine = Engine {
            in_order: Some(&store),
            ..Engine::new(&session)
        };
        let mut heard = Heard {
            enough_after: Some(2),
            ..Heard::default()
        };
        let stop = engine
            .run_reporting(&Done::default(), &mut [&mut heard])
            .unwrap();
        assert_eq!(stop, None);
        assert_eq!(heard.rows(), ["routing::sm_121", "routing::sm_120"]);
        assert_eq!(engine.tally.lock().unwrap().done, 2);
    }
}
