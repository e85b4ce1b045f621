//! The CUDA C sources (real files under `kernels/cuda/`, embedded) and the names of their entries.
//!
//! One NVRTC program per path: the path's `.cu` file, which `#include`s the shared device code
//! (`attention.cuh`, which includes `cta.cuh`, which includes `common.cuh`), handed to NVRTC as
//! in-memory headers. Entries are `extern "C"` kernels named `{path}_{stage}_{dtype}`.

#![deny(unsafe_code)]

use crate::routing::PathId;
use relattn_reference::DType;

/// Device code every program starts with, in order: basics and loads, the attention CTA's
/// building blocks, the attention loops.
pub const COMMON: &str = include_str!("../../cuda/common.cuh");
pub const CTA: &str = include_str!("../../cuda/cta.cuh");
pub const ATTENTION: &str = include_str!("../../cuda/attention.cuh");
pub const SHARED: [(&str, &str); 3] = [
    ("common.cuh", COMMON),
    ("cta.cuh", CTA),
    ("attention.cuh", ATTENTION),
];
pub const SCORE_MOD: &str = include_str!("../../cuda/score_mod.cu");
pub const SHEARED_BIAS: &str = include_str!("../../cuda/sheared_bias.cu");
pub const FALLBACK: &str = include_str!("../../cuda/fallback.cu");

/// The files a program is made of, in order, as (name, text): the shared ones, then the path's.
pub fn files(path: PathId) -> Vec<(&'static str, &'static str)> {
    let own = match path {
        PathId::ScoreMod => ("score_mod.cu", SCORE_MOD),
        PathId::ShearedBias => ("sheared_bias.cu", SHEARED_BIAS),
        PathId::Fallback => ("fallback.cu", FALLBACK),
    };
    SHARED.into_iter().chain([own]).collect()
}

/// The path's own file, as (name, text).
pub fn own_file(path: PathId) -> (&'static str, &'static str) {
    *files(path).last().expect("a path has its own file")
}

/// The text NVRTC compiles for a path: the path's own file, which includes the shared headers
/// (`headers()`, given to NVRTC in memory).
pub fn program_source(path: PathId) -> String {
    own_file(path).1.to_string()
}

/// The headers a program may include, as (include name, text).
pub fn headers() -> Vec<(String, String)> {
    SHARED
        .iter()
        .map(|(name, text)| (name.to_string(), text.to_string()))
        .collect()
}

/// The program's name in NVRTC logs and errors.
pub fn program_name(path: PathId) -> String {
    format!("{}.cu", path.as_str())
}

/// A kernel stage of a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Stage {
    /// sheared_bias: build the sheared bias buffer.
    Prologue,
    /// The tiled flash kernel of every path.
    Main,
    /// score_mod and fallback: the same kernel for windowed layers, whose query blocks also stage
    /// the bias rows of tiles that need masks (its own entry, so the global layers' kernel keeps
    /// its registers).
    Windowed,
    /// sheared_bias: merge split partials.
    Combine,
    /// fallback: split-KV decode (stage 1 in every CTA, stage 2, the merge, in the last CTA of
    /// each request and KV head).
    Decode,
}

impl Stage {
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Prologue => "prologue",
            Stage::Main => "main",
            Stage::Windowed => "windowed",
            Stage::Combine => "combine",
            Stage::Decode => "decode",
        }
    }

    /// Whether the stage runs attention CTAs, which take the launch's dynamic shared memory
    /// (the query blocks' tiles or the decode ring) and set the ring depth.
    pub fn is_attention(self) -> bool {
        match self {
            Stage::Main | Stage::Windowed | Stage::Decode => true,
            Stage::Prologue | Stage::Combine => false,
        }
    }

    /// The stages a path's program defines.
    pub fn of(path: PathId) -> &'static [Stage] {
        match path {
            PathId::ScoreMod => &[Stage::Main, Stage::Windowed],
            PathId::ShearedBias => &[Stage::Prologue, Stage::Main, Stage::Combine],
            PathId::Fallback => &[Stage::Main, Stage::Windowed, Stage::Decode],
        }
    }
}

/// The dtypes every program has entries for: the operator's (SPEC 2: bf16, fp16 also legal).
/// fp32 is the reference's precision, not a storage dtype of the operator, so no kernel is built
/// for it and `plan_launches` refuses it.
pub const DTYPES: [DType; 2] = [DType::Bf16, DType::F16];

/// `{path}_{stage}_{dtype}`, e.g. `sheared_bias_combine_bf16`.
pub fn entry_name(path: PathId, stage: Stage, dtype: DType) -> String {
    format!("{}_{}_{}", path.as_str(), stage.as_str(), dtype.name())
}

/// Every entry of a path's program.
pub fn entries(path: PathId) -> Vec<String> {
    Stage::of(path)
        .iter()
        .flat_map(|&stage| DTYPES.iter().map(move |&dt| entry_name(path, stage, dt)))
        .collect()
}
