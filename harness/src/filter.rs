//! Selecting trials by name and parameters, as pytest's `-k` and nextest's filtersets do: one
//! small expression shared by `run --filter`, `matrix --show --filter` and the `cargo test`
//! trials (`RELATTN_FILTER`).
//!
//! An expression is terms joined by `&`, all of which must hold:
//! - `key=v1,v2`: the parameter is one of the values, whole (`path=vllm/vllm_op` is not
//!   `vllm/vllm_op_sheared`, `page_size=16` not 160); on a key whose values are families
//!   ([`FAMILY_KEYS`]: `layer`), a value also matches a longer one that continues it with `_`
//!   (`layer=local` matches `local_e512`);
//! - `key!=v1,v2`: it is none of them;
//! - `key~text`: its value contains `text` (`name~c97f5` for part of a trial name).
//!
//! Keys: `name` (the trial's name), `path` (`fallback`, `score_mod`, `sheared_bias`, a worker's
//! `<name>/<path>`, `routing`, `reference`), `case` (the case id), and every case parameter of
//! the reports (`layer`, `dtype`, `mix`, `page_size`, `num_heads`, ...).

use crate::trial_list::Trial;
use relattn_matrices::Case;
use relattn_routing::PathId;

/// Keys that are not case parameters.
const TRIAL_KEYS: [&str; 3] = ["name", "path", "case"];

/// Keys whose values name a family and its members (`local`, `local_e512`): every other key's
/// values are names, matched whole.
pub const FAMILY_KEYS: [&str; 1] = ["layer"];

#[derive(Debug, Clone, PartialEq, Eq)]
enum Op {
    In(Vec<String>),
    NotIn(Vec<String>),
    Contains(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Term {
    key: String,
    op: Op,
}

/// A parsed expression (`Filter::parse`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Filter {
    terms: Vec<Term>,
}

/// Whether `value` is `wanted`, or continues it with `_` (a member of the family `wanted`).
fn in_family(value: &str, wanted: &str) -> bool {
    value == wanted
        || value
            .strip_prefix(wanted)
            .is_some_and(|rest| rest.starts_with('_'))
}

impl Filter {
    /// Parse `text`; an unknown key or a term without an operator is a message for the user.
    pub fn parse(text: &str) -> Result<Filter, String> {
        let known: Vec<&str> = TRIAL_KEYS
            .iter()
            .copied()
            .chain(Case::PARAM_KEYS.iter().copied())
            .collect();
        let mut terms = Vec::new();
        for raw in text.split('&').map(str::trim).filter(|t| !t.is_empty()) {
            let (key, op) = if let Some((k, v)) = raw.split_once("!=") {
                (k, Op::NotIn(values(v)))
            } else if let Some((k, v)) = raw.split_once('=') {
                (k, Op::In(values(v)))
            } else if let Some((k, v)) = raw.split_once('~') {
                (k, Op::Contains(v.trim().to_string()))
            } else {
                return Err(format!(
                    "--filter {text:?}: `{raw}` is not `key=value`, `key!=value` or `key~text`"
                ));
            };
            let key = key.trim();
            if !known.contains(&key) {
                return Err(format!(
                    "--filter {text:?}: unknown key `{key}`; the keys are {}",
                    known.join(", ")
                ));
            }
            terms.push(Term {
                key: key.to_string(),
                op,
            });
        }
        if terms.is_empty() {
            return Err(format!("--filter {text:?}: no term"));
        }
        Ok(Filter { terms })
    }

    /// pytest's `-k TEXT`: trials whose name contains `text`.
    pub fn name_contains(text: &str) -> Filter {
        Filter {
            terms: vec![Term {
                key: "name".into(),
                op: Op::Contains(text.to_string()),
            }],
        }
    }

    /// Both this filter and `other`.
    pub fn and(mut self, other: Filter) -> Filter {
        self.terms.extend(other.terms);
        self
    }

    /// Whether `trial` is selected.
    pub fn matches(&self, trial: &Trial) -> bool {
        let params = trial.case().map(|c| c.params()).unwrap_or_default();
        self.terms.iter().all(|term| {
            let value = match term.key.as_str() {
                "name" => Some(trial.name.clone()),
                "path" => Some(trial.path()),
                "case" => trial.case().map(|c| c.id.clone()),
                key => params
                    .iter()
                    .find(|(k, _)| *k == key)
                    .map(|(_, v)| v.clone()),
            };
            term.holds(value.as_deref())
        })
    }

    /// Whether `case` has a trial the filter could select (for lists of cases): its parameters
    /// and id hold, a `path` term holds for a native path the case is not excluded from or
    /// names a worker's path (`NAME/PATH`: a worker may take any case), and `name` terms are
    /// left to the trials.
    pub fn matches_case(&self, case: &Case) -> bool {
        let params = case.params();
        self.terms.iter().all(|term| match term.key.as_str() {
            "name" => true,
            "case" => term.holds(Some(&case.id)),
            "path" => {
                matches!(&term.op, Op::In(vs) if vs.iter().any(|v| v.contains('/')))
                    || PathId::ALL
                        .iter()
                        .filter(|p| !case.excluded.contains_key(p))
                        .any(|p| term.holds(Some(p.as_str())))
            }
            key => term.holds(
                params
                    .iter()
                    .find(|(k, _)| *k == key)
                    .map(|(_, v)| v.as_str()),
            ),
        })
    }
}

impl Term {
    /// Whether `value` is `wanted`: whole, or a member of its family on a family key.
    fn is(&self, value: &str, wanted: &str) -> bool {
        if FAMILY_KEYS.contains(&self.key.as_str()) {
            in_family(value, wanted)
        } else {
            value == wanted
        }
    }

    /// A missing value (a routing trial has no layer) holds only for `!=`.
    fn holds(&self, value: Option<&str>) -> bool {
        match (&self.op, value) {
            (Op::In(vs), Some(v)) => vs.iter().any(|w| self.is(v, w)),
            (Op::NotIn(vs), Some(v)) => !vs.iter().any(|w| self.is(v, w)),
            (Op::Contains(text), Some(v)) => v.contains(text.as_str()),
            (Op::NotIn(_), None) => true,
            (_, None) => false,
        }
    }
}

fn values(text: &str) -> Vec<String> {
    text.split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect()
}

/// Keep the trials `filter` selects (all without one).
pub fn retain(trials: &mut Vec<Trial>, filter: Option<&Filter>) {
    if let Some(f) = filter {
        trials.retain(|t| f.matches(t));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_keys_are_the_case_parameters_of_the_reports() {
        let case = relattn_matrices::load_tier("smoke")
            .unwrap()
            .expand()
            .unwrap()
            .cases[0]
            .clone();
        let keys: Vec<&str> = case.params().iter().map(|(k, _)| *k).collect();
        assert_eq!(keys, Case::PARAM_KEYS);
    }

    #[test]
    fn terms_parse_and_unknown_keys_are_named() {
        let f = Filter::parse("layer=local & dtype=fp16 & path=fallback").unwrap();
        assert_eq!(f.terms.len(), 3);
        let e = Filter::parse("colour=red").unwrap_err();
        assert!(
            e.contains("unknown key `colour`") && e.contains("layer"),
            "{e}"
        );
        assert!(Filter::parse("layer")
            .unwrap_err()
            .contains("not `key=value`"));
        assert!(Filter::parse(" & ").unwrap_err().contains("no term"));
    }

    fn term(text: &str) -> Term {
        Filter::parse(text).unwrap().terms.remove(0)
    }

    #[test]
    fn a_family_value_matches_itself_or_what_continues_it_with_an_underscore() {
        let local = term("layer=local");
        assert!(local.holds(Some("local_e512")) && local.holds(Some("local")));
        assert!(term("layer=local_e512").holds(Some("local_e512")));
        assert!(!term("layer=loc").holds(Some("local_e512")));
        assert!(!term("layer!=local").holds(Some("local_e512")));
    }

    #[test]
    fn every_other_value_matches_whole() {
        let op = term("path=vllm/vllm_op");
        assert!(op.holds(Some("vllm/vllm_op")));
        assert!(!op.holds(Some("vllm/vllm_op_sheared")));
        assert!(!op.holds(Some("vllm/vllm_op_splits")));
        assert!(term("path!=vllm/vllm_op").holds(Some("vllm/vllm_op_splits")));
        assert!(!term("mix=decode").holds(Some("decode_8193")));
        assert!(!term("layout=nhd").holds(Some("nhd_packed")));
        assert!(!term("page_size=1").holds(Some("16")));
        let t = term("page_size!=16");
        assert!(t.holds(Some("128")) && !t.holds(Some("16")) && t.holds(None));
    }
}
