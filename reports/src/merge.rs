//! Merging shard reports into one.

use crate::env::Environment;
use crate::error::ReportError;
use crate::load::{load, ArchReport, Report};
use crate::row::Row;
use crate::writer::write_outputs;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::hash::Hash;
use std::path::{Path, PathBuf};

/// Merges the reports in `dirs` into `out`: architecture directories of the same name are merged,
/// rows deduplicated by trial name. A trial present twice must have the same result (everything
/// but the timing columns `ms`, `wall_ms`, `tflops`, `gbps` and the free-text `message`); otherwise it is a
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
        let mut environment = merge_environment(&parts);
        let gap = shard_gap(&parts);
        if let Some(gap) = &gap {
            push_unique(&mut environment.notes, gap.clone());
            environment
                .extra
                .insert("shard_gap".to_string(), serde_json::json!(gap));
        }
        let complete = gap.is_none() && parts.iter().all(|p| p.complete);
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

/// The parameters of two rows agree, an empty value counting as none: results.csv holds both as
/// an empty cell, so a shard read from its CSV cannot tell them apart.
fn same_params(a: &Row, b: &Row) -> bool {
    // Both maps iterate in key order, so the given entries compare pairwise.
    fn given(r: &Row) -> impl Iterator<Item = (&String, &String)> {
        r.params.iter().filter(|(_, v)| !v.is_empty())
    }
    given(a).eq(given(b))
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
        ("params", same_params(a, b)),
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
                        // Named in a message printed to a terminal.
                        trial: crate::text::visible(&row.trial).into_owned(),
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

/// Parses one `K/N` shard entry.
fn parse_shard(s: &str) -> Option<(u64, u64)> {
    let (k, n) = s.trim().split_once('/')?;
    let (k, n) = (k.trim().parse::<u64>().ok()?, n.trim().parse::<u64>().ok()?);
    (n >= 1 && (1..=n).contains(&k)).then_some((k, n))
}

/// Whether the inputs cover their whole shard set: None when they do (or no input is a shard,
/// each being a whole run), else a sentence saying what is missing. An input without a shard
/// among shards, a shard entry that does not read as `K/N`, or shards of different counts N
/// cannot be shown to cover anything, and say so.
pub(crate) fn shard_gap(parts: &[&ArchReport]) -> Option<String> {
    let mut entries = Vec::new();
    let mut whole_runs = 0;
    for p in parts {
        match &p.environment.shard {
            None => whole_runs += 1,
            Some(list) => entries.extend(list.split(',').map(|e| e.trim().to_string())),
        }
    }
    if entries.is_empty() {
        return None;
    }
    let parsed: Vec<Option<(u64, u64)>> = entries.iter().map(|e| parse_shard(e)).collect();
    if let Some(i) = parsed.iter().position(Option::is_none) {
        return Some(format!(
            "shard coverage unknown: shard entry {:?} does not read as K/N",
            entries[i]
        ));
    }
    let parsed: Vec<(u64, u64)> = parsed.into_iter().flatten().collect();
    let mut counts: Vec<u64> = parsed.iter().map(|(_, n)| *n).collect();
    counts.sort_unstable();
    counts.dedup();
    if counts.len() > 1 {
        let list: Vec<String> = counts.iter().map(u64::to_string).collect();
        return Some(format!(
            "shard coverage unknown: shards of different counts ({}) merged",
            list.join(", ")
        ));
    }
    if whole_runs > 0 {
        return Some(format!(
            "shard coverage unknown: {whole_runs} input(s) without a shard merged with shards"
        ));
    }
    let n = counts[0];
    let present: BTreeSet<u64> = parsed.iter().map(|(k, _)| *k).collect();
    let missing = n - present.len() as u64;
    if missing == 0 {
        return None;
    }
    // The missing shards as ranges between the present ones, never one by one: N comes from
    // the inputs and may be a billion.
    const LISTED: usize = 20;
    let mut ranges = Vec::new();
    let mut next = 1;
    for &k in present.iter().chain(std::iter::once(&(n + 1))) {
        if k > next {
            ranges.push((next, k - 1));
        }
        next = k + 1;
        if ranges.len() > LISTED {
            break;
        }
    }
    let mut list = ranges
        .iter()
        .take(LISTED)
        .map(|&(a, b)| match a == b {
            true => format!("{a}/{n}"),
            false => format!("{a}/{n} to {b}/{n}"),
        })
        .collect::<Vec<_>>()
        .join(", ");
    if ranges.len() > LISTED {
        list.push_str(", and more");
    }
    Some(format!(
        "{missing} of {n} shards missing ({list}): the merged report does not cover the shard set"
    ))
}

/// `items` without repeats, in first-seen order; hashed, so that merging inputs with long
/// lists (of notes, seeds, compile checks) stays linear.
fn unique_in_order<T: Eq + Hash + Clone>(items: impl IntoIterator<Item = T>) -> Vec<T> {
    let mut seen = HashSet::new();
    items
        .into_iter()
        .filter(|x| seen.insert(x.clone()))
        .collect()
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
    // One shard's time split is not the merged run's.
    env.extra.remove("phases");
    let mut shards = Vec::new();
    let mut revisions = Vec::new();
    let mut gpus = Vec::new();
    let mut merged_from = Vec::new();
    let (mut seeds, mut notes, mut checks) = (Vec::new(), Vec::new(), Vec::new());
    for p in parts {
        let e = &p.environment;
        shards.extend(e.shard.clone());
        revisions.extend(
            e.relattn_revision
                .as_ref()
                .or(e.git_revision.as_ref())
                .cloned(),
        );
        gpus.extend(e.gpu_name.clone());
        env.started = min_opt(env.started.take(), e.started.clone());
        env.finished = max_opt(env.finished.take(), e.finished.clone());
        seeds.extend_from_slice(&e.seeds);
        notes.extend(e.notes.iter().cloned());
        checks.extend(e.compile_checks.iter().cloned());
        merged_from.push(serde_json::json!({
            "dir": p.dir.display().to_string(),
            "shard": e.shard,
            "hostname": e.hostname,
            "git_revision": e.git_revision,
            "relattn_revision": e.relattn_revision,
            "gpu_name": e.gpu_name,
            "complete": p.complete,
            "rows": p.rows.len(),
        }));
    }
    seeds.sort_unstable();
    seeds.dedup();
    env.seeds = seeds;
    env.notes = unique_in_order(notes);
    env.compile_checks = unique_in_order(checks);
    let (shards, revisions, gpus) = (
        unique_in_order(shards),
        unique_in_order(revisions),
        unique_in_order(gpus),
    );
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
