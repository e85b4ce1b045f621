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
    let run = |problem: &Problem, variant: &str, split: SplitSetting| {
        // The case again, through a worker: its file (a worker's process reads the file anew
        // for each request), not another copy of gigabytes. Else another case id (the native
        // runner keeps a case's upload by its id) and a life of the run's: a variant's file
        // goes when its run ends.
        let own = CaseLife::default();
        let same_file =
            std::ptr::eq(problem, &data.problem) && matches!(target, Target::Worker { .. });
        let id = if same_file {
            case.id.clone()
        } else {
            format!("{}+{variant}", case.id)
        };
        let req = RunRequest {
            trial: &trial.name,
            case_id: &id,
            problem,
            case_file: None,
            case_life: Some(if same_file { &data.life } else { &own }),
            target,
            split,
            timing: None,
        };
        let result = runner.run(slot, &req);
        outcome(problem, case, data, &result)
    };
    let mut seen: Vec<(&str, Outcome)> = Vec::new();
    let mut cause = None;
    let again = run(&data.problem, "again", split);
    seen.push(("again", again));
    if again == Outcome::Pass {
        cause = Some("flaky");
    }
    let finite = finite_unread(&data.problem);
    if cause.is_none() {
        if let Some(p) = &finite {
            let o = run(p, "finite_unread", split);
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
        let o = run(p, "splits_1", SplitSetting::Forced(1));
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
