//! relattn-routing: compute capability -> GPU path, and the policies that go with it
//! (docs/operator.md sections 3 and 4). Pure functions of plain values, so everything here is
//! testable without a GPU; the kernels crate re-exports this crate as `relattn_kernels::routing`.
//!
//! The table (`table()`) is data; `decide` combines a row with the policies for one shape, which
//! is what `relattn route` prints.
#![deny(unsafe_code)]

mod ids;
mod path;
mod policy;
mod split_setting;
mod splits;
mod table;
mod window;

pub use ids::{Capability, PathId};
pub use path::{
    check_path, path_spec, PathCase, PathLimit, PathSpec, FALLBACK_MAX_SPLITS, HEAD_DIM,
    SHEARED_MAX_SPLITS,
};
pub use policy::{
    bucket_max_seqlen_q, decode_split_count, fallback_decode_splits, num_splits, policy_splits,
    use_split_kv_decode, SHEARED_POLICY_ARCH,
};
pub use split_setting::SplitSetting;
pub use splits::{
    decode_split_keys, decode_split_len, sheared_split_keys, DECODE_SPLIT_ALIGN, SHEAR_TILE,
};
pub use table::{lookup, route, table, ArchRow, Outcome, Rejected};
pub use window::{is_local, spans_extent as window_spans_extent, visible_len};

use serde::{Deserialize, Serialize};

/// Errors of routing's inputs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RoutingError {
    #[error("invalid compute capability {0:?}: write it as major.minor, e.g. 9.0 or 12.1")]
    BadCapability(String),
    #[error("unknown path {0:?}: expected one of {names}", names = PathId::names())]
    BadPath(String),
    #[error("invalid shape: {0}")]
    BadShape(String),
}

/// The shape facts routing and the policies look at (one layer of one batch).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shape {
    pub batch: usize,
    /// Raw (not bucketed) longest query length of the batch.
    pub max_query_len: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub max_kv_len: usize,
    pub page_size: usize,
    /// Left window of a local layer, -1 on global layers.
    pub window_left: i64,
    pub is_local: bool,
}

impl Shape {
    /// Checks what the operator requires of these values (docs/operator.md sections 1 and 2):
    /// positive sizes, whole GQA groups, `Lk >= Lq`, lengths that fit the operator's int32
    /// metadata, and a window exactly on local layers.
    pub fn validate(&self) -> Result<(), RoutingError> {
        let bad = |m: String| Err(RoutingError::BadShape(m));
        let sizes = [
            ("batch", self.batch),
            ("max_query_len", self.max_query_len),
            ("num_heads", self.num_heads),
            ("num_kv_heads", self.num_kv_heads),
            ("max_kv_len", self.max_kv_len),
            ("page_size", self.page_size),
        ];
        for (name, value) in sizes {
            if value == 0 {
                return bad(format!("{name} must be at least 1"));
            }
            if value > i32::MAX as usize {
                return bad(format!(
                    "{name} = {value} does not fit the operator's int32 metadata"
                ));
            }
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return bad(format!(
                "num_heads ({}) must be a multiple of num_kv_heads ({})",
                self.num_heads, self.num_kv_heads
            ));
        }
        if self.max_query_len > self.max_kv_len {
            return bad(format!(
                "max_query_len ({}) exceeds max_kv_len ({}): the KV length includes the new tokens",
                self.max_query_len, self.max_kv_len
            ));
        }
        match (self.is_local, self.window_left) {
            (true, w) if w < 0 || w > i64::from(i32::MAX) => bad(format!(
                "a local layer needs 0 <= window_left <= {}, got {w}",
                i32::MAX
            )),
            (false, w) if w != -1 => bad(format!(
                "a global layer has no window (window_left -1), got {w}"
            )),
            _ => Ok(()),
        }
    }
}

/// The routing decision for one capability and shape. Serialises to exactly eight keys.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    /// Capability as "major.minor".
    pub cc: String,
    /// The production path, `None` when rejected.
    pub path: Option<PathId>,
    pub rejected: bool,
    /// Why the capability is rejected, `None` when routed.
    pub reason: Option<String>,
    /// Main-kernel KV splits (docs/operator.md section 4.1), `None` when rejected.
    pub num_splits: Option<usize>,
    /// Whether the fallback path's two-stage decode kernel runs (docs/operator.md section 4.3).
    pub split_kv_decode: bool,
    /// Splits of that decode kernel: 1 unless `split_kv_decode`, `None` when rejected.
    pub decode_splits: Option<usize>,
    pub max_seqlen_q_bucket: usize,
}

/// Routes `shape` on `cc`. Capabilities outside the table are rejected ("no route for SM x.y").
/// The shape is taken as given; validate user input with `Shape::validate` first.
pub fn decide(cc: Capability, shape: &Shape) -> Decision {
    let bucket = bucket_max_seqlen_q(shape.max_query_len);
    let row = lookup(cc);
    let path = match route(cc) {
        Ok(path) => path,
        Err(rejection) => {
            return Decision {
                cc: cc.to_string(),
                path: None,
                rejected: true,
                reason: Some(rejection.reason),
                num_splits: None,
                split_kv_decode: false,
                decode_splits: None,
                max_seqlen_q_bucket: bucket,
            }
        }
    };
    // `route` succeeded, so the row exists; the fallback keeps this total without a panic.
    let (splits, decode) = row.map_or((1, None), |row| {
        let decode = if row.split_kv_decode {
            fallback_decode_splits(shape)
        } else {
            None
        };
        (num_splits(row, shape), decode)
    });
    let split_kv_decode = decode.is_some();
    let decode_splits = decode.unwrap_or(1);
    Decision {
        cc: cc.to_string(),
        path: Some(path),
        rejected: false,
        reason: None,
        num_splits: Some(splits),
        split_kv_decode,
        decode_splits: Some(decode_splits),
        max_seqlen_q_bucket: bucket,
    }
}
