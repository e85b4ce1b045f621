//! `relattn judge`: judge an output made by anything (a kernel under development, PyTorch, another
//! framework) against a case file by docs/operator.md section 6, with the judge `run` uses.
//!
//! The output is a safetensors file with one tensor `out` `[T, H, D]` in F32, BF16 or F16,
//! padding rows included (as `relattn exec` writes it); padding rows count as intact when they
//! are NaN (poison `out` with NaN before the launch). The tolerance is the default of the
//! case's dtype. Exit 0 on a pass, 1 on a fail, 2 when a file cannot be used.

use crate::cmd::reference::references;
use crate::exit::{failed, usage};
use relattn_reference::casefile::{read_case, read_impl_output};
use relattn_reference::judge::{
    describe, judge, location, padding_is_nan, Element, RuleOutcome, Tolerance, Verdict,
};
use relattn_reference::{sample, Problem};
use serde_json::{json, Value};
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Case file (safetensors, as written by `relattn gen`).
    #[arg(long, short)]
    pub input: PathBuf,
    /// The output to judge: safetensors with tensor `out` [T, H, D] in F32, BF16 or F16, padding
    /// rows included and NaN (as `relattn exec` writes it).
    #[arg(long, short)]
    pub output: PathBuf,
    /// Judge a seeded sample of about N query rows (always each request's first and last row),
    /// as `relattn run` does for long cases.
    #[arg(long, value_name = "N")]
    pub sample_rows: Option<usize>,
    /// Seed of the row sample [default: the case file's seed, else 0: the rows `run` judges].
    #[arg(long, requires = "sample_rows")]
    pub seed: Option<u64>,
    /// Print the verdict as one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let case = read_case(&args.input).map_err(|e| usage(e.to_string()))?;
    let p = &case.problem;
    let shape = [p.total_rows(), p.num_heads, p.head_dim];
    let out = read_impl_output(&args.output, shape).map_err(|e| usage(e.to_string()))?;
    let tolerance = Tolerance::default_for(p.dtype);
    let seed = args.seed.or(case.meta.seed).unwrap_or(0);
    let rows = args.sample_rows.map(|n| sample::sample_rows(p, n, seed));
    let refs = references("judge", p, rows.as_deref(), true);
    let ref_lp = refs
        .emulation
        .as_ref()
        .map(|(out, _)| out)
        .expect("the emulation was asked for");
    let padding_intact = padding_is_nan(p, &out);
    let v = judge(
        p,
        &out,
        &refs.reference,
        ref_lp,
        &tolerance,
        padding_intact,
        0,
    );
    if args.json {
        println!("{}", verdict_json(p, &v, &tolerance, &args, rows.is_some()));
    } else {
        let status = if v.pass { "PASS" } else { "FAIL" };
        println!("{status}: {}", describe(p, &v));
        if !padding_intact {
            println!(
                "note: padding rows (t >= cu_seqlens_q[B] = {}) count as intact when they are \
                 NaN: poison `out` with NaN before the launch",
                p.real_rows()
            );
        }
    }
    if v.pass {
        Ok(())
    } else {
        Err(failed(format!(
            "{} fails docs/operator.md section 6 against {}",
            args.output.display(),
            args.input.display()
        )))
    }
}

/// A figure as JSON; non-finite ones as the strings "NaN", "inf", "-inf" (as the reports write
/// them: JSON has no NaN).
fn figure(x: f64) -> Value {
    if x.is_finite() {
        json!(x)
    } else {
        json!(format!("{x}"))
    }
}

fn element(p: &Problem, e: &Element) -> Value {
    let (request, position) = p
        .request_of_row(e.t)
        .map_or((None, None), |r| (Some(r.index), Some(e.t - r.q_start)));
    json!({
        "request": request,
        "position": position,
        "head": e.h,
        "dim": e.c,
        "row": e.t,
        "where": location(p, e.t, e.h, e.c),
        "out": figure(e.out),
        "ref64": figure(e.reference),
        "bound": figure(e.bound),
        "ratio": figure(e.ratio()),
    })
}

fn rule(p: &Problem, r: &RuleOutcome) -> Value {
    json!({
        "over": r.over,
        "worst": r.worst.map(|e| element(p, &e)),
    })
}

fn verdict_json(
    p: &Problem,
    v: &Verdict,
    tolerance: &Tolerance,
    args: &Args,
    sampled: bool,
) -> Value {
    json!({
        "pass": v.pass,
        "case": args.input.display().to_string(),
        "output": args.output.display().to_string(),
        "dtype": p.dtype.name(),
        "tolerance": tolerance,
        "judged_elements": v.judged,
        "sampled": sampled,
        "max_abs": figure(v.max_abs),
        "mean_abs": figure(v.mean_abs),
        "rel_l2": figure(v.rel_l2),
        "bound": figure(v.bound),
        "ratio": figure(v.ratio),
        "first_bad": v.first_bad,
        "non_finite": v.non_finite,
        "padding_intact": v.padding_intact,
        "rule_a": rule(p, &v.rule_a),
        "rule_b": rule(p, &v.rule_b),
        "message": describe(p, v),
    })
}
