//! The one place a trial's report row is written: made from its trial, filled from its
//! outcome (a check's result, a self-check, a judged GPU run), and finished with its wall time
//! and, for a failure, the command that reproduces it alone.

use super::cases::CaseData;
use super::runners::Runners;
use crate::case_set::CaseSet;
use crate::runner::{Kept, RunError, RunOutput, Target};
use crate::trial_list::{Trial, TrialKind};
use ndarray::Array3;
use relattn_matrices::{Case, SplitSetting};
use relattn_reference::judge::judge;
use relattn_reference::Problem;
use relattn_reports::{Row, Status};
use std::time::Instant;

/// A trial's row before it runs: its case's id, seed and parameters, status pass until its
/// outcome says otherwise.
pub(super) fn new_row(trial: &Trial) -> Row {
    let case_id = trial.case().map_or(String::new(), |c| c.id.clone());
    let mut row = Row::new(case_id, trial.name.clone(), trial.path(), Status::Pass);
    if let Some(case) = trial.case() {
        row.seed = Some(case.seed());
        row.params = case
            .params()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
    }
    row
}

/// A trial not run, and why.
pub(super) fn skip(row: &mut Row, why: String) {
    row.status = Status::Skip;
    row.message = why;
}

/// A reference self-check's result.
pub(super) fn record_self_check(row: &mut Row, c: crate::selfcheck::CheckOutcome) {
    row.status = if c.pass { Status::Pass } else { Status::Fail };
    row.max_abs = Some(c.max_abs);
    row.rel_l2 = Some(c.rel);
    row.message = c.message;
}

/// The command that reruns one case alone: on `target` (every implementation when None), with
/// the split setting `split` where the case set takes one on the command line (a case folder).
pub fn reproduce_command(
    set: &CaseSet,
    case_id: &str,
    target: Option<&Target>,
    split: Option<SplitSetting>,
) -> String {
    let cases = set.case_args(case_id, split);
    match target {
        Some(Target::Native { path, .. }) => format!("relattn run {cases} --paths {path}"),
        Some(Target::Worker { label, .. }) => {
            format!("relattn run {cases} --paths none {label}")
        }
        None => format!("relattn run {cases}"),
    }
}

/// A failing or erroring row as a person reads it, on `relattn run`'s console and under
/// `cargo test`: `FAIL <trial>: <message>` (the message ends with the reproduce line).
pub fn failure_text(row: &Row) -> String {
    format!(
        "{} {}: {}",
        row.status.as_str().to_uppercase(),
        row.trial,
        row.message
    )
}

/// A failing worker trial's case and output, copied into the report's `failures/` (when the
/// run keeps them) while its runner still holds them from this trial's run: before triage
/// runs the trial again.
pub(super) fn keep_files(row: &Row, trial: &Trial, runners: &Runners<'_>) -> Option<Kept> {
    if !row.status.is_bad() {
        return None;
    }
    match (&trial.kind, runners.keep) {
        (
            TrialKind::Gpu {
                target: t @ Target::Worker { .. },
                ..
            },
            Some(dir),
        ) => runners
            .for_target(t)
            .and_then(|(r, _)| r.keep(&trial.name, dir)),
        _ => None,
    }
}

/// The last touches of a row: wall time, and for a failure (an expected one too) the command
/// that reproduces it, with the files `keep_files` kept.
pub(super) fn finish_row(
    row: &mut Row,
    started: Instant,
    trial: &Trial,
    kept: Option<Kept>,
    set: &CaseSet,
) {
    let wall_ms = started.elapsed().as_secs_f64() * 1e3;
    row.wall_ms = Some(wall_ms);
    if row.ms.is_none() && !matches!(trial.kind, TrialKind::Gpu { .. }) {
        row.ms = Some(wall_ms);
    }
    if row.status.is_bad() || row.status == Status::XFail {
        let target = match &trial.kind {
            TrialKind::Gpu { target, .. } => Some(target),
            _ => None,
        };
        let exec = match (&kept, target, &trial.kind) {
            (
                Some(Kept {
                    case: Some(file), ..
                }),
                Some(Target::Worker { label, path, .. }),
                TrialKind::Gpu { split, .. },
            ) => {
                let splits = split
                    .forced()
                    .map_or(String::new(), |n| format!(" --splits {n}"));
                Some(format!(
                    "relattn exec {label} --path {path} --input {}{splits} --output out.safetensors",
                    file.display()
                ))
            }
            _ => None,
        };
        if let Some(k) = &kept {
            if let Some(o) = &k.output {
                row.message = format!("{}; the worker's output: {}", row.message, o.display());
            }
            if !k.left_out.is_empty() {
                row.message = format!("{}; not kept: {}", row.message, k.left_out.join(", "));
            }
        }
        let cmd = match trial.case() {
            Some(c) => {
                let split = match &trial.kind {
                    TrialKind::Gpu { split, .. } => Some(*split),
                    _ => None,
                };
                let run = reproduce_command(set, &c.id, target, split);
                match exec {
                    Some(e) => format!("{e} (or {run})"),
                    None => run,
                }
            }
            None => format!("cargo test --test trials -- --exact {}", trial.name),
        };
        row.message = format!("{}; reproduce: {cmd}", row.message);
    }
}

/// A routing check's result: the shapes it checked, or what disagreed.
pub(super) fn record_check(row: &mut Row, result: Result<usize, String>) {
    match result {
        Ok(n) => row.message = format!("{n} shapes checked"),
        Err(e) => {
            row.status = Status::Fail;
            row.message = e;
        }
    }
}

pub(super) fn error(row: &mut Row, message: String) {
    row.status = Status::Error;
    row.message = message;
}

/// docs/operator.md section 6's verdict on `run`, an output for `problem` (the case's inputs, or a
/// variant of them with the same output), against the case's references.
pub(super) fn verdict(
    problem: &Problem,
    case: &Case,
    data: &CaseData,
    run: &RunOutput,
) -> relattn_reference::judge::Verdict {
    judge(
        problem,
        &run.out,
        data.ref64(),
        data.ref_lp(),
        &case.tolerance,
        run.padding_intact,
        run.counters_left,
    )
}

/// A run's result into the row: judged by docs/operator.md section 6 when there is an output.
pub(super) fn record_run(
    row: &mut Row,
    case: &Case,
    data: &CaseData,
    target: &Target,
    result: &Result<RunOutput, RunError>,
) {
    let run = match result {
        Ok(run) => run,
        Err(RunError::Unsupported(why)) | Err(RunError::NoGpu(why)) => {
            row.status = Status::Skip;
            row.message = why.clone();
            return;
        }
        Err(RunError::Fault(why)) => {
            row.status = Status::Fail;
            row.message = why.clone();
            return;
        }
        Err(RunError::Other(why)) => return error(row, why.clone()),
    };
    let v = verdict(&data.problem, case, data, run);
    row.status = if v.pass { Status::Pass } else { Status::Fail };
    row.max_abs = Some(v.max_abs);
    row.mean_abs = Some(v.mean_abs);
    row.rel_l2 = Some(v.rel_l2);
    row.bound = Some(v.bound);
    row.first_bad = v.first_bad;
    row.message = v.reason;
    row.ms = run.ms;
    if let Some(ms) = run.ms.filter(|&ms| ms > 0.0) {
        let secs = ms * 1e-3;
        row.tflops = Some(data.problem.flops() / secs / 1e12);
        row.gbps = Some(kv_bytes(&data.problem) / secs / 1e9);
    }
    row.params
        .insert("num_splits_run".into(), run.num_splits.to_string());
    row.params
        .insert("out_hash".into(), format!("{:016x}", output_hash(&run.out)));
    if let Target::Native { variant, .. } = target {
        row.params
            .insert("bounds_check".into(), variant.bounds_check.to_string());
    }
    // Under a sanitizer: the row says so (its time is not comparable), and an error the
    // sanitizer reported fails the trial whatever the output, the judge's verdict kept after it.
    if let Some(checked) = &run.sanitizer {
        row.params.insert("sanitize".into(), checked.tool.clone());
        if let Some(errors) = &checked.errors {
            row.message = if row.status == Status::Pass {
                format!("{errors}; the output passes docs/operator.md section 6")
            } else {
                format!("{errors}; the output also fails: {}", row.message)
            };
            row.status = Status::Fail;
        }
    }
}

/// K/V bytes the requests must read: every visible key of every request once, K and V, all KV heads.
pub fn kv_bytes(p: &Problem) -> f64 {
    let mut keys = 0usize;
    for r in p.requests().filter(|r| r.q_len > 0) {
        let (first, _) = p.visible_keys(&r, 0);
        keys += r.kv_len - first;
    }
    (keys * 2 * p.num_kv_heads * p.head_dim * p.dtype.size_bytes()) as f64
}

/// Elements of the output one FNV-1a pass hashes (`output_hash`).
const HASH_CHUNK: usize = 1 << 20;

/// FNV-1a over the output's bits: equal hashes across runs mean bit-identical outputs. An
/// output of more than `HASH_CHUNK` elements is hashed a chunk at a time in parallel, and the
/// chunks' hashes are hashed in order (the same value on any number of threads; smaller
/// outputs keep the plain FNV-1a).
pub fn output_hash(out: &Array3<f32>) -> u64 {
    fn fnv(h: u64, bytes: impl Iterator<Item = u8>) -> u64 {
        bytes.fold(h, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
    }
    const BASIS: u64 = 0xcbf2_9ce4_8422_2325;
    let bits = |xs: &[f32]| fnv(BASIS, xs.iter().flat_map(|x| x.to_bits().to_le_bytes()));
    let owned: Vec<f32>;
    let values = match out.as_slice() {
        Some(values) => values,
        None => {
            owned = out.iter().copied().collect();
            &owned
        }
    };
    if values.len() <= HASH_CHUNK {
        return bits(values);
    }
    use rayon::prelude::*;
    let chunks: Vec<u64> = values.par_chunks(HASH_CHUNK).map(bits).collect();
    fnv(BASIS, chunks.iter().flat_map(|h| h.to_le_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_output_hash_is_the_plain_fnv_up_to_a_chunk_and_the_same_on_any_number_of_threads() {
        // A known FNV-1a value: the bits of [0.0, 1.0] (4 zero bytes, then 00 00 80 3f).
        let two = Array3::from_shape_vec((1, 1, 2), vec![0.0f32, 1.0]).unwrap();
        let mut h = 0xcbf2_9ce4_8422_2325u64;
        for b in [0u8, 0, 0, 0, 0, 0, 0x80, 0x3f] {
            h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
        assert_eq!(output_hash(&two), h);
        // Past one chunk: the same hash on 1 and 4 threads; one flipped bit changes it.
        let n = 3 * HASH_CHUNK + 5;
        let big = Array3::from_shape_fn((n / 5, 1, 5), |(t, _, c)| (t * 5 + c) as f32 * 0.25);
        let on = |threads| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| output_hash(&big))
        };
        assert_eq!(on(1), on(4));
        let mut flipped = big.clone();
        flipped[[n / 5 - 1, 0, 4]] = f32::from_bits(flipped[[n / 5 - 1, 0, 4]].to_bits() ^ 1);
        assert_ne!(output_hash(&flipped), on(1));
        // A transposed view hashes its logical order, as an owned copy of it does.
        let t = big.view().reversed_axes();
        assert_eq!(
            output_hash(&t.to_owned()),
            output_hash(&t.as_standard_layout().into_owned())
        );
    }
}
