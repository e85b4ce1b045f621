//! The routing table and each path's constraints, kept as data (SPEC section 3): supporting a new
//! architecture means adding or editing a row here, not adding a guard somewhere else.

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
    /// The production main kernel can split the KV range (SPEC 4.1; Blackwell datacenter only).
    pub split_kv: bool,
    /// The fallback path's two-stage split-KV decode kernel is available (SPEC 4.3).
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

/// What a path's algorithm can take, independent of the architecture it runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PathSpec {
    pub path: PathId,
    /// The main kernel splits the KV range (fp32 partials + LSE, then a combine kernel).
    pub main_split_kv: bool,
    /// A separate two-stage split-KV decode kernel exists.
    pub split_kv_decode: bool,
    /// Bias tiles are 128 keys wide, so the extent must be a multiple of 128.
    pub requires_extent_multiple_of_128: bool,
    /// On local layers the bias buffer carries the window, so `window_left + 1 == E`.
    pub requires_window_equals_extent: bool,
    /// Most KV splits the path takes (main-kernel splits for `sheared_bias`, decode-kernel splits
    /// for `fallback`, 1 where the path has no split-KV).
    pub max_splits: usize,
}

static SPECS: [PathSpec; 3] = [
    PathSpec {
        path: PathId::ShearedBias,
        main_split_kv: true,
        split_kv_decode: false,
        requires_extent_multiple_of_128: true,
        requires_window_equals_extent: true,
        max_splits: 128,
    },
    PathSpec {
        path: PathId::ScoreMod,
        main_split_kv: false,
        split_kv_decode: false,
        requires_extent_multiple_of_128: false,
        requires_window_equals_extent: false,
        max_splits: 1,
    },
    PathSpec {
        path: PathId::Fallback,
        main_split_kv: false,
        split_kv_decode: true,
        requires_extent_multiple_of_128: false,
        requires_window_equals_extent: false,
        max_splits: 32,
    },
];

/// The constraints record of a path.
pub fn path_spec(path: PathId) -> &'static PathSpec {
    match path {
        PathId::ShearedBias => &SPECS[0],
        PathId::ScoreMod => &SPECS[1],
        PathId::Fallback => &SPECS[2],
    }
}

/// Whether `path` can take a case with extent `e`, `window_left` (-1 = global layer) and
/// `num_splits` KV splits; the error says which constraint the case breaks.
pub fn check_path(
    path: PathId,
    e: usize,
    window_left: i64,
    num_splits: usize,
) -> Result<(), String> {
    let spec = path_spec(path);
    if e == 0 {
        return Err(format!("{path} needs rel_extent >= 1, got 0"));
    }
    if window_left < -1 {
        return Err(format!(
            "window_left must be -1 (global) or >= 0, got {window_left}"
        ));
    }
    if spec.requires_extent_multiple_of_128 && !e.is_multiple_of(128) {
        return Err(format!(
            "{path} lays the bias out in 128-key tiles, so rel_extent must be a multiple of 128, got {e}"
        ));
    }
    if spec.requires_window_equals_extent
        && crate::window::is_local(window_left)
        && !crate::window::spans_extent(window_left, e)
    {
        return Err(format!(
            "{path} carries the window in the bias buffer, so a local layer needs window_left + 1 == rel_extent, \
             got window_left {window_left} and rel_extent {e}"
        ));
    }
    if num_splits == 0 {
        return Err(format!("{path} needs num_splits >= 1, got 0"));
    }
    if num_splits > spec.max_splits {
        return Err(if spec.max_splits == 1 {
            format!("{path} has no split-KV: num_splits must be 1, got {num_splits}")
        } else {
            format!(
                "{path} takes at most {} KV splits, got {num_splits}",
                spec.max_splits
            )
        });
    }
    Ok(())
}
