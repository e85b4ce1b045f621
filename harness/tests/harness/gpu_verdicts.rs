//! How a GPU trial's run becomes a report row, with a stand-in for the GPU that returns the f64
//! reference as its output: such a run passes, unless the decode kernel left merge counters set
//! (the next launch on the same workspace would merge too early or never) or wrote padding rows.

use approx::abs_diff_eq;
use ndarray::Array3;
use relattn_harness::engine::{failure_text, run_trial, CaseStore, Runners};
use relattn_harness::runner::{RunError, RunOutput, RunRequest, Runner, Target};
use relattn_harness::trial_list::{Trial, TrialKind};
use relattn_kernels::gpu::Variant;
use relattn_matrices::{load_tier, SplitSetting};
use relattn_reference::{fast, Problem};
use relattn_reports::{Row, Status};
use relattn_routing::PathId;
use std::sync::Arc;

/// Returns the reference output of each problem (padding rows 0), as the run says.
struct Exact {
    counters_left: usize,
    padding_intact: bool,
    sanitizer: Option<relattn_harness::sanitize::Checked>,
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
            sanitizer: self.sanitizer.clone(),
        })
    }
}

/// The exact output with `delta` added at `at` (`[t, h, c]`).
struct Planted {
    at: [usize; 3],
    delta: f32,
}

impl Runner for Planted {
    fn run(&self, slot: usize, req: &RunRequest<'_>) -> Result<RunOutput, RunError> {
        let exact = Exact {
            counters_left: 0,
            padding_intact: true,
            sanitizer: None,
        };
        let mut run = exact.run(slot, req)?;
        run.out[self.at] += self.delta;
        Ok(run)
    }
}

/// A GPU trial of the smoke tier's `mix` case (the global-layer one, judged on every row).
fn trial_of(mix: &str) -> Trial {
    let cases = load_tier("smoke").unwrap().expand().unwrap().cases;
    let case = cases
        .into_iter()
        .find(|c| c.sample_rows.is_none() && c.mix == mix)
        .expect("the smoke tier has the case, checked on every row");
    Trial {
        name: "gpu::stand_in".into(),
        kind: TrialKind::Gpu {
            case: Arc::new(case),
            target: Target::Native {
                path: PathId::Fallback,
                variant: Variant::PLAIN,
            },
            split: SplitSetting::Policy,
        },
        ignore: None,
    }
}

fn row_with(trial: &Trial, runner: &dyn Runner) -> Row {
    let store = CaseStore::for_trials(std::slice::from_ref(trial));
    let set = relattn_harness::case_set::CaseSet::Matrix("smoke".into());
    run_trial(trial, &store, &Runners::native(Some((runner, 0))), &set)
}

fn row_of(exec: Exact) -> Row {
    row_with(&trial_of("decode"), &exec)
}

#[test]
fn an_exact_run_with_its_counters_reset_passes() {
    let row = row_of(Exact {
        counters_left: 0,
        padding_intact: true,
        sanitizer: None,
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
        sanitizer: None,
    });
    assert_eq!(row.status, Status::Fail);
    assert!(
        row.message
            .starts_with("3 decode counters left non-zero after the launch; rule (a) holds: "),
        "{}",
        row.message
    );
    assert!(
        row.message
            .contains("; rule (b) holds: worst |out - ref64| / (atol2 + rtol2*|ref64|) = 0.00; reproduce: relattn run --matrix smoke --case c"),
        "{}",
        row.message
    );
    // Both reasons when the padding was written too.
    let row = row_of(Exact {
        counters_left: 1,
        padding_intact: false,
        sanitizer: None,
    });
    assert_eq!(row.status, Status::Fail);
    assert!(
        row.message.contains("padding rows were modified")
            && row.message.contains("1 decode counters left non-zero"),
        "{}",
        row.message
    );
}

/// One element planted 0.25 off, in the `mixed` case (requests (1, 700), (48, 48), (1, 33),
/// (40, 1200), (1, 1); H 8): row 57 is position 7 of request 3. The message locates it, gives
/// the values, the bounds and the counts of both rules, and the reproduce line; `failure_text`
/// (what `run` prints and `cargo test` shows) is that text after the status and trial name.
#[test]
fn a_planted_error_is_named_with_its_values_bounds_and_counts() {
    let trial = trial_of("mixed");
    let row = row_with(
        &trial,
        &Planted {
            at: [57, 5, 100],
            delta: 0.25,
        },
    );
    assert_eq!(row.status, Status::Fail);
    let Some(TrialKind::Gpu { case, .. }) = Some(&trial.kind) else {
        unreachable!()
    };
    let reference =
        fast::attention(&relattn_reference::gen::generate(case.spec().unwrap()).unwrap());
    let expected = reference.out[[57, 5, 100]];
    let actual = (expected as f32 + 0.25) as f64;
    let m = &row.message;
    eprintln!("{}", failure_text(&row));
    // 91 real rows x 8 heads x 128 dims.
    let elements = 91 * 8 * 128;
    let at = "request 3, position 7, head 5, dim 100 (row 57)";
    let bound = row.bound.unwrap();
    for part in [
        format!("rule (a) fails: max|out - ref64| = 2.500e-1 > bound {bound:.3e} "),
        format!("1 of {elements} elements (0.0011%) over it; worst at {at}: out "),
        format!("rule (b) fails: 1 of {elements} elements (0.0011%) over atol2 + rtol2*|ref64|; worst at the same element"),
        format!(
            "> bound {:.3e} there (ratio ",
            case.tolerance.atol2 + case.tolerance.rtol2 * expected.abs()
        ),
        format!("; reproduce: relattn run --matrix smoke --case {} --paths fallback", case.id),
    ] {
        assert!(m.contains(&part), "{m}\nlacks\n{part}");
    }
    // The values at the worst element, to the six digits printed.
    let values = m.split(&format!("{at}: out ")).nth(1).unwrap();
    let (out, rest) = values.split_once(", ref64 ").unwrap();
    let reference = rest.split(';').next().unwrap();
    for (text, want) in [(out, actual), (reference, expected)] {
        let got: f64 = text.parse().unwrap();
        assert!(
            abs_diff_eq!(got, want, epsilon = 5e-6 * want.abs()),
            "{text} vs {want}"
        );
    }
    assert_eq!(row.first_bad.as_deref(), Some("57:5:100"));
    let text = failure_text(&row);
    assert_eq!(text, format!("FAIL gpu::stand_in: {m}"));
    assert!(!text.contains("Some("), "no Rust debug text: {text}");
}

/// A sanitized run: the row carries `sanitize`; an error the sanitizer reported fails the
/// trial with its class and first report even when the output is exact, and a failing output's
/// reason follows.
#[test]
fn a_sanitizer_error_fails_the_trial_with_its_class() {
    use relattn_harness::sanitize::{failure_message, parse, Checked};
    let clean = row_of(Exact {
        counters_left: 0,
        padding_intact: true,
        sanitizer: Some(Checked {
            tool: "memcheck".into(),
            errors: None,
        }),
    });
    assert_eq!(clean.status, Status::Pass, "{}", clean.message);
    assert_eq!(clean.params["sanitize"], "memcheck");
    let reports = parse(
        "========= Invalid __global__ read of size 2 bytes\n=========     at k+0x10\n=========\n",
    );
    let errors = Some(failure_message(
        relattn_harness::sanitize::Tool::Memcheck,
        &reports,
    ));
    let row = row_of(Exact {
        counters_left: 0,
        padding_intact: true,
        sanitizer: Some(Checked {
            tool: "memcheck".into(),
            errors: errors.clone(),
        }),
    });
    assert_eq!(row.status, Status::Fail);
    assert!(
        row.message.starts_with(
            "out-of-bounds access (docs/operator.md section 5, class 5): compute-sanitizer memcheck reported 1 \
             error(s) while this trial ran; the first: Invalid __global__ read of size 2 bytes; \
             at k+0x10; the output passes docs/operator.md section 6; reproduce: relattn run"
        ),
        "{}",
        row.message
    );
    let row = row_of(Exact {
        counters_left: 0,
        padding_intact: false,
        sanitizer: Some(Checked {
            tool: "memcheck".into(),
            errors,
        }),
    });
    assert_eq!(row.status, Status::Fail);
    assert!(
        row.message
            .contains("; the output also fails: padding rows were modified"),
        "{}",
        row.message
    );
}
