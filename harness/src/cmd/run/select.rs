//! Which trials a run runs: `--filter` and `-k` (one filter), and `--rerun-failed`.

use super::Args;
use crate::exit;
use crate::filter::Filter;
use relattn_reports::Status;
use std::collections::BTreeSet;
use std::path::Path;

/// `--filter` and `-k` as one filter (both must hold), or none.
pub(super) fn selection_filter(args: &Args) -> anyhow::Result<Option<Filter>> {
    let filter = args
        .filter
        .as_deref()
        .map(Filter::parse)
        .transpose()
        .map_err(exit::usage)?;
    let name = args.name.as_deref().map(Filter::name_contains);
    Ok(match (filter, name) {
        (Some(f), Some(n)) => Some(f.and(n)),
        (f, n) => f.or(n),
    })
}

/// The failed and errored trials of the report at `dir`, and the matrix it ran (an empty set
/// when it has none: there is nothing to run again, which is no error).
pub(super) fn failed_trials(dir: &Path) -> anyhow::Result<(Option<String>, BTreeSet<String>)> {
    let report = relattn_reports::load(dir)
        .map_err(|e| exit::usage(format!("--rerun-failed {}: {e}", dir.display())))?;
    let mut names = BTreeSet::new();
    let mut matrix = None;
    for arch in report.archs.values() {
        matrix = matrix.or_else(|| arch.environment.matrix.clone());
        names.extend(
            arch.rows
                .iter()
                .filter(|r| matches!(r.status, Status::Fail | Status::Error))
                .map(|r| r.trial.clone()),
        );
    }
    if names.is_empty() {
        eprintln!(
            "relattn run: --rerun-failed {}: the report has no failed or errored trial: nothing \
             to run again",
            dir.display()
        );
        return Ok((matrix, names));
    }
    eprintln!(
        "relattn run: running the {} failed and errored trial(s) of {} again",
        names.len(),
        dir.display()
    );
    Ok((matrix, names))
}
