//! `relattn report`: merge shard reports, diff against a baseline, show a summary, draw plots.

use crate::exit;
use relattn_reports::{DiffOptions, Report};
use std::path::{Path, PathBuf};

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: ReportCommand,
}

#[derive(Debug, clap::Subcommand)]
enum ReportCommand {
    /// Merge shard reports (each DIR holds sm90/, sm100/, cpu/ ... or is one of them) into --out.
    Merge {
        /// Report directories to merge: shards of one run (`relattn run --shard K/N --out DIR`).
        #[arg(required = true, value_name = "DIR")]
        dirs: Vec<PathBuf>,
        /// Directory to write the merged report to (one <arch>/ per architecture).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
    /// Compare NEW against BASE for correctness; exit 1 on a new failure, error growth or lost
    /// coverage (timing only with --timing).
    Diff {
        /// The baseline report directory (an earlier good run or merge).
        #[arg(value_name = "BASE")]
        base: PathBuf,
        /// The report directory to check against BASE [default: reports-out/latest, the newest
        /// run without --out].
        #[arg(value_name = "NEW")]
        new: Option<PathBuf>,
        /// max_abs grown by more than this factor is a regression.
        #[arg(long, default_value_t = 2.0, value_name = "F")]
        error_factor: f64,
        /// Ignore error growth while the new error is under this share of its bound.
        #[arg(long, default_value_t = 0.1, value_name = "R")]
        ratio_floor: f64,
        /// Also fail when trials went from pass to skip (missing trials fail without it).
        #[arg(long)]
        strict_coverage: bool,
        /// Do not fail when trials of BASE are missing from NEW, or NEW is incomplete (they
        /// are still listed).
        #[arg(long, conflicts_with = "strict_coverage")]
        allow_missing: bool,
        /// Also judge timing: a TFLOP/s or GB/s drop past --throughput-drop is a regression.
        /// Off by default: a row stores one time, not its spread, so two runs of one build
        /// differ by more than any useful threshold.
        #[arg(long)]
        timing: bool,
        /// With --timing: TFLOP/s or GB/s down by more than this percentage (0 to 100) is a
        /// regression [default: 10].
        #[arg(long, value_name = "PCT")]
        throughput_drop: Option<f64>,
        /// With --timing: throughput drops of trials under this many milliseconds (base and
        /// new) are timing noise: listed, never a regression [default: 0.2].
        #[arg(long, value_name = "MS")]
        time_floor_ms: Option<f64>,
        /// Print the full result as JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Print the summary (summary.md) of a report directory.
    Show {
        /// A report directory (`relattn run --out DIR`, `report merge --out DIR`) or one of its
        /// <arch>/ directories [default: reports-out/latest, the newest run without --out].
        #[arg(value_name = "DIR")]
        dir: Option<PathBuf>,
    },
    /// Draw the plots of a report directory (error / bound per path, against KV length, split
    /// count and layer) into each architecture's plots/, and link them from its summary.md.
    Plot {
        /// A report directory (holding sm90/, cpu/, ...) or one architecture directory
        /// [default: reports-out/latest].
        #[arg(value_name = "DIR")]
        dir: Option<PathBuf>,
    },
}

pub fn run(args: Args) -> anyhow::Result<()> {
    match args.command {
        ReportCommand::Merge { dirs, out } => merge(&dirs, &out),
        ReportCommand::Diff {
            base,
            new,
            error_factor,
            ratio_floor,
            strict_coverage,
            allow_missing,
            timing,
            throughput_drop,
            time_floor_ms,
            json,
        } => {
            let default = DiffOptions::default();
            if !timing && (throughput_drop.is_some() || time_floor_ms.is_some()) {
                // Scripts written when timing was judged by default keep working; the option
                // is named so nobody thinks it did something.
                eprintln!(
                    "relattn report diff: --throughput-drop and --time-floor-ms apply with \
                     --timing only; timing is not judged"
                );
            }
            let options = DiffOptions {
                error_factor,
                timing,
                throughput_drop_pct: throughput_drop.unwrap_or(default.throughput_drop_pct),
                ratio_floor,
                strict_coverage,
                allow_missing,
                time_floor_ms: time_floor_ms.unwrap_or(default.time_floor_ms),
                ..default
            };
            diff(&base, &or_latest(new)?, &options, json)
        }
        ReportCommand::Plot { dir } => plot(&or_latest(dir)?),
        ReportCommand::Show { dir } => {
            let text = relattn_reports::show(&or_latest(dir)?).map_err(unreadable)?;
            crate::output::print(&text)?;
            Ok(())
        }
    }
}

/// The directory given, else the newest run without `--out` (`reports-out/latest`).
fn or_latest(dir: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    use crate::cmd::run::out::{LATEST, RUNS_ROOT};
    if let Some(dir) = dir {
        return Ok(dir);
    }
    let latest = Path::new(RUNS_ROOT).join(LATEST);
    if std::fs::symlink_metadata(&latest).is_err() {
        return Err(exit::usage(format!(
            "no report directory given, and {} does not exist (it names the newest `relattn \
             run` without --out): give a report directory",
            latest.display()
        )));
    }
    Ok(latest)
}

/// The error already names the directory; add what would be accepted instead.
fn unreadable(err: relattn_reports::ReportError) -> anyhow::Error {
    exit::usage(format!(
        "{err}. Give a directory written by `relattn run --out DIR` or `relattn report merge` \
         (or one of its sm90/, sm100/, cpu/ subdirectories)"
    ))
}

fn load(dir: &Path) -> anyhow::Result<Report> {
    relattn_reports::load(dir).map_err(unreadable)
}

fn plot(dir: &Path) -> anyhow::Result<()> {
    load(dir)?;
    let drawn = relattn_reports::plot(dir)
        .map_err(|e| exit::usage(format!("cannot plot {}: {e}", dir.display())))?;
    for a in drawn {
        let plots_dir = a.dir.join(relattn_reports::PLOTS_DIR);
        if a.drawn.is_empty() && a.skipped.is_empty() {
            println!(
                "{}: no judged GPU trials (error and bound), no plots",
                a.dir.display()
            );
        }
        for file in a.drawn {
            println!("{}", plots_dir.join(file).display());
        }
        for (file, why) in a.skipped {
            println!(
                "{}: not drawn: {}",
                plots_dir.join(file).display(),
                relattn_reports::visible(&why)
            );
        }
    }
    Ok(())
}

fn merge(dirs: &[PathBuf], out: &Path) -> anyhow::Result<()> {
    // Read each input first so an unreadable one is named as such, not as a merge failure.
    for d in dirs {
        load(d)?;
    }
    let merged = relattn_reports::merge(dirs, out)
        .map_err(|e| exit::usage(format!("cannot merge into {}: {e}", out.display())))?;
    for (arch, a) in &merged.archs {
        let c = a.summary().counts;
        println!(
            "{arch}: {} trials ({} pass, {} fail, {} skip, {} error, {} xfail, {} xpass){} -> {}",
            c.total(),
            c.pass,
            c.fail,
            c.skip,
            c.error,
            c.xfail,
            c.xpass,
            if a.complete { "" } else { ", INCOMPLETE" },
            a.dir.display()
        );
        if let Some(gap) = a
            .environment
            .extra
            .get("shard_gap")
            .and_then(|v| v.as_str())
        {
            eprintln!("relattn report merge: {arch}: {gap}");
        }
    }
    Ok(())
}

fn diff(base: &Path, new: &Path, options: &DiffOptions, json: bool) -> anyhow::Result<()> {
    let ok_factor = options.error_factor.is_finite() && options.error_factor >= 1.0;
    let ok_drop = (0.0..=100.0).contains(&options.throughput_drop_pct);
    let ok_floor = options.ratio_floor.is_finite() && options.ratio_floor >= 0.0;
    let ok_time = options.time_floor_ms.is_finite() && options.time_floor_ms >= 0.0;
    if !(ok_factor && ok_drop && ok_floor && ok_time) {
        return Err(exit::usage(
            "--error-factor must be >= 1, --throughput-drop in [0, 100], --ratio-floor >= 0, \
             --time-floor-ms >= 0",
        ));
    }
    let (b, n) = (load(base)?, load(new)?);
    relattn_reports::check_comparable(&b, &n).map_err(|e| exit::usage(e.to_string()))?;
    let result = relattn_reports::diff(&b, &n, options);
    if json {
        crate::output::print(&(serde_json::to_string_pretty(&result)? + "\n"))?;
    } else {
        // Trial names and messages come from the rows: never raw control characters.
        crate::output::print(&relattn_reports::visible(&result.render()))?;
    }
    if result.is_regression() {
        return Err(exit::failed(format!(
            "{} regressed against {}",
            new.display(),
            base.display()
        )));
    }
    Ok(())
}
