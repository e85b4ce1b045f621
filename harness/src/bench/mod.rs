//! `relattn bench`: every GPU path timed on the shapes the operator is served at, next to the
//! device's measured copy bandwidth and matrix-product rate.
//!
//! `shapes` defines the shapes and their work counts, `measure` times one shape, `session` runs a
//! whole benchmark on one GPU, `report` formats the result. Everything but `measure` and
//! `session` runs without a GPU.

pub mod measure;
pub mod report;
pub mod session;
pub mod shapes;
pub mod workers;

use relattn_routing::PathId;
use std::path::PathBuf;

/// Which paths to time (`--paths`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathChoice {
    /// Every path this project has kernels for (they run on any SM80+ GPU).
    All,
    /// The device's production path only.
    Routed,
    List(Vec<PathId>),
}

impl PathChoice {
    /// `all`, `routed`, or a comma-separated list of path ids (each kept once).
    pub fn parse(s: &str) -> Result<PathChoice, String> {
        match s.trim() {
            "all" => Ok(PathChoice::All),
            "routed" => Ok(PathChoice::Routed),
            list => {
                let mut out = Vec::new();
                for name in list.split(',') {
                    let p = name.trim().parse::<PathId>().map_err(|e| {
                        format!("invalid --paths `{s}`: {e} (or use all or routed)")
                    })?;
                    if !out.contains(&p) {
                        out.push(p);
                    }
                }
                Ok(PathChoice::List(out))
            }
        }
    }

    /// The paths to time on a device whose production path is `routed`.
    pub fn resolve(&self, routed: PathId) -> Vec<PathId> {
        match self {
            PathChoice::All => PathId::ALL.to_vec(),
            PathChoice::Routed => vec![routed],
            PathChoice::List(v) => v.clone(),
        }
    }
}

/// Checked options of one benchmark.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchOptions {
    pub shapes: Vec<&'static str>,
    pub paths: PathChoice,
    pub reps: usize,
    pub warmup: usize,
    pub json: Option<PathBuf>,
    pub device: usize,
    pub seed: u64,
    /// Copies of the inputs to rotate (None: enough to exceed the L2 several times).
    pub input_sets: Option<usize>,
    /// Measure the copy and matrix-product peaks first.
    pub peaks: bool,
    /// Seconds after which no further shape or path starts (None: no limit).
    pub budget_s: Option<f64>,
    /// Seconds of wall time one (shape, path) may take (None: no limit).
    pub row_budget_s: Option<f64>,
    /// Workers whose paths are timed beside the native ones (`--impl`, `--worker`).
    pub workers: Vec<crate::worker::WorkerSpec>,
    pub worker_timeout: std::time::Duration,
}
