//! `relattn compile-check`: compile every program, both builds (plain and bounds-checked), for
//! every supported architecture with NVRTC, without a GPU (NVRTC is enough). The same check
//! `relattn run` makes after its trials; the outputs land in the shared compile cache, so a later
//! run (or `relattn mutants`' children) finds them compiled.

use crate::exit;
use relattn_kernels::capability::{CapabilitySource, NvmlSource};
use relattn_kernels::gpu;
use std::collections::BTreeMap;
use std::fmt::Write;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print every check as JSON (arch, program, ok, message) instead of a line per architecture.
    #[arg(long)]
    pub json: bool,
    /// Only these architectures (comma-separated, e.g. sm_90a,sm_80; `native`: those of the
    /// visible GPUs, which warms the compile cache for runs on this machine) [default: every
    /// supported one].
    #[arg(long, value_name = "LIST")]
    pub arch: Option<String>,
    /// Write each CUBIN to DIR/ARCH/PROGRAM.BUILD.cubin, e.g. to check that a change of the
    /// sources leaves the machine code as it was (`cmp -r` or `diff -r` of two such folders).
    #[arg(long, value_name = "DIR")]
    pub cubin_dir: Option<std::path::PathBuf>,
}

/// The build architectures of the visible GPUs (exit 3 when there is none).
pub fn native_archs(source: &dyn CapabilitySource) -> anyhow::Result<Vec<String>> {
    let devices = source
        .devices()
        .map_err(|e| exit::no_gpu(format!("--arch native: {e}")))?;
    let mut archs: Vec<String> = devices.iter().map(|d| gpu::compile_arch(d.cc)).collect();
    archs.sort();
    archs.dedup();
    if archs.is_empty() {
        return Err(exit::no_gpu(
            "--arch native: the NVIDIA driver reports no GPU",
        ));
    }
    Ok(archs)
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let archs: Vec<String> = match &args.arch {
        None => gpu::CHECK_ARCHS.iter().map(|a| a.to_string()).collect(),
        Some(list) => {
            let mut archs = Vec::new();
            for a in list.split(',').map(str::trim) {
                if a == "native" {
                    archs.extend(native_archs(&NvmlSource::new())?);
                } else {
                    archs.push(a.to_string());
                }
            }
            archs.dedup();
            archs
        }
    };
    for a in &archs {
        gpu::check_arch(a).map_err(|e| exit::usage(e.to_string()))?;
    }
    if !gpu::nvrtc_available() {
        return Err(exit::no_gpu(
            "NVRTC cannot be loaded (libnvrtc of CUDA 13): the compile check needs it, a GPU it does not",
        ));
    }
    let started = std::time::Instant::now();
    let archs: Vec<&str> = archs.iter().map(String::as_str).collect();
    let records =
        crate::gpu_exec::check_records(&archs, &[gpu::Variant::PLAIN, gpu::Variant::CHECKED])
            .map_err(|e| exit::no_gpu(e.to_string()))?;
    if let Some(dir) = &args.cubin_dir {
        for r in &records {
            let Some(cubin) = &r.cubin else { continue };
            let at = dir.join(&r.arch);
            std::fs::create_dir_all(&at)
                .map_err(|e| exit::usage(format!("creating {}: {e}", at.display())))?;
            let file = at.join(format!("{}.{}.cubin", r.program, r.variant));
            std::fs::write(&file, cubin.as_slice())
                .map_err(|e| exit::usage(format!("writing {}: {e}", file.display())))?;
        }
    }
    let checks: Vec<relattn_reports::CompileCheck> = records
        .into_iter()
        .map(crate::gpu_exec::report_check)
        .collect();
    let failed: Vec<_> = checks.iter().filter(|c| !c.ok).collect();
    let text = if args.json {
        format!("{}\n", serde_json::to_string_pretty(&checks)?)
    } else {
        let mut per_arch: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
        for c in &checks {
            let e = per_arch.entry(c.arch.as_str()).or_default();
            e.0 += usize::from(c.ok);
            e.1 += 1;
        }
        let mut t = String::new();
        for (arch, (ok, all)) in &per_arch {
            let _ = writeln!(t, "{arch:<8} {ok}/{all} compiled");
        }
        for c in &failed {
            let _ = writeln!(t, "FAIL {} {}: {}", c.arch, c.program, c.message);
        }
        let _ = writeln!(
            t,
            "{} of {} compiled in {:.1} s",
            checks.len() - failed.len(),
            checks.len(),
            started.elapsed().as_secs_f64()
        );
        t
    };
    crate::output::print(&text)?;
    if failed.is_empty() {
        Ok(())
    } else {
        Err(exit::failed(format!(
            "{} compile check(s) failed",
            failed.len()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use relattn_kernels::capability::{CapabilityError, MockSource};
    use relattn_routing::Capability;

    #[test]
    fn native_names_the_build_architecture_of_each_visible_gpu_once() {
        let h200 = MockSource::single("NVIDIA H200", Capability::new(9, 0));
        assert_eq!(native_archs(&h200).unwrap(), vec!["sm_90a".to_string()]);
        let a100 = MockSource::single("NVIDIA A100", Capability::new(8, 0));
        assert_eq!(native_archs(&a100).unwrap(), vec!["sm_80".to_string()]);
        for source in [
            MockSource::new(Vec::new()),
            MockSource::failing(CapabilityError::NoDriver("no libnvidia-ml".into())),
        ] {
            let e = native_archs(&source).unwrap_err();
            assert_eq!(exit::code_of(&e), exit::Code::NoGpu, "{e}");
        }
    }
}
