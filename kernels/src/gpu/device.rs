//! One GPU: its context and stream, loading compiled programs, and recovery after a trap.

#![deny(unsafe_code)]

use super::compile::Compiled;
use super::compile_plan::{check_arch, Variant};
use super::error::{driver, GpuError};
use super::ffi;
use super::launch_lock::{lock_path, LaunchLock};
use super::launch_plan::{SmLimits, WGMMA_ARCH};
use super::paths::Stage;
use super::source::entry_name;
use crate::routing::{Capability, PathId};
use cudarc::driver::{sys, CudaContext, CudaFunction, CudaStream, DriverError};
use cudarc::nvrtc::Ptx;
use relattn_reference::DType;
use std::collections::HashMap;
use std::sync::Arc;

/// An open GPU. `Send + Sync`: drive one per thread for several devices.
#[derive(Debug)]
pub struct Gpu {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) stream: Arc<CudaStream>,
    index: usize,
    name: String,
    capability: Capability,
    /// (SMs, shared memory per SM, shared memory a CTA may opt in to).
    sms: (usize, usize, usize),
    /// Makes launches of processes sharing this GPU take turns.
    pub(crate) launch_lock: LaunchLock,
}

/// The kernels of one `Compiled`, loaded on one `Gpu`.
#[derive(Debug)]
pub struct Loaded {
    pub(crate) variant: Variant,
    pub(crate) arch: String,
    functions: HashMap<String, CudaFunction>,
    paths: Vec<PathId>,
}

impl Gpu {
    /// Whether libcuda and libnvrtc can both be loaded. Nothing may touch cudarc before this is
    /// true: cudarc panics when a library is missing.
    pub fn available() -> bool {
        ffi::driver_library_present() && ffi::nvrtc_library_present()
    }

    /// GPUs the driver reports (0 when there is no driver).
    pub fn device_count() -> Result<usize, GpuError> {
        if !ffi::driver_library_present() {
            return Err(GpuError::NoDriver("libcuda cannot be loaded".into()));
        }
        cudarc::driver::result::init().map_err(driver("initialising the CUDA driver"))?;
        let n = CudaContext::device_count().map_err(driver("counting devices"))?;
        Ok(n.max(0) as usize)
    }

    /// Open device `index` (its primary context and a fresh stream).
    pub fn open(index: usize) -> Result<Gpu, GpuError> {
        if !Gpu::available() {
            return Err(GpuError::NoDriver(
                "libcuda or libnvrtc cannot be loaded".into(),
            ));
        }
        let count = Gpu::device_count()?;
        if index >= count {
            return Err(GpuError::NoDevice { index, count });
        }
        let ctx = CudaContext::new(index).map_err(|source| {
            if is_fault(&source) {
                GpuError::ContextLost {
                    index,
                    detail: source.to_string(),
                }
            } else {
                GpuError::Driver {
                    what: format!("opening GPU {index}"),
                    source,
                }
            }
        })?;
        ffi::single_stream_mode(&ctx);
        let name = ctx.name().map_err(driver("reading the device name"))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(driver("reading the compute capability"))?;
        let stream = ctx.new_stream().map_err(driver("creating a stream"))?;
        use sys::CUdevice_attribute as A;
        let attr = |a: A| -> Result<usize, GpuError> {
            let v = ctx
                .attribute(a)
                .map_err(driver("reading a device attribute"))?;
            Ok(v.max(0) as usize)
        };
        let sms = (
            attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
            attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)?,
            attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?,
        );
        let launch_lock = match ctx.uuid() {
            Ok(uuid) => {
                let hex: String = uuid
                    .bytes
                    .iter()
                    .map(|b| format!("{:02x}", *b as u8))
                    .collect();
                LaunchLock::open(lock_path(&hex))
            }
            Err(_) => LaunchLock::none(),
        };
        Ok(Gpu {
            ctx,
            stream,
            index,
            name,
            capability: Capability::new(major as u32, minor as u32),
            sms,
            launch_lock,
        })
    }

    /// Release this GPU and open a fresh context on the same device (drop every `Loaded` and
    /// `DeviceProblem` made on it first). After a `Trap` this returns `ContextLost`: the CUDA
    /// driver keeps a trap's error for the whole process, so recovery needs a new process.
    pub fn reopen(self) -> Result<Gpu, GpuError> {
        let Gpu {
            ctx, stream, index, ..
        } = self;
        drop(stream);
        if Arc::strong_count(&ctx) > 1 {
            return Err(GpuError::ContextInUse(index));
        }
        drop(ctx);
        Gpu::open(index)
    }

    pub fn index(&self) -> usize {
        self.index
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn capability(&self) -> Capability {
        self.capability
    }

    /// The NVRTC architecture the kernels are built for on this device (`compile_arch`).
    pub fn arch(&self) -> String {
        compile_arch(self.capability)
    }

    /// The SM limits the launcher sizes shared memory with; `resident_ctas` is filled per
    /// kernel by the caller.
    pub(crate) fn sm_limits(&self, resident_ctas: usize) -> SmLimits {
        SmLimits {
            sm_count: self.sms.0,
            smem_per_sm: self.sms.1,
            smem_per_block: self.sms.2,
            resident_ctas,
        }
    }

    /// The driver's CUDA version, e.g. 13000 for CUDA 13.0.
    pub fn driver_version(&self) -> Result<i32, GpuError> {
        ffi::driver_version().map_err(driver("reading the driver version"))
    }

    /// (free, total) device memory in bytes.
    pub fn memory(&self) -> Result<(usize, usize), GpuError> {
        self.ctx
            .mem_get_info()
            .map_err(driver("reading device memory"))
    }

    /// Load every program of `compiled` (which must target this device's architecture).
    pub fn load(&self, compiled: &Compiled) -> Result<Loaded, GpuError> {
        let mut functions = HashMap::new();
        let mut paths = Vec::new();
        for program in &compiled.programs {
            let what = format!(
                "loading {} ({}) on {}",
                program.name, compiled.arch, self.name
            );
            let module = self
                .ctx
                .load_module(Ptx::from_binary(program.cubin.to_vec()))
                .map_err(driver(what))?;
            for entry in &program.entries {
                let f = module
                    .load_function(entry)
                    .map_err(driver(format!("finding kernel {entry}")))?;
                // Let every kernel take as much dynamic shared memory as a CTA may opt in to;
                // each launch then asks for what it needs.
                let fixed = f
                    .shared_size_bytes()
                    .map_err(driver(format!("reading {entry}'s shared memory")))?;
                let dynamic = (self.sms.2 as i32 - fixed).max(0);
                f.set_attribute(
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    dynamic,
                )
                .map_err(driver(format!(
                    "allowing {entry} {dynamic} bytes of shared memory"
                )))?;
                functions.insert(entry.clone(), f);
            }
            paths.push(program.path);
        }
        Ok(Loaded {
            variant: compiled.variant,
            arch: compiled.arch.clone(),
            functions,
            paths,
        })
    }
}

impl Loaded {
    pub fn variant(&self) -> Variant {
        self.variant
    }

    pub fn arch(&self) -> &str {
        &self.arch
    }

    pub fn has_path(&self, path: PathId) -> bool {
        self.paths.contains(&path)
    }

    pub(crate) fn function(
        &self,
        path: PathId,
        stage: Stage,
        dtype: DType,
    ) -> Result<(String, &CudaFunction), GpuError> {
        let name = entry_name(path, stage, dtype);
        match self.functions.get(&name) {
            Some(f) => Ok((name, f)),
            None => Err(GpuError::NotCompiled(path)),
        }
    }
}

/// Environment variable overriding the architecture the kernels are built for.
pub const ARCH_ENV: &str = "RELATTN_ARCH";

/// The NVRTC architecture the kernels are built for on a device of capability `c`: `sm_90a` for
/// exactly 9.0 (Hopper's architecture-specific features: the query-block kernel uses wgmma), else
/// `sm_XY` (portable tensor-core kernels); `RELATTN_ARCH` overrides it when it holds a valid name
/// (e.g. `sm_90` to time the portable kernels on a Hopper GPU, which must be able to run it).
/// Every command that compiles for a device goes through here.
pub fn compile_arch(c: Capability) -> String {
    match std::env::var(ARCH_ENV) {
        Ok(a) if check_arch(&a).is_ok() => a,
        _ => native_arch(c),
    }
}

/// `compile_arch` without the override.
pub fn native_arch(c: Capability) -> String {
    if c == Capability::new(9, 0) {
        WGMMA_ARCH.to_string()
    } else {
        c.sm_name()
    }
}

/// The driver errors a kernel trap or fault leaves behind (sticky for the process).
pub(crate) fn is_fault(e: &DriverError) -> bool {
    use sys::cudaError_enum as E;
    matches!(
        e.0,
        E::CUDA_ERROR_LAUNCH_FAILED
            | E::CUDA_ERROR_ILLEGAL_ADDRESS
            | E::CUDA_ERROR_ILLEGAL_INSTRUCTION
            | E::CUDA_ERROR_MISALIGNED_ADDRESS
            | E::CUDA_ERROR_INVALID_ADDRESS_SPACE
            | E::CUDA_ERROR_INVALID_PC
            | E::CUDA_ERROR_HARDWARE_STACK_ERROR
            | E::CUDA_ERROR_ASSERT
            | E::CUDA_ERROR_LAUNCH_TIMEOUT
    )
}
