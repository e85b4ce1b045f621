//! Storage dtypes of the operator's tensors and rounding to them.

use half::{bf16, f16};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Storage dtype of q, the caches, rel_logits and out.
///
/// Tensors are held in memory as `f32` values that are exactly representable in the dtype
/// (bf16 and fp16 values are all exact in f32), so the reference reads "inputs as stored".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    Bf16,
    F16,
    F32,
}

impl DType {
    pub const ALL: [DType; 3] = [DType::Bf16, DType::F16, DType::F32];

    /// Round an f32 to the nearest value of this dtype (round to nearest even), returned as f32.
    #[inline]
    pub fn round(self, x: f32) -> f32 {
        match self {
            DType::Bf16 => bf16::from_f32(x).to_f32(),
            DType::F16 => f16::from_f32(x).to_f32(),
            DType::F32 => x,
        }
    }

    /// Spacing of representable values at 1.0 (the default `atol` of docs/operator.md section 6).
    pub fn spacing_at_one(self) -> f64 {
        match self {
            DType::Bf16 => 2f64.powi(-7),
            DType::F16 => 2f64.powi(-10),
            DType::F32 => 2f64.powi(-23),
        }
    }

    /// Bytes per element as stored.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::Bf16 | DType::F16 => 2,
            DType::F32 => 4,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::Bf16 => "bf16",
            DType::F16 => "fp16",
            DType::F32 => "fp32",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "bf16" | "bfloat16" => Ok(DType::Bf16),
            "fp16" | "f16" | "float16" | "half" => Ok(DType::F16),
            "fp32" | "f32" | "float32" => Ok(DType::F32),
            other => Err(format!(
                "unknown dtype `{other}` (expected bf16, fp16 or fp32)"
            )),
        }
    }
}
