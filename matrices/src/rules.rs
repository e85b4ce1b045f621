//! Which GPU path can take which case: each path's limits (`relattn_routing::PathSpec`, the same
//! the launch plans check), then the rules of tiers/paths.toml, which state what is not a limit of
//! a path's own: the dtypes the kernels are built for, and what a forced split count means.
//!
//! A case that breaks a case-level limit or rule is excluded from the path (every split setting
//! is skipped); a split setting that breaks a split-level one is skipped alone. Skips keep the
//! reason: the limit's rule or the rule's `reason`, then the case's values.

use crate::case::Case;
use crate::error::MatrixError;
use relattn_reference::DType;
use relattn_routing::SplitSetting;
use relattn_routing::{path_spec, PathCase, PathId, PathLimit};
use serde::Deserialize;

const PATHS_FILE: &str = "tiers/paths.toml";
/// Why relattn's own paths skip a case of the strided row layout.
pub const STRIDED_NATIVE: &str = "relattn's kernels take q, rel_logits and out dense: the strided \
     row layout (q a view of a fused projection) is for the workers' ops";
const PATHS_TOML: &str = include_str!("../tiers/paths.toml");

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRules {
    rule: Vec<RawRule>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    paths: Vec<String>,
    reason: String,
    dtypes: Option<Vec<String>>,
    forced_splits_decode_only: Option<bool>,
    // A path's own limits, which `PathSpec` states; read only to refuse them by name.
    extent_multiple_of: Option<toml::Value>,
    local_window_is_extent_minus_one: Option<toml::Value>,
    head_dims: Option<toml::Value>,
    max_forced_splits: Option<toml::Value>,
}

/// What a rule requires.
#[derive(Debug, Clone, PartialEq)]
pub enum Requirement {
    /// The storage dtype is one of these.
    DTypes(Vec<DType>),
    /// Forced split counts only on decode-only cases (every `Lq <= 1`).
    ForcedSplitsDecodeOnly,
}

/// One requirement of some paths, with the reason reports show when it excludes a trial.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    pub paths: Vec<PathId>,
    pub reason: String,
    pub requirement: Requirement,
}

impl Rule {
    /// Case-level check: why the case breaks this rule (None: it does not, or the rule is
    /// about split settings).
    fn case_breaks(&self, case: &Case) -> Option<String> {
        let dtype = case.facts().dtype;
        match &self.requirement {
            Requirement::DTypes(list) => (!list.contains(&dtype)).then(|| format!("dtype {dtype}")),
            Requirement::ForcedSplitsDecodeOnly => None,
        }
    }

    /// Split-level check.
    fn split_breaks(&self, case: &Case, split: SplitSetting) -> Option<String> {
        let forced = split.forced()?;
        match self.requirement {
            Requirement::ForcedSplitsDecodeOnly => (!case.is_decode_only())
                .then(|| format!("{forced} splits, longest query {}", case.max_query_len())),
            Requirement::DTypes(_) => None,
        }
    }
}

/// A skip's reason: the rule, then the case's values.
fn reason(rule: &str, detail: &str) -> String {
    format!("{rule} ({detail})")
}

fn limit_reason(limit: PathLimit) -> String {
    reason(&limit.rule(), &limit.detail())
}

/// The rules of tiers/paths.toml.
#[derive(Debug, Clone, PartialEq)]
pub struct Rules(pub Vec<Rule>);

impl Rules {
    pub fn builtin() -> Result<Rules, MatrixError> {
        Rules::parse(PATHS_TOML, PATHS_FILE)
    }

    pub fn parse(text: &str, file: &str) -> Result<Rules, MatrixError> {
        let raw: RawRules = toml::from_str(text).map_err(|e| MatrixError::Parse {
            file: file.to_string(),
            message: e.to_string(),
        })?;
        let mut rules = Vec::new();
        for (i, r) in raw.rule.into_iter().enumerate() {
            rules.push(rule(file, i + 1, r)?);
        }
        Ok(Rules(rules))
    }

    /// Fill `case.excluded` and `case.excluded_splits`: per path, the path's own limits first,
    /// then the rules in file order; the first one broken gives the reason. `policy` passes the
    /// split-level ones: the route decides the count, within the path's limits.
    pub fn apply(&self, case: &mut Case) {
        case.excluded.clear();
        case.excluded_splits.clear();
        let f = case.facts();
        let facts = PathCase {
            rel_extent: f.rel_extent,
            window_left: f.window_left,
            head_dim: f.head_dim,
        };
        for path in PathId::ALL {
            let spec = path_spec(path);
            let rules = || self.0.iter().filter(|r| r.paths.contains(&path));
            // relattn's kernels take q dense: the strided layout is for the workers' ops.
            if f.rows == relattn_reference::RowLayout::Strided {
                case.excluded.insert(path, STRIDED_NATIVE.to_string());
                continue;
            }
            let excluded = spec.check_case(&facts).err().map(limit_reason).or_else(|| {
                rules().find_map(|r| r.case_breaks(case).map(|d| reason(&r.reason, &d)))
            });
            if let Some(why) = excluded {
                case.excluded.insert(path, why);
                continue;
            }
            for &split in &case.splits {
                let Some(forced) = split.forced() else {
                    continue;
                };
                let skipped = spec
                    .check_splits(forced)
                    .err()
                    .map(limit_reason)
                    .or_else(|| {
                        rules().find_map(|r| {
                            r.split_breaks(case, split).map(|d| reason(&r.reason, &d))
                        })
                    });
                if let Some(why) = skipped {
                    case.excluded_splits
                        .entry(path)
                        .or_default()
                        .insert(split, why);
                }
            }
        }
    }
}

fn rule(file: &str, index: usize, r: RawRule) -> Result<Rule, MatrixError> {
    let key = |k: &str| format!("[[rule]] #{index}.{k}");
    for (name, value) in [
        ("extent_multiple_of", &r.extent_multiple_of),
        (
            "local_window_is_extent_minus_one",
            &r.local_window_is_extent_minus_one,
        ),
        ("head_dims", &r.head_dims),
        ("max_forced_splits", &r.max_forced_splits),
    ] {
        if let Some(value) = value {
            return Err(MatrixError::bad(
                file,
                key(name),
                value,
                "a limit of the path itself: relattn_routing::PathSpec states it (and the launch \
                 plans check it), not this file",
            ));
        }
    }
    let mut paths = Vec::new();
    for p in &r.paths {
        let path = p.parse::<PathId>().map_err(|_| {
            let reason = format!("unknown path (expected one of {})", PathId::names());
            MatrixError::bad(file, key("paths"), format!("{p:?}"), reason)
        })?;
        paths.push(path);
    }
    if paths.is_empty() {
        return Err(MatrixError::bad(
            file,
            key("paths"),
            "[]",
            "name at least one path",
        ));
    }
    if r.reason.trim().is_empty() {
        return Err(MatrixError::bad(
            file,
            key("reason"),
            "\"\"",
            "say why the path needs this",
        ));
    }
    let mut found = Vec::new();
    if let Some(list) = &r.dtypes {
        let mut dtypes = Vec::new();
        for d in list {
            let dtype = d
                .parse()
                .map_err(|e: String| MatrixError::bad(file, key("dtypes"), d, e))?;
            dtypes.push(dtype);
        }
        found.push(Requirement::DTypes(dtypes));
    }
    if r.forced_splits_decode_only == Some(true) {
        found.push(Requirement::ForcedSplitsDecodeOnly);
    }
    if found.len() != 1 {
        let reason = "a rule states exactly one requirement (dtypes or forced_splits_decode_only)";
        return Err(MatrixError::bad(
            file,
            format!("[[rule]] #{index}"),
            found.len(),
            reason,
        ));
    }
    let requirement = found.remove(0);
    Ok(Rule {
        paths,
        reason: r.reason,
        requirement,
    })
}
