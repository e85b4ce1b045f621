//! The real GPU executor, over `relattn_kernels::gpu`.

use crate::execute::GpuExecutor;
use crate::plan::BoundsCheck;
use crate::session::ExecutorFactory;
use relattn_kernels::capability::DeviceInfo;

/// Whether the CUDA driver library and NVRTC can be loaded on this machine.
pub fn libraries_present() -> bool {
    false
}

pub struct RealFactory;

impl ExecutorFactory for RealFactory {
    fn create(&self, _devices: &[DeviceInfo], _bounds: BoundsCheck) -> Result<Box<dyn GpuExecutor>, String> {
        Err("GPU execution is not built in".into())
    }
}

/// Add the GPU software versions and compile checks to a report's environment.
pub fn describe(_session: &crate::session::Session, _env: &mut relattn_reports::Environment) {}
