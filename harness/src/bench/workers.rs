//! Timing the workers' paths on a benchmark shape through the worker protocol: each path runs
//! once per shape with `{"timing":{"warmup":W,"reps":R}}` (CUDA events inside the worker, which
//! rotates its own input copies), and becomes a row of the same table as the native paths.

use super::report::{BenchRow, RowStatus};
use super::shapes::Figures;
use crate::runner::{RunError, RunRequest, Runner, Target, Timing};
use crate::worker::WorkerRunner;
use relattn_kernels::gpu::Peaks;
use relattn_matrices::SplitSetting;
use relattn_reference::Problem;
use std::sync::Arc;

/// Rows of every path of every worker on one shape (its own split policy).
pub fn time_workers(
    workers: &[Arc<WorkerRunner>],
    shape: &str,
    seed: u64,
    problem: &Problem,
    timing: Timing,
    peaks: Option<&Peaks>,
) -> Vec<BenchRow> {
    let figures = Figures::of(problem);
    let case_id = format!("bench-{shape}-seed{seed}");
    // One case file for every worker and path, gone when this shape is done.
    let life = crate::runner::CaseLife::default();
    let mut rows = Vec::new();
    for (index, w) in workers.iter().enumerate() {
        for path in &w.hello.paths {
            let target = Target::Worker {
                worker: index,
                name: w.name().to_string(),
                path: path.clone(),
                label: w.spec.label.clone(),
            };
            let label = target.label();
            let trial = format!("bench::{shape}::{label}");
            let req = RunRequest {
                trial: &trial,
                case_id: &case_id,
                problem,
                case_file: None,
                case_life: Some(&life),
                target: &target,
                split: SplitSetting::Policy,
                timing: Some(timing),
            };
            let row = match w.run(0, &req) {
                Err(RunError::Unsupported(why)) => {
                    BenchRow::not_timed(shape, &label, RowStatus::Unsupported, why, figures)
                }
                Err(e) => {
                    BenchRow::not_timed(shape, &label, RowStatus::Error, e.message(), figures)
                }
                Ok(run) => match relattn_kernels::gpu::Timing::of(&run.ms_all) {
                    None => BenchRow::not_timed(
                        shape,
                        &label,
                        RowStatus::Error,
                        "the worker answered no times for a timed run",
                        figures,
                    ),
                    Some(t) => {
                        let mut row = BenchRow::timed(shape, &label, figures, t, peaks);
                        row.num_splits = Some(run.num_splits);
                        let bad = run.non_finite_real(problem);
                        row.kernels = run.kernels;
                        if bad > 0 || !run.padding_intact {
                            row.status = RowStatus::Error;
                            row.message = format!(
                                "{bad} real output elements not finite{}",
                                if run.padding_intact {
                                    ""
                                } else {
                                    "; padding rows written"
                                }
                            );
                        }
                        row
                    }
                },
            };
            rows.push(row);
        }
    }
    rows
}
