//! `relattn bench-reference`: throughput of the fast f64 reference next to the f64 GEMM of the
//! same binary on the same machine.

use anyhow::Context;
use relattn_reference::bench::bench_reference;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Repetitions of each measurement, 1 to 100 (each takes about a second); the best is kept.
    #[arg(long, default_value_t = 3)]
    pub reps: u64,
    /// Also write the report as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// Most repetitions `--reps` takes.
const MAX_REPS: u64 = 100;

pub fn run(args: Args) -> anyhow::Result<()> {
    // Bounded: 18446744073709551615 repetitions would run for ever.
    if !(1..=MAX_REPS).contains(&args.reps) {
        return Err(crate::exit::usage(format!(
            "--reps {}: expected 1 to {MAX_REPS} repetitions",
            args.reps
        )));
    }
    let r = bench_reference(args.reps as usize);
    println!("case: {} (best of {})", r.case, r.reps);
    println!("{:<34} {:>10} {:>10}", "measurement", "seconds", "GFLOP/s");
    println!(
        "{:<34} {:>10.4} {:>10.2}",
        "reference, 1 thread", r.reference_seconds, r.reference_gflops
    );
    println!(
        "{:<34} {:>10.4} {:>10.2}",
        "f64 GEMM 2048x128x2048, 1 thread", r.gemm_seconds, r.gemm_gflops
    );
    println!(
        "{:<34} {:>10.4} {:>10.2}",
        format!("reference, {} threads", r.threads),
        r.multi_thread_seconds,
        r.multi_thread_gflops
    );
    println!("ratio reference / GEMM (1 thread): {:.3}", r.ratio);
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&r).context("cannot serialize the report")?;
        relattn_common::files::write_atomic(path, |w| {
            w.write_all(text.as_bytes())?;
            w.write_all(b"\n")
        })
        .with_context(|| format!("{}: cannot write", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
