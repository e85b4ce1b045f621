//! `relattn compile-check`: compile every program, both builds (plain and bounds-checked), for
//! every supported architecture with NVRTC, without a GPU (NVRTC is enough). The same check
//! `relattn run` makes after its trials; the outputs land in the shared compile cache, so a later
//! run (or `relattn mutants`' children) finds them compiled.

use crate::exit;
use relattn_kernels::gpu;
use std::collections::BTreeMap;
use std::fmt::Write;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print every check as JSON (arch, program, ok, message) instead of a line per architecture.
    #[arg(long)]
    pub json: bool,
    /// Only these architectures (comma-separated, e.g. sm_90a,sm_80) [default: every supported
    /// one].
    #[arg(long, value_name = "LIST")]
    pub arch: Option<String>,
    /// Write each CUBIN to DIR/ARCH/PROGRAM.BUILD.cubin, e.g. to check that a change of the
    /// sources leaves the machine code as it was (`cmp -r` or `diff -r` of two such folders).
    #[arg(long, value_name = "DIR")]
    pub cubin_dir: Option<std::path::PathBuf>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if !gpu::nvrtc_available() {
        return Err(exit::no_gpu(
            "NVRTC cannot be loaded (libnvrtc of CUDA 13): the compile check needs it, a GPU it does not",
        ));
    }
    let started = std::time::Instant::now();
    let archs: Vec<String> = match &args.arch {
        None => gpu::CHECK_ARCHS.iter().map(|a| a.to_string()).collect(),
        Some(list) => list.split(',').map(|a| a.trim().to_string()).collect(),
    };
    for a in &archs {
        gpu::check_arch(a).map_err(|e| exit::usage(e.to_string()))?;
    }
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
