//! `relattn reference`: the f64 reference and the same-precision emulation of a case file.

use crate::exit::usage;
use relattn_reference::casefile::{read_case, write_output};
use relattn_reference::files::same_file;
use relattn_reference::{emulate, fast, sample};
use std::path::PathBuf;
use std::time::Instant;

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

    let start = Instant::now();
    let reference = match &rows {
        Some(rows) => fast::attention_rows(p, rows),
        None => fast::attention(p),
    };
    let reference_seconds = start.elapsed().as_secs_f64();
    let start = Instant::now();
    let emulation = match &rows {
        Some(rows) => emulate::attention_rows(p, rows),
        None => emulate::attention(p),
    };
    let emulation_seconds = start.elapsed().as_secs_f64();
    write_output(&args.output, &reference, &emulation, p.dtype)?;

    let mode = match &rows {
        Some(_) => format!(
            "{} sampled of {} real rows",
            reference.num_rows(),
            p.real_rows()
        ),
        None => format!("all {} rows ({} real)", p.total_rows(), p.real_rows()),
    };
    println!(
        "wrote {}: {mode}, H={}, D={}, {}; reference {reference_seconds:.3} s, \
         emulation {emulation_seconds:.3} s",
        args.output.display(),
        p.num_heads,
        p.head_dim,
        p.dtype,
    );
    Ok(())
}
