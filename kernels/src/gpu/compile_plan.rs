//! The compile plan: which NVRTC programs a run needs, with which options, and their cache keys.
//! Pure data, so it is tested on machines without a GPU.

#![deny(unsafe_code)]

use super::error::GpuError;
use super::mutant::Mutant;
use super::paths;
use super::source;
use crate::routing::PathId;
use sha2::{Digest, Sha256};

/// The architectures the compile-only check covers (every routed family plus SM120).
pub const CHECK_ARCHS: [&str; 9] = [
    "sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_100", "sm_103", "sm_110", "sm_120",
];

/// Compile-time switches of a build.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Variant {
    /// `-DRELATTN_BOUNDS_CHECK`: every global index is checked; a violation traps.
    pub bounds_check: bool,
    /// Plant one defect: its edits (`Mutant::patches`) applied to the program's sources.
    pub mutant: Option<Mutant>,
}

impl Variant {
    pub const PLAIN: Variant = Variant {
        bounds_check: false,
        mutant: None,
    };
    pub const CHECKED: Variant = Variant {
        bounds_check: true,
        mutant: None,
    };

    /// A short label, e.g. `plain`, `checked`, `checked+kv_head_modulo`.
    pub fn label(&self) -> String {
        let base = if self.bounds_check {
            "checked"
        } else {
            "plain"
        };
        match self.mutant {
            Some(m) => format!("{base}+{m}"),
            None => base.to_string(),
        }
    }
}

/// One NVRTC program of a plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgramBuild {
    pub path: PathId,
    /// Name in NVRTC logs, e.g. `sheared_bias_main_bf16.cu` (`fallback_bf16.cu`: every stage).
    pub name: String,
    /// The path's own file.
    pub source: String,
    /// The headers it includes, as (include name, text), given to NVRTC in memory.
    pub headers: Vec<(String, String)>,
    pub options: Vec<String>,
    /// Kernels the program must define.
    pub entries: Vec<String>,
}

impl ProgramBuild {
    /// sha256 over source, headers, options, arch and NVRTC version: a change to any of them is
    /// a new key.
    pub fn cache_key(&self, arch: &str, nvrtc_version: (i32, i32)) -> String {
        let mut h = Sha256::new();
        let headers: Vec<&str> = self
            .headers
            .iter()
            .flat_map(|(name, text)| [name.as_str(), text.as_str()])
            .collect();
        for part in [
            "relattn-cubin-v2",
            &self.source,
            &headers.join("\u{1f}"),
            &self.options.join("\u{1f}"),
            arch,
            &format!("nvrtc {}.{}", nvrtc_version.0, nvrtc_version.1),
        ] {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part.as_bytes());
        }
        hex::encode(h.finalize())
    }
}

/// Every program a run needs for one architecture and variant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompilePlan {
    pub arch: String,
    pub variant: Variant,
    pub programs: Vec<ProgramBuild>,
}

impl CompilePlan {
    /// The programs of `paths` (duplicates dropped) for `arch` (e.g. `sm_90`): one per entry (a
    /// path's stage in one dtype), so the programs of a build compile in parallel and none waits
    /// for a larger one.
    pub fn new(arch: &str, variant: Variant, paths: &[PathId]) -> Result<CompilePlan, GpuError> {
        CompilePlan::build(arch, variant, paths, true)
    }

    /// The programs of every path, one per path and dtype with all its stages: what NVRTC's front
    /// end checks (`syntax_check`), where a program per entry would parse the headers once per
    /// entry for nothing.
    pub fn per_dtype(arch: &str, variant: Variant) -> Result<CompilePlan, GpuError> {
        CompilePlan::build(arch, variant, &PathId::ALL, false)
    }

    fn build(
        arch: &str,
        variant: Variant,
        paths: &[PathId],
        per_stage: bool,
    ) -> Result<CompilePlan, GpuError> {
        check_arch(arch)?;
        let mut seen = Vec::new();
        for &p in paths {
            if !seen.contains(&p) {
                seen.push(p);
            }
        }
        let mut programs = Vec::new();
        for path in seen {
            let mut source = source::program_source(path);
            let mut headers = source::headers();
            if let Some(m) = variant.mutant {
                plant(m, path, &mut source, &mut headers)?;
            }
            for dtype in source::DTYPES {
                let mut options = options(arch, variant);
                options.push(source::dtype_option(dtype));
                let program = |name, options, entries| ProgramBuild {
                    path,
                    name,
                    source: source.clone(),
                    headers: headers.clone(),
                    options,
                    entries,
                };
                if !per_stage {
                    let entries = source::entries_of(path, dtype);
                    programs.push(program(source::program_name(path, dtype), options, entries));
                    continue;
                }
                for &stage in paths::path_kernels(path).stages {
                    let mut options = options.clone();
                    options.push(source::stage_option(stage));
                    let entry = source::entry_name(path, stage, dtype);
                    programs.push(program(format!("{entry}.cu"), options, vec![entry]));
                }
            }
        }
        Ok(CompilePlan {
            arch: arch.to_string(),
            variant,
            programs,
        })
    }

    /// All three paths.
    pub fn all_paths(arch: &str, variant: Variant) -> Result<CompilePlan, GpuError> {
        CompilePlan::new(arch, variant, &PathId::ALL)
    }
}

/// NVRTC options of a build. No include path: the sources include only the in-memory headers.
pub fn options(arch: &str, variant: Variant) -> Vec<String> {
    let mut o = vec![
        format!("-arch={arch}"),
        "--std=c++17".to_string(),
        "-default-device".to_string(),
    ];
    if variant.bounds_check {
        o.push("-DRELATTN_BOUNDS_CHECK".to_string());
    }
    o
}

/// Apply the edits of planted defect `m` to path `path`'s sources (its own file and the headers);
/// edits of other paths' files are not this program's.
fn plant(
    m: Mutant,
    path: PathId,
    source: &mut String,
    headers: &mut [(String, String)],
) -> Result<(), GpuError> {
    let own = source::own_file(path).0;
    for patch in m.patches() {
        let text = if patch.file == own {
            &mut *source
        } else if let Some((_, text)) = headers.iter_mut().find(|(name, _)| name == patch.file) {
            text
        } else {
            continue;
        };
        let matches = text.matches(patch.from).count();
        if matches != 1 {
            return Err(GpuError::BadPatch {
                mutant: m.to_string(),
                file: patch.file.to_string(),
                matches,
            });
        }
        *text = text.replacen(patch.from, patch.to, 1);
    }
    Ok(())
}

/// `sm_` followed by digits and an optional letter suffix (`sm_90a`, `sm_100f`).
pub fn check_arch(arch: &str) -> Result<(), GpuError> {
    let bad = || GpuError::BadArch(arch.to_string());
    let rest = arch.strip_prefix("sm_").ok_or_else(bad)?;
    let digits = rest.trim_end_matches(|c: char| c.is_ascii_lowercase());
    let suffix = &rest[digits.len()..];
    if digits.len() < 2 || !digits.bytes().all(|b| b.is_ascii_digit()) || suffix.len() > 1 {
        return Err(bad());
    }
    Ok(())
}
