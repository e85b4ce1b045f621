//! Split settings of a case's trials, and deterministic shards of a case list.

use crate::case::Case;
use crate::error::MatrixError;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

/// How many KV splits a trial uses: the path's own policy (SPEC 4.1 / 4.3), or a forced count.
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

/// Shard `index` (1-based) of `count`, parsed from "K/N".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    pub index: usize,
    pub count: usize,
}

impl Shard {
    /// The whole list.
    pub const ALL: Shard = Shard { index: 1, count: 1 };

    pub fn new(index: usize, count: usize) -> Result<Shard, MatrixError> {
        let err = |reason: &str| MatrixError::Shard {
            value: format!("{index}/{count}"),
            reason: reason.to_string(),
        };
        if count == 0 {
            return Err(err("N must be at least 1"));
        }
        if index == 0 {
            return Err(err("K counts from 1"));
        }
        if index > count {
            return Err(err("K is larger than N"));
        }
        Ok(Shard { index, count })
    }

    /// This shard's cases, in their original order.
    pub fn select(self, cases: &[Case]) -> Vec<Case> {
        shard(cases, self.index, self.count)
    }
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

impl FromStr for Shard {
    type Err = MatrixError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |reason: &str| MatrixError::Shard {
            value: s.to_string(),
            reason: reason.into(),
        };
        let (k, n) = s.split_once('/').ok_or_else(|| bad("no `/`"))?;
        let k = k
            .trim()
            .parse()
            .map_err(|_| bad("K is not a whole number"))?;
        let n = n
            .trim()
            .parse()
            .map_err(|_| bad("N is not a whole number"))?;
        Shard::new(k, n).map_err(|_| {
            bad(if n == 0 {
                "N must be at least 1"
            } else {
                "K must be in 1..=N"
            })
        })
    }
}

/// Cases of shard `k` of `n` (k is 1-based), in their original order.
///
/// Cases are ranked by the bytes of their tensors (largest first, then by id) and dealt to the
/// shards back and forth (ranks 0..n to shards 1..n, the next n to shards n..1, and so on), so
/// each shard gets its share of the few large cases (long context: most of a tier's time) and
/// the shards' bytes differ by at most one case's. The shards are disjoint, cover the list,
/// differ in size by at most one, and do not depend on the order of the input or on the
/// machine. A `k` outside `1..=n` selects nothing; parse user input with [`Shard`], which
/// rejects it.
pub fn shard(cases: &[Case], k: usize, n: usize) -> Vec<Case> {
    if n == 0 || k == 0 || k > n {
        return Vec::new();
    }
    let mut ranked: Vec<(u64, &str)> = cases
        .iter()
        .map(|c| (c.spec.size().map_or(0, |s| s.bytes()), c.id.as_str()))
        .collect();
    ranked.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(b.1)));
    let dealt: HashMap<&str, usize> = ranked
        .iter()
        .enumerate()
        .map(|(r, &(_, id))| {
            let (round, at) = (r / n, r % n);
            (id, if round % 2 == 0 { at } else { n - 1 - at })
        })
        .collect();
    cases
        .iter()
        .filter(|c| dealt[c.id.as_str()] == k - 1)
        .cloned()
        .collect()
}
