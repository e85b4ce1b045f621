//! NVRTC compilation of a plan: every program in parallel, through an in-memory and an on-disk
//! CUBIN cache keyed by `ProgramBuild::cache_key`. Needs libnvrtc only (no driver, no GPU), so the
//! compile-only check over every architecture runs on any machine that has NVRTC.

#![deny(unsafe_code)]

use super::compile_plan::{CompilePlan, ProgramBuild, Variant};
use super::error::GpuError;
use super::ffi;
use super::mutant::Mutant;
use crate::routing::PathId;
use rayon::prelude::*;
use serde::Serialize;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

/// One compiled program.
#[derive(Debug, Clone)]
pub struct CompiledProgram {
    pub path: PathId,
    pub name: String,
    pub cache_key: String,
    pub entries: Vec<String>,
    pub cubin: Arc<Vec<u8>>,
}

/// Every program of a plan, ready to load on a device of the plan's architecture.
#[derive(Debug, Clone)]
pub struct Compiled {
    pub arch: String,
    pub variant: Variant,
    pub nvrtc_version: (i32, i32),
    pub programs: Vec<CompiledProgram>,
}

/// One line of the compile-only check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CheckRecord {
    pub arch: String,
    pub program: String,
    /// `plain`, `checked`, ... (see `Variant::label`).
    pub variant: String,
    pub ok: bool,
    /// Empty on success; the NVRTC error and log otherwise.
    pub message: String,
    /// The CUBIN on success (to compare builds: equal bytes, equal machine code).
    #[serde(skip)]
    pub cubin: Option<Arc<Vec<u8>>>,
}

/// Whether NVRTC can be loaded (all that compiling needs).
pub fn nvrtc_available() -> bool {
    ffi::nvrtc_library_present()
}

/// NVRTC's version, or NoDriver when NVRTC is missing.
pub fn nvrtc_version() -> Result<(i32, i32), GpuError> {
    if !nvrtc_available() {
        return Err(GpuError::NoDriver("libnvrtc cannot be loaded".into()));
    }
    ffi::nvrtc_version().map_err(GpuError::NoDriver)
}

/// Where compiled CUBINs are kept: `RELATTN_CACHE_DIR`, else `$XDG_CACHE_HOME/relattn`, else
/// `~/.cache/relattn`; None when none of these is set.
pub fn cache_dir() -> Option<PathBuf> {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    var("RELATTN_CACHE_DIR")
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("relattn")))
        .or_else(|| var("HOME").map(|d| d.join(".cache").join("relattn")))
}

fn memory_cache() -> &'static Mutex<HashMap<String, Arc<Vec<u8>>>> {
    static CACHE: OnceLock<Mutex<HashMap<String, Arc<Vec<u8>>>>> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

fn cached(key: &str) -> Option<Arc<Vec<u8>>> {
    if let Some(hit) = memory_cache().lock().ok()?.get(key) {
        return Some(hit.clone());
    }
    let bytes = std::fs::read(cache_dir()?.join(format!("{key}.cubin"))).ok()?;
    let bytes = Arc::new(bytes);
    if let Ok(mut m) = memory_cache().lock() {
        m.insert(key.to_string(), bytes.clone());
    }
    Some(bytes)
}

/// Keep a CUBIN in memory and, best effort, on disk (a failed write only costs a recompile).
fn store(key: &str, cubin: &Arc<Vec<u8>>) {
    if let Ok(mut m) = memory_cache().lock() {
        m.insert(key.to_string(), cubin.clone());
    }
    if let Some(dir) = cache_dir() {
        if std::fs::create_dir_all(&dir).is_ok() {
            // Written atomically, so a concurrent reader never sees half a file.
            let path = dir.join(format!("{key}.cubin"));
            let _ = relattn_common::files::write_atomic(&path, |w| w.write_all(cubin));
        }
    }
}

/// Whether a CUBIN's symbol names hold `entry` (NUL-terminated, as an ELF string table keeps it;
/// its kernel's section names end with it too).
pub fn cubin_defines(cubin: &[u8], entry: &str) -> bool {
    let mut name = entry.as_bytes().to_vec();
    name.push(0);
    cubin.windows(name.len()).any(|w| w == name.as_slice())
}

fn compile_one(
    p: &ProgramBuild,
    arch: &str,
    version: (i32, i32),
) -> Result<CompiledProgram, GpuError> {
    let key = p.cache_key(arch, version);
    let cubin =
        match cached(&key) {
            Some(c) => c,
            None => {
                let bytes = ffi::compile_cubin(&p.name, &p.source, &p.headers, &p.options)
                    .map_err(|log| GpuError::Nvrtc {
                        program: p.name.clone(),
                        arch: arch.to_string(),
                        log,
                    })?;
                let bytes = Arc::new(bytes);
                store(&key, &bytes);
                bytes
            }
        };
    // An entry the program lost (a define keeping the wrong stage or dtype) fails here, on
    // machines without a GPU too, not first when a device loads it.
    if let Some(missing) = p.entries.iter().find(|e| !cubin_defines(&cubin, e)) {
        return Err(GpuError::Nvrtc {
            program: p.name.clone(),
            arch: arch.to_string(),
            log: format!("the CUBIN has no kernel named {missing}"),
        });
    }
    Ok(CompiledProgram {
        path: p.path,
        name: p.name.clone(),
        cache_key: key,
        entries: p.entries.clone(),
        cubin,
    })
}

/// Compile every program of `plan` in parallel. The first failing program (in plan order) is the
/// error, with its NVRTC log.
pub fn compile(plan: &CompilePlan) -> Result<Compiled, GpuError> {
    let version = nvrtc_version()?;
    let results: Vec<Result<CompiledProgram, GpuError>> = plan
        .programs
        .par_iter()
        .map(|p| compile_one(p, &plan.arch, version))
        .collect();
    let programs = results.into_iter().collect::<Result<Vec<_>, _>>()?;
    Ok(Compiled {
        arch: plan.arch.clone(),
        variant: plan.variant,
        nvrtc_version: version,
        programs,
    })
}

/// Compile every program for every architecture and variant (in parallel, through the cache) and
/// record which compiled. Err only when NVRTC is missing or an architecture name is malformed.
pub fn compile_check(archs: &[&str], variants: &[Variant]) -> Result<Vec<CheckRecord>, GpuError> {
    let version = nvrtc_version()?;
    let mut jobs = Vec::new();
    for &arch in archs {
        for &variant in variants {
            for program in CompilePlan::all_paths(arch, variant)?.programs {
                jobs.push((arch, variant, program));
            }
        }
    }
    Ok(jobs
        .par_iter()
        .map(|(arch, variant, program)| {
            let result = compile_one(program, arch, version);
            CheckRecord {
                arch: arch.to_string(),
                program: program.name.clone(),
                variant: variant.label(),
                ok: result.is_ok(),
                cubin: result.as_ref().ok().map(|c| c.cubin.clone()),
                message: result.err().map(|e| e.to_string()).unwrap_or_default(),
            }
        })
        .collect())
}

/// NVRTC's front end over every program of `arch` in every build: plain, bounds-checked and each
/// planted defect's (parsing, template instantiation and type checks of every entry, no code
/// generation: a tenth of a second per program). Machines with NVRTC and no GPU (CPU CI) catch
/// a CUDA edit that does not compile this way. Err when NVRTC cannot be loaded.
pub fn syntax_check(arch: &str) -> Result<Vec<CheckRecord>, GpuError> {
    if !nvrtc_available() {
        return Err(GpuError::NoDriver("libnvrtc cannot be loaded".into()));
    }
    let mut variants = vec![Variant::PLAIN, Variant::CHECKED];
    variants.extend(Mutant::ALL.into_iter().map(|m| Variant {
        bounds_check: false,
        mutant: Some(m),
    }));
    let mut jobs = Vec::new();
    for variant in variants {
        for program in CompilePlan::per_dtype(arch, variant)?.programs {
            jobs.push((variant, program));
        }
    }
    Ok(jobs
        .par_iter()
        .map(|(variant, p)| {
            let result = ffi::check_syntax(&p.name, &p.source, &p.headers, &p.options);
            CheckRecord {
                arch: arch.to_string(),
                program: p.name.clone(),
                variant: variant.label(),
                ok: result.is_ok(),
                message: result.err().unwrap_or_default(),
                cubin: None,
            }
        })
        .collect())
}
