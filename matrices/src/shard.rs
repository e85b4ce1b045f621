//! Deterministic shards of a case list, and the "K/N" that names one.

use crate::case::Case;
use crate::error::MatrixError;
use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

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
    let mut ranked: Vec<(u64, &str)> = cases.iter().map(|c| (c.bytes(), c.id.as_str())).collect();
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
