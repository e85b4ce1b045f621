//! Running a path on an uploaded problem: poison, launch, time, read back, check.

#![deny(unsafe_code)]

use super::device::{is_fault, Gpu, Loaded};
use super::error::{driver, GpuError};
use super::ffi;
use super::geometry::Geometry;
use super::launch_plan::{
    attention_smem_bytes, kv_map_shape, launch_smem_bytes, plan_launches, ring_stages, LaunchPlan,
    CTA_THREADS, DEC_MIN_STAGES, HEAD_DIM,
};
use super::params::Params;
use super::paths::Stage;
use super::upload::{poisoned, unwritten_bits, DeviceProblem};
use crate::routing::PathId;
use crate::routing::SplitSetting;
use cudarc::driver::{sys, CudaSlice, DevicePtr, DriverError};
use ndarray::Array3;
use std::sync::atomic::{AtomicBool, Ordering};

/// What one run of a path produced.
#[derive(Debug, Clone)]
pub struct GpuRun {
    /// `out` `[T, H, D]` as read back (padding rows included, as they were found).
    pub out: Array3<f32>,
    /// Padding rows are bit-identical to what they held before the launch.
    pub padding_intact: bool,
    /// Real-row elements still holding the unwritten poison.
    pub unwritten: usize,
    /// The first of them as `(t, h, c)`.
    pub first_unwritten: Option<(usize, usize, usize)>,
    /// Decode counters (`ws_count`) left non-zero after the launches: the kernel must reset
    /// every one, or the next launch on the same workspace would merge too early or never.
    pub counters_left: usize,
    /// CUDA-event time of the path's launches (prologue and combine included), in ms: the
    /// median of the warm repeats when `Repeats` asked for them and they ran, else the first
    /// (cold) launch's.
    pub ms: f32,
    /// The first launch's time, in ms (the one whose output is judged).
    pub cold_ms: f32,
    /// The times of the warm repeats, in ms (empty when none ran).
    pub warm_ms: Vec<f32>,
    pub num_splits: usize,
    /// Kernels launched, in order.
    pub kernels: Vec<String>,
}

fn after_launch(kernel: &str) -> impl FnOnce(DriverError) -> GpuError + '_ {
    move |e| {
        if is_fault(&e) {
            GpuError::Trap {
                kernel: kernel.to_string(),
                detail: format!("{e}"),
            }
        } else {
            GpuError::Driver {
                what: format!("running {kernel}"),
                source: e,
            }
        }
    }
}

fn ptr<T>(gpu: &Gpu, buf: &CudaSlice<T>) -> u64 {
    let (p, _guard) = buf.device_ptr(&gpu.stream);
    p
}

/// Whether runs poison their workspaces before the launches (on unless turned off).
static POISON_WORKSPACES: AtomicBool = AtomicBool::new(true);

/// Turn the workspace poison of every later run in this process off (`false`) or on. A process
/// under compute-sanitizer's initcheck turns it off: the poison is a memset, which initcheck
/// counts as a write, so a combine reading a partial no kernel wrote would go unseen.
pub fn set_workspace_poison(on: bool) {
    POISON_WORKSPACES.store(on, Ordering::Relaxed);
}

/// How a run is timed beyond its first launch: up to `warm_launches` repeats of the whole plan
/// on the same buffers, stopping once they have taken `budget_ms` of GPU time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Repeats {
    pub warm_launches: usize,
    pub budget_ms: f32,
}

impl Repeats {
    /// One launch, timed cold (what `bench` wants: it takes its own samples).
    pub const COLD: Repeats = Repeats {
        warm_launches: 0,
        budget_ms: 0.0,
    };
    /// A trial's timing: the first launch is the warm-up and the one judged; the reported time
    /// is the median of up to 5 repeats, bounded to about 20 ms of GPU time per trial so a tier
    /// of thousands of trials keeps its wall time.
    pub const TRIAL: Repeats = Repeats {
        warm_launches: 5,
        budget_ms: 20.0,
    };
}

/// Run `path` on `problem` with `splits`, timed from its one (cold) launch.
pub fn run_path(
    gpu: &Gpu,
    loaded: &Loaded,
    problem: &DeviceProblem,
    path: PathId,
    splits: SplitSetting,
) -> Result<GpuRun, GpuError> {
    run_path_timed(gpu, loaded, problem, path, splits, Repeats::COLD)
}

/// Run `path` on `problem` with `splits`. Before the launches, real rows of `out` are poisoned
/// with a NaN pattern, padding rows with a sentinel, and workspaces with NaN; after them the
/// padding is compared bit for bit and unwritten real elements are counted. Then, when `repeats`
/// asks for it and the first launch left its counters at zero, the plan is launched again on
/// the same buffers for the time alone (bounds-checked builds never repeat: they synchronise
/// after every kernel, so their times mean nothing).
pub fn run_path_timed(
    gpu: &Gpu,
    loaded: &Loaded,
    problem: &DeviceProblem,
    path: PathId,
    splits: SplitSetting,
    repeats: Repeats,
) -> Result<GpuRun, GpuError> {
    if problem.device != gpu.index() {
        return Err(GpuError::Driver {
            what: format!(
                "running on GPU {} a problem uploaded to GPU {}",
                gpu.index(),
                problem.device
            ),
            source: DriverError(sys::cudaError_enum::CUDA_ERROR_INVALID_CONTEXT),
        });
    }
    if !loaded.has_path(path) {
        return Err(GpuError::NotCompiled(path));
    }
    let g = &problem.geometry;
    let plan = plan_launches(path, g, splits)?;
    let stream = &gpu.stream;
    let rows = g.total_rows * g.num_heads;

    // Workspaces, poisoned so a read of anything no kernel wrote shows up as NaN.
    let ws_o_len = plan.workspace_splits * rows * HEAD_DIM;
    let ws_lse_len = plan.workspace_splits * rows;
    let shear_len = rows * plan.shear_width;
    let mut ws_o = ffi::alloc_unwritten::<f32>(stream, ws_o_len.max(1))
        .map_err(driver("allocating the split workspace"))?;
    let mut ws_lse = ffi::alloc_unwritten::<f32>(stream, ws_lse_len.max(1))
        .map_err(driver("allocating the LSE workspace"))?;
    let mut shear = ffi::alloc_unwritten::<u8>(stream, (shear_len * g.dtype.size_bytes()).max(1))
        .map_err(driver("allocating the sheared bias buffer"))?;
    if POISON_WORKSPACES.load(Ordering::Relaxed) {
        for what in [&mut ws_o, &mut ws_lse] {
            ffi::fill_bytes(stream, what, 0xFF).map_err(driver("poisoning the workspace"))?;
        }
        ffi::fill_bytes(stream, &mut shear, 0xFF)
            .map_err(driver("poisoning the sheared bias buffer"))?;
    }
    // The decode kernel's counters (finished splits per request and KV head, then finished
    // pieces per split when splits have several) start at zero; its merging CTAs leave them so.
    let count_len = if plan.has_stage(Stage::Decode) {
        let split_counters = if plan.decode_pieces > 1 {
            plan.num_splits
        } else {
            0
        };
        g.batch() * g.num_kv_heads * (1 + split_counters)
    } else {
        0
    };
    let ws_count = stream
        .alloc_zeros::<u32>(count_len.max(1))
        .map_err(driver("allocating the split counters"))?;
    // A fresh `out` holding the poison image's allocated rows (the kernels write it in place).
    // (Never empty: a zero-length allocation is refused by some drivers.)
    let row_bytes = g.num_heads * g.head_dim * g.dtype.size_bytes();
    let image = &problem.out_poison[..problem.allocated_rows * row_bytes];
    let out = if image.len() >= 4 {
        stream.clone_htod(image)
    } else {
        let mut padded = [0u8; 4];
        padded[..image.len()].copy_from_slice(image);
        stream.clone_htod(&padded)
    }
    .map_err(driver("poisoning out"))?;

    // The attention launch's ring depth and shared memory, for the CTAs an SM can hold.
    let attention = plan
        .launches
        .iter()
        .find(|l| l.stage.is_attention())
        .map(|l| loaded.function(path, l.stage, g.dtype))
        .transpose()?;
    let resident = match attention {
        Some((_, f)) => {
            f.occupancy_max_active_blocks_per_multiprocessor(
                CTA_THREADS,
                attention_smem_bytes(DEC_MIN_STAGES),
                None,
            )
            .map_err(driver("reading the attention kernel's occupancy"))? as usize
        }
        None => 1,
    };
    let stages = ring_stages(&plan, g, &gpu.sm_limits(resident));
    let smem = launch_smem_bytes(&plan, g, stages, loaded.arch()) as u32;
    let workspaces = Workspaces {
        ws_o: &ws_o,
        ws_lse: &ws_lse,
        shear: &shear,
        ws_count: &ws_count,
        ws_o_len,
        ws_lse_len,
        shear_len,
        count_len,
    };
    let mut params = params(gpu, problem, &plan, &out, &workspaces, stages);
    add_tensor_maps(&mut params, g, loaded.arch());
    let start = gpu
        .ctx
        .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(driver("creating an event"))?;
    let end = gpu
        .ctx
        .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(driver("creating an event"))?;
    let launch_all = |kernels: &mut Vec<String>| -> Result<f32, GpuError> {
        // Other processes' launches on this GPU wait until these are done (launch_lock.rs).
        let _turn = gpu.launch_lock.hold();
        start.record(stream).map_err(driver("recording an event"))?;
        kernels.clear();
        for launch in &plan.launches {
            let (name, func) = loaded.function(path, launch.stage, g.dtype)?;
            let dynamic = if launch.stage.is_attention() { smem } else { 0 };
            ffi::launch(stream, func, launch.grid, CTA_THREADS, dynamic, &params)
                .map_err(after_launch(&name))?;
            if loaded.variant.bounds_check {
                // Synchronise per kernel so a trap names the kernel that raised it.
                stream.synchronize().map_err(after_launch(&name))?;
            }
            kernels.push(name);
        }
        end.record(stream).map_err(driver("recording an event"))?;
        stream
            .synchronize()
            .map_err(after_launch(&kernels.join(", ")))?;
        start
            .elapsed_ms(&end)
            .map_err(driver("reading the event timer"))
    };
    let mut kernels = Vec::new();
    let cold_ms = launch_all(&mut kernels)?;
    let all = kernels.join(", ");

    let bytes = stream.clone_dtoh(&out).map_err(after_launch(&all))?;
    // Read back only when a decode launch had counters (the buffer is a 1-element dummy else).
    let counters = if count_len > 0 {
        stream.clone_dtoh(&ws_count).map_err(after_launch(&all))?
    } else {
        Vec::new()
    };
    stream.synchronize().map_err(after_launch(&all))?;
    let counters_left = counters.iter().filter(|&&c| c != 0).count();
    // Rows not on the device (the exact layout's padding) read back as they were poisoned.
    let mut bytes = bytes;
    bytes.truncate(problem.allocated_rows * row_bytes);
    bytes.extend_from_slice(&problem.out_poison[bytes.len()..]);
    let out_bytes = &bytes[..problem.out_poison.len()];
    let padding_start = g.real_rows * g.num_heads * g.head_dim * g.dtype.size_bytes();
    let padding_intact = out_bytes[padding_start..] == problem.out_poison[padding_start..];
    let real = g.real_rows * g.num_heads * g.head_dim;
    let (unwritten, first_unwritten) = poisoned(
        g.dtype,
        out_bytes,
        real,
        (g.num_heads, g.head_dim),
        unwritten_bits(g.dtype),
    );
    let out = problem.decode_out(out_bytes);
    // Warm repeats, for the time alone: the output above is the first launch's.
    let mut warm_ms = Vec::new();
    if !loaded.variant.bounds_check && counters_left == 0 {
        let mut spent = 0.0;
        let mut again = Vec::new();
        while warm_ms.len() < repeats.warm_launches && spent < repeats.budget_ms {
            let ms = launch_all(&mut again)?;
            spent += ms;
            warm_ms.push(ms);
        }
    }
    Ok(GpuRun {
        out,
        padding_intact,
        counters_left,
        unwritten,
        first_unwritten,
        ms: median(&warm_ms).unwrap_or(cold_ms),
        cold_ms,
        warm_ms,
        num_splits: plan.num_splits,
        kernels,
    })
}

/// The median of the finite times, in ms; None when there is none.
fn median(times: &[f32]) -> Option<f32> {
    let times: Vec<f64> = times.iter().map(|&t| f64::from(t)).collect();
    relattn_common::stats::median(&times).map(|m| m as f32)
}

/// A run's workspaces and their lengths in elements.
struct Workspaces<'a> {
    ws_o: &'a CudaSlice<f32>,
    ws_lse: &'a CudaSlice<f32>,
    shear: &'a CudaSlice<u8>,
    ws_count: &'a CudaSlice<u32>,
    ws_o_len: usize,
    ws_lse_len: usize,
    shear_len: usize,
    count_len: usize,
}

fn params(
    gpu: &Gpu,
    p: &DeviceProblem,
    plan: &LaunchPlan,
    out: &CudaSlice<u8>,
    ws: &Workspaces,
    ring_stages: usize,
) -> Params {
    let g = &p.geometry;
    let i = |x: usize| x as i64;
    let (t, h, d, e) = (g.total_rows, g.num_heads, g.head_dim, g.rel_extent);
    // The rows of q, rel_logits and out the device holds (what the bounds check allows).
    let rows = p.allocated_rows;
    Params {
        q: ptr(gpu, &p.q),
        kv: ptr(gpu, &p.kv),
        rel: ptr(gpu, &p.rel),
        out: ptr(gpu, out),
        block_table: ptr(gpu, &p.block_table),
        seqused_k: ptr(gpu, &p.seqused_k),
        cu_seqlens_q: ptr(gpu, &p.cu_seqlens_q),
        ws_o: ptr(gpu, ws.ws_o),
        ws_lse: ptr(gpu, ws.ws_lse),
        shear: ptr(gpu, ws.shear),
        ws_count: ptr(gpu, ws.ws_count),
        t: i(t),
        h: i(h),
        hkv: i(g.num_kv_heads),
        g: i(g.group()),
        d: i(d),
        e: i(e),
        b: i(g.batch()),
        bt_stride: i(g.max_pages),
        page_size: i(g.page_size),
        k_off: i(g.k.offset),
        k_block: i(g.k.block_stride),
        k_slot: i(g.k.slot_stride),
        k_head: i(g.k.head_stride),
        v_off: i(g.v.offset),
        v_block: i(g.v.block_stride),
        v_slot: i(g.v.slot_stride),
        v_head: i(g.v.head_stride),
        window_left: g.window_left,
        num_splits: i(plan.num_splits),
        shear_width: i(plan.shear_width),
        real_rows: i(g.real_rows),
        piece_keys: i(plan.piece_keys),
        q_size: i(rows * h * d),
        kv_size: i(g.kv_elems),
        rel_size: i(rows * h * e),
        out_size: i(rows * h * d),
        bt_size: i(g.batch() * g.max_pages),
        ws_o_size: i(ws.ws_o_len),
        ws_lse_size: i(ws.ws_lse_len),
        shear_size: i(ws.shear_len),
        ws_count_size: i(ws.count_len),
        scale: g.softmax_scale as f32,
        ring_stages: ring_stages as i32,
        tma: 0,
        tmap_k: Default::default(),
        tmap_v: Default::default(),
    }
}

/// Encode the K and V tensor maps of the sm_90a query blocks' tile copies when the kernels can
/// take them (`kv_map_shape`) and the driver accepts both; else the kernels copy with cp.async.
/// Drivers before CUDA 12.0 have no tensor maps.
fn add_tensor_maps(params: &mut Params, g: &Geometry, arch: &str) {
    if !ffi::driver_version().is_ok_and(|v| v >= 12000) {
        return;
    }
    let encode = |view| {
        let s = kv_map_shape(g, view, arch)?;
        ffi::encode_tensor_map_u16(params.kv + s.offset, s.dims, s.strides, s.boxes)
    };
    if let (Some(k), Some(v)) = (encode(&g.k), encode(&g.v)) {
        params.tma = 1;
        params.tmap_k = k;
        params.tmap_v = v;
    }
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn median_of_the_finite_times() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[f32::NAN]), None);
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, f32::INFINITY, 2.0, 3.0]), Some(2.5));
    }
}
