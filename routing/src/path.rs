//! What each path can take, wherever it runs, stated once (docs/operator.md section 3): every limit
//! a case or a split count can break, with the reason a refused launch or a skipped trial gives.
//! The launch plans check a problem against it before they launch anything, and the matrices skip
//! the trials it refuses, so the two cannot disagree.

use crate::splits::SHEAR_TILE;
use crate::{table, window, Outcome, PathId};
use serde::Serialize;
use std::fmt;

/// The only head dim the kernels are built for (the model's, docs/operator.md section 1); mirrors
/// `HEAD_DIM` in kernels/cuda/constants.cuh.
pub const HEAD_DIM: usize = 128;

/// Most KV splits sheared_bias combines: the largest `max_split` of docs/operator.md section 4.1,
/// so every count its production policy picks, and the forced counts the matrices give it.
pub const SHEARED_MAX_SPLITS: usize = 128;

/// Most KV splits fallback's two-stage decode kernel takes, forced or not. Its policy picks at most
/// 32 (docs/operator.md section 4.3), but forced trials may use any count (docs/operator.md section
/// 4.2), and the kernel has no split limit of its own: the launch sizes the workspace (a partial
/// per split, or per piece of a split) and the counters (`B x Hkv x (1 + splits)`) from the count,
/// and the merges (`merge_group` in fallback.cu) loop over any number of partials. Its one bound is
/// the launch grid: a CTA per split or piece on the grid's x dimension, at most 2^31 - 1, which
/// also bounds the kernel's 32-bit split counts. `plan_launches` refuses a count whose pieces
/// overflow that dimension.
pub const FALLBACK_MAX_SPLITS: usize = i32::MAX as usize;

/// What a path can take, independent of the architecture it runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PathSpec {
    pub path: PathId,
    /// The main kernel splits the KV range (fp32 partials + LSE, then a combine kernel).
    pub main_split_kv: bool,
    /// A separate two-stage split-KV decode kernel exists.
    pub split_kv_decode: bool,
    /// The bias is laid out in tiles of this many keys, so the extent must be a multiple of it
    /// (`None`: any extent).
    pub extent_multiple_of: Option<usize>,
    /// On local layers the bias buffer carries the window, so `window_left + 1 == E`.
    pub requires_window_equals_extent: bool,
    /// The head dim the path's kernels are built for.
    pub head_dim: usize,
    /// Most KV splits the path takes (main-kernel splits for `sheared_bias`, decode-kernel splits
    /// for `fallback`, 1 where the path has no split-KV).
    pub max_splits: usize,
}

/// The limits of a path.
pub fn path_spec(path: PathId) -> &'static PathSpec {
    match path {
        PathId::ShearedBias => &SHEARED_BIAS,
        PathId::ScoreMod => &SCORE_MOD,
        PathId::Fallback => &FALLBACK,
    }
}

static SHEARED_BIAS: PathSpec = PathSpec {
    path: PathId::ShearedBias,
    main_split_kv: true,
    split_kv_decode: false,
    extent_multiple_of: Some(SHEAR_TILE),
    requires_window_equals_extent: true,
    head_dim: HEAD_DIM,
    max_splits: SHEARED_MAX_SPLITS,
};

static SCORE_MOD: PathSpec = PathSpec {
    path: PathId::ScoreMod,
    main_split_kv: false,
    split_kv_decode: false,
    extent_multiple_of: None,
    requires_window_equals_extent: false,
    head_dim: HEAD_DIM,
    max_splits: 1,
};

static FALLBACK: PathSpec = PathSpec {
    path: PathId::Fallback,
    main_split_kv: false,
    split_kv_decode: true,
    extent_multiple_of: None,
    requires_window_equals_extent: false,
    head_dim: HEAD_DIM,
    max_splits: FALLBACK_MAX_SPLITS,
};

/// The facts of a case that a path's limits look at, whatever its split count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathCase {
    pub rel_extent: usize,
    /// -1 on global layers.
    pub window_left: i64,
    pub head_dim: usize,
}

/// A limit of a path that a case or a split count breaks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathLimit {
    NoExtent {
        path: PathId,
    },
    BadWindow {
        window_left: i64,
    },
    ExtentMultiple {
        path: PathId,
        multiple: usize,
        rel_extent: usize,
    },
    WindowNotExtent {
        path: PathId,
        window_left: i64,
        rel_extent: usize,
    },
    HeadDim {
        built: usize,
        head_dim: usize,
    },
    NoSplits,
    TooManySplits {
        path: PathId,
        max: usize,
        num_splits: usize,
    },
}

impl PathLimit {
    /// The limit, the same text for every case that breaks it (a skipped trial's reason).
    pub fn rule(&self) -> String {
        match *self {
            PathLimit::NoExtent { path } => format!("{path} needs rel_extent >= 1"),
            PathLimit::BadWindow { .. } => "window_left must be -1 (global) or >= 0".into(),
            PathLimit::ExtentMultiple { path, multiple, .. } => format!(
                "{path} lays the bias out in {multiple}-key tiles, so E must be a multiple of {multiple}"
            ),
            PathLimit::WindowNotExtent { path, .. } => format!(
                "{path} carries the window in the bias buffer, so a local layer needs \
                 window_left + 1 == E"
            ),
            PathLimit::HeadDim { built, .. } => {
                format!("the GPU kernels are built for the model's head dim, {built}")
            }
            PathLimit::NoSplits => "num_splits must be at least 1".into(),
            PathLimit::TooManySplits { path, max, .. } => {
                let spec = path_spec(path);
                if spec.main_split_kv {
                    format!("{path} combines at most {max} KV splits")
                } else if spec.split_kv_decode {
                    format!("{path}'s split-KV decode kernel takes at most {max} splits")
                } else {
                    format!(
                        "{path} has no split-KV ({} contract): num_splits must be 1",
                        routed_from(path)
                    )
                }
            }
        }
    }

    /// The values of the case that break the limit.
    pub fn detail(&self) -> String {
        match *self {
            PathLimit::NoExtent { .. } => "E = 0".into(),
            PathLimit::BadWindow { window_left } => format!("window_left = {window_left}"),
            PathLimit::ExtentMultiple { rel_extent, .. } => format!("E = {rel_extent}"),
            PathLimit::WindowNotExtent {
                window_left,
                rel_extent,
                ..
            } => format!("window_left = {window_left}, E = {rel_extent}"),
            PathLimit::HeadDim { head_dim, .. } => format!("head_dim {head_dim}"),
            PathLimit::NoSplits => "0 splits".into(),
            PathLimit::TooManySplits { num_splits, .. } => format!("{num_splits} splits"),
        }
    }
}

/// The capabilities whose production path `path` is, as `SM90` or `SM80/SM86`.
fn routed_from(path: PathId) -> String {
    let sms: Vec<String> = table()
        .iter()
        .filter(|row| row.outcome == Outcome::Route(path))
        .map(|row| format!("SM{}{}", row.cc.major, row.cc.minor))
        .collect();
    sms.join("/")
}

/// `rule (detail)`.
impl fmt::Display for PathLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.rule(), self.detail())
    }
}

impl std::error::Error for PathLimit {}

impl PathSpec {
    /// Whether the path takes the case at all (every split count is refused when not).
    pub fn check_case(&self, case: &PathCase) -> Result<(), PathLimit> {
        let path = self.path;
        let (e, w) = (case.rel_extent, case.window_left);
        if e == 0 {
            return Err(PathLimit::NoExtent { path });
        }
        if w < -1 {
            return Err(PathLimit::BadWindow { window_left: w });
        }
        if let Some(multiple) = self.extent_multiple_of {
            if !e.is_multiple_of(multiple) {
                return Err(PathLimit::ExtentMultiple {
                    path,
                    multiple,
                    rel_extent: e,
                });
            }
        }
        if self.requires_window_equals_extent && window::is_local(w) && !window::spans_extent(w, e)
        {
            return Err(PathLimit::WindowNotExtent {
                path,
                window_left: w,
                rel_extent: e,
            });
        }
        if case.head_dim != self.head_dim {
            return Err(PathLimit::HeadDim {
                built: self.head_dim,
                head_dim: case.head_dim,
            });
        }
        Ok(())
    }

    /// Whether the path takes `num_splits` KV splits.
    pub fn check_splits(&self, num_splits: usize) -> Result<(), PathLimit> {
        if num_splits == 0 {
            return Err(PathLimit::NoSplits);
        }
        if num_splits > self.max_splits {
            return Err(PathLimit::TooManySplits {
                path: self.path,
                max: self.max_splits,
                num_splits,
            });
        }
        Ok(())
    }
}

/// Whether `path` takes `case` with `num_splits` KV splits; the error names the limit broken.
pub fn check_path(path: PathId, case: &PathCase, num_splits: usize) -> Result<(), PathLimit> {
    let spec = path_spec(path);
    spec.check_case(case)?;
    spec.check_splits(num_splits)
}
