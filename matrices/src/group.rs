//! A matrix file's `[[group]]`: its axes as written, and the check that turns them into values.

use crate::count::{product, MAX_CASES, MAX_FORCED_SPLITS, MAX_SPLIT_SETTINGS, MAX_TRIALS};
use crate::error::MatrixError;
use crate::layer::Layer;
use crate::mixes::{mix, Mix, MIXES};
use crate::REGRESSION_CLASSES;
use relattn_reference::limits::Dim;
use relattn_reference::{BiasMode, CacheLayout, DType, GenSpec, Inputs, RowLayout};
use relattn_routing::PathId;
use relattn_routing::SplitSetting;
use serde::Deserialize;

/// A `[[group]]`: the cartesian product of its axes. Only `layers`, `heads` and `mixes` are
/// required; the other axes default to the model's values.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawGroup {
    layers: Vec<String>,
    /// `[H, Hkv]` pairs; read as lists so that a pair of the wrong length is an error, not cut.
    heads: Vec<Vec<usize>>,
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
    /// Input regimes (`relattn_reference::regime`); default `rms1`.
    #[serde(default = "default_inputs")]
    inputs: Vec<String>,
    /// Unused blocks and block-table slack past the last needed page.
    spare_pages: Option<usize>,
    /// NaN in every cache slot no request may read (default true).
    poison: Option<bool>,
    /// How q, rel_logits and out are laid out for the implementations: padded (default),
    /// strided or exact (`relattn_reference::RowLayout`).
    rows: Option<String>,
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
fn default_inputs() -> Vec<String> {
    vec!["rms1".into()]
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
    pub(crate) inputs: Vec<Inputs>,
    pub(crate) spare_pages: usize,
    pub(crate) poison: bool,
    pub(crate) rows: RowLayout,
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
    non_empty("inputs", g.inputs.len())?;
    // Counted from the lengths alone, before anything is parsed or built.
    let cases = product(&[
        g.layers.len(),
        g.heads.len(),
        g.mixes.len(),
        g.head_dims.len(),
        g.page_sizes.len(),
        g.layouts.len(),
        g.dtypes.len(),
        g.bias.len(),
        g.inputs.len(),
        g.seeds.len(),
    ]);
    if cases > MAX_CASES {
        return Err(MatrixError::TooMany {
            file: file.to_string(),
            what: format!("[[group]] #{index}"),
            count: cases,
            unit: "cases",
            limit: MAX_CASES,
        });
    }
    if g.splits.len() > MAX_SPLIT_SETTINGS {
        return Err(bad(
            "splits",
            &format!("a list of {} settings", g.splits.len()),
            &format!("a group has at most {MAX_SPLIT_SETTINGS} split settings"),
        ));
    }

    let quoted = |s: &String| format!("{s:?}");
    let mut layers = Vec::new();
    for s in &g.layers {
        layers.push(
            s.parse::<Layer>()
                .map_err(|e| bad("layers", &quoted(s), &e))?,
        );
    }
    let mut heads = Vec::new();
    for pair in &g.heads {
        let v = format!("{pair:?}");
        let &[h, hkv] = pair.as_slice() else {
            return Err(bad(
                "heads",
                &v,
                &format!(
                    "a head pair is [H, Hkv], two numbers; this one has {}",
                    pair.len()
                ),
            ));
        };
        for (dim, x) in [(Dim::Heads, h), (Dim::KvHeads, hkv)] {
            dim.check("a head count", x as u128)
                .map_err(|e| bad("heads", &v, &e.to_string()))?;
        }
        heads.push((h, hkv));
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
        Dim::HeadDim
            .check("the head dim", d as u128)
            .map_err(|e| bad("head_dims", &d, &e.to_string()))?;
    }
    for &p in &g.page_sizes {
        if p == 0 {
            return Err(bad("page_sizes", &p, "a page holds at least one token"));
        }
        Dim::PageSize
            .check("the page size", p as u128)
            .map_err(|e| bad("page_sizes", &p, &e.to_string()))?;
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
        if let Some(n) = parsed.forced().filter(|&n| n > MAX_FORCED_SPLITS) {
            return Err(bad(
                "splits",
                &n,
                &format!("a forced split count is at most {MAX_FORCED_SPLITS}"),
            ));
        }
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
    let mut inputs = Vec::new();
    for s in &g.inputs {
        let regime = s
            .parse::<Inputs>()
            .map_err(|e| bad("inputs", &quoted(s), &e))?;
        if !inputs.contains(&regime) {
            inputs.push(regime);
        }
    }
    let rows = match &g.rows {
        Some(s) => s
            .parse::<RowLayout>()
            .map_err(|e| bad("rows", &quoted(s), &e))?,
        None => RowLayout::Padded,
    };
    if g.sample_rows == Some(0) {
        return Err(bad("sample_rows", &0, "sample at least one row"));
    }
    if let Some(n) = g.sample_rows {
        Dim::SampleRows
            .check("sample_rows", n as u128)
            .map_err(|e| bad("sample_rows", &n, &e.to_string()))?;
    }
    let spare_pages = g.spare_pages.unwrap_or(1);
    Dim::Blocks
        .check("spare_pages", spare_pages as u128)
        .map_err(|e| bad("spare_pages", &spare_pages, &e.to_string()))?;
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
    check_lengths(file, index, &layers, &mixes, &g.page_sizes, spare_pages)?;
    let trials = cases
        .saturating_mul(splits.len() as u64)
        .saturating_mul(PathId::ALL.len() as u64);
    if trials > MAX_TRIALS {
        return Err(MatrixError::TooMany {
            file: file.to_string(),
            what: format!("[[group]] #{index}"),
            count: trials,
            unit: "trials (cases x split settings x paths)",
            limit: MAX_TRIALS,
        });
    }
    Ok(Group {
        layers,
        heads,
        mixes,
        head_dims: g.head_dims,
        page_sizes: g.page_sizes,
        layouts,
        dtypes,
        splits,
        seeds: g.seeds,
        bias,
        inputs,
        spare_pages,
        poison: g.poison.unwrap_or(true),
        rows,
        sample_rows: g.sample_rows,
        scale: g.scale,
        regression: g.regression,
    })
}

impl Group {
    /// Cases of the group's product (before merging duplicates), counted, not built.
    pub(crate) fn case_count(&self) -> u64 {
        product(&[
            self.layers.len(),
            self.heads.len(),
            self.mixes.len(),
            self.head_dims.len(),
            self.page_sizes.len(),
            self.layouts.len(),
            self.dtypes.len(),
            self.bias.len(),
            self.inputs.len(),
            self.seeds.len(),
        ])
    }

    /// Trials of the group: cases x split settings x GPU paths.
    pub(crate) fn trial_count(&self) -> u64 {
        self.case_count()
            .saturating_mul(self.splits.len() as u64)
            .saturating_mul(PathId::ALL.len() as u64)
    }
}

/// The lengths each (layer, mix, page size) of a group gives its cases (rows, `Lk`, blocks,
/// block-table width) against the operator's int32 ranges, so that no case fails late, as a
/// negative `seqused_k`, when it is generated. Heads and head dims are checked on their own.
fn check_lengths(
    file: &str,
    index: usize,
    layers: &[Layer],
    mixes: &[&'static Mix],
    page_sizes: &[usize],
    spare_pages: usize,
) -> Result<(), MatrixError> {
    let key_of = |field: &'static str| {
        match field {
            "rel_extent" => "layers",
            "page_size" => "page_sizes",
            "requests" => "mixes",
            "padding_rows" => "the mix's padding rows",
            other => other,
        }
        .to_string()
    };
    for &layer in layers {
        for mix in mixes {
            let shape = mix.shape(layer);
            for &page_size in page_sizes {
                let spec = GenSpec {
                    rel_extent: layer.extent,
                    window_left: layer.window_left,
                    page_size,
                    requests: shape.requests.clone(),
                    padding_rows: shape.padding_rows,
                    pages: shape.pages,
                    spare_pages,
                    ..GenSpec::global(1, 1, Vec::new(), 0)
                };
                spec.size_with(&key_of)
                    .map_err(|error| MatrixError::Limit {
                        file: file.to_string(),
                        key: format!("[[group]] #{index}"),
                        case: format!("layer {layer}, mix {}, page size {page_size}", mix.name),
                        error: Box::new(error),
                    })?;
            }
        }
    }
    Ok(())
}
