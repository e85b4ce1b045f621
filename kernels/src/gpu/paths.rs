//! What each native path is, stated once: its kernel file, its stages, which of them split the
//! keys and where its rows' bias comes from. Whatever asks "which path has X" reads this table:
//! the program sources (`source`), the launch plans, the coverage table and where a planted
//! defect sits (`Mutant::paths`). `path_kernels` is a `match` on `PathId`, so a new path does not
//! compile until it has a descriptor here. Its limits (extent, window, split counts) are
//! routing's `PathSpec`, which has no GPU side; a test keeps the two in agreement.

#![deny(unsafe_code)]

use super::mutant::{Mutant, Site};
use super::source::Stage;
use crate::routing::PathId;

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
