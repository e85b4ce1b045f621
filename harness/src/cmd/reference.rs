//! `relattn reference`: the f64 reference and the same-precision emulation of a case file.

use crate::exit::usage;
use crate::progress::Phase;
use relattn_common::files::same_file;
use relattn_reference::casefile::{read_case, write_output};
use relattn_reference::{emulate, fast, sample, Problem, RefOutput};
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Case file (safetensors, as written by `relattn gen`).
    #[arg(long, short)]
    pub input: PathBuf,
    /// Output file to write: `out`, `lse`, `out_lp` (and `rows` with --sample-rows).
    #[arg(long, short)]
    pub output: PathBuf,
    /// Compute only a seeded sample of about N query rows (always including each request's
    /// first and last row).
    #[arg(long)]
    pub sample_rows: Option<usize>,
    /// Seed of the row sample.
    #[arg(long, default_value_t = 0, requires = "sample_rows")]
    pub seed: u64,
    /// Skip the same-precision emulation (the slower half on large cases): the output file has
    /// no `out_lp`.
    #[arg(long)]
    pub no_emulation: bool,
}

/// The references of a case, each timed.
pub struct References {
    pub reference: RefOutput,
    pub reference_seconds: f64,
    /// None when skipped.
    pub emulation: Option<(RefOutput, f64)>,
}

/// The f64 reference and, with `emulation`, the same-precision emulation of `p` on `rows` (all
/// rows: None), each a phase with progress on stderr.
pub fn references(
    command: &str,
    p: &Problem,
    rows: Option<&[usize]>,
    emulation: bool,
) -> References {
    let units = rows.map_or(p.real_rows(), <[usize]>::len) as u64 * p.num_heads as u64;
    let phase = Phase::start(command, "f64 reference", units);
    let reference = fast::attention_with(p, rows, &|n| phase.add(n));
    let reference_seconds = phase.finish();
    let emulation = emulation.then(|| {
        let phase = Phase::start(command, "same-precision emulation", units);
        let out = emulate::attention_with(p, rows, &|n| phase.add(n));
        (out, phase.finish())
    });
    References {
        reference,
        reference_seconds,
        emulation,
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if same_file(&args.input, &args.output) {
        return Err(usage(format!(
            "--output {} is the input file: write the reference to another file",
            args.output.display()
        )));
    }
    let case = read_case(&args.input)?;
    let p = &case.problem;
    let rows = args
        .sample_rows
        .map(|n| sample::sample_rows(p, n, args.seed));
    let refs = references("reference", p, rows.as_deref(), !args.no_emulation);
    let emulation = refs.emulation.as_ref().map(|(out, _)| out);
    write_output(&args.output, &refs.reference, emulation, p.dtype)?;

    let reference = &refs.reference;
    let mode = match &rows {
        Some(_) => format!(
            "{} sampled of {} real rows",
            reference.num_rows(),
            p.real_rows()
        ),
        None => format!("all {} rows ({} real)", p.total_rows(), p.real_rows()),
    };
    let emulation = match &refs.emulation {
        Some((_, seconds)) => format!("emulation {seconds:.3} s"),
        None => "no emulation".to_string(),
    };
    println!(
        "wrote {}: {mode}, H={}, D={}, {}; reference {:.3} s, {emulation}",
        args.output.display(),
        p.num_heads,
        p.head_dim,
        p.dtype,
        refs.reference_seconds,
    );
    Ok(())
}
