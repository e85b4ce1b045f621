//! python3 with numpy, which the workers need, for the test binaries that start workers.

use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;

fn has_numpy(path: &str) -> Result<bool, String> {
    Command::new("python3")
        .args(["-c", "import numpy"])
        .env("PYTHONPATH", path)
        .output()
        .map(|o| o.status.success())
        .map_err(|e| format!("python3 cannot be started: {e}"))
}

/// The `PYTHONPATH` under which python3 imports numpy, checked once: empty when python3 has it,
/// else a folder under the test target's temporary directory where it is installed with pip
/// (nothing outside that folder changes). Panics, saying why, when neither works.
pub fn numpy_path() -> &'static str {
    static READY: OnceLock<Result<String, String>> = OnceLock::new();
    let ready = READY.get_or_init(|| {
        if has_numpy("")? {
            return Ok(String::new());
        }
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("python-deps");
        let dir = dir.to_string_lossy().into_owned();
        if has_numpy(&dir)? {
            return Ok(dir);
        }
        let out = Command::new("python3")
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(["--target", &dir, "numpy"])
            .output()
            .map_err(|e| format!("python3 -m pip cannot be started: {e}"))?;
        if out.status.success() && has_numpy(&dir)? {
            Ok(dir)
        } else {
            Err(format!(
                "python3 has no numpy and `pip install --target {dir} numpy` failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    });
    match ready {
        Ok(path) => path,
        Err(e) => panic!("{e}"),
    }
}

/// The repository's root (the workspace above the harness crate).
#[allow(dead_code)]
pub fn repo() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `relattn ARGS` with `env` and python3 finding numpy (for the workers and adapters' scripts).
#[allow(dead_code)]
pub fn relattn_with_numpy(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_relattn"))
        .args(args)
        .env("RUST_BACKTRACE", "1")
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
