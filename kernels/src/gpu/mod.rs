//! The GPU paths: CUDA C kernels (`kernels/cuda/`) compiled at run time by NVRTC and launched
//! through cudarc.
//!
//! Flow: `Gpu::available()` (nothing touches cudarc before it is true) -> `CompilePlan` (pure)
//! -> `compile` (parallel, cached) -> `Gpu::open` -> `Gpu::load` -> `Gpu::upload` (once per
//! problem) -> `run_path` (per path, split count and trial).
//!
//! Every `unsafe` of the crate lives in `ffi`.

#![deny(unsafe_code)]

mod compile;
mod compile_plan;
mod constants;
mod device;
mod error;
mod ffi;
mod geometry;
mod launch_lock;
mod launch_plan;
mod mutant;
mod mutant_patches;
mod params;
mod paths;
mod peaks;
mod run_path;
mod source;
mod upload;

pub use crate::routing::SplitSetting;
pub use compile::{
    cache_dir, compile, compile_check, cubin_defines, nvrtc_available, nvrtc_version, syntax_check,
    CheckRecord, Compiled, CompiledProgram,
};
pub use compile_plan::{check_arch, options, CompilePlan, ProgramBuild, Variant, CHECK_ARCHS};
pub use device::{compile_arch, native_arch, Gpu, Loaded, ARCH_ENV};
pub use error::GpuError;
pub use geometry::Geometry;
pub use launch_plan::{
    attention_smem_bytes, bias_stages, decode_piece_keys, decode_piece_keys_for,
    decode_piece_layout, has_single_query_ctas, kv_map_shape, launch_smem_bytes, plan_launches,
    ring_stages, streams_kv, KvMapShape, Launch, LaunchPlan, SmLimits, ATTN_SMEM_BYTES, CTA_ROWS,
    CTA_THREADS, DECODE_MIN_PIECE_KEYS, DECODE_TARGET_CTAS, DEC_BIAS_BYTES, DEC_MAX_STAGES,
    DEC_MIN_STAGES, DEC_Q_BYTES, DEC_RING_STAGE_BYTES, DEC_STAGE_BYTES, HEAD_DIM, KEY_TILE,
    KV_TMA_MIN_PAGE, QUERY_SMEM_BYTES, QUERY_SMEM_BYTES_WG, QUERY_SMEM_BYTES_WG_WINDOW, SHEAR_TILE,
    SMEM_ALIGN, WGMMA_ARCH,
};
pub use mutant::{Mutant, Patch, Site};
pub use params::{c_struct_fields, Params, TensorMap, FIELDS as PARAM_FIELDS, PARAMS_BYTES};
pub use paths::{path_kernels, BiasSource, PathKernels, Stage};
pub use peaks::{
    measure_copy, measure_gemm, measure_peaks, CopyPeak, GemmPeak, PeakError, PeakOptions, Peaks,
    Timing,
};
pub use run_path::{run_path, run_path_timed, set_workspace_poison, GpuRun, Repeats};
pub use source::{
    constants_header, dtype_option, entries, entries_of, entry_name, files, own_file, program_name,
    program_source, DTYPES, PARAMS, SHARED, SHARED_CONSTANTS,
};
pub use upload::{decode_bits, encode, out_poison, padding_bits, unwritten_bits, DeviceProblem};
