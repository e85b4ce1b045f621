//! The workers' JIT compiles: their caches kept in relattn's cache folder between runs, and the
//! kernels they compiled during a run, counted for its timing line.
//!
//! Each shipped worker that compiles kernels at run time (CuTe DSL, Triton, Inductor) gets its
//! caches under `<cache>/jit/<worker>/<identity>/`, where the identity hashes the interpreter,
//! the versions of the compiling packages and every source file of vLLM's kernels the worker
//! loads, so a second run on the machine compiles nothing and a changed kernel source (another
//! release, an edited checkout) never reuses an entry made from the old one. A cache variable
//! the user set is left as it is.

use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// The shipped workers that compile kernels at run time.
pub const COMPILING: [&str; 4] = ["vllm", "triton", "fa4", "flex"];

/// vLLM's kernel sources a worker may compile, under a vLLM tree.
const KERNEL_SOURCES: [&str; 3] = [
    "vllm/models/inkling",
    "vllm/vllm_flash_attn/cute",
    "vllm/third_party/tml_fa4",
];

static MICROS: AtomicU64 = AtomicU64::new(0);

/// The JIT cache folders of this process's workers, with the kernels each held when first seen.
static WATCHED: Mutex<Vec<(PathBuf, u64)>> = Mutex::new(Vec::new());

/// Count a run answer's `jit` (`{"compiled":N,"seconds":S}`; absent or malformed: nothing): the
/// seconds of a run during which kernels appeared in the caches. The kernels themselves are
/// counted here, in the cache folders: processes of a pool share them, so each would also count
/// the others' kernels.
pub fn record(answer: &serde_json::Value) {
    let seconds = answer
        .get("jit")
        .and_then(|j| j.get("seconds"))
        .and_then(serde_json::Value::as_f64);
    if let Some(s) = seconds.filter(|s| s.is_finite() && (0.0..=86_400.0).contains(s)) {
        MICROS.fetch_add((s * 1e6) as u64, Ordering::Relaxed);
    }
}

/// A compiled kernel in a JIT cache: a Triton kernel's cubin, a CuTe DSL kernel exported by
/// FA4's persistent cache (one object file each).
fn kernels_in(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| {
            let path = e.path();
            match std::fs::symlink_metadata(&path) {
                Ok(m) if m.is_dir() => kernels_in(&path),
                Ok(m) if m.is_file() => {
                    u64::from(path.extension().is_some_and(|x| x == "cubin" || x == "o"))
                }
                _ => 0,
            }
        })
        .sum()
}

/// Count the kernels compiled into `dirs` from now on.
pub fn watch(dirs: &[PathBuf]) {
    let mut watched = WATCHED.lock().unwrap_or_else(|e| e.into_inner());
    for dir in dirs {
        if !watched.iter().any(|(d, _)| d == dir) {
            watched.push((dir.clone(), kernels_in(dir)));
        }
    }
}

/// Kernels the workers compiled into the watched caches so far, and the seconds of the runs
/// that compiled them (summed over the processes of a pool, which compile side by side).
pub fn totals() -> (u64, f64) {
    let watched = WATCHED.lock().unwrap_or_else(|e| e.into_inner());
    let compiled = watched
        .iter()
        .map(|(dir, before)| kernels_in(dir).saturating_sub(*before))
        .sum();
    (compiled, MICROS.load(Ordering::Relaxed) as f64 * 1e-6)
}

/// What `python` says of itself and its packages: the interpreter's tag, the versions of the
/// compiling packages, and the folder above an installed `vllm` package.
const PROBE: &str = r#"
import importlib.metadata as m, importlib.util as u, sys
print(sys.implementation.cache_tag)
for p in ("torch", "triton", "nvidia-cutlass-dsl", "flash-attn-4", "quack-kernels", "apache-tvm-ffi"):
    try:
        print(p, m.version(p))
    except Exception:
        print(p, "-")
s = u.find_spec("vllm")
print(list(s.submodule_search_locations)[0].rsplit("/", 1)[0] if s and s.submodule_search_locations else "")
"#;

/// The cache folder of worker `name` started with `python`, its vLLM tree at `vllm_root` (None:
/// `RELATTN_VLLM_ROOT`, else an installed vLLM, else none).
pub fn cache_dir(name: &str, python: &str, vllm_root: Option<&Path>) -> Option<PathBuf> {
    let said = super::provision::python_says(python, PROBE, None)?;
    let installed = said.lines().last().map(str::trim).unwrap_or_default();
    let root = vllm_root
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os("RELATTN_VLLM_ROOT").map(PathBuf::from))
        .or_else(|| (!installed.is_empty()).then(|| PathBuf::from(installed)));
    let mut hash = Sha256::new();
    hash.update(name.as_bytes());
    hash.update(said.as_bytes());
    if let Some(root) = root {
        for dir in KERNEL_SOURCES {
            hash_sources(&root, &root.join(dir), &mut hash);
        }
    }
    let identity = hex::encode(&hash.finalize()[..8]);
    Some(
        relattn_kernels::gpu::cache_dir()?
            .join("jit")
            .join(name)
            .join(identity),
    )
}

/// Every `.py` file under `dir`, in a fixed order: its path relative to `root`, its length and
/// its bytes.
fn hash_sources(root: &Path, dir: &Path, hash: &mut Sha256) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    paths.sort();
    for path in paths {
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            hash_sources(root, &path, hash);
        } else if meta.is_file() && path.extension().is_some_and(|e| e == "py") {
            if let Ok(bytes) = std::fs::read(&path) {
                let relative = path.strip_prefix(root).unwrap_or(&path);
                hash.update(relative.to_string_lossy().as_bytes());
                hash.update((bytes.len() as u64).to_le_bytes());
                hash.update(&bytes);
            }
        }
    }
}

/// The cache variables for a worker whose caches live in `dir` (those the user set stay), and
/// `RELATTN_JIT_DIRS`, the folders where the worker sees kernels appear; relattn counts the
/// kernels compiled into those folders from now on ([`watch`]).
pub fn cache_env(dir: &Path) -> Vec<(String, String)> {
    let at = |sub: &str| dir.join(sub).to_string_lossy().into_owned();
    let wanted = [
        ("TRITON_CACHE_DIR", at("triton")),
        ("CUTE_DSL_CACHE_DIR", at("cute_dsl")),
        ("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "1".to_string()),
        ("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", at("fa4")),
        ("TORCHINDUCTOR_CACHE_DIR", at("inductor")),
    ];
    let mut env = Vec::new();
    let mut counted = Vec::new();
    for (key, value) in wanted {
        let value = std::env::var(key).unwrap_or(value);
        if key.ends_with("_DIR") && key != "TORCHINDUCTOR_CACHE_DIR" {
            counted.push(value.clone());
        }
        env.push((key.to_string(), value));
    }
    env.push(("RELATTN_JIT_DIRS".to_string(), counted.join(":")));
    watch(&counted.iter().map(PathBuf::from).collect::<Vec<_>>());
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_kernel_source_changes_the_cache_folder() {
        let tree = tempfile::tempdir().unwrap();
        let ops = tree.path().join("vllm/models/inkling/nvidia/ops");
        std::fs::create_dir_all(&ops).unwrap();
        std::fs::write(ops.join("op.py"), "x = 1\n").unwrap();
        let dir = |root: &Path| {
            let mut h = Sha256::new();
            for d in KERNEL_SOURCES {
                hash_sources(root, &root.join(d), &mut h);
            }
            hex::encode(h.finalize())
        };
        let before = dir(tree.path());
        assert_eq!(before, dir(tree.path()), "the same tree, the same identity");
        std::fs::write(ops.join("op.py"), "x = 2\n").unwrap();
        assert_ne!(before, dir(tree.path()));
        let changed = dir(tree.path());
        std::fs::write(ops.join("notes.txt"), "not a source").unwrap();
        assert_eq!(changed, dir(tree.path()), "only sources count");
    }

    #[test]
    fn kernels_are_counted_in_the_caches_and_seconds_from_the_answers() {
        let cache = tempfile::tempdir().unwrap();
        let triton = cache.path().join("triton");
        std::fs::create_dir_all(triton.join("k0")).unwrap();
        std::fs::write(triton.join("k0/old.cubin"), "").unwrap();
        watch(std::slice::from_ref(&triton));
        let (n0, s0) = totals();
        for (dir, file) in [("k1", "a.cubin"), ("k1", "a.json"), ("k2", "b.o")] {
            std::fs::create_dir_all(triton.join(dir)).unwrap();
            std::fs::write(triton.join(dir).join(file), "").unwrap();
        }
        record(&serde_json::json!({"jit": {"compiled": 9, "seconds": 1.5}}));
        record(&serde_json::json!({"jit": {"seconds": f64::MAX}}));
        record(&serde_json::json!({"ok": true}));
        let (n1, s1) = totals();
        assert_eq!(n1 - n0, 2, "the two new kernels, not the answer's count");
        assert!((s1 - s0 - 1.5).abs() < 1e-6);
    }

    #[test]
    fn a_variable_the_user_set_is_kept() {
        let env = cache_env(Path::new("/c"));
        let get = |k: &str| env.iter().find(|(key, _)| key == k).map(|(_, v)| v.clone());
        assert_eq!(
            get("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED").as_deref(),
            Some("1")
        );
        let dirs = get("RELATTN_JIT_DIRS").unwrap();
        assert!(dirs.split(':').count() == 3, "{dirs}");
    }
}
