//! Matrix files: parsing, checking every value, and expansion into cases.

use crate::case::{bias_name, canonical_form, case_id, Case, CaseSource};
use crate::count::{MAX_CASES, MAX_TRIALS};
use crate::error::MatrixError;
use crate::group::{check_group, Group, RawGroup};
use crate::layer::Layer;
use crate::mixes::Mix;
use crate::rules::Rules;
use crate::tolerance::{self, RawTolerance, Tolerances};
use relattn_reference::{BiasMode, CacheLayout, DType, GenSpec, Inputs, RowLayout};
use relattn_routing::PathId;
use relattn_routing::SplitSetting;
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};

/// A matrix file as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMatrix {
    #[serde(default)]
    description: String,
    #[serde(default)]
    tolerance: BTreeMap<String, RawTolerance>,
    #[serde(default)]
    group: Vec<RawGroup>,
}

/// A loaded, checked matrix (a tier or a user's file).
#[derive(Debug, Clone)]
pub struct Matrix {
    /// The tier name, or the file's stem.
    pub name: String,
    /// Where it came from (`tiers/smoke.toml`, or the path given), for messages.
    pub origin: String,
    pub description: String,
    groups: Vec<Group>,
    tolerances: Tolerances,
    rules: Rules,
}

/// The cases of a matrix and every (case, path, split) trial that will not run.
#[derive(Debug, Clone, PartialEq)]
pub struct Expansion {
    pub cases: Vec<Case>,
    pub skipped: Vec<Skip>,
}

/// A trial its path cannot take (a limit of the path's `PathSpec` or a rule of tiers/paths.toml).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skip {
    pub case_id: String,
    pub trial_name: String,
    pub path: PathId,
    pub split: SplitSetting,
    pub reason: String,
}

impl Expansion {
    /// Runnable trials per path (every path present, possibly 0).
    pub fn trials_per_path(&self) -> BTreeMap<PathId, usize> {
        let mut out: BTreeMap<PathId, usize> = PathId::ALL.iter().map(|p| (*p, 0)).collect();
        for case in &self.cases {
            for t in case.trials() {
                if t.skip.is_none() {
                    *out.entry(t.path).or_default() += 1;
                }
            }
        }
        out
    }
}

impl Matrix {
    /// Parse and check a matrix; `name` becomes each case's `tier`, `origin` prefixes errors.
    pub fn parse(text: &str, name: &str, origin: &str) -> Result<Matrix, MatrixError> {
        let raw: RawMatrix = toml::from_str(text).map_err(|e| MatrixError::Parse {
            file: origin.to_string(),
            message: e.to_string(),
        })?;
        let tolerances = tolerance::apply(origin, tolerance::defaults(), &raw.tolerance)?;
        let mut groups = Vec::with_capacity(raw.group.len());
        for (i, g) in raw.group.into_iter().enumerate() {
            groups.push(check_group(origin, i + 1, g)?);
        }
        // Every group is within the limits; so must all of them together be.
        let sum = |count: fn(&Group) -> u64| {
            groups
                .iter()
                .fold(0u64, |acc, g| acc.saturating_add(count(g)))
        };
        for (count, unit, limit) in [
            (sum(Group::case_count), "cases", MAX_CASES),
            (
                sum(Group::trial_count),
                "trials (cases x split settings x paths)",
                MAX_TRIALS,
            ),
        ] {
            if count > limit {
                return Err(MatrixError::TooMany {
                    file: origin.to_string(),
                    what: format!("its {} groups together", groups.len()),
                    count,
                    unit,
                    limit,
                });
            }
        }
        Ok(Matrix {
            name: name.to_string(),
            origin: origin.to_string(),
            description: raw.description,
            groups,
            tolerances,
            rules: Rules::builtin()?,
        })
    }

    /// Every case of the matrix, in group order then axis order, and the skipped trials.
    ///
    /// Two groups that produce the same case (same id) give one case whose split settings are
    /// the union of theirs; if they disagree on the regression class that is an error. Two
    /// different cases with one id (a hash collision) are an error too.
    pub fn expand(&self) -> Result<Expansion, MatrixError> {
        let mut cases: Vec<Case> = Vec::new();
        let mut index: HashMap<String, usize> = HashMap::new();
        for g in &self.groups {
            for case in self.group_cases(g) {
                let Some(&at) = index.get(&case.id) else {
                    index.insert(case.id.clone(), cases.len());
                    cases.push(case);
                    continue;
                };
                let first = &mut cases[at];
                let form = |c: &Case| c.spec().map(|s| canonical_form(s, c.sample_rows));
                if form(first) != form(&case) {
                    return Err(MatrixError::IdCollision {
                        file: self.origin.clone(),
                        id: case.id,
                        first: first.name.clone(),
                        second: case.name,
                    });
                }
                if first.regression != case.regression {
                    let show = |r: &Option<String>| r.clone().unwrap_or_else(|| "none".into());
                    return Err(MatrixError::ConflictingDuplicate {
                        file: self.origin.clone(),
                        id: case.id,
                        what: "regression classes".into(),
                        first: show(&first.regression),
                        second: show(&case.regression),
                    });
                }
                for s in case.splits {
                    if !first.splits.contains(&s) {
                        first.splits.push(s);
                    }
                }
                self.rules.apply(first);
            }
        }
        if cases.is_empty() {
            return Err(MatrixError::Empty {
                file: self.origin.clone(),
            });
        }
        let mut skipped = Vec::new();
        for case in &cases {
            for t in case.trials() {
                if let Some(reason) = t.skip {
                    skipped.push(Skip {
                        case_id: case.id.clone(),
                        trial_name: t.name,
                        path: t.path,
                        split: t.split,
                        reason,
                    });
                }
            }
        }
        Ok(Expansion { cases, skipped })
    }

    /// The group's cartesian product; the last axis (seeds) varies fastest.
    fn group_cases(&self, g: &Group) -> Vec<Case> {
        let dims = [
            g.layers.len(),
            g.heads.len(),
            g.head_dims.len(),
            g.page_sizes.len(),
            g.layouts.len(),
            g.dtypes.len(),
            g.mixes.len(),
            g.bias.len(),
            g.inputs.len(),
            g.seeds.len(),
        ];
        let total: usize = dims.iter().product();
        let mut out = Vec::with_capacity(total);
        for n in 0..total {
            let mut at = [0usize; 10];
            let mut rest = n;
            for k in (0..dims.len()).rev() {
                at[k] = rest % dims[k];
                rest /= dims[k];
            }
            let axes = Axes {
                layer: g.layers[at[0]],
                heads: g.heads[at[1]],
                head_dim: g.head_dims[at[2]],
                page: g.page_sizes[at[3]],
                layout: g.layouts[at[4]],
                dtype: g.dtypes[at[5]],
                mix: g.mixes[at[6]],
                bias: g.bias[at[7]],
                inputs: g.inputs[at[8]],
                seed: g.seeds[at[9]],
            };
            out.push(self.case(g, axes));
        }
        out
    }

    fn case(&self, g: &Group, a: Axes) -> Case {
        let shape = a.mix.shape(a.layer);
        let spec = GenSpec {
            dtype: a.dtype,
            num_heads: a.heads.0,
            num_kv_heads: a.heads.1,
            head_dim: a.head_dim,
            rel_extent: a.layer.extent,
            window_left: a.layer.window_left,
            softmax_scale: g.scale.unwrap_or(1.0 / a.head_dim as f64),
            page_size: a.page,
            layout: a.layout,
            requests: shape.requests,
            padding_rows: shape.padding_rows,
            bias: a.bias,
            pages: shape.pages,
            spare_pages: g.spare_pages,
            poison: g.poison,
            seed: a.seed,
            inputs: a.inputs,
            rows: g.rows,
        };
        let sample_rows = g.sample_rows.or(shape.sample_rows);
        let mut name = String::new();
        if let Some(class) = &g.regression {
            name.push_str(class);
            name.push_str("::");
        }
        name.push_str(&format!("{}::h{}_kv{}", a.layer, a.heads.0, a.heads.1));
        if a.head_dim != 128 {
            name.push_str(&format!("::d{}", a.head_dim));
        }
        name.push_str(&format!(
            "::page{}::{}::{}::{}::{}",
            a.page,
            a.layout.name(),
            a.dtype.name(),
            a.mix.name,
            bias_name(a.bias),
        ));
        // The default regime is left out, so names (and ids) from before the axis stand.
        if a.inputs != Inputs::Rms1 {
            name.push_str(&format!("::{}", a.inputs.name()));
        }
        name.push_str(&format!("::seed{}", a.seed));
        // Group scalars away from their defaults, so names of different cases rarely collide.
        if g.spare_pages != 1 {
            name.push_str(&format!("::spare{}", g.spare_pages));
        }
        if !g.poison {
            name.push_str("::no_poison");
        }
        if g.rows != RowLayout::Padded {
            name.push_str(&format!("::rows_{}", g.rows.name()));
        }
        if let Some(n) = g.sample_rows {
            name.push_str(&format!("::sample{n}"));
        }
        if g.scale.is_some() {
            name.push_str(&format!("::scale{}", spec.softmax_scale));
        }
        let mut case = Case {
            id: case_id(&spec, sample_rows),
            name,
            tier: self.name.clone(),
            mix: a.mix.name.to_string(),
            tolerance: self.tolerances[&a.dtype],
            source: CaseSource::Spec(spec),
            splits: g.splits.clone(),
            sample_rows,
            excluded: BTreeMap::new(),
            excluded_splits: BTreeMap::new(),
            regression: g.regression.clone(),
        };
        self.rules.apply(&mut case);
        case
    }
}

/// One point of a group's product.
struct Axes {
    layer: Layer,
    heads: (usize, usize),
    head_dim: usize,
    page: usize,
    layout: CacheLayout,
    dtype: DType,
    mix: &'static Mix,
    bias: BiasMode,
    inputs: Inputs,
    seed: u64,
}
