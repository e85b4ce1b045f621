//! One trial, from its case to its report row: routing and self-check trials on this thread, a
//! GPU trial in two steps (the run on a device thread, then the judge on any thread).

use super::cases::{CaseData, CaseStore, CaseUse};
use super::row;
use super::runners::Runners;
use super::triage;
use crate::case_set::CaseSet;
use crate::phases::{self, Phase};
use crate::runner::{RunError, RunOutput, RunRequest, Target};
use crate::selfcheck;
use crate::trial_list::{check_routing_row, check_unknown_capabilities, Trial, TrialKind};
use relattn_reports::Row;
use std::sync::Arc;
use std::time::Instant;

/// Run one trial (not ignored) to a report row.
pub fn run_trial(trial: &Trial, store: &CaseStore, runners: &Runners<'_>, set: &CaseSet) -> Row {
    start_trial(trial, store, runners).finish(trial, runners, set)
}

/// Where a trial stands after `start_trial`: its row is complete but for the last touches, or
/// its GPU run is done and the judge is left to do (on any thread: the case's references are
/// computed already).
pub enum Step {
    Done {
        row: Box<Row>,
        started: Option<Instant>,
    },
    Ran(Box<Ran>),
}

/// A GPU trial's run, waiting for the judge.
pub struct Ran {
    row: Row,
    started: Instant,
    data: Arc<CaseData>,
    /// The trial's use of the case, ended when the judge is done with it.
    held: CaseUse,
    result: Result<RunOutput, RunError>,
    /// The device slot or pool process the run took (triage runs there again).
    slot: usize,
}

/// Start a trial: everything but the judging of a GPU run. A device thread hands the `Step` of
/// a GPU trial to another thread to judge and finish, and runs the next trial meanwhile.
pub fn start_trial(trial: &Trial, store: &CaseStore, runners: &Runners<'_>) -> Step {
    let _on = crate::trace::on_trial(&trial.name);
    let mut row = row::new_row(trial);
    if let Some(why) = &trial.ignore {
        row::skip(&mut row, why.clone());
        return Step::Done {
            row: Box::new(row),
            started: None,
        };
    }
    let started = Instant::now();
    match &trial.kind {
        TrialKind::BadFile => row::skip(&mut row, "not a valid case file".into()),
        TrialKind::Routing(r) => row::record_check(&mut row, check_routing_row(r)),
        TrialKind::RoutingUnknown => row::record_check(&mut row, check_unknown_capabilities()),
        TrialKind::Reference { case, check } => match store.get(case).data() {
            Ok(data) => {
                let ref64 = data.ref64();
                let c = phases::time(Phase::SelfChecks, || {
                    selfcheck::check(*check, &data.problem, Some(ref64))
                });
                row::record_self_check(&mut row, c);
            }
            Err(e) => row::error(&mut row, e.to_string()),
        },
        TrialKind::Gpu {
            case,
            target,
            split,
        } => {
            let held = store.get(case);
            match (held.data(), runners.for_target(target)) {
                (Ok(data), Some((runner, slot))) => {
                    let req = RunRequest {
                        trial: &trial.name,
                        case_id: &case.id,
                        problem: &data.problem,
                        case_file: None,
                        case_life: Some(&data.life),
                        target,
                        split: *split,
                        timing: None,
                    };
                    let phase = match target {
                        Target::Native { .. } => Phase::Gpu,
                        Target::Worker { .. } => Phase::Workers,
                    };
                    let result = phases::time(phase, || runner.run(slot, &req));
                    // The references first, so the judge's time is the judge's alone (and a
                    // judging thread never waits for a case being built).
                    if result.is_ok() {
                        let _ = (data.ref64(), data.ref_lp());
                    }
                    return Step::Ran(Box::new(Ran {
                        row,
                        started,
                        data: data.clone(),
                        held,
                        result,
                        slot,
                    }));
                }
                (Err(e), _) => {
                    row::error(&mut row, e.to_string());
                    row.params
                        .insert("triage".into(), "not run: the case was not built".into());
                }
                (_, None) => row::skip(&mut row, "no GPU".into()),
            }
        }
    }
    Step::Done {
        row: Box::new(row),
        started: Some(started),
    }
}

impl Step {
    /// Judge a GPU run (ending its use of the case) and give the row its wall time and, when it failed,
    /// the command that reproduces it.
    pub fn finish(self, trial: &Trial, runners: &Runners<'_>, set: &CaseSet) -> Row {
        let _on = crate::trace::on_trial(&trial.name);
        let (mut row, started, mut kept) = match self {
            Step::Done { row, started: None } => return *row,
            Step::Done {
                row,
                started: Some(started),
            } => {
                let kept = row::keep_files(&row, trial, runners);
                (*row, started, kept)
            }
            Step::Ran(ran) => {
                let Ran {
                    mut row,
                    started,
                    data,
                    held,
                    result,
                    slot,
                } = *ran;
                if let TrialKind::Gpu {
                    case,
                    target,
                    split,
                } = &trial.kind
                {
                    let first = phases::time(Phase::Judge, || {
                        row::record_run(&mut row, case, &data, target, &result);
                        triage::first_outcome(&result, &row)
                    });
                    // The failing run's files, before triage runs the trial again.
                    let kept = row::keep_files(&row, trial, runners);
                    let runner = runners.for_target(target).map(|(r, _)| r);
                    let triage = runners.triage && row.status.is_bad();
                    if triage && super::stopping() {
                        row.params
                            .insert("triage".into(), "not run: the run was stopping".into());
                    } else if let (true, Some(runner)) = (triage, runner) {
                        phases::time(Phase::Triage, || {
                            triage::triage(
                                &mut row, trial, case, &data, target, *split, runner, slot, first,
                            )
                        });
                    }
                    drop((data, held));
                    (row, started, kept)
                } else {
                    (row, started, None)
                }
            }
        };
        if let Some(x) = runners.xfail {
            x.apply(trial, &mut row);
            // An expected failure keeps no files: the report's room is for new failures.
            if row.status == relattn_reports::Status::XFail {
                if let Some(k) = kept.take() {
                    k.discard();
                }
            }
        }
        row::finish_row(&mut row, started, trial, kept, set);
        row
    }
}
