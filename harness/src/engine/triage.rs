//! Triage of a failing or erroring GPU trial: its cause, from variants of the same case run again
//! and judged against the same references (none of them changes the operator's output), so that
//! a trial that already fails for a known cause still shows a new one.
//!
//! A run that could not complete is `error` and one that trapped, faulted or drew a sanitizer
//! report is `fault`, without running again: a rerun would cost a worker process (three deaths
//! in a row end it) or the device's context, and no variant below tells their causes apart.
//! A wrong output is run again in these variants, in order, each only while no cause is found
//! (at most three more runs):
//! 1. `again`: the same inputs once more: a pass means the result is not reproducible (`flaky`);
//! 2. `finite_unread`: every value no real row reads (unused and pre-window pages, padding rows,
//!    bias cells past the visible distances) finite instead of NaN: a pass means the trial fails
//!    only through NaN read from memory it must not read (`nan_leak`, docs/operator.md section
//!    5, class 7);
//! 3. `splits_1`: where the run split the KV sequence and the path takes a forced split count,
//!    one split (on the finite inputs when the case had NaN): a pass means the split path or its
//!    combine is wrong (`split_combine`).
//!
//! Failing every variant it ran, the cause is `wrong`.

use super::cases::CaseData;
use super::causes::meaning;
use crate::runner::{CaseLife, RunError, RunOutput, RunRequest, Runner, Target};
use crate::trial_list::Trial;
use relattn_matrices::{Case, SplitSetting};
use relattn_reference::transform::finite_unread;
use relattn_reference::Problem;
use relattn_reports::Row;

/// How the original run ended, as triage sorts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Pass,
    Wrong,
    Fault,
    Error,
}

/// Judge one run of `problem` against `data`'s references.
fn outcome(
    problem: &Problem,
    case: &Case,
    data: &CaseData,
    result: &Result<RunOutput, RunError>,
) -> Outcome {
    match result {
        Ok(run) => {
            let v = super::row::verdict(problem, case, data, run);
            let sanitized_errors = run.sanitizer.as_ref().is_some_and(|s| s.errors.is_some());
            match (v.pass, sanitized_errors) {
                (_, true) => Outcome::Fault,
                (true, false) => Outcome::Pass,
                (false, false) => Outcome::Wrong,
            }
        }
        Err(RunError::Fault(_)) => Outcome::Fault,
        Err(_) => Outcome::Error,
    }
}

/// The original run's outcome (for a row already judged failing or erroring).
pub fn first_outcome(result: &Result<RunOutput, RunError>, row: &Row) -> Outcome {
    match result {
        Err(RunError::Fault(_)) => Outcome::Fault,
        Err(_) => Outcome::Error,
        Ok(run) if run.sanitizer.as_ref().is_some_and(|s| s.errors.is_some()) => Outcome::Fault,
        Ok(_) if row.status.is_bad() => Outcome::Wrong,
        Ok(_) => Outcome::Pass,
    }
}

fn word(o: Outcome) -> &'static str {
    match o {
        Outcome::Pass => "pass",
        Outcome::Wrong => "fail",
        Outcome::Fault => "fault",
        Outcome::Error => "error",
    }
}

/// The case id and life a variant's run of `problem` goes by. The case again, through a worker,
/// is its file (a worker's process reads the file anew for each request), not another copy of
/// gigabytes. Else another case id (the native runner keeps a case's upload by its id) and the
/// variant's own life, `own`: its file goes when the variant's runs end.
fn variant_key<'a>(
    case: &Case,
    data: &'a CaseData,
    target: &Target,
    problem: &Problem,
    variant: &str,
    own: &'a CaseLife,
) -> (String, &'a CaseLife) {
    if std::ptr::eq(problem, &data.problem) && matches!(target, Target::Worker { .. }) {
        (case.id.clone(), &data.life)
    } else {
        (format!("{}+{variant}", case.id), own)
    }
}

/// The request of a variant's run (or of its staging) of `trial`.
fn variant_request<'a>(
    trial: &'a Trial,
    target: &'a Target,
    case_id: &'a str,
    problem: &'a Problem,
    split: SplitSetting,
    life: &'a CaseLife,
) -> RunRequest<'a> {
    RunRequest {
        trial: &trial.name,
        case_id,
        problem,
        case_file: None,
        case_life: Some(life),
        target,
        split,
        timing: None,
    }
}

/// Triage `trial` (whose first run ended `first`) on `runner`'s `slot`, and write the cause and
/// each variant's verdict into `row` (`cause` and `triage` columns, and the message).
#[allow(clippy::too_many_arguments)]
pub fn triage(
    row: &mut Row,
    trial: &Trial,
    case: &Case,
    data: &CaseData,
    target: &Target,
    split: SplitSetting,
    runner: &dyn Runner,
    slot: usize,
    first: Outcome,
) {
    let not_rerun = match first {
        Outcome::Fault => Some("fault"),
        Outcome::Error => Some("error"),
        Outcome::Pass | Outcome::Wrong => None,
    };
    if let Some(cause) = not_rerun {
        row.params.insert("cause".into(), cause.to_string());
        row.params.insert("triage".into(), "not run again".into());
        row.message = format!(
            "{}; cause: {cause} ({})",
            row.message,
            meaning(cause).unwrap_or_default()
        );
        return;
    }
    let run = |problem: &Problem, variant: &str, split: SplitSetting, own: &CaseLife| {
        let (id, life) = variant_key(case, data, target, problem, variant, own);
        let req = variant_request(trial, target, &id, problem, split, life);
        let result = runner.run(slot, &req);
        outcome(problem, case, data, &result)
    };
    let (again_life, finite_life) = (CaseLife::default(), CaseLife::default());
    // The finite variant is made (and a worker's file of it written) while the trial runs
    // again: for a case of gigabytes each takes seconds. Unused when the run passes again.
    let (again, finite) = std::thread::scope(|s| {
        let staged = s.spawn(|| {
            let _on = crate::trace::on_trial(&trial.name);
            let finite = finite_unread(&data.problem);
            if let Some(p) = &finite {
                let (id, life) = variant_key(case, data, target, p, "finite_unread", &finite_life);
                runner.stage(&variant_request(trial, target, &id, p, split, life));
            }
            finite
        });
        let again = run(&data.problem, "again", split, &again_life);
        let finite = staged
            .join()
            .unwrap_or_else(|e| std::panic::resume_unwind(e));
        (again, finite)
    });
    let mut seen: Vec<(&str, Outcome)> = vec![("again", again)];
    let mut cause = (again == Outcome::Pass).then_some("flaky");
    if cause.is_none() {
        if let Some(p) = &finite {
            let o = run(p, "finite_unread", split, &finite_life);
            seen.push(("finite_unread", o));
            if o == Outcome::Pass {
                cause = Some("nan_leak");
            }
        }
    }
    let used_splits = row
        .params
        .get("num_splits_run")
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or(1);
    // A worker path that takes no forced split count would only refuse the variant.
    let split_run = split.forced().unwrap_or(used_splits) > 1 && runner.takes_forced_splits(target);
    if cause.is_none() && split_run {
        let p = finite.as_ref().unwrap_or(&data.problem);
        // A worker reads the finite variant's file again rather than a copy of it.
        let own = CaseLife::default();
        let (variant, life) = match (&finite, target) {
            (Some(_), Target::Worker { .. }) => ("finite_unread", &finite_life),
            _ => ("splits_1", &own),
        };
        let o = run(p, variant, SplitSetting::Forced(1), life);
        seen.push(("splits_1", o));
        if o == Outcome::Pass {
            cause = Some("split_combine");
        }
    }
    let cause = cause.unwrap_or("wrong");
    let verdicts: Vec<String> = seen
        .iter()
        .map(|(v, o)| format!("{v} {}", word(*o)))
        .collect();
    row.params.insert("cause".into(), cause.to_string());
    row.params.insert("triage".into(), verdicts.join(", "));
    row.message = format!(
        "{}; cause: {cause} ({}; triage: {})",
        row.message,
        meaning(cause).unwrap_or_default(),
        verdicts.join(", ")
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trial_list::TrialKind;
    use std::sync::{Arc, Condvar, Mutex};
    use std::time::Duration;

    /// A worker stand-in recording what it was asked: (staged or run, case id, life's address).
    /// Its outputs are zeros (wrong), but for the `again` run's when `again` is given. That run
    /// waits for the finite variant to be staged.
    #[derive(Default)]
    struct Recorder {
        asked: Mutex<Vec<(&'static str, String, usize)>>,
        staged: Condvar,
        again: Option<ndarray::Array3<f32>>,
    }

    fn entry(what: &'static str, req: &RunRequest<'_>) -> (&'static str, String, usize) {
        let life = req.case_life.map_or(0, |l| l as *const CaseLife as usize);
        (what, req.case_id.to_string(), life)
    }

    impl Runner for Recorder {
        fn run(&self, _slot: usize, req: &RunRequest<'_>) -> Result<RunOutput, RunError> {
            let mut asked = self.asked.lock().unwrap();
            let again = !req.case_id.contains('+');
            if again {
                let (asked_now, _) = self
                    .staged
                    .wait_timeout_while(asked, Duration::from_secs(10), |a| a.is_empty())
                    .unwrap();
                asked = asked_now;
            }
            asked.push(entry("run", req));
            let p = req.problem;
            let zeros = ndarray::Array3::zeros((p.total_rows(), p.num_heads, p.head_dim));
            Ok(RunOutput {
                out: self.again.clone().filter(|_| again).unwrap_or(zeros),
                padding_intact: true,
                counters_left: 0,
                ms: None,
                ms_all: Vec::new(),
                num_splits: 1,
                kernels: Vec::new(),
                sanitizer: None,
            })
        }

        fn stage(&self, req: &RunRequest<'_>) {
            self.asked.lock().unwrap().push(entry("stage", req));
            self.staged.notify_all();
        }
    }

    /// A smoke case with NaN where no row reads, its data, a worker trial of it and its row
    /// (`num_splits_run` as given).
    fn failing_trial(splits_run: usize) -> (Case, CaseData, Target, Trial, Row) {
        let tier = relattn_matrices::load_tier("smoke").unwrap();
        let (case, data) = tier
            .expand()
            .unwrap()
            .cases
            .into_iter()
            .find_map(|c| {
                let data = CaseData::new(&c).unwrap();
                finite_unread(&data.problem).map(|_| (c, data))
            })
            .expect("a smoke case with NaN no row reads");
        let target = Target::Worker {
            worker: 0,
            name: "w".into(),
            path: "p".into(),
            label: "--worker w".into(),
        };
        let trial = Trial {
            name: format!("impl::w::p::{}", case.id),
            kind: TrialKind::Gpu {
                case: Arc::new(case.clone()),
                target: target.clone(),
                split: SplitSetting::Policy,
            },
            ignore: None,
        };
        let mut row = super::super::row::new_row(&trial);
        row.params
            .insert("num_splits_run".into(), splits_run.to_string());
        (case, data, target, trial, row)
    }

    fn triaged(runner: &Recorder, splits_run: usize) -> (Row, Vec<(&'static str, String, usize)>) {
        let (case, data, target, trial, mut row) = failing_trial(splits_run);
        let split = SplitSetting::Policy;
        triage(
            &mut row,
            &trial,
            &case,
            &data,
            &target,
            split,
            runner,
            0,
            Outcome::Wrong,
        );
        let data_life = &data.life as *const CaseLife as usize;
        let asked = runner.asked.lock().unwrap().clone();
        // The variant is staged first, under its own id and life; the run again reads the
        // case's own file.
        let variant = format!("{}+finite_unread", case.id);
        assert_eq!(
            (asked[0].0, asked[0].1.as_str()),
            ("stage", variant.as_str())
        );
        assert_ne!(asked[0].2, data_life);
        assert_eq!(asked[1], ("run", case.id.clone(), data_life), "again");
        (row, asked)
    }

    /// A failing worker trial's finite variant is made and staged while the trial runs again,
    /// and its run then goes by the staged case id and life (the file written ahead).
    #[test]
    fn the_finite_variant_is_staged_while_the_trial_runs_again() {
        let (row, asked) = triaged(&Recorder::default(), 1);
        assert_eq!(row.params["triage"], "again fail, finite_unread fail");
        assert_eq!(asked.len(), 3, "{asked:?}");
        assert_eq!(
            asked[2],
            ("run", asked[0].1.clone(), asked[0].2),
            "the staged file"
        );
    }

    /// A worker's one-split variant on the finite inputs reads the finite variant's file again.
    #[test]
    fn the_split_variant_reads_the_finite_file_again() {
        let (row, asked) = triaged(&Recorder::default(), 2);
        assert_eq!(
            row.params["triage"],
            "again fail, finite_unread fail, splits_1 fail"
        );
        assert_eq!(asked.len(), 4, "{asked:?}");
        assert_eq!(asked[2], asked[3]);
        assert_eq!(asked[3], ("run", asked[0].1.clone(), asked[0].2));
    }

    /// A trial that passes when run again is flaky: the staged variant is not run.
    #[test]
    fn a_flaky_trial_runs_no_variant() {
        let (_, data, ..) = failing_trial(1);
        let runner = Recorder {
            again: Some(data.ref_lp().out.mapv(|x| x as f32)),
            ..Recorder::default()
        };
        let (row, asked) = triaged(&runner, 1);
        assert_eq!(row.params["cause"], "flaky");
        assert_eq!(row.params["triage"], "again pass");
        assert_eq!(asked.len(), 2, "{asked:?}");
    }
}
