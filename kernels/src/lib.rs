//! relattn-kernels: routing (pure, no GPU needed) and the GPU paths (CUDA C through NVRTC).

pub mod capability;
pub mod gpu;
pub mod routing;
