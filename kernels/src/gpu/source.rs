//! The CUDA C sources (real files under `kernels/cuda/`, embedded) and the names of their entries.
//!
//! One NVRTC program per path: the path's `.cu` file, which `#include`s the shared device code
//! (`attention.cuh`, which includes its parts by concern, which include the CTA's pieces
//! (`cta.cuh`, `ptx.cuh`, `paged_kv.cuh`, `softmax.cuh`), which include `params.cuh`, which
//! includes `basics.cuh`), handed to NVRTC as in-memory headers. Entries are
//! `extern "C"` kernels named `{path}_{stage}_{dtype}`.

#![deny(unsafe_code)]

use super::constants;
use super::paths::{path_kernels, Stage};
use crate::routing::PathId;
use relattn_reference::DType;

/// The shared device code, in the order a program meets it: the basics (sizes, dtypes), the
/// parameters and their loads, the FMA loop's pieces, the split combine, the kernel entries, the
/// attention CTA's building blocks (its geometry, the SM80+ instructions, the paged K/V copies,
/// the per-tile fragments and softmax), the sm_90a instructions, then the attention loops (a file per
/// concern: the query blocks' biases and softmax, the tensor-core products, the K/V tensor copies, the query block, the
/// sm_90a windowed block, the single-query CTAs, then the dispatch), and the rows whose bias is
/// rel_logits itself with their query-block kernels.
pub const CONSTANTS: &str = include_str!("../../cuda/constants.cuh");
pub const BASICS: &str = include_str!("../../cuda/basics.cuh");
pub const PARAMS: &str = include_str!("../../cuda/params.cuh");
pub const FMA_LOOP: &str = include_str!("../../cuda/fma_loop.cuh");
pub const COMBINE: &str = include_str!("../../cuda/combine.cuh");
pub const ENTRY: &str = include_str!("../../cuda/entry.cuh");
pub const CTA: &str = include_str!("../../cuda/cta.cuh");
pub const PTX: &str = include_str!("../../cuda/ptx.cuh");
pub const PAGED_KV: &str = include_str!("../../cuda/paged_kv.cuh");
pub const SOFTMAX: &str = include_str!("../../cuda/softmax.cuh");
pub const SM90: &str = include_str!("../../cuda/sm90.cuh");
pub const QUERY_BIAS: &str = include_str!("../../cuda/query_bias.cuh");
pub const PRODUCTS: &str = include_str!("../../cuda/products.cuh");
pub const KV_TMA: &str = include_str!("../../cuda/kv_tma.cuh");
pub const QUERY_BLOCK: &str = include_str!("../../cuda/query_block.cuh");
pub const WINDOW_BLOCK: &str = include_str!("../../cuda/window_block.cuh");
pub const DECODE: &str = include_str!("../../cuda/decode.cuh");
pub const ATTENTION: &str = include_str!("../../cuda/attention.cuh");
pub const REL_ROW: &str = include_str!("../../cuda/rel_row.cuh");
pub const SHARED: [(&str, &str); 19] = [
    ("constants.cuh", CONSTANTS),
    ("basics.cuh", BASICS),
    ("params.cuh", PARAMS),
    ("fma_loop.cuh", FMA_LOOP),
    ("combine.cuh", COMBINE),
    ("entry.cuh", ENTRY),
    ("cta.cuh", CTA),
    ("ptx.cuh", PTX),
    ("paged_kv.cuh", PAGED_KV),
    ("softmax.cuh", SOFTMAX),
    ("sm90.cuh", SM90),
    ("query_bias.cuh", QUERY_BIAS),
    ("products.cuh", PRODUCTS),
    ("kv_tma.cuh", KV_TMA),
    ("query_block.cuh", QUERY_BLOCK),
    ("window_block.cuh", WINDOW_BLOCK),
    ("decode.cuh", DECODE),
    ("attention.cuh", ATTENTION),
    ("rel_row.cuh", REL_ROW),
];

/// The files a program is made of, in order, as (name, text): the shared ones, then the path's.
pub fn files(path: PathId) -> Vec<(&'static str, &'static str)> {
    SHARED.into_iter().chain([own_file(path)]).collect()
}

/// The path's own file (its descriptor's), as (name, text).
pub fn own_file(path: PathId) -> (&'static str, &'static str) {
    let k = path_kernels(path);
    (k.file, k.source)
}

/// The text NVRTC compiles for a path: the path's own file, which includes the shared headers
/// (`headers()`, given to NVRTC in memory).
pub fn program_source(path: PathId) -> String {
    own_file(path).1.to_string()
}

/// The headers a program may include, as (include name, text): `constants.cuh` as generated
/// from the Rust constants (`constants_header`), the others as written.
pub fn headers() -> Vec<(String, String)> {
    SHARED
        .iter()
        .map(|(name, text)| match *name {
            "constants.cuh" => (name.to_string(), constants_header()),
            _ => (name.to_string(), text.to_string()),
        })
        .collect()
}

/// The sizes the kernels and the launch planning share, written once here: (C name, value, what
/// it is).
pub const SHARED_CONSTANTS: [(&str, usize, &str); 16] = [
    ("HEAD_DIM", constants::HEAD_DIM, "The head dim the kernels are built for."),
    ("THREADS", constants::CTA_THREADS as usize, "Threads of a CTA (4 warps)."),
    ("MMA_ROWS", constants::CTA_ROWS, "Virtual rows of a tensor-core CTA (16 per warp)."),
    ("KEY_TILE", constants::KEY_TILE, "Keys of a tensor-core CTA's tile."),
    ("SHEAR_TILE", constants::SHEAR_TILE, "Key tile of the sheared bias buffer and of sheared_bias splits."),
    ("KV_TMA_MIN_PAGE", constants::KV_TMA_MIN_PAGE, "Smallest page whose whole tiles the sm_90a query blocks copy by TMA (a box per page and half head dim: 8 per tile at this size)."),
    ("DEC_STAGE_BYTES", constants::DEC_STAGE_BYTES, "A stage of the single-query CTAs' K/V ring (`Params::ring_stages` stages, the launcher sizes the dynamic shared memory for them)."),
    ("DEC_MIN_STAGES", constants::DEC_MIN_STAGES, "The fewest stages of that ring."),
    ("DEC_MAX_STAGES", constants::DEC_MAX_STAGES, "The most stages of that ring."),
    ("DEC_Q_BYTES", constants::DEC_Q_BYTES, "The single-query CTAs' Q tile (16 rows), in shared memory ahead of the ring."),
    ("DEC_BIAS_BYTES", constants::DEC_BIAS_BYTES, "A ring stage's staged rel_logits chunks (4 warps x 16 rows), after the K/V stages."),
    ("ATTN_SMEM_BYTES", constants::ATTN_SMEM_BYTES, "Shared memory of every attention CTA at least (Q, K and V tiles, the FMA loop's fp32 chunks, a minimal decode ring, the decode merge), plus SMEM_ALIGN of slack."),
    ("SMEM_ALIGN", constants::SMEM_ALIGN, "The alignment the kernels give their shared-memory tiles."),
    ("QUERY_SMEM_BYTES", constants::QUERY_SMEM_BYTES, "Launches without single-query CTAs: the query block's tiles."),
    ("QUERY_SMEM_BYTES_WG", constants::QUERY_SMEM_BYTES_WG, "The wgmma query blocks (sm_90a): also the staged rel_logits rows and two mbarriers."),
    ("QUERY_SMEM_BYTES_WG_WINDOW", constants::QUERY_SMEM_BYTES_WG_WINDOW, "Their windowed entries (`window_block`): also a second V tile and a third mbarrier."),
];

/// The text of `kernels/cuda/constants.cuh`, generated from `SHARED_CONSTANTS` (the file in the
/// repository is this text, for editors; a test keeps them equal).
pub fn constants_header() -> String {
    let mut t = String::from(
        "// Generated from kernels/src/gpu/source.rs (SHARED_CONSTANTS): edit the Rust constants,\n\
         // then write this file from `gpu::constants_header()` (a test prints it when they differ).\n\
         #pragma once\n",
    );
    for (name, value, what) in SHARED_CONSTANTS {
        t.push_str(&format!("// {what}\n#define {name} {value}\n"));
    }
    t
}

/// The name of a path's program of every stage in one storage dtype, e.g. `fallback_bf16.cu` (its
/// own file with `-DRELATTN_ONLY_<dtype>`); a program of one stage is named after its entry.
pub fn program_name(path: PathId, dtype: DType) -> String {
    format!("{}_{}.cu", path.as_str(), dtype.name())
}

/// The NVRTC option that keeps only `dtype`'s entries in a program (entry.cuh).
pub fn dtype_option(dtype: DType) -> String {
    format!("-DRELATTN_ONLY_{}", dtype.name())
}

/// The NVRTC option that keeps only `stage`'s entries in a program (entry.cuh).
pub fn stage_option(stage: Stage) -> String {
    format!("-DRELATTN_ONLY_STAGE_{}", stage.as_str())
}

/// The dtypes every program has entries for: the operator's (docs/operator.md section 2: bf16, fp16
/// also legal). fp32 is the reference's precision, not a storage dtype of the operator, so no
/// kernel is built for it and `plan_launches` refuses it.
pub const DTYPES: [DType; 2] = [DType::Bf16, DType::F16];

/// `{path}_{stage}_{dtype}`, e.g. `sheared_bias_combine_bf16`.
pub fn entry_name(path: PathId, stage: Stage, dtype: DType) -> String {
    format!("{}_{}_{}", path.as_str(), stage.as_str(), dtype.name())
}

/// Every entry of a path, in every dtype.
pub fn entries(path: PathId) -> Vec<String> {
    DTYPES.iter().flat_map(|&dt| entries_of(path, dt)).collect()
}

/// The entries of a path's program for one dtype.
pub fn entries_of(path: PathId, dtype: DType) -> Vec<String> {
    path_kernels(path)
        .stages
        .iter()
        .map(|&stage| entry_name(path, stage, dtype))
        .collect()
}
