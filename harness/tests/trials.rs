//! The `cargo test` harness (libtest-mimic): one trial per routing row, per reference self-check
//! of the smoke tier, and per (case, path, split) GPU trial of the selected tier.
//!
//! `RELATTN_MATRIX` selects the GPU tier (default: `smoke` without a GPU, `ci` with one), or
//! `RELATTN_CASES` a case folder (with `RELATTN_SPLITS` and `RELATTN_KEEP_GOING=1`);
//! `RELATTN_FILTER` an expression of `relattn run --filter` (trials by name and parameters).
//! Trials this machine cannot run are listed as ignored; the reasons are printed first.
//!
//! A trial that does not run never passes. libtest (`cargo test`) shows it as ignored with its
//! reason. nextest has no run-time skip (it counts one as a pass), so under nextest a trial
//! that cannot run when asked to (`--run-ignored`), or that declines at run time (a worker that
//! answers `unsupported`, a kernel refusing a case the matrix let through), fails with the
//! reason instead. Under nextest, which runs each trial in a process of its own, generated cases
//! are kept on disk between processes, under the test target's temporary directory (see
//! `case_cache`). `harness::list_time_ignores` checks the listing nextest reads.
//!
//! Each trial is a test of its own, run when and where libtest (or nextest) chooses, so this
//! target is no reporter of an engine run: each test runs its one trial through
//! `Engine::run_one` (docs/decisions.md).

use libtest_mimic::{Arguments, Completion, Failed, Trial};
use relattn_harness::engine::case_cache::CaseCache;
use relattn_harness::engine::{CaseStore, Engine};
use relattn_harness::session::{Session, SessionOptions};
use relattn_reports::Status;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, ExitCode};
use std::sync::Arc;

/// What a trial that did not run reports: an ignore where the runner can show one, else a
/// failure.
fn not_run(reason: &str, nextest: bool) -> Result<Completion, Failed> {
    if nextest {
        Err(Failed::from(format!(
            "not run: {reason} (nextest has no run-time skip, so this is a failure, not a pass)"
        )))
    } else {
        Ok(Completion::ignored_with(reason))
    }
}

/// Names of the trials a listing prints (`name: test` lines), as nextest reads them.
fn listed(extra: &[&str]) -> Result<Vec<String>, Failed> {
    let exe = std::env::current_exe()?;
    let out = Command::new(exe)
        .args(["--list", "--format", "terse"])
        .args(extra)
        .output()?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned().into());
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_suffix(": test"))
        .map(str::to_string)
        .collect())
}

/// The listing marks exactly the trials this machine cannot run as ignored, and one of them,
/// run anyway, reports its reason: ignored under libtest, failed under nextest, never passed.
fn list_time_ignores(ignored: Vec<(String, String)>) -> Result<(), Failed> {
    let all = listed(&[])?;
    let mut listed_ignored = listed(&["--ignored"])?;
    let mut expected: Vec<String> = ignored.iter().map(|(n, _)| n.clone()).collect();
    listed_ignored.sort();
    expected.sort();
    if listed_ignored != expected {
        return Err(format!(
            "--list --ignored gave {} trials, the plan ignores {}",
            listed_ignored.len(),
            expected.len()
        )
        .into());
    }
    if let Some(name) = expected.iter().find(|n| !all.contains(n)) {
        return Err(format!("{name} is ignored but not listed").into());
    }
    let Some((name, reason)) = ignored.first() else {
        return Ok(());
    };
    let exe = std::env::current_exe()?;
    for nextest in [false, true] {
        let mut cmd = Command::new(&exe);
        cmd.args(["--exact", name, "--include-ignored", "--test-threads", "1"]);
        if nextest {
            cmd.env("NEXTEST", "1");
        } else {
            cmd.env_remove("NEXTEST");
        }
        let out = cmd.output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let shown = if nextest {
            !out.status.success() && text.contains(&format!("not run: {reason}"))
        } else {
            out.status.success() && text.contains(&format!("ignored ({reason})"))
        };
        if !shown {
            return Err(format!("{name} run anyway (nextest {nextest}):\n{text}").into());
        }
    }
    Ok(())
}

const MUTANTS_TRIAL: &str = "mutants::every_planted_defect_is_caught";

/// `relattn mutants` on the `ci` tier: every planted defect on every path it touches is caught
/// (each pair in a child process of its own, so a defect that traps ends only its child's CUDA).
/// The binary is this build's, or `RELATTN_BIN` (as for the `ci/` scripts).
fn every_planted_defect_is_caught() -> Result<Completion, Failed> {
    let bin = std::env::var_os("RELATTN_BIN").unwrap_or(env!("CARGO_BIN_EXE_relattn").into());
    let out = Command::new(bin)
        .args(["mutants", "--matrix", "ci"])
        .output()?;
    if out.status.success() {
        return Ok(Completion::Completed);
    }
    Err(Failed::from(format!(
        "relattn mutants --matrix ci exited with {}:\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )))
}

/// The process of a worker's pool that runs `trial`: every trial of one kernel configuration
/// on the same process (libtest runs the trials on threads of its own, in its own order), so a
/// configuration compiles once per run, and the pool's processes share the trials.
fn pool_slot(session: &Session, trial: &relattn_harness::trial_list::Trial) -> usize {
    use std::hash::{Hash, Hasher};
    let (
        Some(case),
        relattn_harness::trial_list::TrialKind::Gpu {
            target: relattn_harness::runner::Target::Worker { worker, .. },
            ..
        },
    ) = (trial.case(), &trial.kind)
    else {
        return 0;
    };
    let size = session.workers.get(*worker).map_or(1, |w| w.pool_size());
    let mut h = std::collections::hash_map::DefaultHasher::new();
    relattn_harness::engine::compile_key::of_case(case).hash(&mut h);
    (h.finish() % size as u64) as usize
}

fn main() -> ExitCode {
    let args = Arguments::from_args();
    let session = match SessionOptions::for_cargo_test()
        .and_then(|o| Session::open(&o, &relattn_harness::gpu_exec::RealFactory::default()))
    {
        Ok(s) => Arc::new(s),
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::from(2);
        }
    };
    let trials = session.trials.clone();
    // The trials libtest's own filter (`cargo test -- NAME`, `--exact`, `--skip`) selects: the
    // header counts their ignore reasons only.
    let selected = |name: &str| {
        let wanted = args.filter.as_deref().is_none_or(|f| {
            if args.exact {
                name == f
            } else {
                name.contains(f)
            }
        });
        wanted && !args.skip.iter().any(|s| name.contains(s.as_str()))
    };
    let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
    // The planted defects (`relattn mutants`): each built into the kernels and caught by the
    // `ci` tier, on this machine's GPU.
    let mutants_ignore = (session.device_count() == 0)
        .then(|| format!("planted defects need a usable GPU ({})", session.gpu_line()));
    if let Some(reason) = mutants_ignore.as_ref().filter(|_| selected(MUTANTS_TRIAL)) {
        reasons.insert(reason.clone(), 1);
    }
    for t in trials.iter().filter(|t| selected(&t.name)) {
        if let Some(r) = &t.ignore {
            *reasons.entry(r.clone()).or_default() += 1;
        }
    }
    if !args.list {
        eprintln!(
            "relattn trials: GPU tier `{}`; {}",
            session.set.name(),
            session.gpu_line()
        );
        for (reason, n) in &reasons {
            eprintln!("  ignored {n:>5}: {reason}");
        }
    }
    // nextest sets NEXTEST=1 in the processes it starts.
    let nextest = std::env::var_os("NEXTEST").is_some();
    // Under cargo test one process runs every trial and shares each case in memory; under
    // nextest every trial has a process of its own, and the disk saves generating it again.
    let cache = nextest
        .then(|| CaseCache::for_this_binary(option_env!("CARGO_TARGET_TMPDIR").map(Path::new)))
        .flatten();
    let store = Arc::new(CaseStore::for_trials(&trials).with_disk_cache(cache));
    let mut ignored: Vec<(String, String)> = trials
        .iter()
        .filter_map(|t| Some((t.name.clone(), t.ignore.clone()?)))
        .collect();
    if let Some(reason) = &mutants_ignore {
        ignored.push((MUTANTS_TRIAL.to_string(), reason.clone()));
    }
    let mut tests: Vec<Trial> = vec![Trial::test("harness::list_time_ignores", move || {
        list_time_ignores(ignored)
    })];
    tests.extend(trials.into_iter().map(|t| {
        let ignored = t.ignore.is_some();
        let (store, session) = (store.clone(), session.clone());
        let name = t.name.clone();
        Trial::ignorable_test(name, move || {
            if let Some(reason) = &t.ignore {
                return not_run(reason, nextest);
            }
            let row = Engine::new(&session).run_one(&t, &store, pool_slot(&session, &t));
            match row.status {
                Status::Pass | Status::XPass => Ok(Completion::Completed),
                // libtest has no expected failure: the test passes and says so.
                Status::XFail => {
                    eprintln!("{}", relattn_harness::engine::failure_text(&row));
                    Ok(Completion::Completed)
                }
                Status::Skip => not_run(&row.message, nextest),
                Status::Fail | Status::Error => {
                    Err(Failed::from(relattn_harness::engine::failure_text(&row)))
                }
            }
        })
        .with_ignored_flag(ignored)
    }));
    tests.push(
        Trial::ignorable_test(MUTANTS_TRIAL, {
            let reason = mutants_ignore.clone();
            move || match &reason {
                Some(reason) => not_run(reason, nextest),
                None => every_planted_defect_is_caught(),
            }
        })
        .with_ignored_flag(mutants_ignore.is_some()),
    );
    libtest_mimic::run(&args, tests).exit_code()
}
