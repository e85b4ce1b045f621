//! The one error type of the GPU side.

#![deny(unsafe_code)]

use crate::routing::PathId;
use cudarc::driver::DriverError;
use thiserror::Error;

/// Everything that can go wrong between a compile plan and a read-back output.
#[derive(Debug, Error)]
pub enum GpuError {
    /// libcuda or libnvrtc cannot be loaded on this machine.
    #[error("no usable CUDA installation: {0}")]
    NoDriver(String),
    /// The requested device ordinal does not exist.
    #[error("GPU {index} does not exist: the driver reports {count} device(s)")]
    NoDevice { index: usize, count: usize },
    /// An architecture name NVRTC cannot take.
    #[error("invalid GPU architecture `{0}`: expected a name like sm_90 or sm_100a")]
    BadArch(String),
    /// NVRTC rejected a program; `log` is NVRTC's full log.
    #[error("NVRTC failed to compile {program} for {arch}:\n{log}")]
    Nvrtc {
        program: String,
        arch: String,
        log: String,
    },
    /// A planted defect's edit does not match the sources once (the sources changed under it).
    #[error("planted defect {mutant}: its edit of {file} matches {matches} time(s) instead of once: update gpu::mutant_patches")]
    BadPatch {
        mutant: String,
        file: String,
        matches: usize,
    },
    /// A CUDA driver call failed.
    #[error("CUDA driver call failed while {what}: {source}")]
    Driver {
        what: String,
        #[source]
        source: DriverError,
    },
    /// The path cannot take this case (reported as a skip, not a failure).
    #[error("{path} does not support this case: {reason}")]
    Unsupported { path: PathId, reason: String },
    /// A kernel trapped (bounds check) or faulted. The error is sticky: the CUDA driver refuses
    /// every later call of this process (checked on the H200: a fresh primary context, even after
    /// a reset, fails with the same error). Run work that may trap in a child process, e.g.
    /// `relattn exec --bounds-check` per case, and keep going in a new process.
    #[error("kernel {kernel} trapped or faulted ({detail}); CUDA is unusable in this process from now on: continue in a new process")]
    Trap { kernel: String, detail: String },
    /// `Loaded` was built without the program a path needs.
    #[error("no compiled program for path {0}: include it in the compile plan")]
    NotCompiled(PathId),
    /// `Gpu::reopen` was called while buffers or modules of the old context were still alive.
    #[error("cannot reopen GPU {0}: drop every Loaded and DeviceProblem made on it first")]
    ContextInUse(usize),
    /// The device cannot be opened again in this process: an earlier kernel trap or fault left a
    /// sticky error. Only a new process can use CUDA again.
    #[error("GPU {index} cannot be reopened in this process after a kernel trap or fault ({detail}): continue in a new process")]
    ContextLost { index: usize, detail: String },
}

/// Attach what was being done to a driver error.
pub(crate) fn driver(what: impl Into<String>) -> impl FnOnce(DriverError) -> GpuError {
    let what = what.into();
    move |source| GpuError::Driver { what, source }
}
