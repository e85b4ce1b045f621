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
    /// A kernel trapped (bounds check) or faulted. The CUDA context is dead afterwards: drop every
    /// `Loaded` and `DeviceProblem` of this `Gpu`, then call `Gpu::reopen`.
    #[error("kernel {kernel} trapped or faulted ({detail}); the CUDA context is unusable until Gpu::reopen")]
    Trap { kernel: String, detail: String },
    /// `Loaded` was built without the program a path needs.
    #[error("no compiled program for path {0}: include it in the compile plan")]
    NotCompiled(PathId),
    /// `Gpu::reopen` was called while buffers or modules of the old context were still alive.
    #[error("cannot reopen GPU {0}: drop every Loaded and DeviceProblem made on it first")]
    ContextInUse(usize),
}

/// Attach what was being done to a driver error.
pub(crate) fn driver(what: impl Into<String>) -> impl FnOnce(DriverError) -> GpuError {
    let what = what.into();
    move |source| GpuError::Driver { what, source }
}
