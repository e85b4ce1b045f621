//! The compile-only check `run` ends with: every program's plain build for every architecture,
//! beside the trials at the lowest priority.

use super::Args;
use relattn_kernels::gpu::Variant;
use relattn_reports::CompileCheck;
use std::thread::JoinHandle;

/// Whether `run` ends with the compile-only check of every program for every architecture: on
/// a run with native GPU trials, unless `--no-compile-checks`.
pub(super) fn wants_compile_checks(args: &Args, native_gpu: bool) -> bool {
    native_gpu && !args.no_compile_checks
}

/// The compile checks running beside the trials.
pub(super) struct Checks(JoinHandle<Vec<CompileCheck>>);

/// Starts the compile checks on a thread of their own when the run wants them
/// (`wants_compile_checks`). They run beside the trials, after the device's own programs were
/// compiled (the session did that): the trials come first, the checks fill the cores the
/// trials leave idle.
pub(super) fn start(args: &Args, native_gpu: bool) -> Option<Checks> {
    wants_compile_checks(args, native_gpu).then(|| Checks(std::thread::spawn(run_compile_checks)))
}

impl Checks {
    /// Waits for the checks; a panic among them is one failed check.
    pub(super) fn wait(self) -> Vec<CompileCheck> {
        self.0.join().unwrap_or_else(|_| {
            vec![CompileCheck {
                arch: "all".into(),
                program: "every program".into(),
                ok: false,
                message: "the compile check panicked".into(),
            }]
        })
    }
}

/// The compile checks of `run`: the plain build of every program for every architecture, on a
/// pool of one thread per core at the lowest priority, so they take only the cores the trials
/// leave idle.
fn run_compile_checks() -> Vec<CompileCheck> {
    let checks = background_pool(rayon::current_num_threads())
        .map_err(|e| e.to_string())
        .and_then(|pool| {
            pool.install(|| crate::gpu_exec::compile_checks(&[Variant::PLAIN]))
                .map_err(|e| e.to_string())
        });
    checks.unwrap_or_else(|message| {
        vec![CompileCheck {
            arch: "all".into(),
            program: "every program".into(),
            ok: false,
            message,
        }]
    })
}

/// A thread pool whose threads run at the lowest scheduling priority (nice 19; on Linux the
/// nice value is per thread). Where the system refuses, the threads keep the usual priority.
pub(super) fn background_pool(
    threads: usize,
) -> Result<rayon::ThreadPool, rayon::ThreadPoolBuildError> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads.max(1))
        .thread_name(|i| format!("relattn-compile-check-{i}"))
        .start_handler(|_| {
            let _ = rustix::process::setpriority_process(None, 19);
        })
        .build()
}
