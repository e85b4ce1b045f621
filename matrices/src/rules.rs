//! Which GPU path can take which case: the exclusion rules of tiers/paths.toml.
//!
//! Every rule states one requirement of one or more paths. A case that breaks a case-level
//! requirement is excluded from the path (every split setting is skipped); a split setting that
//! breaks a split-level requirement is skipped alone. Skips keep the rule's reason.

use crate::case::Case;
use crate::error::MatrixError;
use crate::split::SplitSetting;
use crate::PATHS;
use relattn_reference::DType;
use serde::Deserialize;

const PATHS_FILE: &str = "tiers/paths.toml";
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
    extent_multiple_of: Option<usize>,
    local_window_is_extent_minus_one: Option<bool>,
    dtypes: Option<Vec<String>>,
    head_dims: Option<Vec<usize>>,
    max_forced_splits: Option<usize>,
    forced_splits_decode_only: Option<bool>,
}

/// What a rule requires.
#[derive(Debug, Clone, PartialEq)]
pub enum Requirement {
    /// `E % n == 0`.
    ExtentMultipleOf(usize),
    /// On local layers `window_left + 1 == E`.
    LocalWindowIsExtentMinusOne,
    DTypes(Vec<DType>),
    HeadDims(Vec<usize>),
    /// Forced split counts at most `n` (`Policy` always passes: the route decides).
    MaxForcedSplits(usize),
    /// Forced split counts only on decode-only cases (every `Lq <= 1`).
    ForcedSplitsDecodeOnly,
}

/// One requirement of some paths, with the reason reports show when it excludes a trial.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    pub paths: Vec<&'static str>,
    pub reason: String,
    pub requirement: Requirement,
}

impl Rule {
    /// Case-level check: why the case breaks this rule (None: it does not, or the rule is
    /// about split settings).
    fn case_breaks(&self, case: &Case) -> Option<String> {
        let s = &case.spec;
        match &self.requirement {
            Requirement::ExtentMultipleOf(n) => {
                (!s.rel_extent.is_multiple_of(*n)).then(|| format!("E = {}", s.rel_extent))
            }
            Requirement::LocalWindowIsExtentMinusOne => {
                (relattn_reference::Window::from_left(s.window_left).is_local()
                    && !relattn_reference::window_spans_extent(s.window_left, s.rel_extent))
                .then(|| format!("window_left = {}, E = {}", s.window_left, s.rel_extent))
            }
            Requirement::DTypes(list) => {
                (!list.contains(&s.dtype)).then(|| format!("dtype {}", s.dtype))
            }
            Requirement::HeadDims(list) => {
                (!list.contains(&s.head_dim)).then(|| format!("head_dim {}", s.head_dim))
            }
            Requirement::MaxForcedSplits(_) | Requirement::ForcedSplitsDecodeOnly => None,
        }
    }

    /// Split-level check.
    fn split_breaks(&self, case: &Case, split: SplitSetting) -> Option<String> {
        let forced = split.forced()?;
        match self.requirement {
            Requirement::MaxForcedSplits(n) => (forced > n).then(|| format!("{forced} splits")),
            Requirement::ForcedSplitsDecodeOnly => (!case.is_decode_only())
                .then(|| format!("{forced} splits, longest query {}", case.max_query_len())),
            _ => None,
        }
    }
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

    /// Fill `case.excluded` and `case.excluded_splits`; the first broken rule gives the reason.
    pub fn apply(&self, case: &mut Case) {
        case.excluded.clear();
        case.excluded_splits.clear();
        for path in PATHS {
            let rules = || self.0.iter().filter(|r| r.paths.contains(&path));
            if let Some(reason) = rules().find_map(|r| r.case_breaks(case).map(|d| (r, d))) {
                let (rule, detail) = reason;
                case.excluded
                    .insert(path.to_string(), format!("{} ({detail})", rule.reason));
                continue;
            }
            for &split in &case.splits {
                if let Some((rule, detail)) =
                    rules().find_map(|r| r.split_breaks(case, split).map(|d| (r, d)))
                {
                    case.excluded_splits
                        .entry(path.to_string())
                        .or_default()
                        .insert(split, format!("{} ({detail})", rule.reason));
                }
            }
        }
    }
}

fn rule(file: &str, index: usize, r: RawRule) -> Result<Rule, MatrixError> {
    let key = |k: &str| format!("[[rule]] #{index}.{k}");
    let mut paths = Vec::new();
    for p in &r.paths {
        match PATHS.iter().find(|known| *known == p) {
            Some(known) => paths.push(*known),
            None => {
                let reason = format!("unknown path (expected one of {})", PATHS.join(", "));
                return Err(MatrixError::bad(
                    file,
                    key("paths"),
                    format!("{p:?}"),
                    reason,
                ));
            }
        }
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
    if let Some(n) = r.extent_multiple_of {
        if n == 0 {
            return Err(MatrixError::bad(
                file,
                key("extent_multiple_of"),
                0,
                "must be >= 1",
            ));
        }
        found.push(Requirement::ExtentMultipleOf(n));
    }
    if r.local_window_is_extent_minus_one == Some(true) {
        found.push(Requirement::LocalWindowIsExtentMinusOne);
    }
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
    if let Some(list) = &r.head_dims {
        found.push(Requirement::HeadDims(list.clone()));
    }
    if let Some(n) = r.max_forced_splits {
        if n == 0 {
            return Err(MatrixError::bad(
                file,
                key("max_forced_splits"),
                0,
                "must be >= 1",
            ));
        }
        found.push(Requirement::MaxForcedSplits(n));
    }
    if r.forced_splits_decode_only == Some(true) {
        found.push(Requirement::ForcedSplitsDecodeOnly);
    }
    if found.len() != 1 {
        let reason = "a rule states exactly one requirement (extent_multiple_of, \
                      local_window_is_extent_minus_one, dtypes, head_dims, max_forced_splits or \
                      forced_splits_decode_only)";
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
