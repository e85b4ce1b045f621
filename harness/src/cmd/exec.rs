//! `relattn exec`: run one GPU path on one case file and write `out` (F32 `[T, H, D]`, as read
//! back, padding rows included) as safetensors, so a case captured anywhere replays on any path.
//!
//! Whether the path can take the case is decided before any GPU work (exit 2 with the reason,
//! also on machines without a GPU); no usable driver exits 3; a kernel trap or fault exits 1.

use crate::exit::{failed, no_gpu, usage};
use crate::gpu_status::{detect, DeviceSelection, GpuStatus};
use anyhow::Context;
use relattn_kernels::capability::NvmlSource;
use relattn_kernels::gpu::{self, CompilePlan, Geometry, Gpu, GpuError, Splits, Variant};
use relattn_kernels::routing::PathId;
use relattn_reference::casefile::read_case;
use relattn_reference::files::{same_file, write_atomic};
use relattn_reference::transform::with_layout;
use std::path::{Path, PathBuf};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The path to run: sheared_bias, score_mod or fallback.
    #[arg(long)]
    pub path: PathId,
    /// Case file (safetensors, as written by `relattn gen`).
    #[arg(long)]
    pub input: PathBuf,
    /// Where to write `out` (safetensors, F32 `[T, H, D]`).
    #[arg(long)]
    pub output: PathBuf,
    /// Force this many KV splits (default: the path's production policy).
    #[arg(long)]
    pub splits: Option<usize>,
    /// GPU ordinal.
    #[arg(long, default_value_t = 0)]
    pub device: usize,
    /// Build the kernels with RELATTN_BOUNDS_CHECK (every index checked; a violation traps).
    #[arg(long)]
    pub bounds_check: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if same_file(&args.input, &args.output) {
        return Err(usage(format!(
            "--output {} is the input file: write the output to another file",
            args.output.display()
        )));
    }
    let case = read_case(&args.input).map_err(|e| usage(e.to_string()))?;
    let problem = if case.problem.layout == case.meta.cache_layout {
        case.problem
    } else {
        with_layout(&case.problem, case.meta.cache_layout)
    };
    let splits = match args.splits {
        None => Splits::Policy,
        Some(n) => Splits::Forced(n),
    };
    // Pure planning first: an unsupported combination is a usage error even without a GPU.
    let plan = gpu::plan_launches(args.path, &Geometry::of(&problem), splits).map_err(gpu_error)?;
    // A device whose route is a rejection stops here, before anything is compiled or allocated.
    let selection = DeviceSelection::List(vec![args.device as u32]);
    if let GpuStatus::Rejected(why) = detect(&NvmlSource::new(), Gpu::available(), &selection) {
        return Err(no_gpu(why));
    }
    if !Gpu::available() {
        return Err(no_gpu(
            "no usable CUDA driver and NVRTC on this machine: `relattn exec` needs an NVIDIA GPU",
        ));
    }
    let device = Gpu::open(args.device).map_err(gpu_error)?;
    let variant = Variant {
        bounds_check: args.bounds_check,
        mutant: None,
    };
    let compile_plan =
        CompilePlan::new(&device.arch(), variant, &[args.path]).map_err(gpu_error)?;
    let compiled = gpu::compile(&compile_plan).map_err(gpu_error)?;
    let loaded = device.load(&compiled).map_err(gpu_error)?;
    let uploaded = device.upload(&problem).map_err(gpu_error)?;
    let run = gpu::run_path(&device, &loaded, &uploaded, args.path, splits).map_err(gpu_error)?;
    let dims = run.out.shape().to_vec();
    let values: Vec<f32> = run.out.iter().copied().collect();
    write_f32_safetensors(&args.output, "out", &dims, &values)
        .with_context(|| format!("writing {}", args.output.display()))?;
    println!(
        "{} on {} ({}): {} kernel(s) [{}], num_splits {}, {:.3} ms; unwritten {}, padding {}, decode counters left {}; wrote {}",
        args.path,
        device.name(),
        device.arch(),
        plan.launches.len(),
        run.kernels.join(", "),
        run.num_splits,
        run.ms,
        run.unwritten,
        if run.padding_intact { "intact" } else { "WRITTEN" },
        run.counters_left,
        args.output.display()
    );
    Ok(())
}

/// Exit code per GpuError kind: skip-worthy input is a usage error, a missing driver is "no GPU",
/// a kernel that traps, faults or does not compile is a failure.
fn gpu_error(e: GpuError) -> anyhow::Error {
    let msg = e.to_string();
    match e {
        GpuError::NoDriver(_) => no_gpu(msg),
        GpuError::NoDevice { count: 0, .. } | GpuError::ContextLost { .. } => no_gpu(msg),
        GpuError::Trap { .. } | GpuError::Nvrtc { .. } => failed(msg),
        _ => usage(msg),
    }
}

/// A one-tensor safetensors file: u64 LE header length, JSON header padded with spaces to a
/// multiple of 8, then the little-endian data.
pub fn write_f32_safetensors(
    path: &Path,
    name: &str,
    shape: &[usize],
    values: &[f32],
) -> anyhow::Result<()> {
    let bytes = values.len() * 4;
    let header = serde_json::json!({
        name: { "dtype": "F32", "shape": shape, "data_offsets": [0, bytes] },
        "__metadata__": { "format": "pt" },
    });
    let mut header = serde_json::to_vec(&header)?;
    header.resize(header.len().div_ceil(8) * 8, b' ');
    write_atomic(path, |w| {
        w.write_all(&(header.len() as u64).to_le_bytes())?;
        w.write_all(&header)?;
        for v in values {
            w.write_all(&v.to_le_bytes())?;
        }
        Ok(())
    })?;
    Ok(())
}
