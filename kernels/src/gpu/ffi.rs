//! Every `unsafe` of the crate: library probes, NVRTC's C API, raw memsets and kernel launches.
//! Each block says why it is sound; nothing else in the crate may use `unsafe`.

#![allow(unsafe_code)]

use super::params::{Params, TensorMap};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtrMut, DeviceRepr, DriverError,
    LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc;
use std::ffi::{c_char, CString};
use std::sync::Arc;

// SAFETY: `Params` is `#[repr(C)]`, `Copy`, holds only integers and floats, and matches the C
// struct the kernels take by value field for field (tested against params.cuh).
unsafe impl DeviceRepr for Params {}

/// Whether libcuda can be loaded. Must be true before anything touches cudarc's driver API,
/// which panics when the library is missing.
pub(crate) fn driver_library_present() -> bool {
    // SAFETY: only tries to dlopen the library by name and drops the handle; no symbol is called.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Whether libnvrtc can be loaded (the same guard for cudarc's NVRTC API).
pub(crate) fn nvrtc_library_present() -> bool {
    // SAFETY: as above, a dlopen probe only.
    unsafe { nvrtc::sys::is_culib_present() }
}

/// NVRTC's (major, minor) version. Call only after `nvrtc_library_present()`.
pub(crate) fn nvrtc_version() -> Result<(i32, i32), String> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the library is present (caller's contract); both pointers are valid for writes.
    unsafe { nvrtc::sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| format!("nvrtcVersion failed: {e:?}"))?;
    Ok((major, minor))
}

/// The CUDA driver version as the driver reports it (e.g. 13000). Call only after
/// `driver_library_present()`.
pub(crate) fn driver_version() -> Result<i32, DriverError> {
    let mut v = 0;
    // SAFETY: the library is present (caller's contract); the pointer is valid for a write.
    unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) }.result()?;
    Ok(v)
}

/// Compile `source` to a CUBIN for the `-arch` in `options`. Err carries NVRTC's error and full
/// log. Call only after `nvrtc_library_present()`.
pub(crate) fn compile_cubin(
    name: &str,
    source: &str,
    headers: &[(String, String)],
    options: &[String],
) -> Result<Vec<u8>, String> {
    nvrtc_compile(name, source, headers, options, true)
}

/// Run NVRTC's front end only (`-fdevice-syntax-only`: parsing, templates instantiated for every
/// entry, types checked; no code generated). Err carries NVRTC's error and log.
pub(crate) fn check_syntax(
    name: &str,
    source: &str,
    headers: &[(String, String)],
    options: &[String],
) -> Result<(), String> {
    let mut options = options.to_vec();
    options.push("-fdevice-syntax-only".to_string());
    nvrtc_compile(name, source, headers, &options, false).map(|_| ())
}

fn nvrtc_compile(
    name: &str,
    source: &str,
    headers: &[(String, String)],
    options: &[String],
    want_cubin: bool,
) -> Result<Vec<u8>, String> {
    let nul = |what: &str| format!("{what} contains a NUL byte");
    let src = CString::new(source).map_err(|_| nul("source"))?;
    let cname = CString::new(name).map_err(|_| nul("program name"))?;
    let mut texts = Vec::with_capacity(headers.len());
    let mut names = Vec::with_capacity(headers.len());
    for (include, text) in headers {
        names.push(CString::new(include.as_str()).map_err(|_| nul("a header name"))?);
        texts.push(CString::new(text.as_str()).map_err(|_| nul(include))?);
    }
    let text_ptrs: Vec<*const c_char> = texts.iter().map(|t| t.as_ptr()).collect();
    let name_ptrs: Vec<*const c_char> = names.iter().map(|n| n.as_ptr()).collect();
    let mut prog: nvrtc::sys::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: every pointer is to a NUL-terminated string alive until this function returns
    // (NVRTC copies them into the program); the two arrays have `headers.len()` entries each.
    unsafe {
        nvrtc::sys::nvrtcCreateProgram(
            &mut prog,
            src.as_ptr(),
            cname.as_ptr(),
            headers.len() as i32,
            text_ptrs.as_ptr(),
            name_ptrs.as_ptr(),
        )
    }
    .result()
    .map_err(|e| format!("nvrtcCreateProgram: {e:?}"))?;
    // SAFETY: `prog` was just created and is destroyed only at the end of this function; `src` and
    // `cname` outlive it.
    let compiled = unsafe { nvrtc::result::compile_program(prog, options) };
    // SAFETY: as above.
    let log = match unsafe { nvrtc::result::get_program_log(prog) } {
        Ok(chars) => {
            let bytes: Vec<u8> = chars
                .iter()
                .take_while(|&&c| c != 0)
                .map(|&c| c as u8)
                .collect();
            String::from_utf8_lossy(&bytes).into_owned()
        }
        Err(e) => format!("(no log: {e:?})"),
    };
    let result = match compiled {
        Err(e) => Err(format!("{e:?}\n{log}")),
        Ok(()) if !want_cubin => Ok(Vec::new()),
        Ok(()) => {
            let mut size = 0usize;
            // SAFETY: `prog` compiled successfully; `size` is valid for a write.
            match unsafe { nvrtc::sys::nvrtcGetCUBINSize(prog, &mut size) }.result() {
                Err(e) => Err(format!(
                    "nvrtcGetCUBINSize: {e:?} (is -arch a real sm_ architecture?)\n{log}"
                )),
                Ok(()) => {
                    let mut cubin = vec![0u8; size];
                    // SAFETY: `cubin` has exactly the size NVRTC reported for this program.
                    unsafe { nvrtc::sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr() as *mut c_char) }
                        .result()
                        .map(|()| cubin)
                        .map_err(|e| format!("nvrtcGetCUBIN: {e:?}\n{log}"))
                }
            }
        }
    };
    // SAFETY: `prog` is valid and not used after this.
    let _ = unsafe { nvrtc::result::destroy_program(prog) };
    result
}

/// Turn off cudarc's per-buffer event tracking: every buffer of a `Gpu` lives on its one stream,
/// where stream order already serialises all uses.
pub(crate) fn single_stream_mode(ctx: &Arc<CudaContext>) {
    // SAFETY: called right after the context is created, before any buffer exists; all later
    // work on this context goes through one stream, so no cross-stream synchronisation is needed.
    unsafe { ctx.disable_event_tracking() }
}

/// Set every byte of `buf` to `byte` (e.g. 0xFF: NaN in every float format), in stream order.
pub(crate) fn fill_bytes<T>(
    stream: &Arc<CudaStream>,
    buf: &mut CudaSlice<T>,
    byte: u8,
) -> Result<(), DriverError> {
    let n = buf.num_bytes();
    let (ptr, _guard) = buf.device_ptr_mut(stream);
    // SAFETY: `ptr` addresses `n` bytes owned by `buf`, which outlives the enqueued memset because
    // every use of it is ordered on this stream and it is freed on the same stream.
    unsafe { cudarc::driver::result::memset_d8_async(ptr, byte, n, stream.cu_stream()) }
}

/// A buffer of `len` elements whose bytes nothing has written (no memset, no copy): what
/// compute-sanitizer's initcheck needs to see a read of a workspace element no kernel wrote.
pub(crate) fn alloc_unwritten<T: DeviceRepr>(
    stream: &Arc<CudaStream>,
    len: usize,
) -> Result<CudaSlice<T>, DriverError> {
    // SAFETY: the elements are plain device bytes of a `DeviceRepr` type; reading one before a
    // kernel writes it yields unspecified bytes, never undefined behaviour on the host (the host
    // reads back only what the launches wrote, or a poison image it uploaded itself).
    unsafe { stream.alloc::<T>(len) }
}

/// Launch one kernel taking `Params` by value, with the CTA size the entries are built for (entry.cuh) and
/// `shared_mem_bytes` of dynamic shared memory (the function must allow that much: see
/// `Gpu::load`).
pub(crate) fn launch(
    stream: &Arc<CudaStream>,
    func: &CudaFunction,
    grid: (u32, u32, u32),
    threads: u32,
    shared_mem_bytes: u32,
    params: &Params,
) -> Result<(), DriverError> {
    let cfg = LaunchConfig {
        grid_dim: grid,
        block_dim: (threads, 1, 1),
        shared_mem_bytes,
    };
    let mut builder = stream.launch_builder(func);
    builder.arg(params);
    // SAFETY: every kernel of the relattn programs takes exactly one `Params` by value (the entry
    // macros in entry.cuh), and `params` mirrors it. Its pointers come from live buffers of this
    // context that stay alive until the stream is synchronised after the launches, and the sizes
    // in it are those buffers' lengths, which the kernels' index arithmetic stays within (and
    // checks under RELATTN_BOUNDS_CHECK). The attention kernels use at most the dynamic shared
    // memory the caller sized for this launch (the ring depth in `params` is derived from it).
    unsafe { builder.launch(cfg) }.map(|_| ())
}

/// A 16-bit tensor of `dims` elements (innermost first) at device address `base`, with byte
/// strides `strides` for dims 1.., copied in boxes of `boxes` elements into shared memory with the
/// 128-byte swizzle. None when the driver refuses it (a stride not a multiple of 16 bytes, an
/// address not 16-byte aligned, a dimension out of range): the kernels then copy with cp.async.
/// Call only with a current context of a device of compute capability 9.0 or more.
pub(crate) fn encode_tensor_map_u16(
    base: u64,
    dims: [u64; 4],
    strides: [u64; 3],
    boxes: [u32; 4],
) -> Option<TensorMap> {
    use cudarc::driver::sys::{
        cuTensorMapEncodeTiled, CUtensorMap, CUtensorMapDataType, CUtensorMapFloatOOBfill,
        CUtensorMapInterleave, CUtensorMapL2promotion, CUtensorMapSwizzle,
    };
    let mut map = CUtensorMap { opaque: [0; 16] };
    let ones = [1u32; 4];
    // SAFETY: every pointer is valid for the 4 (dims, boxes, element strides) or 3 (strides)
    // entries a rank-4 map reads, and `map` for the 128-byte write; the driver only encodes the
    // description (it dereferences neither `base` nor anything else).
    let r = unsafe {
        cuTensorMapEncodeTiled(
            &mut map,
            CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT16,
            4,
            base as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            ones.as_ptr(),
            CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    r.result().ok().map(|()| TensorMap(map.opaque))
}

/// Whether libcublas can be loaded. Must be true before anything touches cudarc's cuBLAS API,
/// which panics when the library is missing.
pub(crate) fn cublas_library_present() -> bool {
    // SAFETY: only tries to dlopen the library by name and drops the handle; no symbol is called.
    unsafe { cudarc::cublas::sys::is_culib_present() }
}

/// `C = A B` through cuBLAS (`cublasGemmEx`, bf16 operands and result, fp32 accumulation), all
/// three column-major and unpadded: A is `m x k`, B `k x n`, C `m x n`. Enqueued on the handle's
/// stream. Refuses (CUBLAS_STATUS_INVALID_VALUE) any size the buffers do not hold.
pub(crate) fn gemm_bf16(
    blas: &cudarc::cublas::CudaBlas,
    (m, n, k): (usize, usize, usize),
    a: &CudaSlice<half::bf16>,
    b: &CudaSlice<half::bf16>,
    c: &mut CudaSlice<half::bf16>,
) -> Result<(), cudarc::cublas::result::CublasError> {
    use cudarc::cublas::sys::{cublasOperation_t, cublasStatus_t};
    use cudarc::cublas::{result::CublasError, Gemm, GemmConfig};
    let invalid = CublasError(cublasStatus_t::CUBLAS_STATUS_INVALID_VALUE);
    let holds = |len: usize, rows: usize, cols: usize| {
        rows.checked_mul(cols).is_some_and(|need| need <= len)
    };
    let dim = |x: usize| i32::try_from(x).ok().filter(|&v| v > 0);
    let (Some(mi), Some(ni), Some(ki)) = (dim(m), dim(n), dim(k)) else {
        return Err(invalid);
    };
    if !(holds(a.len(), m, k) && holds(b.len(), k, n) && holds(c.len(), m, n)) {
        return Err(invalid);
    }
    let cfg = GemmConfig {
        transa: cublasOperation_t::CUBLAS_OP_N,
        transb: cublasOperation_t::CUBLAS_OP_N,
        m: mi,
        n: ni,
        k: ki,
        alpha: half::bf16::ONE,
        lda: mi,
        ldb: ki,
        beta: half::bf16::ZERO,
        ldc: mi,
    };
    // SAFETY: with no transposition and leading dimensions equal to the row counts, cuBLAS reads
    // exactly m*k elements of A and k*n of B and writes m*n of C; each buffer was checked above to
    // hold at least that many. The buffers are live `CudaSlice`s of the handle's context, used
    // only in the order of its stream, so they outlive the enqueued product.
    unsafe { blas.gemm(cfg, a, b, c) }
}
