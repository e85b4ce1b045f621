//! Merging shard reports into one.

use crate::env::Environment;
use crate::error::ReportError;
use crate::load::{load, ArchReport, Report};
use crate::row::Row;
use crate::writer::write_outputs;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Merges the reports in `dirs` into `out`: architecture directories of the same name are merged,
/// rows deduplicated by trial name. A trial present twice must have the same result (everything
/// but the timing columns `ms`, `tflops`, `gbps` and the free-text `message`); otherwise it is a
/// [`ReportError::Conflict`]. The environment is the first input's, with the shards listed
/// together, `started`/`finished` spanning all inputs, and `extra.merged_from` naming each input.
/// All inputs are read before anything is written, so `out` may be one of them.
pub fn merge(dirs: &[PathBuf], out: &Path) -> Result<Report, ReportError> {
    if dirs.is_empty() {
        return Err(ReportError::NoInputs);
    }
    let inputs = dirs
        .iter()
        .map(|d| load(d))
        .collect::<Result<Vec<_>, _>>()?;
    let mut by_arch: BTreeMap<String, Vec<&ArchReport>> = BTreeMap::new();
    for report in &inputs {
        for (arch, a) in &report.archs {
            by_arch.entry(arch.clone()).or_default().push(a);
        }
    }
    // Every architecture is merged before anything is written: a conflict leaves `out` as it
    // was. Architecture names were checked when the inputs were read (`sm<digits>`, `cpu`), so
    // `out.join(arch)` stays inside `out`.
    let mut merged = Vec::with_capacity(by_arch.len());
    for (arch, parts) in by_arch {
        let rows = merge_rows(&arch, &parts)?;
        let environment = merge_environment(&parts);
        let complete = parts.iter().all(|p| p.complete);
        merged.push((arch, rows, environment, complete));
    }
    let mut archs = BTreeMap::new();
    for (arch, rows, environment, complete) in merged {
        let dir = out.join(&arch);
        write_outputs(&dir, &arch, environment.clone(), &rows, complete, true)?;
        archs.insert(
            arch.clone(),
            ArchReport {
                arch,
                dir,
                environment,
                complete,
                rows,
            },
        );
    }
    Ok(Report {
        root: out.to_path_buf(),
        archs,
    })
}

fn same_float(a: Option<f64>, b: Option<f64>) -> bool {
    match (a, b) {
        (Some(x), Some(y)) => x == y || (x.is_nan() && y.is_nan()),
        (None, None) => true,
        _ => false,
    }
}

/// The first column in which two rows of one trial disagree about the result.
fn conflicting_field(a: &Row, b: &Row) -> Option<&'static str> {
    let checks: [(&'static str, bool); 10] = [
        ("case_id", a.case_id == b.case_id),
        ("path", a.path == b.path),
        ("status", a.status == b.status),
        ("max_abs", same_float(a.max_abs, b.max_abs)),
        ("mean_abs", same_float(a.mean_abs, b.mean_abs)),
        ("rel_l2", same_float(a.rel_l2, b.rel_l2)),
        ("bound", same_float(a.bound, b.bound)),
        ("first_bad", a.first_bad == b.first_bad),
        ("seed", a.seed == b.seed),
        ("params", a.params == b.params),
    ];
    checks.iter().find(|(_, same)| !same).map(|(name, _)| *name)
}

fn merge_rows(arch: &str, parts: &[&ArchReport]) -> Result<Vec<Row>, ReportError> {
    let mut seen: BTreeMap<&str, (&Row, &Path)> = BTreeMap::new();
    for part in parts {
        for row in &part.rows {
            if let Some((first, first_dir)) = seen.get(row.trial.as_str()) {
                if let Some(field) = conflicting_field(first, row) {
                    return Err(ReportError::Conflict {
                        arch: arch.to_string(),
                        trial: row.trial.clone(),
                        field,
                        first: first_dir.to_path_buf(),
                        second: part.dir.clone(),
                    });
                }
            } else {
                seen.insert(row.trial.as_str(), (row, part.dir.as_path()));
            }
        }
    }
    Ok(seen.into_values().map(|(r, _)| r.clone()).collect())
}

fn push_unique<T: PartialEq>(list: &mut Vec<T>, item: T) {
    if !list.contains(&item) {
        list.push(item);
    }
}

fn merge_environment(parts: &[&ArchReport]) -> Environment {
    let mut env = parts
        .first()
        .map(|p| p.environment.clone())
        .unwrap_or_default();
    if parts.len() < 2 {
        return env;
    }
    let mut shards = Vec::new();
    let mut revisions = Vec::new();
    let mut gpus = Vec::new();
    let mut merged_from = Vec::new();
    for p in parts {
        let e = &p.environment;
        if let Some(s) = &e.shard {
            push_unique(&mut shards, s.clone());
        }
        if let Some(r) = &e.git_revision {
            push_unique(&mut revisions, r.clone());
        }
        if let Some(g) = &e.gpu_name {
            push_unique(&mut gpus, g.clone());
        }
        env.started = min_opt(env.started.take(), e.started.clone());
        env.finished = max_opt(env.finished.take(), e.finished.clone());
        for s in &e.seeds {
            push_unique(&mut env.seeds, *s);
        }
        for n in &e.notes {
            push_unique(&mut env.notes, n.clone());
        }
        for c in &e.compile_checks {
            push_unique(&mut env.compile_checks, c.clone());
        }
        merged_from.push(serde_json::json!({
            "dir": p.dir.display().to_string(),
            "shard": e.shard,
            "hostname": e.hostname,
            "git_revision": e.git_revision,
            "gpu_name": e.gpu_name,
            "complete": p.complete,
            "rows": p.rows.len(),
        }));
    }
    env.seeds.sort_unstable();
    env.shard = (!shards.is_empty()).then(|| shards.join(","));
    if revisions.len() > 1 {
        push_unique(
            &mut env.notes,
            format!(
                "shards ran at different revisions: {}",
                revisions.join(", ")
            ),
        );
    }
    if gpus.len() > 1 {
        push_unique(
            &mut env.notes,
            format!("shards ran on different GPUs: {}", gpus.join(", ")),
        );
    }
    env.extra.insert(
        "merged_from".to_string(),
        serde_json::Value::Array(merged_from),
    );
    env
}

/// RFC 3339 timestamps in one time zone order as strings.
fn min_opt(a: Option<String>, b: Option<String>) -> Option<String> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, y) => x.or(y),
    }
}

fn max_opt(a: Option<String>, b: Option<String>) -> Option<String> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.max(y)),
        (x, y) => x.or(y),
    }
}
