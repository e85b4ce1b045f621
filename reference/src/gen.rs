//! Seeded realistic inputs (SPEC section 1 "producer facts").

use crate::dtype::DType;
use crate::problem::{CacheLayout, Problem};
use serde::{Deserialize, Serialize};

/// How `rel_logits` is filled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BiasMode {
    /// `r[t,h,0..16] @ proj[16,E]`, r and proj standard normal (scaled so entries have unit
    /// variance), rounded to the dtype (the model's producer).
    Normal,
    /// Every (t, h, e) cell holds a different value, so index errors cannot cancel.
    Distinct,
    /// All zero (plain causal attention).
    Zero,
}

/// How logical pages map to physical blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PageMode {
    /// Every needed page gets its own physical block, shuffled; block 0 is never used.
    Shuffled,
    /// Every entry of the block table is 0 (every request aliases block 0).
    AllZero,
}

/// Everything that determines a generated case. Equal specs give bit-identical problems.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GenSpec {
    pub dtype: DType,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rel_extent: usize,
    /// -1 = global layer.
    pub window_left: i64,
    pub softmax_scale: f64,
    pub page_size: usize,
    pub layout: CacheLayout,
    /// `(Lq_b, Lk_b)` per request.
    pub requests: Vec<(usize, usize)>,
    /// Padding rows after `cu_seqlens_q[B]` (filled with NaN).
    pub padding_rows: usize,
    pub bias: BiasMode,
    pub pages: PageMode,
    /// Extra unused physical blocks and block-table slack (pages past the last needed one).
    pub spare_pages: usize,
    /// Fill every cache slot no request may read with NaN.
    pub poison: bool,
    pub seed: u64,
}

impl GenSpec {
    /// A small global-layer spec with the model's defaults (bf16, D = 128, scale 1/D,
    /// page 16, NHD packed, normal bias, shuffled pages, poison on).
    pub fn global(num_heads: usize, num_kv_heads: usize, requests: Vec<(usize, usize)>, seed: u64) -> GenSpec {
        GenSpec {
            dtype: DType::Bf16,
            num_heads,
            num_kv_heads,
            head_dim: 128,
            rel_extent: 1024,
            window_left: -1,
            softmax_scale: 1.0 / 128.0,
            page_size: 16,
            layout: CacheLayout::NhdPacked,
            requests,
            padding_rows: 0,
            bias: BiasMode::Normal,
            pages: PageMode::Shuffled,
            spare_pages: 1,
            poison: true,
            seed,
        }
    }

    /// Same as `global` with a local layer: window `extent - 1`, `E = extent`.
    pub fn local(num_heads: usize, num_kv_heads: usize, extent: usize, requests: Vec<(usize, usize)>, seed: u64) -> GenSpec {
        GenSpec { rel_extent: extent, window_left: extent as i64 - 1, ..GenSpec::global(num_heads, num_kv_heads, requests, seed) }
    }
}

/// Build the problem a spec describes.
pub fn generate(spec: &GenSpec) -> Result<Problem, crate::problem::ProblemError> {
    let _ = spec;
    unimplemented!("generate")
}
