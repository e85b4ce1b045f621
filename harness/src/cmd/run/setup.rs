//! A run set up from its arguments: its share of the machine, the session's options, the one
//! device a sanitized run takes, and the architecture its report is for.

use super::select::selection_filter;
use super::Args;
use crate::case_set::CaseSet;
use crate::exit;
use crate::gpu_status::{DeviceSelection, GpuStatus};
use crate::sanitize::Sanitizer;
use crate::session::{Session, SessionOptions};
use crate::trial_list::{BoundsCheck, PathSelection};
use relattn_matrices::Shard;
use std::collections::BTreeSet;

/// The session's options from `args`; `rerun` is what `--rerun-failed` found (the matrix its
/// report ran, and the trials to run again).
pub(super) fn session_options(
    args: &Args,
    rerun: Option<&(Option<String>, BTreeSet<String>)>,
    sanitizer: Option<&Sanitizer>,
) -> anyhow::Result<SessionOptions> {
    Ok(SessionOptions {
        gpu_cases: case_set(args, rerun.and_then(|(m, _)| m.as_deref()))?,
        selfcheck_matrix: None,
        paths: args.paths.parse::<PathSelection>().map_err(exit::usage)?,
        // Sanitized, the plain build by default: memcheck, not a trap, is to see the accesses.
        bounds: args
            .bounds_check
            .as_deref()
            .map(str::parse::<BoundsCheck>)
            .transpose()
            .map_err(exit::usage)?
            .or(sanitizer.map(|_| BoundsCheck::Off)),
        shard: args
            .shard
            .as_deref()
            .map(str::parse::<Shard>)
            .transpose()
            .map_err(|e| exit::usage(e.to_string()))?,
        devices: args
            .devices
            .parse::<DeviceSelection>()
            .map_err(exit::usage)?,
        case: args.case.clone(),
        filter: selection_filter(args)?,
        only: rerun.map(|(_, names)| names.clone()),
        workers: crate::worker::sanitized(
            crate::worker::specs(&args.impls, &args.workers).map_err(exit::usage)?,
            sanitizer,
        ),
        worker_timeout: crate::worker::timeout(args.worker_timeout_s).map_err(exit::usage)?,
        worker_processes: args.worker_processes.map(|n| n as usize),
        processes: args.processes,
        triage: !args.no_triage,
        xfail: args.xfail.clone(),
        self_checks: args.self_checks.then_some(true),
    })
}

/// The architecture the report is for (`sm90`, `sm100`, ... or `cpu`). Exit 3 when the device
/// is rejected, or with `--require-gpu` when no usable GPU runs the GPU trials.
pub(super) fn arch(session: &Session, require_gpu: bool) -> anyhow::Result<String> {
    if let GpuStatus::Rejected(why) = &session.status {
        return Err(exit::no_gpu(why.clone()));
    }
    // A failed GPU setup turns the status into Absent, so Ready means the device is in use.
    if require_gpu {
        if let Some(why) = session.status.unusable_reason() {
            return Err(exit::no_gpu(format!(
                "--require-gpu: {why}; nothing was run (drop --require-gpu to run the CPU part)"
            )));
        }
    }
    Ok(match &session.status {
        GpuStatus::Ready { devices, .. } => {
            format!("sm{}{}", devices[0].cc.major, devices[0].cc.minor)
        }
        _ => "cpu".to_string(),
    })
}

/// `--sanitize` runs the native paths on one GPU, one trial at a time (so every report in the
/// sanitizer's log between two trials is the trial's): `--devices` must name one.
pub(super) fn sanitized_devices(args: &Args) -> anyhow::Result<DeviceSelection> {
    let devices = args
        .devices
        .parse::<DeviceSelection>()
        .map_err(exit::usage)?;
    match &devices {
        DeviceSelection::List(v) if v.len() == 1 => Ok(devices),
        _ => Err(exit::usage(format!(
            "--sanitize runs the native paths on one GPU, one trial at a time: give --devices \
             with one index (not {})",
            args.devices
        ))),
    }
}

/// `--processes` is at least 1. (The run's share of the cores, its thread pool, is `main`'s:
/// `relattn_harness::threads::share`.)
pub(super) fn check_processes(processes: usize) -> anyhow::Result<()> {
    if processes == 0 {
        return Err(exit::usage("--processes must be at least 1"));
    }
    Ok(())
}

/// Where the run's cases come from: `--cases` (with `--splits` and `--keep-going`), else
/// `--matrix`, else what the report of `--rerun-failed` ran (`rerun`), else the default tier.
fn case_set(args: &Args, rerun: Option<&str>) -> anyhow::Result<Option<CaseSet>> {
    let splits = args
        .splits
        .as_deref()
        .map(relattn_matrices::parse_splits)
        .transpose()
        .map_err(exit::usage)?;
    let set = match (&args.cases, &args.matrix, rerun) {
        (Some(dir), _, _) => Some(CaseSet::folder(dir.clone())),
        (None, Some(m), _) => Some(CaseSet::Matrix(m.clone())),
        (None, None, Some(name)) => Some(CaseSet::from_name(name)),
        (None, None, None) => None,
    };
    match set {
        Some(CaseSet::Folder {
            dir,
            splits: default,
            ..
        }) => Ok(Some(CaseSet::Folder {
            dir,
            splits: splits.unwrap_or(default),
            keep_going: args.keep_going,
        })),
        _ if splits.is_some() || args.keep_going => Err(exit::usage(
            "--splits and --keep-going are for case folders (--cases DIR); a matrix states its \
             split settings per group",
        )),
        other => Ok(other),
    }
}
