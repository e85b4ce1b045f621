//! The routing table, kept as data (docs/operator.md section 3): supporting a new architecture
//! means adding or editing a row here, not adding a guard somewhere else. What each path itself can
//! take is `path.rs`.

use super::{Capability, PathId};
use serde::Serialize;
use std::fmt;

/// What routing does with an architecture.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The production path of this architecture.
    Route(PathId),
    /// No path may run here; the reason is shown to the user.
    Reject(&'static str),
}

/// One architecture of the routing table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ArchRow {
    pub cc: Capability,
    /// Architecture family, e.g. "Hopper".
    pub family: &'static str,
    pub outcome: Outcome,
    /// The production kernel can read the paged KV cache in its forward pass.
    pub paged_kv_forward: bool,
    /// The production main kernel can split the KV range (docs/operator.md section 4.1; Blackwell
    /// datacenter only).
    pub split_kv: bool,
    /// The fallback path's two-stage split-KV decode kernel is available (docs/operator.md section
    /// 4.3).
    pub split_kv_decode: bool,
    /// The production kernel uses sheared bias tiles.
    pub sheared_bias: bool,
}

const PRE_AMPERE: &str = "the operator's kernels need SM80 or newer (bf16 tensor-core MMA); \
     there is no path below SM80";
const SM12X: &str =
    "the production FA4 kernel has no paged-KV forward for this operator on SM12x, \
     and serving always reads the paged cache";

const fn rejected(major: u32, minor: u32, family: &'static str, reason: &'static str) -> ArchRow {
    ArchRow {
        cc: Capability::new(major, minor),
        family,
        outcome: Outcome::Reject(reason),
        paged_kv_forward: false,
        split_kv: false,
        split_kv_decode: false,
        sheared_bias: false,
    }
}

const fn ampere_ada(major: u32, minor: u32, family: &'static str) -> ArchRow {
    ArchRow {
        cc: Capability::new(major, minor),
        family,
        outcome: Outcome::Route(PathId::Fallback),
        paged_kv_forward: true,
        split_kv: false,
        split_kv_decode: true,
        sheared_bias: false,
    }
}

const fn blackwell_datacenter(major: u32, minor: u32) -> ArchRow {
    ArchRow {
        cc: Capability::new(major, minor),
        family: "Blackwell datacenter",
        outcome: Outcome::Route(PathId::ShearedBias),
        paged_kv_forward: true,
        split_kv: true,
        split_kv_decode: false,
        sheared_bias: true,
    }
}

static TABLE: [ArchRow; 12] = [
    rejected(7, 0, "Volta", PRE_AMPERE),
    rejected(7, 5, "Turing", PRE_AMPERE),
    ampere_ada(8, 0, "Ampere"),
    ampere_ada(8, 6, "Ampere"),
    ampere_ada(8, 7, "Ampere"),
    ampere_ada(8, 9, "Ada"),
    ArchRow {
        cc: Capability::new(9, 0),
        family: "Hopper",
        outcome: Outcome::Route(PathId::ScoreMod),
        paged_kv_forward: true,
        split_kv: false,
        split_kv_decode: false,
        sheared_bias: false,
    },
    blackwell_datacenter(10, 0),
    blackwell_datacenter(10, 3),
    blackwell_datacenter(11, 0),
    rejected(12, 0, "Blackwell consumer", SM12X),
    rejected(12, 1, "Blackwell consumer", SM12X),
];

/// Every architecture routing knows, in capability order.
pub fn table() -> &'static [ArchRow] {
    &TABLE
}

/// The table row of a capability; `None` for a capability not in the table (which `route` and
/// `decide` reject: there is no silent default).
pub fn lookup(cc: Capability) -> Option<&'static ArchRow> {
    TABLE.iter().find(|row| row.cc == cc)
}

/// Why a capability has no route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    pub cc: Capability,
    pub reason: String,
}

impl fmt::Display for Rejected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SM {} is not supported: {}", self.cc, self.reason)
    }
}

impl std::error::Error for Rejected {}

/// The production path of a capability, or why there is none ("no route for SM x.y" when the
/// capability is not in the table).
pub fn route(cc: Capability) -> Result<PathId, Rejected> {
    match lookup(cc).map(|row| row.outcome) {
        Some(Outcome::Route(path)) => Ok(path),
        Some(Outcome::Reject(reason)) => Err(Rejected {
            cc,
            reason: reason.to_string(),
        }),
        None => Err(Rejected {
            cc,
            reason: format!("no route for SM {cc}"),
        }),
    }
}
