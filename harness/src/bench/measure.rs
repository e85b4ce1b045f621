//! Timing the paths on one shape: upload a few copies of the inputs, then for each path warm up
//! and time launches with CUDA events (`run_path`: the events bracket the path's launches only,
//! prologue and combine included; poisoning `out` before and reading it back after stay outside),
//! rotating through the copies so the L2 cache never holds the inputs a launch starts on.

use super::report::{BenchRow, RowStatus};
use super::shapes::Figures;
use relattn_kernels::gpu::{
    plan_launches, run_path, Geometry, Gpu, GpuError, Loaded, Peaks, SplitSetting, Timing,
};
use relattn_reference::Problem;
use relattn_routing::PathId;
use std::time::{Duration, Instant};

/// Copies of the inputs rotate until together they exceed this many times the L2 size.
pub const L2_MULTIPLE: usize = 4;
/// Fewest copies: even a set far larger than the L2 ends a launch with its last-read lines
/// cached, and the next launch on the same addresses could start on them.
pub const MIN_SETS: usize = 2;
pub const MAX_SETS: usize = 4;

/// Device bytes of one uploaded copy of a problem's inputs (q, the cache, rel_logits).
pub fn set_bytes(g: &Geometry) -> usize {
    let rows = g.total_rows * g.num_heads;
    (rows * g.head_dim + g.kv_elems + rows * g.rel_extent) * g.dtype.size_bytes()
}

/// How many copies to rotate: enough to exceed `L2_MULTIPLE` x L2 together, between `MIN_SETS`
/// and `MAX_SETS`, and no more than fit in half the free memory (at least one).
pub fn input_sets(set_bytes: usize, l2_bytes: usize, free_bytes: usize) -> usize {
    let set = set_bytes.max(1);
    let want = (L2_MULTIPLE * l2_bytes)
        .div_ceil(set)
        .clamp(MIN_SETS, MAX_SETS);
    want.min(free_bytes / 2 / set).max(1)
}

/// How the timed launches run.
#[derive(Debug, Clone, Copy)]
pub struct TimingOptions {
    pub warmup: usize,
    pub reps: usize,
    /// Copies of the inputs to rotate (None: `input_sets`).
    pub sets: Option<usize>,
    /// Wall time one (shape, path) may take: after the first launch, fewer launches are timed
    /// (warm-ups dropped first, at least one timed) when all would not fit, and the row says so.
    pub row_budget: Option<Duration>,
    /// No path starts after this instant (its row says why).
    pub deadline: Option<Instant>,
}

/// Launches after the first (a warm-up) that fit a row budget, as (warm-ups, timed): all of them
/// when they fit, else the remaining warm-ups are dropped and as many timed as fit (at least 1).
pub fn launches_within(
    warmup: usize,
    reps: usize,
    first: Duration,
    budget: Option<Duration>,
) -> (usize, usize) {
    let rest = (warmup.saturating_sub(1), reps.max(1));
    let Some(budget) = budget else { return rest };
    let per = first.as_secs_f64().max(1e-9);
    let fit = ((budget.as_secs_f64() - per) / per).floor().max(0.0) as usize;
    if rest.0 + rest.1 <= fit {
        rest
    } else {
        (0, fit.clamp(1, rest.1))
    }
}

/// Rows of one shape, and whether CUDA is still usable in this process.
pub struct ShapeResult {
    pub rows: Vec<BenchRow>,
    /// Set after a kernel trap or fault: the driver refuses every later call of the process.
    pub fatal: Option<String>,
}

/// Time every path of `paths` on `problem`.
pub fn bench_shape(
    gpu: &Gpu,
    loaded: &Loaded,
    shape: &str,
    problem: &Problem,
    paths: &[PathId],
    opts: TimingOptions,
    peaks: Option<&Peaks>,
) -> ShapeResult {
    let figures = Figures::of(problem);
    let geometry = Geometry::of(problem);
    let mut rows = Vec::new();
    let mut runnable = Vec::new();
    // Decided from the launch plan before anything is uploaded.
    for &path in paths {
        match plan_launches(path, &geometry, SplitSetting::Policy) {
            Ok(_) => runnable.push(path),
            Err(GpuError::Unsupported { reason, .. }) => rows.push(BenchRow::not_timed(
                shape,
                path.as_str(),
                RowStatus::Unsupported,
                reason,
                figures,
            )),
            Err(e) => rows.push(BenchRow::not_timed(
                shape,
                path.as_str(),
                RowStatus::Error,
                e.to_string(),
                figures,
            )),
        }
    }
    let mut result = ShapeResult { rows, fatal: None };
    if runnable.is_empty() {
        return result;
    }
    let sets = match opts.sets {
        Some(n) => n.max(1),
        None => {
            let l2 = peaks.map_or(60 << 20, |p| p.l2_bytes);
            let free = gpu.memory().map_or(0, |(free, _)| free);
            input_sets(set_bytes(&geometry), l2, free)
        }
    };
    let mut uploaded = Vec::with_capacity(sets);
    for _ in 0..sets {
        match gpu.upload(problem) {
            Ok(dp) => uploaded.push(dp),
            Err(e) => {
                let message = format!("uploading the inputs: {e}");
                for &path in &runnable {
                    result.rows.push(BenchRow::not_timed(
                        shape,
                        path.as_str(),
                        RowStatus::Error,
                        message.clone(),
                        figures,
                    ));
                }
                return result;
            }
        }
    }
    for &path in &runnable {
        let late = opts.deadline.is_some_and(|d| Instant::now() >= d);
        if late {
            result.rows.push(BenchRow::not_timed(
                shape,
                path.as_str(),
                RowStatus::Skipped,
                "the --budget-s time was spent",
                figures,
            ));
            continue;
        }
        if let Some(why) = &result.fatal {
            result.rows.push(BenchRow::not_timed(
                shape,
                path.as_str(),
                RowStatus::Error,
                format!("not run: {why}"),
                figures,
            ));
            continue;
        }
        let row = match time_path(gpu, loaded, &uploaded, path, opts) {
            Ok(t) => {
                let mut row = BenchRow::timed(shape, path.as_str(), figures, t.timing, peaks);
                row.num_splits = Some(t.num_splits);
                row.kernels = t.kernels;
                row.input_sets = uploaded.len();
                if let Some(why) = t.invalid {
                    row.status = RowStatus::Error;
                    row.message = why;
                } else if let Some(note) = t.note {
                    row.message = note;
                }
                row
            }
            Err(e) => {
                if matches!(e, GpuError::Trap { .. } | GpuError::ContextLost { .. }) {
                    result.fatal = Some(e.to_string());
                }
                BenchRow::not_timed(
                    shape,
                    path.as_str(),
                    RowStatus::Error,
                    e.to_string(),
                    figures,
                )
            }
        };
        result.rows.push(row);
    }
    result
}

struct PathTiming {
    timing: Timing,
    num_splits: usize,
    kernels: Vec<String>,
    /// Why the outputs cannot be trusted, if they cannot.
    invalid: Option<String>,
    /// Fewer launches than asked for were timed (row budget).
    note: Option<String>,
}

fn time_path(
    gpu: &Gpu,
    loaded: &Loaded,
    sets: &[relattn_kernels::gpu::DeviceProblem],
    path: PathId,
    opts: TimingOptions,
) -> Result<PathTiming, GpuError> {
    let mut samples = Vec::new();
    let mut last = None;
    let mut invalid = None;
    // The first launch is a warm-up when any is asked for; its wall time sizes the rest.
    let (mut warmup, mut reps) = (opts.warmup, opts.reps.max(1));
    let mut note = None;
    let mut i = 0;
    while i < warmup + reps {
        let started = Instant::now();
        let run = run_path(
            gpu,
            loaded,
            &sets[i % sets.len()],
            path,
            SplitSetting::Policy,
        )?;
        if i == 0 && warmup > 0 {
            let (w, r) = launches_within(warmup, reps, started.elapsed(), opts.row_budget);
            if r < reps {
                note = Some(format!(
                    "{r} of {reps} launches timed after 1 warm-up: one launch takes {:.1} s of wall time (--row-budget-s)",
                    started.elapsed().as_secs_f64()
                ));
            }
            (warmup, reps) = (1 + w, r);
        }
        if invalid.is_none() && (run.unwritten > 0 || !run.padding_intact || run.counters_left > 0)
        {
            invalid = Some(format!(
                "launch {i} left {} output elements unwritten (first at t:h:c {:?}), padding {}, {} decode counters non-zero",
                run.unwritten,
                run.first_unwritten,
                if run.padding_intact { "intact" } else { "written" },
                run.counters_left
            ));
        }
        if i >= warmup {
            samples.push(run.ms as f64);
        }
        last = Some(run);
        i += 1;
    }
    let last = last.ok_or_else(|| GpuError::NoDriver("no launch ran".into()))?;
    if invalid.is_none() {
        // Rows past the real ones are padding (NaN sentinels by design): count real rows only.
        let real = sets[0].geometry().real_rows * last.out.shape()[1] * last.out.shape()[2];
        let bad = last
            .out
            .iter()
            .take(real)
            .filter(|x| !x.is_finite())
            .count();
        if bad > 0 {
            invalid = Some(format!("{bad} non-finite output elements"));
        }
    }
    let timing = Timing::of(&samples).ok_or_else(|| GpuError::NoDriver("no sample".into()))?;
    Ok(PathTiming {
        timing,
        num_splits: last.num_splits,
        kernels: last.kernels,
        invalid,
        note,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_sets_exceed_the_l2_several_times_within_memory() {
        let mib = 1usize << 20;
        // 10 MiB sets, 60 MiB L2: 24 wanted, capped at 4.
        assert_eq!(input_sets(10 * mib, 60 * mib, 100_000 * mib), MAX_SETS);
        // 100 MiB sets: 240 / 100 -> 3.
        assert_eq!(input_sets(100 * mib, 60 * mib, 100_000 * mib), 3);
        // Sets far larger than the L2 still rotate two copies.
        assert_eq!(input_sets(1024 * mib, 60 * mib, 100_000 * mib), MIN_SETS);
        // Memory for one copy only.
        assert_eq!(input_sets(1024 * mib, 60 * mib, 3000 * mib), 1);
        assert_eq!(input_sets(1024 * mib, 60 * mib, 0), 1);
    }

    #[test]
    fn a_row_budget_drops_warm_ups_first_then_timed_launches() {
        let s = Duration::from_secs;
        // No budget, or one that fits: 3 warm-ups (1 done) and 20 timed.
        assert_eq!(launches_within(3, 20, s(1), None), (2, 20));
        assert_eq!(launches_within(3, 20, s(1), Some(s(23))), (2, 20));
        // 22 s: 21 more launches fit, not 22: warm-ups go, 20 timed.
        assert_eq!(launches_within(3, 20, s(1), Some(s(22))), (0, 20));
        // 10 s: 9 more fit.
        assert_eq!(launches_within(3, 20, s(1), Some(s(10))), (0, 9));
        // The first launch alone is over budget: still one timed.
        assert_eq!(launches_within(3, 20, s(30), Some(s(10))), (0, 1));
    }
}
