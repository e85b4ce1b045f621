//! python3 with the packages the tests need (numpy for the workers, xmlschema for the JUnit
//! schema check), for the test binaries that start python3. A package python3 lacks is installed
//! once with pip into a folder of its own under the test target's temporary directory (nothing
//! outside `target/` changes), so the README's test command needs only python3 with pip.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

fn imports(module: &str, path: &str) -> Result<bool, String> {
    Command::new("python3")
        .args(["-c", &format!("import {module}")])
        .env("PYTHONPATH", path)
        .output()
        .map(|o| o.status.success())
        .map_err(|e| format!("python3 cannot be started: {e}"))
}

/// Each module asked for, and where python3 finds it (or why it cannot).
type Found = Vec<(String, Result<String, String>)>;

/// The `PYTHONPATH` under which python3 imports `module` (installed as `package`), checked once
/// per process: empty when python3 has it, else its folder under `target/`, installed there on
/// first use. Err says why neither works (no python3, no pip, no network).
pub fn package_path(module: &str, package: &str) -> Result<String, String> {
    static READY: OnceLock<Mutex<Found>> = OnceLock::new();
    let ready = READY.get_or_init(|| Mutex::new(Vec::new()));
    let mut ready = ready.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, found)) = ready.iter().find(|(m, _)| m == module) {
        return found.clone();
    }
    let found = (|| {
        if imports(module, "")? {
            return Ok(String::new());
        }
        let dir: PathBuf = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join("python-deps")
            .join(package);
        let dir_s = dir.to_string_lossy().into_owned();
        if !imports(module, &dir_s)? {
            relattn_harness::worker::provision::pip_install_into("python3", package, &dir)
                .map_err(|e| format!("python3 has no {package}: {e}"))?;
        }
        if imports(module, &dir_s)? {
            Ok(dir_s)
        } else {
            Err(format!(
                "{package} was installed into {dir_s} but python3 cannot import it"
            ))
        }
    })();
    ready.push((module.to_string(), found.clone()));
    found
}

/// The `PYTHONPATH` under which python3 imports numpy (`package_path`). Panics, saying why,
/// when it cannot be had: every worker test needs it.
pub fn numpy_path() -> &'static str {
    static PATH: OnceLock<String> = OnceLock::new();
    PATH.get_or_init(|| package_path("numpy", "numpy").unwrap_or_else(|e| panic!("{e}")))
}

/// The repository's root (the workspace above the harness crate).
#[allow(dead_code)]
pub fn repo() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `relattn ARGS` with `env` and python3 finding numpy (for the workers and adapters' scripts).
#[allow(dead_code)]
pub fn relattn_with_numpy(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    crate::binary::relattn_command()
        .args(args)
        .env("PYTHONPATH", numpy_path())
        .envs(env.iter().copied())
        .output()
        .expect("the relattn binary runs")
}

/// `python3 -m unittest ARGS` in `adapters/` (the workers' own tests), python3 finding numpy,
/// with `env`.
#[allow(dead_code)]
pub fn adapters_unittest(args: &[&str], env: &[(&str, &Path)]) -> std::process::Output {
    Command::new("python3")
        .args(["-m", "unittest"])
        .args(args)
        .current_dir(repo().join("adapters"))
        .env("PYTHONPATH", numpy_path())
        .envs(env.iter().copied())
        .output()
        .expect("python3 runs")
}
