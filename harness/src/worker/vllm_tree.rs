//! The vLLM tree of the workers that load vLLM's op (`--impl vllm`, `--impl triton`): the
//! user's (`RELATTN_VLLM_ROOT`, or a vLLM python3 imports), else vLLM's pinned release in
//! relattn's cache folder, fetched once by `adapters/fetch_vllm.sh` (as the tests do), so every
//! README line that names these workers runs as typed on a fresh clone.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The shipped workers that load vLLM's op.
pub const NEEDS_VLLM: [&str; 2] = ["vllm", "triton"];

/// The script that fetches a release's files, under `adapters/`.
pub const FETCH_SCRIPT: &str = "fetch_vllm.sh";

/// Where the workers' vLLM comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VllmTree {
    /// `RELATTN_VLLM_ROOT` is set, or python3 imports vLLM: the worker finds it itself.
    Users,
    /// The pinned release's files in relattn's cache folder: the worker gets this root.
    Pinned(PathBuf),
    /// Neither, and the pinned release could not be fetched (why): the worker answers every
    /// trial unsupported and says why.
    Missing(String),
}

/// The vLLM tree for workers started with `python` (resolved once per process: a pool of
/// workers shares one fetch). `adapters` is the folder holding `fetch_vllm.sh`.
pub fn resolve(python: &str, adapters: &Path) -> VllmTree {
    static TREE: OnceLock<VllmTree> = OnceLock::new();
    TREE.get_or_init(|| {
        if std::env::var_os("RELATTN_VLLM_ROOT").is_some() || imports_vllm(python) {
            return VllmTree::Users;
        }
        let tree = fetch(adapters, gpu_present());
        match &tree {
            VllmTree::Pinned(root) => eprintln!(
                "relattn: RELATTN_VLLM_ROOT is not set and python3 has no vLLM: the vLLM workers \
                 use vLLM's pinned release in {} (fetched once by adapters/{FETCH_SCRIPT})",
                root.display()
            ),
            VllmTree::Missing(why) => eprintln!("relattn: {why}"),
            VllmTree::Users => {}
        }
        tree
    })
    .clone()
}

fn imports_vllm(python: &str) -> bool {
    Command::new(python)
        .args([
            "-c",
            "import importlib.util as u, sys; sys.exit(0 if u.find_spec('vllm') else 1)",
        ])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// A GPU run imports the op's kernels too (`--kernels`); routing needs only the op's files.
fn gpu_present() -> bool {
    use relattn_kernels::capability::{CapabilitySource, NvmlSource};
    NvmlSource::new().devices().is_ok_and(|d| !d.is_empty())
}

/// Run `fetch_vllm.sh [--kernels]` into its default folder (relattn's cache folder); it prints
/// the folder on stdout and does nothing more when the files are already there.
fn fetch(adapters: &Path, kernels: bool) -> VllmTree {
    let script = adapters.join(FETCH_SCRIPT);
    let mut command = Command::new("bash");
    command.arg(&script);
    if kernels {
        command.arg("--kernels");
    }
    let missing = |why: String| {
        VllmTree::Missing(format!(
            "RELATTN_VLLM_ROOT is not set, python3 has no vLLM, and vLLM's pinned release could \
             not be fetched ({why}); the vLLM workers answer every trial unsupported"
        ))
    };
    match command.output() {
        Ok(out) if out.status.success() => {
            let root = String::from_utf8_lossy(&out.stdout).trim().to_string();
            if Path::new(&root).is_dir() {
                VllmTree::Pinned(PathBuf::from(root))
            } else {
                missing(format!("{} printed no folder", script.display()))
            }
        }
        Ok(out) => missing(String::from_utf8_lossy(&out.stderr).trim().to_string()),
        Err(e) => missing(format!("bash cannot be started: {e}")),
    }
}
