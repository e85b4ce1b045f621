//! The context a report carries: machine, software versions, matrix, shard, compile checks.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Where and how a report was produced. Every field is optional on read, so reports written by
/// older versions (or by hand) still load.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Environment {
    pub gpu_name: Option<String>,
    /// Compute capability as "9.0", "10.0".
    pub capability: Option<String>,
    pub driver: Option<String>,
    pub cuda_version: Option<String>,
    pub nvrtc_version: Option<String>,
    /// The git revision of the directory the command ran in (when it is a checkout); relattn's
    /// own is `relattn_revision`.
    pub git_revision: Option<String>,
    /// relattn's own git revision, embedded at build time.
    pub relattn_revision: Option<String>,
    /// relattn's build: version, short revision (`+modified` for uncommitted changes), profile,
    /// target.
    pub relattn_build: Option<String>,
    pub hostname: Option<String>,
    /// Tier name ("smoke", "ci", "nightly", "regressions") or a matrix file path.
    pub matrix: Option<String>,
    /// "K/N" for one shard; merged reports list their shards separated by commas.
    pub shard: Option<String>,
    pub seeds: Vec<u64>,
    pub notes: Vec<String>,
    /// RFC 3339 timestamps.
    pub started: Option<String>,
    pub finished: Option<String>,
    pub relattn_version: Option<String>,
    /// Compile-only checks of the kernels (NVRTC per arch and program), kept apart from the
    /// numerical results so a compile failure is never read as a wrong answer.
    pub compile_checks: Vec<CompileCheck>,
    /// Anything else (measured peaks, paths routed, ...).
    pub extra: BTreeMap<String, serde_json::Value>,
}

/// One NVRTC compile-only check.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CompileCheck {
    /// "sm_90a", "sm_100", ...
    pub arch: String,
    /// Program (kernel source) name.
    pub program: String,
    pub ok: bool,
    /// Empty when ok; the NVRTC log (or its head) otherwise.
    #[serde(default)]
    pub message: String,
}

impl Environment {
    /// One line naming the machine, for report headers.
    pub fn machine_line(&self) -> String {
        let mut parts = Vec::new();
        parts.push(
            self.gpu_name
                .clone()
                .unwrap_or_else(|| "no GPU".to_string()),
        );
        if let Some(c) = &self.capability {
            parts.push(format!("capability {c}"));
        }
        if let Some(d) = &self.driver {
            parts.push(format!("driver {d}"));
        }
        if let Some(c) = &self.cuda_version {
            parts.push(format!("CUDA {c}"));
        }
        if let Some(n) = &self.nvrtc_version {
            parts.push(format!("NVRTC {n}"));
        }
        if let Some(h) = &self.hostname {
            parts.push(format!("host {h}"));
        }
        parts.join(", ")
    }
}
