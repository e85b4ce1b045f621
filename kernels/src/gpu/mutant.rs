//! Planted defects (`RELATTN_MUTANT`): each is one line of the kernels, switched on at compile time,
//! so a harness can prove its matrices catch the bug classes of SPEC section 5.

#![deny(unsafe_code)]

use crate::routing::PathId;
use std::fmt;
use std::str::FromStr;

const ALL_PATHS: &[PathId] = &[PathId::ShearedBias, PathId::ScoreMod, PathId::Fallback];

/// One planted defect. `define()` is the value of `-DRELATTN_MUTANT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mutant {
    /// The bias index is `d - 1` instead of `d`.
    RelIndexMinusOne,
    /// The bias is applied at `d == E` too (`d <= E`, index clamped to `E - 1`).
    BiasAtExtent,
    /// `rel_logits` is read at the request's local row `i` instead of the packed row `t`.
    LocalRowBias,
    /// Query head `h` reads KV head `h % Hkv` instead of `h / G`.
    KvHeadModulo,
    /// The split combine averages the partials without the `exp(lse - max)` rescale.
    CombineNoRescale,
    /// The window keeps `d < window_left` instead of `d <= window_left`.
    WindowStrict,
    /// `rel_logits` is read for the row one past the request's last row (a tile padding row);
    /// the value is never used, so only the bounds check can see it.
    RelRowPastEnd,
    /// The fallback decode kernel's last CTA of a group leaves the group's merge counter set:
    /// this launch is right, the next on the same workspace would merge early; only the check
    /// that every counter is back at zero sees it.
    CounterNotReset,
}

impl Mutant {
    pub const ALL: [Mutant; 8] = [
        Mutant::RelIndexMinusOne,
        Mutant::BiasAtExtent,
        Mutant::LocalRowBias,
        Mutant::KvHeadModulo,
        Mutant::CombineNoRescale,
        Mutant::WindowStrict,
        Mutant::RelRowPastEnd,
        Mutant::CounterNotReset,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Mutant::RelIndexMinusOne => "rel_index_minus_one",
            Mutant::BiasAtExtent => "bias_at_extent",
            Mutant::LocalRowBias => "local_row_bias",
            Mutant::KvHeadModulo => "kv_head_modulo",
            Mutant::CombineNoRescale => "combine_no_rescale",
            Mutant::WindowStrict => "window_strict",
            Mutant::RelRowPastEnd => "rel_row_past_end",
            Mutant::CounterNotReset => "counter_not_reset",
        }
    }

    /// The value of `RELATTN_MUTANT` that plants this defect (1..=8).
    pub fn define(self) -> u32 {
        match self {
            Mutant::RelIndexMinusOne => 1,
            Mutant::BiasAtExtent => 2,
            Mutant::LocalRowBias => 3,
            Mutant::KvHeadModulo => 4,
            Mutant::CombineNoRescale => 5,
            Mutant::WindowStrict => 6,
            Mutant::RelRowPastEnd => 7,
            Mutant::CounterNotReset => 8,
        }
    }

    /// The paths whose kernels contain the defect's line.
    pub fn paths(self) -> &'static [PathId] {
        match self {
            // Only the split combines rescale partials: sheared_bias's combine and the fallback
            // path's decode merge.
            Mutant::CombineNoRescale => &[PathId::ShearedBias, PathId::Fallback],
            // Only the fallback decode kernel counts finished splits.
            Mutant::CounterNotReset => &[PathId::Fallback],
            _ => ALL_PATHS,
        }
    }

    /// Whether the defect changes no number, so only a bounds-checked build can catch it.
    pub fn needs_bounds_check(self) -> bool {
        matches!(self, Mutant::RelRowPastEnd)
    }

    /// What kind of case exposes the defect (for reports and for choosing cases).
    pub fn exposed_by(self) -> &'static str {
        match self {
            Mutant::RelIndexMinusOne => "any case with a bias",
            Mutant::BiasAtExtent => "a global layer with Lk > E",
            Mutant::LocalRowBias => "a request that does not start at packed row 0",
            Mutant::KvHeadModulo => "GQA with 1 < Hkv < H",
            Mutant::CombineNoRescale => "split-KV with two or more non-empty splits",
            Mutant::WindowStrict => "a local layer with Lk > window",
            Mutant::RelRowPastEnd => {
                "a last request whose q_len is not a tile multiple and no padding rows, under the bounds check"
            }
            Mutant::CounterNotReset => "any split-KV decode on the fallback path"
        }
    }
}

impl fmt::Display for Mutant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Mutant {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        Mutant::ALL
            .into_iter()
            .find(|m| m.as_str() == s || m.define().to_string() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Mutant::ALL.iter().map(|m| m.as_str()).collect();
                format!(
                    "unknown mutant `{s}`: expected 1..=8 or one of {}",
                    names.join(", ")
                )
            })
    }
}
