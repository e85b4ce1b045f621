//! relattn-kernels: the GPU paths (CUDA C through NVRTC), the capability sources and preflight,
//! and routing (`relattn_routing`, pure, no GPU needed) re-exported as `routing`.

pub mod capability;
pub mod gpu;
pub use relattn_routing as routing;
