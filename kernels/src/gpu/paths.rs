//! What each native path is, stated once: its kernel file, its stages, which of them split the
//! keys and where its rows' bias comes from. Whatever asks "which path has X" reads this table:
//! the program sources (`source`), the launch plans, the coverage table and where a planted
//! defect sits (`Mutant::paths`). `path_kernels` is a `match` on `PathId`, so a new path does not
//! compile until it has a descriptor here. Its limits (extent, window, split counts) are
//! routing's `PathSpec`, which has no GPU side; a test keeps the two in agreement.

#![deny(unsafe_code)]

use super::mutant::{Mutant, Site};
use crate::routing::PathId;
use std::sync::LazyLock;

/// Where the rows of a path's attention kernels get their bias.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BiasSource {
    /// `rel_logits[t, h, d]` itself, gathered per cell or staged in shared memory (`RelStage`,
    /// decode's staged chunks): the row types of `rel_row.cuh` (`REL_ROWS = true`).
    RelLogits,
    /// A buffer the path's prologue lays out from `rel_logits` (sheared_bias).
    Prologue,
}

/// One native path's kernels.
#[derive(Debug)]
pub struct PathKernels {
    pub path: PathId,
    /// The path's own `.cu` file under `kernels/cuda/`: its program, which includes the shared
    /// headers (`source::SHARED`).
    pub file: &'static str,
    pub source: &'static str,
    /// The stages its program defines, in launch order: an entry `{path}_{stage}_{dtype}` each.
    pub stages: &'static [Stage],
    /// The stages whose launches split the keys when the path runs with more than one split.
    pub split_stages: &'static [Stage],
    pub bias: BiasSource,
}

static SHEARED_BIAS: PathKernels = PathKernels {
    path: PathId::ShearedBias,
    file: "sheared_bias.cu",
    source: include_str!("../../cuda/sheared_bias.cu"),
    stages: &[Stage::Prologue, Stage::Main, Stage::Combine],
    split_stages: &[Stage::Main, Stage::Combine],
    bias: BiasSource::Prologue,
};

static SCORE_MOD: PathKernels = PathKernels {
    path: PathId::ScoreMod,
    file: "score_mod.cu",
    source: include_str!("../../cuda/score_mod.cu"),
    stages: &[Stage::Main, Stage::Windowed],
    split_stages: &[],
    bias: BiasSource::RelLogits,
};

static FALLBACK: PathKernels = PathKernels {
    path: PathId::Fallback,
    file: "fallback.cu",
    source: include_str!("../../cuda/fallback.cu"),
    stages: &[Stage::Main, Stage::Windowed, Stage::Decode],
    split_stages: &[Stage::Decode],
    bias: BiasSource::RelLogits,
};

/// The kernels of `path`.
pub fn path_kernels(path: PathId) -> &'static PathKernels {
    match path {
        PathId::ShearedBias => &SHEARED_BIAS,
        PathId::ScoreMod => &SCORE_MOD,
        PathId::Fallback => &FALLBACK,
    }
}

impl PathKernels {
    /// Whether the path's program defines `stage`.
    pub fn has(&self, stage: Stage) -> bool {
        self.stages.contains(&stage)
    }

    /// Whether the path's kernels hold code of kind `site` (where a planted defect sits).
    pub fn holds(&self, site: Site) -> bool {
        match site {
            Site::Every => true,
            Site::SplitMerge => self.has(Stage::Combine) || self.has(Stage::Decode),
            Site::CombineKernel => self.has(Stage::Combine),
            Site::DecodeKernel => self.has(Stage::Decode),
            Site::RelLogitsRows => self.bias == BiasSource::RelLogits,
        }
    }

    /// The planted defects the path's kernels hold, in `Mutant::ALL` order.
    pub fn defects(&self) -> Vec<Mutant> {
        Mutant::ALL
            .into_iter()
            .filter(|m| self.holds(m.site()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::path_spec;

    #[test]
    fn each_descriptor_is_its_paths() {
        for path in PathId::ALL {
            let k = path_kernels(path);
            assert_eq!(k.path, path);
            assert_eq!(k.file, format!("{}.cu", path.as_str()));
            assert!(k.has(Stage::Main), "{path}");
            assert!(k.split_stages.iter().all(|&s| k.has(s)), "{path}");
        }
    }

    /// Routing's limits say which paths split the keys and how; the stages here are the kernels
    /// that do it.
    #[test]
    fn stages_agree_with_the_path_limits() {
        for path in PathId::ALL {
            let (k, spec) = (path_kernels(path), path_spec(path));
            assert_eq!(k.has(Stage::Combine), spec.main_split_kv, "{path}");
            assert_eq!(k.has(Stage::Decode), spec.split_kv_decode, "{path}");
            assert_eq!(!k.split_stages.is_empty(), spec.max_splits > 1, "{path}");
        }
    }

    #[test]
    fn a_paths_defects_are_those_that_name_it() {
        for path in PathId::ALL {
            for m in Mutant::ALL {
                assert_eq!(
                    path_kernels(path).defects().contains(&m),
                    m.paths().contains(&path),
                    "{m} on {path}"
                );
            }
        }
    }
}

/// A kernel stage of a path (which paths define which: `PathKernels::stages`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Stage {
    /// Lay out a bias buffer before the main kernel (sheared_bias's sheared rows).
    Prologue,
    /// The tiled flash kernel of every path.
    Main,
    /// The same kernel for windowed layers, whose query blocks also stage the bias rows of tiles
    /// that need masks (its own entry, so the global layers' kernel keeps its registers); a path
    /// without it runs `Main` on windowed layers too.
    Windowed,
    /// Merge the main kernel's split partials.
    Combine,
    /// Split-KV decode (stage 1 in every CTA, stage 2, the merge, in the last CTA of each
    /// request and KV head).
    Decode,
}

impl Stage {
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Prologue => "prologue",
            Stage::Main => "main",
            Stage::Windowed => "windowed",
            Stage::Combine => "combine",
            Stage::Decode => "decode",
        }
    }

    /// Whether the stage runs attention CTAs, which take the launch's dynamic shared memory
    /// (the query blocks' tiles or the decode ring) and set the ring depth.
    pub fn is_attention(self) -> bool {
        match self {
            Stage::Main | Stage::Windowed | Stage::Decode => true,
            Stage::Prologue | Stage::Combine => false,
        }
    }
}

impl Mutant {
    /// The paths whose kernels contain the defect's line, in `PathId::ALL` order.
    pub fn paths(self) -> &'static [PathId] {
        static PATHS: LazyLock<Vec<Vec<PathId>>> = LazyLock::new(|| {
            Mutant::ALL
                .iter()
                .map(|m| {
                    PathId::ALL
                        .into_iter()
                        .filter(|&p| path_kernels(p).holds(m.site()))
                        .collect()
                })
                .collect()
        });
        let at = Mutant::ALL.iter().position(|&m| m == self);
        &PATHS[at.expect("every defect is in Mutant::ALL")]
    }
}
