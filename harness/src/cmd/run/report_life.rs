//! A run's report from start to end: created in OUT/<arch>, or with `--resume` continued once
//! its run is known to be this one (a complete report is left as it is); `reports-out/latest`
//! moved once the report exists; each row appended as it finishes; written whole at the end,
//! INCOMPLETE when the run stopped early.

use super::environment::{check_identity, IDENTITY_KEY};
use super::out::{self, ReportOut};
use crate::engine::{Done, Event, Reporter, Stop};
use crate::exit;
use crate::phases::Split;
use crate::trial_list::Trial;
use relattn_reports::{CompileCheck, Environment, ReportWriter, Summary};
use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// The report being written; as a reporter it appends each row and notes an early stop.
pub(super) struct ReportLife {
    writer: ReportWriter,
    /// The trials of the run (the INCOMPLETE message counts them).
    trials: usize,
    stop: Option<Stop>,
}

/// A report written whole.
pub(super) struct Finished {
    pub(super) dir: PathBuf,
    summary: Summary,
}

impl ReportLife {
    /// The report of a run of `trials` in `out`/`arch`, recording `env`: a new one, or with
    /// `resume` the one there. None when that one is complete (nothing to run); an error when
    /// it has failures then, or the report may not be written or continued.
    pub(super) fn open(
        out: &ReportOut,
        arch: &str,
        mut env: Environment,
        trials: &[Trial],
        resume: bool,
    ) -> anyhow::Result<Option<ReportLife>> {
        let arch_dir = out.dir.join(arch);
        // Any file `report show` reads as a report counts (a CSV-only report too): never
        // overwritten.
        let has_report = ["results.jsonl", "summary.json", "results.csv"]
            .iter()
            .any(|f| arch_dir.join(f).is_file());
        let writer = if has_report && resume {
            let identity = env.extra.get(IDENTITY_KEY).cloned().unwrap_or_default();
            let kept = relattn_reports::load_arch(&arch_dir)
                .map_err(|e| exit::usage(format!("--resume: {e}")))?;
            check_identity(&arch_dir, &kept.environment, &identity)?;
            // A finished report is left as it is (rewriting it would reset its wall time and
            // `finished`): the resume has nothing to run, and ends as the run did.
            if kept.complete && kept.rows.len() == trials.len() {
                eprintln!(
                    "relattn run: {} is complete ({} trials): nothing to resume",
                    arch_dir.display(),
                    kept.rows.len()
                );
                return complete_verdict(&kept.summary(), &arch_dir).map(|()| None);
            }
            env.started = kept.environment.started.clone();
            let mut resumed = kept
                .environment
                .extra
                .get("resumed")
                .and_then(|v| v.as_array().cloned())
                .unwrap_or_default();
            resumed.push(serde_json::json!(relattn_reports::now()));
            env.extra.insert("resumed".into(), resumed.into());
            let (writer, rows) = ReportWriter::resume(&out.dir, arch, env)?;
            let names: HashSet<&str> = trials.iter().map(|t| t.name.as_str()).collect();
            if let Some(r) = rows.iter().find(|r| !names.contains(r.trial.as_str())) {
                return Err(exit::usage(format!(
                    "--resume: {} holds trial {}, which this run does not have: the matrix \
                     changed; give another --out",
                    arch_dir.display(),
                    r.trial
                )));
            }
            eprintln!(
                "relattn run: resuming {}: {} of {} trials already done",
                arch_dir.display(),
                rows.len(),
                trials.len()
            );
            writer
        } else if has_report {
            return Err(exit::usage(format!(
                "{} already holds a report: pass --resume to continue an interrupted run there, \
                 or give another --out (or remove that directory)",
                arch_dir.display()
            )));
        } else {
            ReportWriter::create(&out.dir, arch, env)?
        };
        // `latest` moves only once this run has a report: a run refused before (bad arguments,
        // a bad case folder, no GPU with --require-gpu) leaves it at the previous run.
        if let Some(id) = &out.new_run {
            if let Err(why) = out::point_latest(Path::new(out::RUNS_ROOT), id) {
                eprintln!("relattn run: {why}");
            }
        }
        Ok(Some(ReportLife {
            writer,
            trials: trials.len(),
            stop: None,
        }))
    }

    /// The rows the report holds so far: before the trials, those a resumed run keeps.
    pub(super) fn done(&self) -> Done {
        Done::of(self.writer.rows())
    }

    /// Where failing worker trials keep their case and output files.
    pub(super) fn failures(&self) -> PathBuf {
        self.writer.dir().join("failures")
    }

    pub(super) fn record_compile_checks(&mut self, checks: Vec<CompileCheck>) {
        self.writer.environment_mut().compile_checks = checks;
    }

    /// Records the `--xfail` file and its entries that decided no trial; returns those.
    pub(super) fn record_xfail(&mut self, xfail: &crate::xfail::XFails) -> Vec<String> {
        let unmatched = xfail.unmatched();
        self.writer.environment_mut().extra.insert(
            "xfail".into(),
            serde_json::json!({ "file": xfail.source, "unmatched": unmatched }),
        );
        unmatched
    }

    /// Writes every file of the report with the run's time `split`. A run stopped early (by
    /// `--max-fail`, or a signal, even one during the compile checks) leaves it INCOMPLETE and
    /// ends in an error (exit 1) saying how to continue it.
    pub(super) fn finish(mut self, split: &Split) -> anyhow::Result<Finished> {
        self.writer
            .environment_mut()
            .extra
            .insert("phases".into(), split.json());
        let dir = self.writer.dir().to_path_buf();
        let stop = self
            .stop
            .or_else(|| crate::engine::stopping().then_some(Stop::Interrupted));
        if let Some(stop) = stop {
            let done = self.writer.rows().len();
            self.writer.finish_incomplete()?;
            let why = match stop {
                Stop::MaxFail(n) => {
                    format!("stopped after {n} failed or errored trial(s) (--max-fail)")
                }
                Stop::Interrupted => "interrupted".to_string(),
            };
            return Err(exit::failed(format!(
                "{why} after {done} of {} trials; the report in {} is INCOMPLETE: continue it \
                 with the same command and --resume",
                self.trials,
                dir.display()
            )));
        }
        let summary = self.writer.finish()?;
        Ok(Finished { dir, summary })
    }
}

impl Reporter for ReportLife {
    fn event(&mut self, event: &Event<'_>) -> anyhow::Result<()> {
        match event {
            Event::Row(row) => self.writer.push((*row).clone())?,
            Event::Stopped(stop) => self.stop = Some(*stop),
            Event::Planned { .. } | Event::Phase(_) => {}
        }
        Ok(())
    }
}

impl Finished {
    /// Exit 1 unless every trial and compile check passed.
    pub(super) fn verdict(&self) -> anyhow::Result<()> {
        if self.summary.all_passed() {
            return Ok(());
        }
        Err(exit::failed(format!(
            "{} trial(s) failed or errored, {} compile check(s) failed",
            self.summary.counts.fail + self.summary.counts.error,
            self.summary.compile_checks_failed
        )))
    }
}

/// A complete report's verdict: exit 1 when trials of it failed or errored.
fn complete_verdict(summary: &Summary, dir: &Path) -> anyhow::Result<()> {
    if summary.all_passed() {
        return Ok(());
    }
    Err(exit::failed(format!(
        "{} trial(s) failed or errored in {}",
        summary.counts.fail + summary.counts.error,
        dir.display()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trial_list::TrialKind;
    use relattn_reports::{Row, Status};

    fn trials(names: &[&str]) -> Vec<Trial> {
        names
            .iter()
            .map(|n| Trial {
                name: n.to_string(),
                kind: TrialKind::RoutingUnknown,
                ignore: None,
            })
            .collect()
    }

    fn env(identity: &str) -> Environment {
        let mut env = Environment::default();
        env.extra.insert(
            IDENTITY_KEY.into(),
            serde_json::json!({ "matrix": identity }),
        );
        env
    }

    fn out(dir: &Path) -> ReportOut {
        ReportOut {
            dir: dir.to_path_buf(),
            new_run: None,
        }
    }

    fn row(trial: &str, status: Status) -> Row {
        Row::new("", trial, "routing", status)
    }

    fn open(dir: &Path, identity: &str, names: &[&str], resume: bool) -> anyhow::Result<bool> {
        ReportLife::open(&out(dir), "cpu", env(identity), &trials(names), resume)
            .map(|r| r.is_some())
    }

    fn code(e: anyhow::Error) -> (exit::Code, String) {
        (exit::code_of(&e), e.to_string())
    }

    #[test]
    fn a_report_stopped_early_is_incomplete_and_a_resume_continues_it_with_its_rows() {
        let dir = tempfile::tempdir().unwrap();
        let names = ["a", "b"];
        let mut report =
            ReportLife::open(&out(dir.path()), "cpu", env("m"), &trials(&names), false)
                .unwrap()
                .unwrap();
        report.event(&Event::Row(&row("a", Status::Fail))).unwrap();
        report.event(&Event::Stopped(Stop::MaxFail(1))).unwrap();
        let (c, msg) = code(report.finish(&crate::phases::split(0.0)).err().unwrap());
        assert_eq!(c, exit::Code::Failed);
        assert!(
            msg.starts_with("stopped after 1 failed or errored trial(s) (--max-fail) after 1 of 2")
                && msg.contains("INCOMPLETE"),
            "{msg}"
        );
        // Not without --resume, not started differently, not with trials this run lacks.
        let (c, msg) = code(open(dir.path(), "m", &names, false).unwrap_err());
        assert!(
            c == exit::Code::Usage && msg.contains("already holds a report"),
            "{msg}"
        );
        let (c, msg) = code(open(dir.path(), "other", &names, true).unwrap_err());
        assert!(
            c == exit::Code::Usage && msg.contains("started differently"),
            "{msg}"
        );
        let (c, msg) = code(open(dir.path(), "m", &["b"], true).unwrap_err());
        assert!(
            c == exit::Code::Usage && msg.contains("holds trial a"),
            "{msg}"
        );
        let mut report = ReportLife::open(&out(dir.path()), "cpu", env("m"), &trials(&names), true)
            .unwrap()
            .unwrap();
        let done = report.done();
        assert_eq!(done.trials.len(), 1);
        assert_eq!(done.counts.get("fail"), Some(&1));
        report.event(&Event::Row(&row("b", Status::Pass))).unwrap();
        let finished = report.finish(&crate::phases::split(0.0)).unwrap();
        assert_eq!(finished.dir, dir.path().join("cpu"));
        let (c, msg) = code(finished.verdict().unwrap_err());
        assert!(
            c == exit::Code::Failed && msg.starts_with("1 trial(s) failed"),
            "{msg}"
        );
        // Complete: a resume leaves it as it is and ends as the run did.
        let (c, msg) = code(open(dir.path(), "m", &names, true).unwrap_err());
        assert!(
            c == exit::Code::Failed && msg.contains("failed or errored in"),
            "{msg}"
        );
    }

    #[test]
    fn a_complete_report_that_passed_has_nothing_to_resume() {
        let dir = tempfile::tempdir().unwrap();
        let mut report =
            ReportLife::open(&out(dir.path()), "cpu", env("m"), &trials(&["a"]), false)
                .unwrap()
                .unwrap();
        report.event(&Event::Row(&row("a", Status::Pass))).unwrap();
        report
            .finish(&crate::phases::split(0.0))
            .unwrap()
            .verdict()
            .unwrap();
        assert!(!open(dir.path(), "m", &["a"], true).unwrap());
    }
}
