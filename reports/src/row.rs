//! One result row: a (case, path) trial and its judgement.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

/// Outcome of one trial.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Pass,
    Fail,
    Skip,
    Error,
    /// An expected failure (`--xfail`): failed or errored for the cause its entry expects.
    #[serde(rename = "xfail")]
    XFail,
    /// An unexpected pass of a trial a non-strict `--xfail` entry expects to fail (a strict
    /// entry's unexpected pass is a `fail`).
    #[serde(rename = "xpass")]
    XPass,
}

impl Status {
    pub const ALL: [Status; 6] = [
        Status::Pass,
        Status::Fail,
        Status::Skip,
        Status::Error,
        Status::XFail,
        Status::XPass,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pass => "pass",
            Status::Fail => "fail",
            Status::Skip => "skip",
            Status::Error => "error",
            Status::XFail => "xfail",
            Status::XPass => "xpass",
        }
    }

    /// Fail or error: the trial ran (or tried to) and did not pass.
    pub fn is_bad(self) -> bool {
        matches!(self, Status::Fail | Status::Error)
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Status {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Status::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| {
                format!("unknown status {s:?} (expected pass, fail, skip, error, xfail or xpass)")
            })
    }
}

/// One row of `results.csv`: a trial of one case on one path.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    pub case_id: String,
    /// Full hierarchical trial name; unique within an architecture's report.
    pub trial: String,
    /// "reference", "routing", "sheared_bias", "score_mod", "fallback", ...
    pub path: String,
    pub status: Status,
    #[serde(default, with = "opt_float")]
    pub max_abs: Option<f64>,
    #[serde(default, with = "opt_float")]
    pub mean_abs: Option<f64>,
    #[serde(default, with = "opt_float")]
    pub rel_l2: Option<f64>,
    #[serde(default, with = "opt_float")]
    pub bound: Option<f64>,
    /// First failing element as "t:h:c".
    #[serde(default)]
    pub first_bad: Option<String>,
    /// Time of the run the judgement is about: the kernel (GPU trials, CUDA events) or the
    /// check (CPU trials), in milliseconds.
    #[serde(default, with = "opt_float")]
    pub ms: Option<f64>,
    /// Wall time of the whole trial (case generation or lookup, reference, run, judgement), in
    /// milliseconds; absent for a trial that did not run.
    #[serde(default, with = "opt_float")]
    pub wall_ms: Option<f64>,
    #[serde(default, with = "opt_float")]
    pub tflops: Option<f64>,
    #[serde(default, with = "opt_float")]
    pub gbps: Option<f64>,
    #[serde(default)]
    pub seed: Option<u64>,
    #[serde(default)]
    pub message: String,
    /// Case parameters (layer, heads, page, dtype, ...), one CSV column each.
    #[serde(default)]
    pub params: BTreeMap<String, String>,
}

impl Row {
    /// A row with no figures, message or parameters.
    pub fn new(
        case_id: impl Into<String>,
        trial: impl Into<String>,
        path: impl Into<String>,
        status: Status,
    ) -> Row {
        Row {
            case_id: case_id.into(),
            trial: trial.into(),
            path: path.into(),
            status,
            max_abs: None,
            mean_abs: None,
            rel_l2: None,
            bound: None,
            first_bad: None,
            ms: None,
            wall_ms: None,
            tflops: None,
            gbps: None,
            seed: None,
            message: String::new(),
            params: BTreeMap::new(),
        }
    }

    /// `max_abs / bound`: how much of the tolerance the error used (> 1 fails rule (a)).
    pub fn ratio(&self) -> Option<f64> {
        match (self.max_abs, self.bound) {
            (Some(err), Some(bound)) if bound > 0.0 => Some(err / bound),
            _ => None,
        }
    }

    /// The `layer` parameter, the grouping key of summary.md's tables.
    pub fn layer(&self) -> &str {
        self.params.get("layer").map(String::as_str).unwrap_or("-")
    }
}

/// Text form of a figure in CSV and Markdown: round-trips through `f64::from_str`, and stays
/// short for very small or very large values.
pub(crate) fn format_float(v: f64) -> String {
    let a = v.abs();
    if v == 0.0 || !v.is_finite() || (1e-4..1e15).contains(&a) {
        format!("{v}")
    } else {
        format!("{v:e}")
    }
}

/// Figures with 4 significant digits, for tables a person reads.
pub(crate) fn short_float(v: f64) -> String {
    let a = v.abs();
    if v == 0.0 || !v.is_finite() {
        format!("{v}")
    } else if (1e-3..1e6).contains(&a) {
        let digits = (3 - a.log10().floor() as i32).max(0) as usize;
        format!("{v:.digits$}")
    } else {
        format!("{v:.3e}")
    }
}

/// Serde for `Option<f64>` that keeps non-finite values: JSON has no NaN, and a NaN error is
/// exactly what a broken kernel produces, so it is written as the string "NaN" (or "inf",
/// "-inf") instead of silently becoming null.
pub(crate) mod opt_float {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(x) if x.is_finite() => x.serialize(s),
            Some(x) => s.serialize_str(&format!("{x}")),
            None => s.serialize_none(),
        }
    }

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Num(f64),
        Text(String),
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
        match Option::<Raw>::deserialize(d)? {
            None => Ok(None),
            Some(Raw::Num(x)) => Ok(Some(x)),
            Some(Raw::Text(t)) => t
                .parse::<f64>()
                .map(Some)
                .map_err(|_| serde::de::Error::custom(format!("not a number: {t:?}"))),
        }
    }
}

/// Serde for a plain `f64` with the same non-finite handling as [`opt_float`].
pub(crate) mod float {
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
        super::opt_float::serialize(&Some(*v), s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        super::opt_float::deserialize(d)?.ok_or_else(|| serde::de::Error::custom("missing number"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_round_trip_through_text() {
        for v in [
            0.0,
            1e-30,
            3.5e-3,
            0.1 + 0.2,
            123456.789,
            2e20,
            f64::NAN,
            f64::INFINITY,
        ] {
            let back: f64 = format_float(v).parse().unwrap();
            assert!(
                back == v || (v.is_nan() && back.is_nan()),
                "{v} -> {}",
                format_float(v)
            );
        }
    }

    #[test]
    fn nan_survives_json() {
        let mut row = Row::new("c", "t", "p", Status::Fail);
        row.max_abs = Some(f64::NAN);
        row.bound = Some(f64::NEG_INFINITY);
        let text = serde_json::to_string(&row).unwrap();
        let back: Row = serde_json::from_str(&text).unwrap();
        assert!(back.max_abs.unwrap().is_nan());
        assert_eq!(back.bound, Some(f64::NEG_INFINITY));
        assert_eq!(back.mean_abs, None);
    }

    #[test]
    fn status_parses_its_own_names_only() {
        for st in Status::ALL {
            assert_eq!(st.as_str().parse::<Status>(), Ok(st));
        }
        assert!("PASS".parse::<Status>().is_err());
    }
}
