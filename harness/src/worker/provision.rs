//! What the shipped workers (`--impl NAME`) need that python3 may lack, provided once in
//! relattn's cache folder as the tests provide it, so every README line that names a worker runs
//! as typed on a machine with only python3 and pip:
//! - numpy (every shipped worker): python3's own, else installed with pip into
//!   `<cache>/python/<interpreter tag>/` and put on the workers' `PYTHONPATH`;
//! - the vLLM tree of the workers that load vLLM's op (`--impl vllm`, `--impl triton`): the
//!   user's (`RELATTN_VLLM_ROOT`, or a vLLM python3 imports), else vLLM's pinned release, fetched
//!   once by `adapters/tools/fetch_vllm.sh`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

/// The shipped workers that load vLLM's op.
pub const NEEDS_VLLM: [&str; 2] = ["vllm", "triton"];

/// The script that fetches a release's files, under `adapters/`.
pub const FETCH_SCRIPT: &str = "tools/fetch_vllm.sh";

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
/// workers shares one fetch). `adapters` is the folder holding `tools/fetch_vllm.sh`.
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
    let code = "import importlib.util as u, sys; sys.exit(0 if u.find_spec('vllm') else 1)";
    python_says(python, code, None).is_some()
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

/// What `python -c code` prints (trimmed), with `pythonpath` as its `PYTHONPATH` when given;
/// None when it cannot start or exits non-zero.
pub(crate) fn python_says(python: &str, code: &str, pythonpath: Option<&str>) -> Option<String> {
    let mut command = Command::new(python);
    command.args(["-c", code]);
    if let Some(path) = pythonpath {
        command.env("PYTHONPATH", path);
    }
    let out = command.output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// A folder to put first on the workers' `PYTHONPATH` so that `python` imports numpy: None when
/// it already does, or when numpy cannot be had (the worker then says `No module named
/// 'numpy'`, after relattn said why). Decided once per process and interpreter.
pub fn numpy_path(python: &str) -> Option<PathBuf> {
    static DONE: Mutex<Vec<(String, Option<PathBuf>)>> = Mutex::new(Vec::new());
    let mut done = DONE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, found)) = done.iter().find(|(p, _)| p == python) {
        return found.clone();
    }
    let found = find_or_install_numpy(python);
    done.push((python.to_string(), found.clone()));
    found
}

fn find_or_install_numpy(python: &str) -> Option<PathBuf> {
    const IMPORT: &str = "import numpy";
    let inherited = std::env::var("PYTHONPATH").ok();
    if python_says(python, IMPORT, inherited.as_deref()).is_some() {
        return None;
    }
    let tag = python_says(
        python,
        "import sys; print(sys.implementation.cache_tag)",
        None,
    )?;
    let Some(cache) = relattn_kernels::gpu::cache_dir() else {
        eprintln!(
            "relattn: {python} has no numpy, which the shipped workers need, and relattn has no \
             cache folder to install it in (set HOME or RELATTN_CACHE_DIR, or `{python} -m pip \
             install numpy`)"
        );
        return None;
    };
    let dir = cache.join("python").join(tag).join("numpy");
    let dir_s = dir.to_string_lossy().into_owned();
    if python_says(python, IMPORT, Some(&dir_s)).is_some() {
        return Some(dir);
    }
    eprintln!(
        "relattn: {python} has no numpy, which the shipped workers need: installing it once with \
         pip into {dir_s}"
    );
    let installed = pip_install_into(python, "numpy", &dir);
    match installed.and_then(|()| {
        python_says(python, IMPORT, Some(&dir_s)).ok_or_else(|| "it does not import".into())
    }) {
        Ok(_) => Some(dir),
        Err(why) => {
            eprintln!(
                "relattn: numpy could not be installed into {dir_s} ({why}); install it with \
                 `{python} -m pip install numpy`"
            );
            None
        }
    }
}

/// Install `package` with `python`'s pip into `dir`, which appears whole or not at all: pip
/// writes a folder beside it that is then renamed into place, so processes installing at the
/// same time never see half a package (either's copy will do). Err: why pip failed.
pub fn pip_install_into(python: &str, package: &str, dir: &Path) -> Result<(), String> {
    let staging = dir.with_extension(format!("partial-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    }
    let out = Command::new(python)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
        ])
        .env("PIP_ROOT_USER_ACTION", "ignore")
        .arg("--target")
        .arg(&staging)
        .arg(package)
        .output()
        .map_err(|e| format!("{python} -m pip cannot be started: {e}"))?;
    if !out.status.success() {
        let _ = std::fs::remove_dir_all(&staging);
        return Err(format!(
            "`pip install --target {} {package}` failed: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    if std::fs::rename(&staging, dir).is_err() {
        let _ = std::fs::remove_dir_all(&staging);
    }
    Ok(())
}
