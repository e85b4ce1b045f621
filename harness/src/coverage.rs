//! `relattn matrix --coverage`: which (path, kernel entry, dtype) a tier's trials reach, crossed
//! with the features a launch can use, counted from the launch plans the GPU runs make
//! (`plan_launches` over `Geometry::of_spec`, the geometry the generated case has), not from a
//! second model of them.

use relattn_kernels::gpu::{
    bias_stages, has_single_query_ctas, kv_map_shape, path_kernels, plan_launches, streams_kv,
    BiasSource, Geometry, Stage, CTA_ROWS, KEY_TILE, WGMMA_ARCH,
};
use relattn_matrices::Case;
use relattn_reference::{DType, Inputs};
use relattn_routing::PathId;
use serde::Serialize;
use std::collections::BTreeMap;

/// The dtypes the GPU paths are built for.
pub use relattn_kernels::gpu::DTYPES;
/// GQA groups of docs/operator.md's tables and beyond.
pub const GROUPS: [usize; 5] = [1, 2, 4, 8, 16];

/// A column of the table: a feature a launch can use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Feature {
    /// More than one KV split (sheared_bias main and combine, fallback decode).
    SplitKv,
    /// Fallback decode splits cut into pieces.
    DecodePieces,
    /// Decode rows in single-query CTAs.
    SingleQuery,
    /// A decode-only batch streaming K/V through the single-query ring.
    StreamedKv,
    /// K/V tiles by tensor copy (TMA) on sm_90a.
    TensorCopy,
    /// rel_logits staged in shared memory (E a multiple of 8).
    StagedBias,
    /// rel_logits gathered per cell (E not a multiple of 8).
    GatheredBias,
    /// A KV length that is not a multiple of the 64-key tile.
    PartialTile,
    PaddingRows,
    Group(usize),
    /// Page sizes below 64, 64 to 128, above 128, not a power of two.
    PageSmall,
    PageMid,
    PageLarge,
    PageNotPow2,
    Regime(Inputs),
}

impl Feature {
    pub fn all() -> Vec<Feature> {
        let mut v = vec![
            Feature::SplitKv,
            Feature::DecodePieces,
            Feature::SingleQuery,
            Feature::StreamedKv,
            Feature::TensorCopy,
            Feature::StagedBias,
            Feature::GatheredBias,
            Feature::PartialTile,
            Feature::PaddingRows,
        ];
        v.extend(GROUPS.map(Feature::Group));
        v.extend([
            Feature::PageSmall,
            Feature::PageMid,
            Feature::PageLarge,
            Feature::PageNotPow2,
        ]);
        v.extend(Inputs::ALL.map(Feature::Regime));
        v
    }

    pub fn name(self) -> String {
        match self {
            Feature::SplitKv => "split_kv".into(),
            Feature::DecodePieces => "decode_pieces".into(),
            Feature::SingleQuery => "single_query".into(),
            Feature::StreamedKv => "streamed_kv".into(),
            Feature::TensorCopy => "tensor_copy".into(),
            Feature::StagedBias => "staged_bias".into(),
            Feature::GatheredBias => "gathered_bias".into(),
            Feature::PartialTile => "partial_tile".into(),
            Feature::PaddingRows => "padding_rows".into(),
            Feature::Group(g) => format!("G{g}"),
            Feature::PageSmall => "page<64".into(),
            Feature::PageMid => "page64-128".into(),
            Feature::PageLarge => "page>128".into(),
            Feature::PageNotPow2 => "page_npot".into(),
            Feature::Regime(r) => r.name().into(),
        }
    }

    /// Whether a launch of `stage` on `path` can use the feature at all (the table's cells that
    /// must be reached; the others print `-`).
    pub fn applies(self, path: PathId, stage: Stage) -> bool {
        let query = matches!(stage, Stage::Main | Stage::Windowed);
        let kernels = path_kernels(path);
        match self {
            Feature::SplitKv => kernels.split_stages.contains(&stage),
            Feature::DecodePieces => stage == Stage::Decode,
            Feature::SingleQuery | Feature::StreamedKv | Feature::TensorCopy => query,
            // Only rows that read rel_logits stage or gather it (a prologue's buffer is neither).
            Feature::StagedBias | Feature::GatheredBias => {
                kernels.bias == BiasSource::RelLogits && (query || stage == Stage::Decode)
            }
            // Prologue and combine work per query row: KV tiles and pages are not theirs.
            Feature::PartialTile
            | Feature::PageSmall
            | Feature::PageMid
            | Feature::PageLarge
            | Feature::PageNotPow2 => !matches!(stage, Stage::Prologue | Stage::Combine),
            Feature::PaddingRows | Feature::Group(_) | Feature::Regime(_) => true,
        }
    }
}

/// A row of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Entry {
    pub path: PathId,
    pub stage: Stage,
    pub dtype: DType,
}

/// Per entry, the cases whose trials reach each feature.
#[derive(Debug, Default)]
pub struct Coverage {
    pub cells: BTreeMap<(Entry, Feature), usize>,
    /// Runnable trials `plan_launches` refused, as `trial: reason` (none in a healthy tier:
    /// the exclusion rules keep such trials out).
    pub unplanned: Vec<String>,
}

/// The features a launch of `stage` in one plan of a case uses.
fn features(
    case: &Case,
    g: &Geometry,
    stage: Stage,
    num_splits: usize,
    pieces: usize,
) -> Vec<Feature> {
    let mut f = Vec::new();
    if num_splits > 1 {
        f.push(Feature::SplitKv);
    }
    if pieces > 1 {
        f.push(Feature::DecodePieces);
    }
    if has_single_query_ctas(g) {
        f.push(Feature::SingleQuery);
    }
    if streams_kv(g) {
        f.push(Feature::StreamedKv);
    }
    // Query-block CTAs (some request with more than one new token) copy K/V tiles by TMA.
    let q_lens = || g.shape.requests.iter().map(|r| r.0);
    let query_blocks = !g.decode_only();
    if query_blocks && kv_map_shape(g, &g.k, WGMMA_ARCH).is_some() {
        f.push(Feature::TensorCopy);
    }
    // The decode entry stages rel_logits whenever E allows; a query block only when its CTA's
    // rows are all real (a request's full tile), and single-query CTAs in query launches gather.
    let rows_per_cta = (CTA_ROWS / g.group().max(1)).max(1);
    let (staged, gathered) = if stage == Stage::Decode {
        (bias_stages(g), !bias_stages(g))
    } else {
        let full = q_lens().any(|q| q > 1 && q >= rows_per_cta);
        let partial = q_lens().any(|q| q == 1 || (q > 1 && q % rows_per_cta != 0));
        (bias_stages(g) && full, !bias_stages(g) || partial)
    };
    if staged {
        f.push(Feature::StagedBias);
    }
    if gathered {
        f.push(Feature::GatheredBias);
    }
    if g.shape.requests.iter().any(|r| r.1 % KEY_TILE != 0) {
        f.push(Feature::PartialTile);
    }
    if g.total_rows > g.real_rows {
        f.push(Feature::PaddingRows);
    }
    let group = g.group();
    if GROUPS.contains(&group) {
        f.push(Feature::Group(group));
    }
    let page = g.page_size;
    f.push(match page {
        0..64 => Feature::PageSmall,
        64..=128 => Feature::PageMid,
        _ => Feature::PageLarge,
    });
    if !page.is_power_of_two() {
        f.push(Feature::PageNotPow2);
    }
    if let Some(spec) = case.spec() {
        f.push(Feature::Regime(spec.inputs));
    }
    f
}

/// The coverage of a tier's runnable trials.
pub fn of_cases(cases: &[Case]) -> Coverage {
    let mut cov = Coverage::default();
    for case in cases {
        let Some(spec) = case.spec() else {
            cov.unplanned.push(format!(
                "case {}: a case file (coverage plans generated cases)",
                case.id
            ));
            continue;
        };
        let g = match Geometry::of_spec(spec) {
            Ok(g) => g,
            Err(e) => {
                cov.unplanned.push(format!("case {}: {e}", case.id));
                continue;
            }
        };
        let mut seen = std::collections::BTreeSet::new();
        for trial in case.trials().into_iter().filter(|t| t.skip.is_none()) {
            let path = trial.path;
            let plan = match plan_launches(path, &g, trial.split) {
                Ok(plan) => plan,
                Err(e) => {
                    cov.unplanned.push(format!("{}: {e}", trial.name));
                    continue;
                }
            };
            for launch in &plan.launches {
                let feats = features(case, &g, launch.stage, plan.num_splits, plan.decode_pieces);
                let entry = Entry {
                    path,
                    stage: launch.stage,
                    dtype: g.dtype,
                };
                for &f in &feats {
                    if f.applies(path, launch.stage) && seen.insert((entry, f)) {
                        *cov.cells.entry((entry, f)).or_default() += 1;
                    }
                }
            }
        }
    }
    cov
}

/// Every entry the launch plans can choose.
pub fn entries() -> Vec<Entry> {
    let mut v = Vec::new();
    for path in PathId::ALL {
        for &stage in path_kernels(path).stages {
            for dtype in DTYPES {
                v.push(Entry { path, stage, dtype });
            }
        }
    }
    v
}

impl Coverage {
    pub fn count(&self, e: Entry, f: Feature) -> usize {
        self.cells.get(&(e, f)).copied().unwrap_or(0)
    }

    /// Cells that apply and no case reaches.
    pub fn gaps(&self) -> Vec<(Entry, Feature)> {
        let mut out = Vec::new();
        for e in entries() {
            for f in Feature::all() {
                if f.applies(e.path, e.stage) && self.count(e, f) == 0 {
                    out.push((e, f));
                }
            }
        }
        out
    }

    /// One table per path: a row per feature the path can use, a column per kernel entry and
    /// dtype (`-`: that entry cannot use the feature).
    pub fn table(&self) -> String {
        let mut out = String::new();
        for path in PathId::ALL {
            let cols: Vec<Entry> = entries().into_iter().filter(|e| e.path == path).collect();
            let names: Vec<String> = cols
                .iter()
                .map(|e| format!("{} {}", e.stage.as_str(), e.dtype.name()))
                .collect();
            let mut header = vec![path.as_str()];
            header.extend(names.iter().map(String::as_str));
            let mut t = crate::table::new(&header, &(1..header.len()).collect::<Vec<_>>());
            for f in Feature::all() {
                if !cols.iter().any(|e| f.applies(e.path, e.stage)) {
                    continue;
                }
                let mut row = vec![f.name()];
                row.extend(cols.iter().map(|&e| {
                    if f.applies(e.path, e.stage) {
                        self.count(e, f).to_string()
                    } else {
                        "-".into()
                    }
                }));
                t.add_row(row);
            }
            out.push_str(&crate::table::text(&t));
            out.push('\n');
        }
        out
    }

    pub fn json(&self) -> serde_json::Value {
        let rows: Vec<_> = entries()
            .into_iter()
            .map(|e| {
                let counts: serde_json::Map<String, serde_json::Value> = Feature::all()
                    .into_iter()
                    .filter(|f| f.applies(e.path, e.stage))
                    .map(|f| (f.name(), self.count(e, f).into()))
                    .collect();
                serde_json::json!({
                    "path": e.path.as_str(),
                    "entry": e.stage.as_str(),
                    "dtype": e.dtype.name(),
                    "cases": counts,
                })
            })
            .collect();
        let gaps: Vec<_> = self
            .gaps()
            .into_iter()
            .map(|(e, f)| {
                serde_json::json!({
                    "path": e.path.as_str(),
                    "entry": e.stage.as_str(),
                    "dtype": e.dtype.name(),
                    "feature": f.name(),
                })
            })
            .collect();
        serde_json::json!({ "rows": rows, "gaps": gaps, "unplanned": self.unplanned })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use relattn_matrices::{Requirement, Rules};

    /// tiers/paths.toml lets through, on every path, exactly the dtypes the kernels have entries
    /// for: the one rule of that file the launch plans also check.
    #[test]
    fn the_dtype_rule_is_the_kernels_entries() {
        let rules = Rules::builtin().unwrap().0;
        for path in PathId::ALL {
            let dtypes: Vec<_> = rules
                .iter()
                .filter(|r| r.paths.contains(&path))
                .filter_map(|r| match &r.requirement {
                    Requirement::DTypes(list) => Some(list.clone()),
                    _ => None,
                })
                .collect();
            assert_eq!(dtypes, [DTYPES.to_vec()], "{path}");
        }
    }
}
