//! How many KV splits a run uses, from a matrix's split settings through a trial to the launch
//! plan: one type end to end.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

/// How many KV splits a trial uses: the path's own policy (docs/operator.md section 4.1 / 4.3), or
/// a forced count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SplitSetting {
    Policy,
    Forced(usize),
}

impl SplitSetting {
    /// The forced count, if any.
    pub fn forced(self) -> Option<usize> {
        match self {
            SplitSetting::Policy => None,
            SplitSetting::Forced(n) => Some(n),
        }
    }
}

impl fmt::Display for SplitSetting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SplitSetting::Policy => f.write_str("policy"),
            SplitSetting::Forced(n) => write!(f, "s{n}"),
        }
    }
}

impl FromStr for SplitSetting {
    type Err = String;
    /// `policy`, `s7` or `7`; forced counts must be at least 1.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "policy" {
            return Ok(SplitSetting::Policy);
        }
        let digits = s.strip_prefix('s').unwrap_or(s);
        match digits.parse::<usize>() {
            Ok(0) => Err("a forced split count must be at least 1".to_string()),
            Ok(n) => Ok(SplitSetting::Forced(n)),
            Err(_) => Err(format!(
                "unknown split setting `{s}` (expected \"policy\" or a count >= 1 such as 7)"
            )),
        }
    }
}

impl Serialize for SplitSetting {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for SplitSetting {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}
