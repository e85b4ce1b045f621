//! The list of trials a run (or `cargo test`) has: routing rows, reference self-checks and GPU
//! trials, each with a stable hierarchical name and, when this machine cannot run it, the reason
//! it is ignored, decided when the list is built.

use crate::gpu_status::GpuStatus;
use crate::runner::Target;
use crate::selfcheck::Check;
use crate::worker::protocol::Hello;
use relattn_matrices::{Case, SplitSetting};
use relattn_routing::{table, ArchRow, Capability, PathId};
use std::str::FromStr;
use std::sync::Arc;

/// Largest case (reference FLOP) the naive oracle self-checks run on.
pub const SELFCHECK_MAX_FLOPS: f64 = 1.0e9;

/// Which GPU paths a run covers (`--paths`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathSelection {
    /// Only the device's production path.
    Routed,
    /// Every path this project has native kernels for (they run on any SM80+ GPU).
    All,
    List(Vec<PathId>),
}

impl FromStr for PathSelection {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "routed" => Ok(PathSelection::Routed),
            "all" => Ok(PathSelection::All),
            "none" => Ok(PathSelection::List(Vec::new())),
            list => list
                .split(',')
                .map(|p| p.trim().parse::<PathId>().map_err(|e| e.to_string()))
                .collect::<Result<Vec<_>, _>>()
                .map(PathSelection::List),
        }
    }
}

impl PathSelection {
    fn includes(&self, path: PathId, routed: Option<PathId>) -> bool {
        match self {
            PathSelection::All => true,
            PathSelection::Routed => routed.is_none_or(|r| r == path),
            PathSelection::List(v) => v.contains(&path),
        }
    }
}

pub use crate::runner::BoundsCheck;

#[derive(Debug, Clone)]
pub enum TrialKind {
    /// Invariants of one routing-table row over a grid of shapes.
    Routing(ArchRow),
    /// Capabilities outside the table are rejected.
    RoutingUnknown,
    /// One reference self-check of one case.
    Reference { case: Arc<Case>, check: Check },
    /// One implementation (a native GPU path or a worker's path) on one case.
    Gpu {
        case: Arc<Case>,
        target: Target,
        split: SplitSetting,
    },
    /// A file of a case folder that is not a valid case (`run --cases --keep-going`): always
    /// ignored, with the reason.
    BadFile,
}

#[derive(Debug, Clone)]
pub struct Trial {
    pub name: String,
    pub kind: TrialKind,
    /// Why this machine cannot run it (listed as ignored / reported as skip).
    pub ignore: Option<String>,
}

impl Trial {
    pub fn case(&self) -> Option<&Arc<Case>> {
        match &self.kind {
            TrialKind::Reference { case, .. } | TrialKind::Gpu { case, .. } => Some(case),
            _ => None,
        }
    }

    /// The worker (its index in the session) that runs this trial, for a worker trial.
    pub fn worker_index(&self) -> Option<usize> {
        match &self.kind {
            TrialKind::Gpu {
                target: Target::Worker { worker, .. },
                ..
            } => Some(*worker),
            _ => None,
        }
    }

    /// The `path` column of the report.
    pub fn path(&self) -> String {
        match &self.kind {
            TrialKind::Routing(_) | TrialKind::RoutingUnknown => "routing".into(),
            TrialKind::Reference { .. } => "reference".into(),
            TrialKind::Gpu { target, .. } => target.label(),
            TrialKind::BadFile => "case_file".into(),
        }
    }
}

/// Routing trials: one per table row, plus unknown capabilities.
pub fn routing_trials() -> Vec<Trial> {
    let mut out: Vec<Trial> = table()
        .iter()
        .map(|row| Trial {
            name: format!("routing::{}", row.cc.sm_name()),
            kind: TrialKind::Routing(*row),
            ignore: None,
        })
        .collect();
    out.push(Trial {
        name: "routing::unknown".into(),
        kind: TrialKind::RoutingUnknown,
        ignore: None,
    });
    out
}

/// Reference self-check trials of a tier's cases (the naive oracle is too slow for big ones).
pub fn reference_trials(cases: &[Arc<Case>]) -> Vec<Trial> {
    let mut out = Vec::new();
    for case in cases {
        for check in Check::ALL {
            let ignore = if case.sample_rows.is_some() {
                Some("sampled-row case: too large for the naive oracle".to_string())
            } else if case.flops() > SELFCHECK_MAX_FLOPS {
                Some(format!(
                    "{:.1} GFLOP: too large for the naive oracle (limit {:.1})",
                    case.flops() / 1e9,
                    SELFCHECK_MAX_FLOPS / 1e9
                ))
            } else {
                None
            };
            out.push(Trial {
                name: format!("reference::{check}::{}::{}", case.name, case.id),
                kind: TrialKind::Reference {
                    case: case.clone(),
                    check,
                },
                ignore,
            });
        }
    }
    out
}

/// GPU trials of an expansion: every (case, path, split) the selection covers, runnable or not.
pub fn gpu_trials(
    cases: &[Arc<Case>],
    status: &GpuStatus,
    paths: &PathSelection,
    bounds: BoundsCheck,
) -> Vec<Trial> {
    let routed = match status {
        GpuStatus::Ready { routed, .. } => Some(*routed),
        _ => None,
    };
    let unusable = status.unusable_reason();
    let mut out = Vec::new();
    for case in cases {
        for plan in case.trials() {
            let path = plan.path;
            if !paths.includes(path, routed) {
                continue;
            }
            for &variant in bounds.variants() {
                let name = if variant.bounds_check {
                    plan.name.replacen("gpu::", "gpu_checked::", 1)
                } else {
                    plan.name.clone()
                };
                let ignore = plan.skip.clone().or_else(|| unusable.clone());
                out.push(Trial {
                    name,
                    kind: TrialKind::Gpu {
                        case: case.clone(),
                        target: Target::Native { path, variant },
                        split: plan.split,
                    },
                    ignore,
                });
            }
        }
    }
    out
}

/// Trials of the workers' paths: one per (case, worker path) with the implementation's own
/// split policy, plus one per forced split setting of the case on the worker's `split_paths`.
/// Named `impl::<worker>::<path>::<case name>::<split>::<id>`. Exclusion rules do not apply:
/// a worker says itself what it cannot take (`unsupported`, a skip with its reason).
pub fn worker_trials(cases: &[Arc<Case>], workers: &[(usize, &Hello, &str)]) -> Vec<Trial> {
    let mut out = Vec::new();
    for case in cases {
        for &(index, hello, label) in workers {
            for path in &hello.paths {
                let splits: Vec<SplitSetting> = if hello.split_paths.contains(path) {
                    case.splits
                        .iter()
                        .copied()
                        .filter(|s| *s != SplitSetting::Policy)
                        .collect()
                } else {
                    vec![SplitSetting::Policy]
                };
                for split in splits {
                    out.push(Trial {
                        name: format!(
                            "impl::{}::{path}::{}::{split}::{}",
                            hello.name, case.name, case.id
                        ),
                        kind: TrialKind::Gpu {
                            case: case.clone(),
                            target: Target::Worker {
                                worker: index,
                                name: hello.name.clone(),
                                path: path.clone(),
                                label: label.to_string(),
                            },
                            split,
                        },
                        // A worker that cannot run here skips without a case file.
                        ignore: hello.unavailable.clone(),
                    });
                }
            }
        }
    }
    out
}

/// The skipped trials of a case folder's invalid files, one each, with the reason.
pub fn bad_file_trials(bad: &[relattn_matrices::BadFile]) -> Vec<Trial> {
    bad.iter()
        .map(|b| Trial {
            name: b.trial_name(),
            kind: TrialKind::BadFile,
            ignore: Some(format!(
                "not a valid case file: {}: {}",
                b.relative, b.reason
            )),
        })
        .collect()
}

/// How many trials `worker_trials` would make, counted without making them (saturating).
pub fn worker_trial_count(cases: &[Arc<Case>], workers: &[(usize, &Hello, &str)]) -> u64 {
    let mut total = 0u64;
    for case in cases {
        let forced = case
            .splits
            .iter()
            .filter(|s| **s != SplitSetting::Policy)
            .count() as u64;
        for (_, hello, _) in workers {
            let split = hello
                .paths
                .iter()
                .filter(|p| hello.split_paths.contains(p))
                .count() as u64;
            let policy = hello.paths.len() as u64 - split;
            total = total
                .saturating_add(policy)
                .saturating_add(split.saturating_mul(forced));
        }
    }
    total
}

/// Refuse a run whose trial list, workers' trials included, is longer than the matrices' own
/// limit (`relattn_matrices::MAX_TRIALS`): every trial costs memory and report rows before it runs.
pub fn check_trial_count(planned: u64, of_workers: u64) -> Result<(), String> {
    let limit = relattn_matrices::MAX_TRIALS;
    let total = planned.saturating_add(of_workers);
    if total <= limit {
        return Ok(());
    }
    Err(format!(
        "this run would have {total} trials ({of_workers} of them on workers), over the limit of {limit}: \
         select fewer cases (--case, --shard or a smaller matrix), fewer workers, or workers with fewer paths"
    ))
}

/// Every shape the routing checks cover: 2,160 of them (batch x query length x head pair x KV
/// length x layer kind x page size), the same for the model's own rows and for `route --check`.
pub fn routing_shapes() -> Vec<relattn_routing::Shape> {
    let mut out = Vec::with_capacity(2160);
    let heads = [(64, 8), (32, 4), (16, 2), (8, 1), (64, 16), (8, 2)];
    for batch in [1usize, 8, 32] {
        for max_query_len in [1usize, 9, 128, 2048] {
            for &(num_heads, num_kv_heads) in &heads {
                for max_kv_len in [512usize, 8192, 65536, 131072, 1_048_576] {
                    for (is_local, window_left) in [(false, -1i64), (true, 511)] {
                        for page_size in [16usize, 64, 128] {
                            out.push(relattn_routing::Shape {
                                batch,
                                max_query_len,
                                num_heads,
                                num_kv_heads,
                                max_kv_len,
                                page_size,
                                window_left,
                                is_local,
                            });
                        }
                    }
                }
            }
        }
    }
    out
}

/// Check one routing row against the policies over a grid of shapes.
pub fn check_routing_row(row: &ArchRow) -> Result<usize, String> {
    use relattn_routing::{decide, Outcome};
    let mut checked = 0;
    for shape in routing_shapes() {
        let (is_local, max_query_len) = (shape.is_local, shape.max_query_len);
        let d = decide(row.cc, &shape);
        checked += 1;
        let ctx = || format!("SM {} {shape:?}: {d:?}", row.cc);
        match row.outcome {
            Outcome::Reject(_) => {
                if !d.rejected || d.path.is_some() || d.num_splits.is_some() {
                    return Err(format!("rejected row routed: {}", ctx()));
                }
            }
            Outcome::Route(path) => {
                let splits = d.num_splits.unwrap_or(0);
                if d.rejected || d.path != Some(path) || splits < 1 {
                    return Err(format!("wrong route: {}", ctx()));
                }
                if !row.paged_kv_forward {
                    return Err(format!("route without a paged forward: {}", ctx()));
                }
                if (!row.split_kv || is_local) && splits != 1 {
                    return Err(format!("num_splits > 1 without split-KV: {}", ctx()));
                }
                if d.split_kv_decode && !row.split_kv_decode {
                    return Err(format!("split-KV decode on a row without it: {}", ctx()));
                }
            }
        }
        if d.max_seqlen_q_bucket < max_query_len || !d.max_seqlen_q_bucket.is_power_of_two() {
            return Err(format!("bad bucket: {}", ctx()));
        }
    }
    Ok(checked)
}

/// Capabilities outside the table are all rejected with "no route for SM x.y".
pub fn check_unknown_capabilities() -> Result<usize, String> {
    use relattn_routing::{lookup, route};
    let mut checked = 0;
    for major in 0..=15 {
        for minor in 0..=9 {
            let cc = Capability::new(major, minor);
            if lookup(cc).is_some() {
                continue;
            }
            checked += 1;
            match route(cc) {
                Ok(p) => return Err(format!("SM {cc} is not in the table but routes to {p}")),
                Err(r) if !r.reason.contains(&format!("no route for SM {cc}")) => {
                    return Err(format!(
                        "SM {cc} rejected with an unclear reason: {}",
                        r.reason
                    ))
                }
                Err(_) => {}
            }
        }
    }
    Ok(checked)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello(paths: usize, split_paths: usize) -> Hello {
        let paths: Vec<String> = (0..paths).map(|i| format!("p{i}")).collect();
        Hello {
            ok: true,
            protocol: 1,
            name: "w".into(),
            version: "1".into(),
            device: None,
            capability: None,
            split_paths: paths[..split_paths].to_vec(),
            unavailable: None,
            maps_case_files: false,
            stderr_marks: false,
            paths,
        }
    }

    #[test]
    fn worker_trials_are_counted_before_they_are_made() {
        let cases: Vec<Arc<Case>> = relattn_matrices::load_tier("ci")
            .unwrap()
            .expand()
            .unwrap()
            .cases
            .into_iter()
            .take(40)
            .map(Arc::new)
            .collect();
        let (a, b) = (hello(3, 1), hello(2, 0));
        let workers = [(0, &a, "--impl a"), (1, &b, "--impl b")];
        let made = worker_trials(&cases, &workers).len() as u64;
        assert!(made > 5 * 40, "some cases have forced splits: {made}");
        assert_eq!(worker_trial_count(&cases, &workers), made);
    }

    #[test]
    fn the_trial_limit_counts_worker_trials() {
        let limit = relattn_matrices::MAX_TRIALS;
        assert!(check_trial_count(limit - 10, 10).is_ok());
        let e = check_trial_count(37, limit).unwrap_err();
        assert!(
            e.contains(
                "would have 1000037 trials (1000000 of them on workers), over the limit of 1000000"
            ) && e.contains("select fewer cases"),
            "{e}"
        );
        assert!(check_trial_count(u64::MAX, u64::MAX).is_err());
    }
}
