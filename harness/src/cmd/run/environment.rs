//! What a run's report records about it (the environment) and what `--resume` compares (its
//! identity).

use super::Args;
use crate::exit;
use crate::gpu_status::GpuStatus;
use crate::sanitize::Sanitizer;
use crate::session::Session;
use relattn_reports::Environment;

/// The report's environment with the sanitizer's settings (`--sanitize`) and the run's
/// identity (`run_identity`, under `IDENTITY_KEY`).
pub(super) fn run_environment(
    session: &Session,
    args: &Args,
    sanitizer: Option<&Sanitizer>,
) -> Environment {
    let mut env = environment(session, args);
    if let Some(s) = sanitizer {
        env.extra.insert(
            "sanitize".into(),
            serde_json::json!({
                "tool": s.tool.as_str(),
                "sanitizer": s.program.display().to_string(),
                "native_paths": crate::sanitize::child_log().is_some(),
                "note": "every GPU trial ran under the sanitizer: times are not comparable with unsanitized runs",
            }),
        );
    }
    env.extra
        .insert(IDENTITY_KEY.into(), run_identity(session, args));
    env
}

/// The report's environment: matrix, shard, relattn's revision and build, seeds, the GPU, the
/// executor's and the workers' own descriptions.
fn environment(session: &Session, args: &Args) -> Environment {
    let mut env = Environment {
        matrix: Some(session.set.name()),
        shard: args.shard.clone(),
        started: Some(relattn_reports::now()),
        relattn_version: Some(env!("CARGO_PKG_VERSION").to_string()),
        relattn_revision: crate::provenance::relattn_revision(),
        relattn_build: Some(crate::provenance::relattn_build()),
        git_revision: crate::provenance::workdir_revision(),
        hostname: std::fs::read_to_string("/etc/hostname")
            .ok()
            .map(|s| s.trim().to_string()),
        ..Environment::default()
    };
    let mut seeds: Vec<u64> = session.cases.iter().map(|c| c.seed()).collect();
    seeds.sort_unstable();
    seeds.dedup();
    env.seeds = seeds;
    if let GpuStatus::Ready { devices, routed } = &session.status {
        let d = &devices[0];
        env.gpu_name = Some(d.name.clone());
        env.capability = Some(d.cc.to_string());
        env.driver = Some(d.driver_version.clone());
        env.extra
            .insert("routed_path".into(), serde_json::json!(routed.as_str()));
        env.extra
            .insert("devices".into(), serde_json::json!(devices.len()));
    } else if let Some(why) = session.status.unusable_reason() {
        env.notes.push(why);
    }
    if let Some(exec) = session.executor_ref() {
        exec.describe(&mut env);
    }
    for w in &session.workers {
        crate::runner::Runner::describe(&**w, &mut env);
    }
    env
}

/// Key of summary.json's `environment.extra` holding what a resumed run must share.
pub(super) const IDENTITY_KEY: &str = "run_identity";

/// What `--resume` compares: the matrix or case folder (with its split settings and
/// `--keep-going`), shard, case filter, paths, bounds checks, devices, workers, self-checks,
/// sanitizer, expected failures, triage and relattn's build.
fn run_identity(session: &Session, args: &Args) -> serde_json::Value {
    serde_json::json!({
        "matrix": session.set.name(),
        // Absent (null) unless given, so reports of runs from before the flags still resume.
        "splits": args.splits,
        "keep_going": args.keep_going.then_some(true),
        "shard": args.shard,
        "case": args.case,
        "filter": args.filter,
        "name": args.name,
        "rerun_failed": args.rerun_failed,
        "paths": args.paths,
        "bounds_check": args.bounds_check,
        "devices": args.devices,
        "impls": args.impls,
        "workers": args.workers,
        "self_checks": args.self_checks,
        "sanitize": args.sanitize.map(|t| t.as_str()),
        // Rows decided under another xfail file or without triage would not mix.
        "xfail": args.xfail,
        "no_triage": args.no_triage.then_some(true),
        "build": crate::provenance::relattn_build(),
    })
}

/// Refuses (exit 2) to resume the report in `dir` when its run was started differently from
/// this one (`identity`), naming what differs.
pub(super) fn check_identity(
    dir: &std::path::Path,
    kept: &Environment,
    identity: &serde_json::Value,
) -> anyhow::Result<()> {
    let Some(old) = kept.extra.get(IDENTITY_KEY) else {
        return Err(exit::usage(format!(
            "--resume: {} does not record how its run was started (written by an older \
             relattn); give another --out",
            dir.display()
        )));
    };
    let differing: Vec<String> = identity
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(k, v)| old.get(k.as_str()).unwrap_or(&serde_json::Value::Null) != *v)
        .map(|(k, v)| {
            format!(
                "{k} {} (was {})",
                v,
                old.get(k.as_str()).unwrap_or(&serde_json::Value::Null)
            )
        })
        .collect();
    if differing.is_empty() {
        return Ok(());
    }
    Err(exit::usage(format!(
        "--resume: {} was started differently: {}; resume with the same matrix, shard, paths \
         and build, or give another --out",
        dir.display(),
        differing.join(", ")
    )))
}
