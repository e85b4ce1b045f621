//! One benchmark on one GPU: compile, open the device, measure its peaks, then time each shape.
//! Shapes are generated on a worker thread, one ahead of the shape being timed, so the CPU work of
//! building million-key caches overlaps the GPU work. Progress goes to stderr row by row, and the
//! JSON file is rewritten after every shape, so a run cut short keeps what it measured.

use super::measure::{bench_shape, TimingOptions};
use super::report::{fill_vs_native, format_header, format_row, BenchReport, BenchRow};
use super::report::{DeviceSummary, RowStatus};
use super::shapes::{spec, Figures};
use super::workers::time_workers;
use super::BenchOptions;
use crate::exit::{failed, no_gpu};
use anyhow::Context;
use relattn_kernels::capability::DeviceInfo;
use relattn_kernels::gpu::{
    compile, measure_peaks, nvrtc_version, CompilePlan, Gpu, GpuError, PeakError, PeakOptions,
    Variant,
};
use relattn_reference::gen::generate;
use relattn_reference::Problem;
use relattn_routing::PathId;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Exit code per GPU error, through the one classification of every command
/// (`gpu_exec::classify`): no usable device is 3, a kernel that traps or does not compile is 1.
pub fn gpu_error(e: GpuError) -> anyhow::Error {
    crate::gpu_exec::classify(e).into_exit()
}

fn peak_error(e: PeakError) -> anyhow::Error {
    match e {
        PeakError::Gpu(e) => gpu_error(e),
        PeakError::NoCublas => no_gpu(format!("{e}; run with --no-peaks to time without it")),
        other => failed(other.to_string()),
    }
}

/// Run the benchmark of `opts` on the device `info` (already checked by the capability
/// preflight), timing `paths`.
pub fn run_on_gpu(
    opts: &BenchOptions,
    info: &DeviceInfo,
    paths: &[PathId],
) -> anyhow::Result<BenchReport> {
    let deadline = opts
        .budget_s
        .map(|s| Instant::now() + Duration::from_secs_f64(s));
    // Compile first: a compile failure is reported before any device memory is used.
    let arch = relattn_kernels::gpu::compile_arch(info.cc);
    let plan = CompilePlan::new(&arch, Variant::PLAIN, paths).map_err(gpu_error)?;
    let started = Instant::now();
    let compiled = compile(&plan).map_err(gpu_error)?;
    eprintln!(
        "bench: compiled {} program(s) for {arch} in {:.1} s",
        plan.programs.len(),
        started.elapsed().as_secs_f64()
    );
    let gpu = Gpu::open(opts.device).map_err(gpu_error)?;
    let loaded = gpu.load(&compiled).map_err(gpu_error)?;
    let device = DeviceSummary {
        index: gpu.index(),
        name: gpu.name().to_string(),
        capability: gpu.capability().to_string(),
        arch: gpu.arch(),
        driver: info.driver_version.clone(),
        cuda_version: gpu
            .driver_version()
            .ok()
            .map(|v| format!("{}.{}", v / 1000, (v % 1000) / 10)),
        nvrtc_version: nvrtc_version().ok().map(|(a, b)| format!("{a}.{b}")),
        memory_total_bytes: info.memory_total_bytes,
    };
    let peaks = if opts.peaks {
        let started = Instant::now();
        let p = measure_peaks(&gpu, &PeakOptions::default()).map_err(peak_error)?;
        eprintln!(
            "bench: peaks measured in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        Some(p)
    } else {
        None
    };
    // Workers start before any shape is built: a bad worker stops the bench at once (exit 2).
    let workers = crate::worker::start_all(
        &opts.workers,
        opts.worker_timeout,
        &crate::worker::Pool::single(),
    )
    .map_err(crate::exit::usage)?;
    let worker_timing = crate::runner::Timing {
        warmup: opts.warmup,
        reps: opts.reps,
    };
    let mut report = BenchReport {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        device,
        peaks,
        reps: opts.reps,
        warmup: opts.warmup,
        seed: opts.seed,
        rows: Vec::new(),
    };
    eprint!("{}", format_header(&report));
    let timing = TimingOptions {
        warmup: opts.warmup,
        reps: opts.reps,
        sets: opts.input_sets,
        row_budget: opts.row_budget_s.map(Duration::from_secs_f64),
        deadline,
    };
    let seed = opts.seed;
    let shapes = opts.shapes.clone();
    std::thread::scope(|scope| -> anyhow::Result<()> {
        let (tx, rx) = mpsc::sync_channel::<(&str, Result<Problem, String>, f64)>(0);
        scope.spawn(move || {
            for name in shapes {
                let started = Instant::now();
                let problem = spec(name, seed)
                    .ok_or_else(|| format!("unknown shape {name}"))
                    .and_then(|s| generate(&s).map_err(|e| e.to_string()));
                let secs = started.elapsed().as_secs_f64();
                if tx.send((name, problem, secs)).is_err() {
                    break; // the timing side stopped
                }
            }
        });
        let mut fatal: Option<String> = None;
        let mut done = 0;
        for (name, problem, gen_secs) in rx {
            if deadline.is_some_and(|d| Instant::now() >= d) {
                break; // dropping the receiver stops the generator
            }
            done += 1;
            let rows = match &problem {
                Err(e) => rows_of(name, paths, RowStatus::Error, &format!("generating: {e}")),
                Ok(p) => {
                    eprintln!("bench: {name}: inputs generated in {gen_secs:.1} s");
                    let peaks = report.peaks.as_ref();
                    let r = bench_shape(&gpu, &loaded, name, p, paths, timing, peaks);
                    fatal = r.fatal;
                    let mut rows = r.rows;
                    if fatal.is_none() {
                        rows.extend(time_workers(
                            &workers,
                            name,
                            opts.seed,
                            p,
                            worker_timing,
                            peaks,
                        ));
                    }
                    rows
                }
            };
            drop(problem);
            push_rows(&mut report, rows, opts)?;
            if fatal.is_some() {
                break;
            }
        }
        for name in &opts.shapes[done..] {
            let rows = match &fatal {
                Some(why) => rows_of(name, paths, RowStatus::Error, &format!("not run: {why}")),
                None => rows_of(
                    name,
                    paths,
                    RowStatus::Skipped,
                    "the --budget-s time was spent",
                ),
            };
            push_rows(&mut report, rows, opts)?;
        }
        Ok(())
    })?;
    Ok(report)
}

/// Print rows as progress, add them to the report, and rewrite the JSON file.
fn push_rows(
    report: &mut BenchReport,
    rows: Vec<BenchRow>,
    opts: &BenchOptions,
) -> anyhow::Result<()> {
    let first = report.rows.len();
    report.rows.extend(rows);
    fill_vs_native(&mut report.rows);
    for row in &report.rows[first..] {
        eprintln!("{}", format_row(row));
    }
    if let Some(path) = &opts.json {
        let text = report.to_json().context("cannot serialise the report")?;
        relattn_common::files::write_atomic(path, |w| w.write_all(text.as_bytes()))
            .with_context(|| format!("{}: cannot write", path.display()))?;
    }
    Ok(())
}

/// Rows for every path of a shape that was not timed.
fn rows_of(shape: &str, paths: &[PathId], status: RowStatus, message: &str) -> Vec<BenchRow> {
    paths
        .iter()
        .map(|p| BenchRow::not_timed(shape, p.as_str(), status, message, Figures::default()))
        .collect()
}
