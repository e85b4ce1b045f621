//! The `cargo test` harness (libtest-mimic): one trial per routing row, per reference self-check
//! of the smoke tier, and per (case, path, split) GPU trial of the selected tier.
//!
//! `RELATTN_MATRIX` selects the GPU tier (default: `smoke` without a GPU, `ci` with one).
//! Trials this machine cannot run are listed as ignored; the reasons are printed first.

use libtest_mimic::{Arguments, Completion, Failed, Trial};
use relattn_harness::execute::{run_trial, CaseStore};

use relattn_harness::session::{Session, SessionOptions};
use relattn_reports::Status;
use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;

fn main() -> ExitCode {
    let args = Arguments::from_args();
    let session = match SessionOptions::for_cargo_test().and_then(|o| Session::open(&o)) {
        Ok(s) => Arc::new(s),
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::from(2);
        }
    };
    let trials = session.trials.clone();
    let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
    for t in &trials {
        if let Some(r) = &t.ignore {
            *reasons.entry(r.clone()).or_default() += 1;
        }
    }
    if !args.list {
        eprintln!(
            "relattn trials: GPU tier `{}`; {}",
            session.gpu_matrix,
            session.gpu_line()
        );
        for (reason, n) in &reasons {
            eprintln!("  ignored {n:>5}: {reason}");
        }
    }
    let store = Arc::new(CaseStore::for_trials(&trials));
    let tests = trials
        .into_iter()
        .map(|t| {
            let ignored = t.ignore.is_some();
            let (store, session) = (store.clone(), session.clone());
            let name = t.name.clone();
            Trial::ignorable_test(name, move || {
                if let Some(reason) = &t.ignore {
                    return Ok(Completion::ignored_with(reason));
                }
                let row = run_trial(&t, &store, &session.runners(0), &session.gpu_matrix);
                match row.status {
                    Status::Pass => Ok(Completion::Completed),
                    Status::Skip => Ok(Completion::ignored_with(row.message)),
                    Status::Fail | Status::Error => {
                        Err(Failed::from(relattn_harness::execute::failure_text(&row)))
                    }
                }
            })
            .with_ignored_flag(ignored)
        })
        .collect();
    libtest_mimic::run(&args, tests).exit_code()
}
