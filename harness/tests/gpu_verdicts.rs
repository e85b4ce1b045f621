//! How a GPU trial's run becomes a report row, with a stand-in for the GPU that returns the f64
//! reference as its output: such a run passes, unless the decode kernel left merge counters set
//! (the next launch on the same workspace would merge too early or never) or wrote padding rows.

use ndarray::Array3;
use relattn_harness::execute::{run_trial, CaseStore, Runners};
use relattn_harness::plan::{Trial, TrialKind};
use relattn_harness::runner::{RunError, RunOutput, RunRequest, Runner, Target};
use relattn_kernels::routing::PathId;
use relattn_matrices::{load_tier, SplitSetting};
use relattn_reference::{fast, Problem};
use relattn_reports::{Row, Status};
use std::sync::Arc;

/// Returns the reference output of each problem (padding rows 0), as the run says.
struct Exact {
    counters_left: usize,
    padding_intact: bool,
}

impl Runner for Exact {
    fn run(&self, _slot: usize, req: &RunRequest<'_>) -> Result<RunOutput, RunError> {
        let problem: &Problem = req.problem;
        let reference = fast::attention(problem);
        let (rows, h, d) = reference.out.dim();
        let mut out = Array3::<f32>::zeros((rows.max(problem.real_rows()), h, d));
        for ((t, hh, c), x) in reference.out.indexed_iter() {
            out[[reference.row(t), hh, c]] = *x as f32;
        }
        Ok(RunOutput {
            out,
            padding_intact: self.padding_intact,
            counters_left: self.counters_left,
            ms: Some(1.0),
            ms_all: Vec::new(),
            num_splits: 1,
            kernels: Vec::new(),
        })
    }
}

fn decode_trial() -> Trial {
    let cases = load_tier("smoke").unwrap().expand().unwrap().cases;
    let case = cases
        .into_iter()
        .find(|c| c.sample_rows.is_none() && c.mix == "decode")
        .expect("the smoke tier has a decode case checked on every row");
    Trial {
        name: "gpu::stand_in".into(),
        kind: TrialKind::Gpu {
            case: Arc::new(case),
            target: Target::Native {
                path: PathId::Fallback,
                bounds_check: false,
            },
            split: SplitSetting::Policy,
        },
        ignore: None,
    }
}

fn row_of(exec: Exact) -> Row {
    let trial = decode_trial();
    let store = CaseStore::for_trials(std::slice::from_ref(&trial));
    run_trial(&trial, &store, &Runners::native(Some((&exec, 0))), "smoke")
}

#[test]
fn an_exact_run_with_its_counters_reset_passes() {
    let row = row_of(Exact {
        counters_left: 0,
        padding_intact: true,
    });
    assert_eq!(row.status, Status::Pass, "{}", row.message);
    // The f64 reference rounded to f32.
    assert!(row.max_abs.is_some_and(|e| e < 1e-6), "{:?}", row.max_abs);
    // `ms` is the run's own time; `wall_ms` the whole trial's, generation included.
    assert_eq!(row.ms, Some(1.0));
    assert!(row.wall_ms.is_some_and(|w| w > 0.0), "{:?}", row.wall_ms);
}

#[test]
fn decode_counters_left_set_fail_the_trial_and_say_so() {
    let row = row_of(Exact {
        counters_left: 3,
        padding_intact: true,
    });
    assert_eq!(row.status, Status::Fail);
    assert!(
        row.message
            .starts_with("3 decode counters left non-zero after the launch; reproduce: relattn run --matrix smoke --case "),
        "{}",
        row.message
    );
    // Both reasons when the padding was written too.
    let row = row_of(Exact {
        counters_left: 1,
        padding_intact: false,
    });
    assert_eq!(row.status, Status::Fail);
    assert!(
        row.message.contains("padding rows were modified")
            && row.message.contains("1 decode counters left non-zero"),
        "{}",
        row.message
    );
}
