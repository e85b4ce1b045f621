//! Other implementations of the operator, run as worker processes over worker protocol v1
//! (`adapters/PROTOCOL.md`): `--worker "<command line>"` for any worker, `--impl NAME` for the
//! ones this project ships under `adapters/`.

pub mod case_files;
pub mod jit;
mod live;
pub mod process;
pub mod protocol;
pub mod provision;
pub mod runner;
mod stderr;
pub mod text;

pub use live::end_all;
pub use runner::{Pool, WorkerRunner};

use std::path::{Path, PathBuf};

/// The workers under `adapters/`: `--impl NAME` runs `adapters/NAME_worker.py` (a test holds
/// this list to the folder's files).
pub const IMPLS: [&str; 7] = ["numpy", "vllm", "triton", "fa4", "flex", "faulty", "leaky"];

/// The help of an `--impl` flag: `what`, then the shipped workers, from [`IMPLS`].
pub fn impl_help(what: &str) -> String {
    format!("{what}: {} (adapters/NAME_worker.py)", IMPLS.join(", "))
}

/// Default answer time of a worker (`--worker-timeout-s`).
pub const DEFAULT_TIMEOUT_S: f64 = 120.0;

/// How to start a worker, and how a user would ask for it again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerSpec {
    /// Program and arguments.
    pub command: Vec<String>,
    /// `--impl numpy` or `--worker '<command>'`: what reproduces it on a command line.
    pub label: String,
    /// `--sanitize`: every process of the worker runs under this sanitizer.
    pub sanitizer: Option<crate::sanitize::Sanitizer>,
    /// `--impl NAME`: a shipped worker, started with what [`provision`] provides for it.
    pub shipped: Option<String>,
}

impl WorkerSpec {
    /// `--worker "<command line>"`, split as a POSIX shell would (quotes, no expansion).
    pub fn from_command(line: &str) -> Result<WorkerSpec, String> {
        let command = shlex::split(line)
            .filter(|c| !c.is_empty())
            .ok_or_else(|| {
                format!("--worker {line:?}: not a command line (empty, or unbalanced quotes)")
            })?;
        Ok(WorkerSpec {
            command,
            label: format!(
                "--worker {}",
                shlex::try_quote(line).unwrap_or_else(|_| line.into())
            ),
            sanitizer: None,
            shipped: None,
        })
    }

    /// `--impl NAME`: `python3 <adapters>/NAME_worker.py` (`$RELATTN_PYTHON` instead of
    /// `python3` when set).
    pub fn from_impl(name: &str) -> Result<WorkerSpec, String> {
        if !IMPLS.contains(&name) {
            return Err(format!(
                "unknown --impl `{name}`: the shipped workers are {}; any other worker runs with --worker \"<command>\"",
                IMPLS.join(", ")
            ));
        }
        let dir = adapters_dir().ok_or_else(|| {
            format!(
                "--impl {name}: the adapters/ folder was not found (looked in $RELATTN_ADAPTERS, beside the binary and its parent folders, and in the source tree); set RELATTN_ADAPTERS=<folder holding {name}_worker.py>"
            )
        })?;
        let script = dir.join(format!("{name}_worker.py"));
        if !script.is_file() {
            return Err(format!(
                "--impl {name}: {} does not exist",
                script.display()
            ));
        }
        let python = std::env::var("RELATTN_PYTHON").unwrap_or_else(|_| "python3".into());
        Ok(WorkerSpec {
            command: vec![python, script.to_string_lossy().into_owned()],
            label: format!("--impl {name}"),
            sanitizer: None,
            shipped: Some(name.to_string()),
        })
    }

    /// Environment variables the worker's processes get beyond relattn's own: for a shipped
    /// worker, numpy's folder first on `PYTHONPATH` and the vLLM tree, where relattn provides
    /// them ([`provision`]).
    pub fn env(&self) -> Vec<(String, String)> {
        let Some(name) = &self.shipped else {
            return Vec::new();
        };
        let python = self.command.first().map_or("python3", String::as_str);
        let mut env = Vec::new();
        if let Some(numpy) = provision::numpy_path(python) {
            let path = std::env::var_os("PYTHONPATH")
                .map(|old| format!("{}:{}", numpy.display(), old.to_string_lossy()))
                .unwrap_or_else(|| numpy.display().to_string());
            env.push(("PYTHONPATH".to_string(), path));
        }
        let mut vllm_root = None;
        if provision::NEEDS_VLLM.contains(&name.as_str()) {
            if let Some(dir) = adapters_dir() {
                if let provision::VllmTree::Pinned(root) = provision::resolve(python, &dir) {
                    env.push((
                        "RELATTN_VLLM_ROOT".to_string(),
                        root.to_string_lossy().into_owned(),
                    ));
                    vllm_root = Some(root);
                }
            }
        }
        if jit::COMPILING.contains(&name.as_str()) {
            if let Some(dir) = jit::cache_dir(name, python, vllm_root.as_deref()) {
                env.extend(jit::cache_env(&dir));
            }
        }
        env
    }
}

/// Every `--impl` (each may be a comma-separated list) and `--worker`, in that order. A worker
/// given twice is refused: its trials would have the same names, which no report can hold.
pub fn specs(impls: &[String], commands: &[String]) -> Result<Vec<WorkerSpec>, String> {
    let mut out: Vec<WorkerSpec> = Vec::new();
    for name in impls.iter().flat_map(|s| s.split(',')).map(str::trim) {
        if !name.is_empty() {
            out.push(WorkerSpec::from_impl(name)?);
        }
    }
    for c in commands {
        out.push(WorkerSpec::from_command(c)?);
    }
    for (i, s) in out.iter().enumerate() {
        if out[..i].iter().any(|o| o.command == s.command) {
            return Err(format!("{} is given twice: name each worker once", s.label));
        }
    }
    Ok(out)
}

/// The folder holding the shipped workers: `$RELATTN_ADAPTERS`; else `adapters/` beside the
/// binary or in one of its three parent folders (a checkout's `target/release/relattn`, a
/// bundle's `.device/relattn`); else `share/relattn/adapters` of an install prefix; else the
/// source tree this binary was built from.
pub fn adapters_dir() -> Option<PathBuf> {
    if let Ok(dir) = std::env::var("RELATTN_ADAPTERS") {
        return Some(PathBuf::from(dir));
    }
    let has = |d: &Path| d.join("numpy_worker.py").is_file();
    if let Some(exe_dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
    {
        for dir in exe_dir.ancestors().take(4) {
            for candidate in [dir.join("adapters"), dir.join("share/relattn/adapters")] {
                if has(&candidate) {
                    return Some(candidate);
                }
            }
        }
    }
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../adapters");
    has(&source).then_some(source)
}

/// The most processes a worker's pool may have.
pub const MAX_POOL: usize = 64;

/// Memory one worker process may take (its interpreter, torch, a CUDA context and a case):
/// the default pool keeps this much of the run's memory share per process.
pub const POOL_PROCESS_BYTES: u64 = 4 << 30;

/// The default processes per worker for a run of `workers` workers that is one of `processes`
/// runs side by side, on a machine with `gpus` GPUs. With GPUs: enough to keep each GPU busy
/// while others compile (half the run's share of the cores, at most 8 per GPU), and, over all
/// the run's workers, at most one per [`POOL_PROCESS_BYTES`] of its share of the memory, so
/// runs side by side never exhaust the machine's memory; without a GPU: the run's share of the
/// cores.
pub fn default_pool_size(gpus: usize, processes: usize, workers: usize) -> usize {
    let cores = rayon::current_num_threads().max(1);
    if gpus == 0 {
        return cores.min(MAX_POOL);
    }
    let (memory, _) = relattn_reference::limits::memory_bytes();
    let share = memory / processes.max(1) as u64 / workers.max(1) as u64;
    let by_memory = (share / POOL_PROCESS_BYTES) as usize;
    (cores / 2).min(8 * gpus).min(by_memory).clamp(1, MAX_POOL)
}

/// Start every worker (the first process of each pool) and greet it, in order. Two workers
/// that give the same name in `hello` are refused (their trials would have the same names).
pub fn start_all(
    specs: &[WorkerSpec],
    timeout: std::time::Duration,
    pool: &Pool,
) -> Result<Vec<std::sync::Arc<WorkerRunner>>, String> {
    let mut out: Vec<std::sync::Arc<WorkerRunner>> = Vec::new();
    for s in specs {
        let w = WorkerRunner::start_pool(s.clone(), timeout, pool)?;
        if let Some(other) = out.iter().find(|o| o.name() == w.name()) {
            return Err(format!(
                "workers {} and {} both call themselves `{}`: the names of workers must differ (trials are named impl::<name>::...), so give one of them once or rename one",
                other.spec.label,
                w.spec.label,
                w.name()
            ));
        }
        out.push(std::sync::Arc::new(w));
    }
    Ok(out)
}

/// The specs with every worker under `sanitizer` (`--sanitize`), when there is one.
pub fn sanitized(
    specs: Vec<WorkerSpec>,
    sanitizer: Option<&crate::sanitize::Sanitizer>,
) -> Vec<WorkerSpec> {
    specs
        .into_iter()
        .map(|s| WorkerSpec {
            sanitizer: sanitizer.cloned(),
            ..s
        })
        .collect()
}

/// `--worker-timeout-s`, checked.
pub fn timeout(seconds: f64) -> Result<std::time::Duration, String> {
    if seconds.is_finite() && seconds > 0.0 && seconds <= 86_400.0 {
        Ok(std::time::Duration::from_secs_f64(seconds))
    } else {
        Err(format!(
            "--worker-timeout-s {seconds}: expected a number of seconds in (0, 86400]"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_split_like_a_shell() {
        let s = WorkerSpec::from_command("python3 'my worker.py' --f64").unwrap();
        assert_eq!(s.command, ["python3", "my worker.py", "--f64"]);
        assert!(WorkerSpec::from_command("python3 'unbalanced").is_err());
        assert!(WorkerSpec::from_command("   ").is_err());
    }

    /// `IMPLS` is the folder's list: every `adapters/NAME_worker.py` but the shared library
    /// `relattn_worker.py`, so every command's `--impl` help names what ships.
    #[test]
    fn impls_are_the_shipped_workers() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../adapters");
        let mut shipped: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                Some(name.strip_suffix("_worker.py")?.to_string())
            })
            .filter(|n| n != "relattn")
            .collect();
        shipped.sort();
        let mut impls: Vec<String> = IMPLS.iter().map(|s| s.to_string()).collect();
        impls.sort();
        assert_eq!(impls, shipped);
        assert_eq!(
            impl_help("Run"),
            "Run: numpy, vllm, triton, fa4, flex, faulty, leaky (adapters/NAME_worker.py)"
        );
    }

    #[test]
    fn unknown_impls_list_the_known_ones() {
        let e = WorkerSpec::from_impl("cudnn").unwrap_err();
        assert!(e.contains("numpy, vllm, triton, fa4, flex, faulty"), "{e}");
    }

    #[test]
    fn shipped_impls_are_found_in_the_source_tree() {
        let s = WorkerSpec::from_impl("numpy").unwrap();
        assert!(s.command[1].ends_with("numpy_worker.py"), "{:?}", s.command);
        assert_eq!(s.label, "--impl numpy");
    }

    #[test]
    fn a_worker_given_twice_is_refused() {
        let e = specs(&["numpy,flex".into(), "numpy".into()], &[]).unwrap_err();
        assert_eq!(e, "--impl numpy is given twice: name each worker once");
        let e = specs(&[], &["sh w.sh".into(), "sh  'w.sh'".into()]).unwrap_err();
        assert!(e.contains("--worker") && e.contains("given twice"), "{e}");
        assert_eq!(specs(&["numpy,flex".into()], &[]).unwrap().len(), 2);
    }

    #[test]
    fn timeouts_are_checked() {
        assert!(timeout(0.0).is_err() && timeout(f64::NAN).is_err() && timeout(1e9).is_err());
        assert_eq!(timeout(2.0).unwrap().as_secs(), 2);
    }
}
