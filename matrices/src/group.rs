//! A matrix file's `[[group]]`: its axes as written, and the check that turns them into values.

use crate::error::MatrixError;
use crate::layer::Layer;
use crate::mixes::{mix, Mix, MIXES};
use crate::split::SplitSetting;
use crate::REGRESSION_CLASSES;
use relattn_reference::{BiasMode, CacheLayout, DType};
use serde::Deserialize;

/// A `[[group]]`: the cartesian product of its axes. Only `layers`, `heads` and `mixes` are
/// required; the other axes default to the model's values.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawGroup {
    layers: Vec<String>,
    heads: Vec<[usize; 2]>,
    mixes: Vec<String>,
    #[serde(default = "default_head_dims")]
    head_dims: Vec<usize>,
    #[serde(default = "default_page_sizes")]
    page_sizes: Vec<usize>,
    #[serde(default = "default_layouts")]
    layouts: Vec<String>,
    #[serde(default = "default_dtypes")]
    dtypes: Vec<String>,
    #[serde(default = "default_splits")]
    splits: Vec<RawSplit>,
    #[serde(default = "default_seeds")]
    seeds: Vec<u64>,
    #[serde(default = "default_bias")]
    bias: Vec<String>,
    /// Unused blocks and block-table slack past the last needed page.
    spare_pages: Option<usize>,
    /// NaN in every cache slot no request may read (default true).
    poison: Option<bool>,
    /// Overrides the mix's sampled-row count.
    sample_rows: Option<usize>,
    /// `softmax_scale` (default 1 / head_dim, the model's).
    scale: Option<f64>,
    /// Marks the group's cases as the regression case of this bug class.
    regression: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum RawSplit {
    Count(i64),
    Text(String),
}

fn default_head_dims() -> Vec<usize> {
    vec![128]
}
fn default_page_sizes() -> Vec<usize> {
    vec![16]
}
fn default_layouts() -> Vec<String> {
    vec!["nhd_packed".into()]
}
fn default_dtypes() -> Vec<String> {
    vec!["bf16".into()]
}
fn default_splits() -> Vec<RawSplit> {
    vec![RawSplit::Text("policy".into())]
}
fn default_seeds() -> Vec<u64> {
    vec![1]
}
fn default_bias() -> Vec<String> {
    vec!["normal".into()]
}

/// A checked group.
#[derive(Debug, Clone)]
pub(crate) struct Group {
    pub(crate) layers: Vec<Layer>,
    pub(crate) heads: Vec<(usize, usize)>,
    pub(crate) mixes: Vec<&'static Mix>,
    pub(crate) head_dims: Vec<usize>,
    pub(crate) page_sizes: Vec<usize>,
    pub(crate) layouts: Vec<CacheLayout>,
    pub(crate) dtypes: Vec<DType>,
    pub(crate) splits: Vec<SplitSetting>,
    pub(crate) seeds: Vec<u64>,
    pub(crate) bias: Vec<BiasMode>,
    pub(crate) spare_pages: usize,
    pub(crate) poison: bool,
    pub(crate) sample_rows: Option<usize>,
    pub(crate) scale: Option<f64>,
    pub(crate) regression: Option<String>,
}

pub(crate) fn check_group(file: &str, index: usize, g: RawGroup) -> Result<Group, MatrixError> {
    let key = |k: &str| format!("[[group]] #{index}.{k}");
    let bad = |k: &str, v: &dyn std::fmt::Display, reason: &str| {
        MatrixError::bad(file, key(k), v, reason)
    };
    let non_empty = |k: &str, len: usize| {
        if len == 0 {
            Err(bad(
                k,
                &"[]",
                "an empty axis expands to no cases; list at least one value",
            ))
        } else {
            Ok(())
        }
    };
    non_empty("layers", g.layers.len())?;
    non_empty("heads", g.heads.len())?;
    non_empty("mixes", g.mixes.len())?;
    non_empty("head_dims", g.head_dims.len())?;
    non_empty("page_sizes", g.page_sizes.len())?;
    non_empty("layouts", g.layouts.len())?;
    non_empty("dtypes", g.dtypes.len())?;
    non_empty("splits", g.splits.len())?;
    non_empty("seeds", g.seeds.len())?;
    non_empty("bias", g.bias.len())?;

    let quoted = |s: &String| format!("{s:?}");
    let mut layers = Vec::new();
    for s in &g.layers {
        layers.push(
            s.parse::<Layer>()
                .map_err(|e| bad("layers", &quoted(s), &e))?,
        );
    }
    for &[h, hkv] in &g.heads {
        let v = format!("[{h}, {hkv}]");
        if h == 0 || hkv == 0 || !h.is_multiple_of(hkv) {
            return Err(bad(
                "heads",
                &v,
                "H and Hkv must be positive and H a multiple of Hkv",
            ));
        }
    }
    let mut mixes = Vec::new();
    for s in &g.mixes {
        let names: Vec<&str> = MIXES.iter().map(|m| m.name).collect();
        let reason = format!("unknown mix (known: {})", names.join(", "));
        mixes.push(mix(s).ok_or_else(|| bad("mixes", &quoted(s), &reason))?);
    }
    for &d in &g.head_dims {
        if d == 0 {
            return Err(bad("head_dims", &d, "a head dim must be at least 1"));
        }
    }
    for &p in &g.page_sizes {
        if p == 0 {
            return Err(bad("page_sizes", &p, "a page holds at least one token"));
        }
    }
    let mut layouts = Vec::new();
    for s in &g.layouts {
        layouts.push(
            s.parse()
                .map_err(|e: String| bad("layouts", &quoted(s), &e))?,
        );
    }
    let mut dtypes = Vec::new();
    for s in &g.dtypes {
        dtypes.push(
            s.parse()
                .map_err(|e: String| bad("dtypes", &quoted(s), &e))?,
        );
    }
    let mut splits = Vec::new();
    for s in &g.splits {
        let parsed = match s {
            RawSplit::Count(n) if *n >= 1 => Ok(SplitSetting::Forced(*n as usize)),
            RawSplit::Count(n) => Err(bad("splits", n, "a forced split count must be at least 1")),
            RawSplit::Text(t) => t
                .parse::<SplitSetting>()
                .map_err(|e| bad("splits", &quoted(t), &e)),
        }?;
        if !splits.contains(&parsed) {
            splits.push(parsed);
        }
    }
    let mut bias = Vec::new();
    for s in &g.bias {
        let mode = match s.as_str() {
            "normal" => BiasMode::Normal,
            "distinct" => BiasMode::Distinct,
            "zero" => BiasMode::Zero,
            _ => {
                return Err(bad(
                    "bias",
                    &quoted(s),
                    "unknown bias mode (normal, distinct or zero)",
                ))
            }
        };
        bias.push(mode);
    }
    if g.sample_rows == Some(0) {
        return Err(bad("sample_rows", &0, "sample at least one row"));
    }
    if let Some(s) = g.scale {
        if !(s.is_finite() && s > 0.0) {
            return Err(bad(
                "scale",
                &s,
                "the softmax scale must be a finite number > 0",
            ));
        }
    }
    if let Some(class) = &g.regression {
        if !REGRESSION_CLASSES.iter().any(|(c, _)| c == class) {
            let known: Vec<&str> = REGRESSION_CLASSES.iter().map(|(c, _)| *c).collect();
            let reason = format!("unknown bug class (known: {})", known.join(", "));
            return Err(bad("regression", &quoted(class), &reason));
        }
    }
    Ok(Group {
        layers,
        heads: g.heads.iter().map(|&[h, k]| (h, k)).collect(),
        mixes,
        head_dims: g.head_dims,
        page_sizes: g.page_sizes,
        layouts,
        dtypes,
        splits,
        seeds: g.seeds,
        bias,
        spare_pages: g.spare_pages.unwrap_or(1),
        poison: g.poison.unwrap_or(true),
        sample_rows: g.sample_rows,
        scale: g.scale,
        regression: g.regression,
    })
}
