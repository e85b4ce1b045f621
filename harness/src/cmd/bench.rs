//! `relattn bench`: time every GPU path on the benchmark shapes, next to the device's measured
//! copy bandwidth and cuBLAS bf16 matrix-product rate; print a table, optionally write JSON and
//! the roofline (`--plot`). `--from-json` prints and plots a table measured before, on any
//! machine.
//!
//! Arguments are checked first (exit 2), then the capability preflight (no GPU or a rejected
//! device: exit 3, before anything is compiled or allocated). A row that errors, or whose
//! outputs were not all written, makes the command exit 1 after the table is printed.

use crate::bench::report::{format_report, roofline_svg, BenchReport, RowStatus};
use crate::bench::session::run_on_gpu;
use crate::bench::shapes::{parse_shapes, SHAPES};
use crate::bench::{BenchOptions, PathChoice};
use crate::exit::{failed, no_gpu, usage};
use crate::gpu_status::{detect, DeviceSelection, GpuStatus};
use anyhow::Context;
use relattn_kernels::capability::{CapabilitySource, NvmlSource};
use relattn_kernels::gpu::Gpu;
use relattn_reports::MAX_REPORT_FILE_BYTES;
use std::path::{Path, PathBuf};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Shapes: all, or a list of prefill8k, prefill8k_local, prefill8k_p16, decode128k,
    /// decode1m, decode8k_b32, mixed.
    #[arg(long, default_value = "all")]
    pub shapes: String,
    /// Paths: all, routed (the device's production path), or a list like score_mod,fallback.
    #[arg(long, default_value = "all")]
    pub paths: String,
    /// Timed launches per shape and path (the median is the figure).
    #[arg(long, default_value_t = 20)]
    pub reps: usize,
    /// Untimed launches before the timed ones.
    #[arg(long, default_value_t = 3)]
    pub warmup: usize,
    /// Write device, peaks and every row (with all samples) as JSON; rewritten after each shape.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write the roofline of the table as SVG: each timed row's TFLOP/s against its FLOP per
    /// byte, one series per path, under the measured compute and memory roofs.
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
    /// Measure nothing: read a table written by --json (on any machine, no GPU needed), print
    /// it and, with --plot, draw its roofline.
    #[arg(long, value_name = "FILE", conflicts_with = "json")]
    pub from_json: Option<PathBuf>,
    /// GPU ordinal.
    #[arg(long, default_value_t = 0)]
    pub device: usize,
    /// Seed of the generated inputs.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Copies of each shape's inputs to rotate (default: enough to exceed 4x the L2; 2 to 4).
    #[arg(long)]
    pub input_sets: Option<usize>,
    /// Do not measure the copy and matrix-product peaks (no percentages in the table).
    #[arg(long)]
    pub no_peaks: bool,
    /// Start no shape or path after this many seconds (their rows say so); for time-limited
    /// machines, so the table is printed before the limit.
    #[arg(long)]
    pub budget_s: Option<f64>,
    /// Wall seconds one shape and path may take: when the first launch shows that warm-up and
    /// --reps launches would not fit, fewer are timed (at least one) and the row says so.
    #[arg(long)]
    pub row_budget_s: Option<f64>,
    #[arg(
        long = "impl",
        value_name = "NAME",
        help = crate::worker::impl_help("Also time a shipped worker's paths (repeatable or comma-separated)")
    )]
    pub impls: Vec<String>,
    /// Also time the paths of a worker speaking worker protocol v1 (repeatable).
    #[arg(long = "worker", value_name = "COMMAND")]
    pub workers: Vec<String>,
    /// Seconds a worker may take to answer one request (its first calls compile).
    #[arg(long, default_value_t = crate::worker::DEFAULT_TIMEOUT_S)]
    pub worker_timeout_s: f64,
}

/// Check the arguments (usage errors, exit 2) without touching any device.
pub fn options(args: &Args) -> anyhow::Result<BenchOptions> {
    if args.reps == 0 {
        return Err(usage("--reps must be at least 1"));
    }
    if args.input_sets == Some(0) {
        return Err(usage("--input-sets must be at least 1"));
    }
    for (name, v) in [
        ("--budget-s", args.budget_s),
        ("--row-budget-s", args.row_budget_s),
    ] {
        if v.is_some_and(|x| !(x.is_finite() && x > 0.0)) {
            return Err(usage(format!(
                "{name} must be a positive number of seconds"
            )));
        }
    }
    if let (Some(plot), Some(json)) = (&args.plot, &args.json) {
        if plot == json || relattn_common::files::same_file(plot, json) {
            return Err(usage(format!(
                "--plot and --json name the same file {}: give two files",
                plot.display()
            )));
        }
    }
    if u32::try_from(args.device).is_err() {
        return Err(usage(format!(
            "--device {} is not a GPU index",
            args.device
        )));
    }
    Ok(BenchOptions {
        shapes: parse_shapes(&args.shapes).map_err(usage)?,
        paths: PathChoice::parse(&args.paths).map_err(usage)?,
        reps: args.reps,
        warmup: args.warmup,
        json: args.json.clone(),
        device: args.device,
        seed: args.seed,
        input_sets: args.input_sets,
        peaks: !args.no_peaks,
        budget_s: args.budget_s,
        row_budget_s: args.row_budget_s,
        workers: crate::worker::specs(&args.impls, &args.workers).map_err(usage)?,
        worker_timeout: crate::worker::timeout(args.worker_timeout_s).map_err(usage)?,
    })
}

pub fn run(args: Args) -> anyhow::Result<()> {
    run_with(args, &NvmlSource::new(), Gpu::available())
}

/// `run` with the capability source given: a missing or rejected device stops here, before any
/// kernel is compiled or device memory allocated.
pub fn run_with(
    args: Args,
    source: &dyn CapabilitySource,
    libs_present: bool,
) -> anyhow::Result<()> {
    let opts = options(&args)?;
    if let Some(path) = &args.from_json {
        let report = read_json(path)?;
        print!("{}", format_report(&report));
        return write_plot(&report, args.plot.as_deref());
    }
    let selection = DeviceSelection::List(vec![opts.device as u32]);
    let (info, routed) = match detect(source, libs_present, &selection) {
        GpuStatus::Absent(why) => {
            return Err(no_gpu(format!(
                "`relattn bench` needs an NVIDIA GPU: {why} (shapes: {})",
                SHAPES.join(", ")
            )))
        }
        GpuStatus::Rejected(why) => return Err(no_gpu(why)),
        GpuStatus::Ready { devices, routed } => match devices.into_iter().next() {
            Some(d) => (d, routed),
            None => return Err(no_gpu("no device selected")),
        },
    };
    let paths = opts.paths.resolve(routed);
    let report = run_on_gpu(&opts, &info, &paths)?;
    print!("{}", format_report(&report));
    if let Some(path) = &opts.json {
        let text = report.to_json().context("cannot serialise the report")?;
        relattn_common::files::write_atomic(path, |w| w.write_all(text.as_bytes()))
            .with_context(|| format!("{}: cannot write", path.display()))?;
        println!("wrote {}", path.display());
    }
    write_plot(&report, args.plot.as_deref())?;
    let bad = report
        .rows
        .iter()
        .filter(|r| r.status == RowStatus::Error)
        .count();
    if bad > 0 {
        return Err(failed(format!(
            "{bad} row(s) failed: see the table (ERROR or INVALID)"
        )));
    }
    Ok(())
}

/// A table `--json` wrote, refused past the report-file size limit.
fn read_json(path: &Path) -> anyhow::Result<BenchReport> {
    let bad = |why: String| usage(format!("--from-json {}: {why}", path.display()));
    // A regular file only, read up to the limit (a FIFO or a device is refused, not read).
    let text = relattn_common::files::read_regular_text(path, MAX_REPORT_FILE_BYTES)
        .map_err(|e| bad(e.to_string()))?;
    serde_json::from_str(&text).map_err(|e| {
        bad(format!(
            "not a table written by `relattn bench --json`: {e}"
        ))
    })
}

/// Writes the roofline of `report` to `path`, when one is given.
fn write_plot(report: &BenchReport, path: Option<&Path>) -> anyhow::Result<()> {
    let Some(path) = path else { return Ok(()) };
    let svg = roofline_svg(report).map_err(|e| failed(format!("cannot draw the roofline: {e}")))?;
    relattn_common::files::write_atomic(path, |w| w.write_all(svg.as_bytes()))
        .with_context(|| format!("{}: cannot write", path.display()))?;
    println!("wrote {}", path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exit::{code_of, Code};
    use clap::Parser;
    use relattn_kernels::capability::{CapabilityError, MockSource};
    use relattn_routing::{Capability, PathId};

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn args(line: &[&str]) -> Args {
        let mut argv = vec!["relattn-bench"];
        argv.extend_from_slice(line);
        Cli::try_parse_from(argv).unwrap().args
    }

    #[test]
    fn defaults_time_every_shape_and_path_twenty_times() {
        let o = options(&args(&[])).unwrap();
        assert_eq!(o.shapes, SHAPES.to_vec());
        assert_eq!(o.paths, PathChoice::All);
        assert_eq!((o.reps, o.warmup, o.device, o.seed), (20, 3, 0, 1));
        assert_eq!((o.json, o.input_sets, o.peaks), (None, None, true));
        assert_eq!((o.budget_s, o.row_budget_s), (None, None));
        assert_eq!(o.paths.resolve(PathId::ScoreMod), PathId::ALL.to_vec());
    }

    #[test]
    fn arguments_parse() {
        let o = options(&args(&[
            "--shapes",
            "decode1m,mixed",
            "--paths",
            "score_mod, fallback",
            "--reps",
            "30",
            "--warmup",
            "0",
            "--json",
            "b.json",
            "--device",
            "1",
            "--input-sets",
            "3",
            "--no-peaks",
            "--budget-s",
            "240",
            "--row-budget-s",
            "7.5",
        ]))
        .unwrap();
        assert_eq!(o.shapes, vec!["decode1m", "mixed"]);
        assert_eq!(
            o.paths,
            PathChoice::List(vec![PathId::ScoreMod, PathId::Fallback])
        );
        assert_eq!((o.reps, o.warmup, o.device), (30, 0, 1));
        assert_eq!(o.json, Some(PathBuf::from("b.json")));
        assert_eq!((o.input_sets, o.peaks), (Some(3), false));
        assert_eq!((o.budget_s, o.row_budget_s), (Some(240.0), Some(7.5)));
        let routed = options(&args(&["--paths", "routed"])).unwrap().paths;
        assert_eq!(routed.resolve(PathId::ScoreMod), vec![PathId::ScoreMod]);
    }

    #[test]
    fn bad_arguments_are_usage_errors() {
        for line in [
            &["--shapes", "prefill4k"][..],
            &["--paths", "flash"],
            &["--reps", "0"],
            &["--input-sets", "0"],
            &["--budget-s", "0"],
            &["--row-budget-s=-1"],
            &["--row-budget-s", "nan"],
        ] {
            let e = options(&args(line)).unwrap_err();
            assert_eq!(code_of(&e), Code::Usage, "{line:?}: {e}");
        }
        let e = options(&args(&["--shapes", "prefill4k"])).unwrap_err();
        assert!(e.to_string().contains("prefill8k_local"), "{e}");
    }

    #[test]
    fn no_gpu_or_a_rejected_device_exits_3_and_bad_input_2_first() {
        let none = MockSource::failing(CapabilityError::NoDriver("no libnvidia-ml".into()));
        let e = run_with(args(&[]), &none, false).unwrap_err();
        assert_eq!(code_of(&e), Code::NoGpu, "{e}");
        let gb10 = MockSource::single("NVIDIA GB10", Capability::new(12, 1));
        let e = run_with(args(&[]), &gb10, true).unwrap_err();
        assert_eq!(code_of(&e), Code::NoGpu, "{e}");
        assert!(e.to_string().contains("GB10"), "{e}");
        // A missing device index is "no GPU" too.
        let h200 = MockSource::single("NVIDIA H200", Capability::new(9, 0));
        let e = run_with(args(&["--device", "2"]), &h200, true).unwrap_err();
        assert_eq!(code_of(&e), Code::NoGpu, "{e}");
        // Usage is checked before the device.
        let e = run_with(args(&["--reps", "0"]), &none, false).unwrap_err();
        assert_eq!(code_of(&e), Code::Usage, "{e}");
    }
}
