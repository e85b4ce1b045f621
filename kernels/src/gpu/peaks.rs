//! The device's measured ceilings, against which kernel timings are read: copy bandwidth (a large
//! device-to-device copy, bytes read plus written) and the bf16 matrix-product rate of cuBLAS
//! (bf16 operands, fp32 accumulation). Datasheet figures are not used: clocks, memory parts and
//! power limits differ between boards of one model, so both are measured on the device at hand.

#![deny(unsafe_code)]

use super::device::Gpu;
use super::error::{driver, GpuError};
use super::ffi;
use cudarc::cublas::CudaBlas;
use cudarc::driver::sys;
use half::bf16;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

/// Median, min and max of a set of timings (ms), with the samples.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Timing {
    pub median_ms: f64,
    pub min_ms: f64,
    pub max_ms: f64,
    pub samples_ms: Vec<f64>,
}

impl Timing {
    /// None when there is no finite sample. The median (`relattn_common::stats::median`) of an
    /// even count is the mean of the middle two.
    pub fn of(samples_ms: &[f64]) -> Option<Timing> {
        let median_ms = relattn_common::stats::median(samples_ms)?;
        let (min_ms, max_ms) = samples_ms
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &x| {
                (lo.min(x), hi.max(x))
            });
        Some(Timing {
            median_ms,
            min_ms,
            max_ms,
            samples_ms: samples_ms.to_vec(),
        })
    }
}

/// What `measure_peaks` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeakOptions {
    /// Bytes of the device-to-device copy (lowered to a quarter of the free memory if needed).
    pub copy_bytes: usize,
    /// M = N = K of the matrix product.
    pub gemm_size: usize,
    /// Untimed runs before the timed ones.
    pub warmup: usize,
    /// Timed runs; the median is the figure.
    pub reps: usize,
}

impl Default for PeakOptions {
    fn default() -> Self {
        PeakOptions {
            copy_bytes: 4 << 30,
            gemm_size: 8192,
            warmup: 3,
            reps: 10,
        }
    }
}

/// Device-to-device copy bandwidth.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CopyPeak {
    /// Bytes copied per run (the traffic is twice this: each byte is read once and written once).
    pub bytes: usize,
    pub time: Timing,
    /// `2 * bytes / median`, in GB/s (1e9 bytes per second).
    pub gbps: f64,
}

/// bf16 matrix-product rate through cuBLAS.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GemmPeak {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub time: Timing,
    /// `2 m n k / median`, in TFLOP/s.
    pub tflops: f64,
    /// Largest error of the checked entries of C over their bound (must be <= 1).
    pub worst_error_ratio: f64,
}

/// Both ceilings, and the L2 size that decides how many input sets a benchmark rotates.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Peaks {
    pub copy: CopyPeak,
    pub gemm: GemmPeak,
    pub l2_bytes: usize,
}

/// Why a ceiling could not be measured.
#[derive(Debug, thiserror::Error)]
pub enum PeakError {
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error("cuBLAS (libcublas) cannot be loaded: the matrix-product peak needs it")]
    NoCublas,
    #[error("cuBLAS failed while {what}: {detail}")]
    Cublas { what: String, detail: String },
    #[error("cannot measure the {what} peak: {why}")]
    Invalid { what: &'static str, why: String },
}

fn cublas(what: &str) -> impl FnOnce(cudarc::cublas::result::CublasError) -> PeakError + '_ {
    move |e| PeakError::Cublas {
        what: what.to_string(),
        detail: format!("{e:?}"),
    }
}

impl Gpu {
    /// Size of the device's L2 cache in bytes.
    pub fn l2_bytes(&self) -> Result<usize, GpuError> {
        let v = self
            .ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)
            .map_err(driver("reading the L2 cache size"))?;
        Ok(v.max(0) as usize)
    }

    /// CUDA-event time of the work `enqueue` puts on this GPU's stream, in ms.
    pub fn time_events<E: From<GpuError>>(
        &self,
        enqueue: impl FnOnce() -> Result<(), E>,
    ) -> Result<f64, E> {
        let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let start = self
            .ctx
            .new_event(flags)
            .map_err(driver("creating an event"))?;
        let end = self
            .ctx
            .new_event(flags)
            .map_err(driver("creating an event"))?;
        start
            .record(&self.stream)
            .map_err(driver("recording an event"))?;
        enqueue()?;
        end.record(&self.stream)
            .map_err(driver("recording an event"))?;
        let ms = start
            .elapsed_ms(&end)
            .map_err(driver("waiting for the timed work"))?;
        Ok(ms as f64)
    }
}

/// Time `warmup + reps` runs of `enqueue`, keeping the last `reps`.
fn repeat(
    gpu: &Gpu,
    warmup: usize,
    reps: usize,
    mut enqueue: impl FnMut() -> Result<(), PeakError>,
) -> Result<Timing, PeakError> {
    let mut samples = Vec::with_capacity(reps);
    for i in 0..warmup + reps.max(1) {
        let ms = gpu.time_events(&mut enqueue)?;
        if i >= warmup {
            samples.push(ms);
        }
    }
    Timing::of(&samples).ok_or(PeakError::Invalid {
        what: "timing",
        why: "no sample".into(),
    })
}

/// Copy bandwidth: `bytes` (at most a quarter of the free memory, since source and destination
/// both live on the device) copied device to device; traffic counted as read plus written.
pub fn measure_copy(
    gpu: &Gpu,
    bytes: usize,
    warmup: usize,
    reps: usize,
) -> Result<CopyPeak, PeakError> {
    let (free, _) = gpu.memory()?;
    let bytes = bytes.min(free / 4) & !((1 << 20) - 1);
    if bytes < 256 << 20 {
        return Err(PeakError::Invalid {
            what: "copy",
            why: format!("only {free} bytes of device memory are free"),
        });
    }
    let stream = &gpu.stream;
    let mut src = stream
        .alloc_zeros::<u8>(bytes)
        .map_err(driver("allocating the copy source"))?;
    let mut dst = stream
        .alloc_zeros::<u8>(bytes)
        .map_err(driver("allocating the copy destination"))?;
    // Not zeros: a copy engine or compressible memory could treat zero pages specially.
    ffi::fill_bytes(stream, &mut src, 0x5A).map_err(driver("filling the copy source"))?;
    let time = repeat(gpu, warmup, reps, || {
        stream
            .memcpy_dtod(&src, &mut dst)
            .map_err(|e| PeakError::Gpu(driver("copying device to device")(e)))
    })?;
    let gbps = 2.0 * bytes as f64 / (time.median_ms * 1e-3) / 1e9;
    Ok(CopyPeak { bytes, time, gbps })
}

/// A reproducible bf16 value in [-1, 1] (uniform in [-1, 1), then rounded) for element `i` of matrix `which` (splitmix64).
fn uniform(which: u64, i: usize) -> bf16 {
    let mut z = (i as u64)
        .wrapping_add(which << 48)
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    bf16::from_f32(((z >> 40) as f32) / (1u64 << 23) as f32 - 1.0)
}

fn random_matrix(which: u64, len: usize) -> Vec<bf16> {
    (0..len)
        .into_par_iter()
        .map(|i| uniform(which, i))
        .collect()
}

/// bf16 matrix-product rate: `C = A B` with M = N = K = `size`, random operands in [-1, 1],
/// fp32 accumulation; a few entries of C are checked against a host dot product first.
pub fn measure_gemm(
    gpu: &Gpu,
    size: usize,
    warmup: usize,
    reps: usize,
) -> Result<GemmPeak, PeakError> {
    if !ffi::cublas_library_present() {
        return Err(PeakError::NoCublas);
    }
    let (m, n, k) = (size, size, size);
    let (free, _) = gpu.memory()?;
    let need = 2 * (m * k + k * n + m * n);
    if size == 0 || need > free / 2 {
        return Err(PeakError::Invalid {
            what: "matrix-product",
            why: format!("{size}^3 needs {need} bytes, {free} are free"),
        });
    }
    let a_host = random_matrix(1, m * k);
    let b_host = random_matrix(2, k * n);
    let stream = &gpu.stream;
    let a = stream.clone_htod(&a_host).map_err(driver("uploading A"))?;
    let b = stream.clone_htod(&b_host).map_err(driver("uploading B"))?;
    let mut c = stream
        .alloc_zeros::<bf16>(m * n)
        .map_err(driver("allocating C"))?;
    let blas = CudaBlas::new(stream.clone()).map_err(cublas("creating a handle"))?;
    ffi::gemm_bf16(&blas, (m, n, k), &a, &b, &mut c).map_err(cublas("multiplying"))?;
    // Column-major: A(i, l) = a[i + l m], B(l, j) = b[l + j k], C(i, j) = c[i + j m].
    let mut worst: f64 = 0.0;
    for j in [0, n - 1] {
        let column = stream
            .clone_dtoh(&c.slice(j * m..(j + 1) * m))
            .map_err(driver("reading C back"))?;
        for i in [0, 1, m / 2, m - 1] {
            let (mut dot, mut abs) = (0f64, 0f64);
            for l in 0..k {
                let p = a_host[i + l * m].to_f64() * b_host[l + j * k].to_f64();
                dot += p;
                abs += p.abs();
            }
            // bf16 rounding of the result, plus fp32 accumulation error.
            let bound = dot.abs() * 2f64.powi(-8) + abs * 1e-4 + 1e-6;
            worst = worst.max((column[i].to_f64() - dot).abs() / bound);
        }
    }
    if worst.is_nan() || worst > 1.0 {
        return Err(PeakError::Invalid {
            what: "matrix-product",
            why: format!("cuBLAS returned a wrong product (error {worst:.2} x the bound)"),
        });
    }
    let time = repeat(gpu, warmup, reps, || {
        ffi::gemm_bf16(&blas, (m, n, k), &a, &b, &mut c).map_err(cublas("multiplying"))
    })?;
    let tflops = 2.0 * (m * n * k) as f64 / (time.median_ms * 1e-3) / 1e12;
    Ok(GemmPeak {
        m,
        n,
        k,
        time,
        tflops,
        worst_error_ratio: worst,
    })
}

/// Both ceilings of `gpu`, copy first (it needs the most memory).
pub fn measure_peaks(gpu: &Gpu, opts: &PeakOptions) -> Result<Peaks, PeakError> {
    let copy = measure_copy(gpu, opts.copy_bytes, opts.warmup, opts.reps)?;
    let gemm = measure_gemm(gpu, opts.gemm_size, opts.warmup, opts.reps)?;
    Ok(Peaks {
        copy,
        gemm,
        l2_bytes: gpu.l2_bytes()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timing_takes_the_middle_of_sorted_samples() {
        let t = Timing::of(&[5.0, 1.0, 3.0]).unwrap();
        assert_eq!((t.median_ms, t.min_ms, t.max_ms), (3.0, 1.0, 5.0));
        assert_eq!(t.samples_ms, vec![5.0, 1.0, 3.0]);
        let t = Timing::of(&[4.0, 1.0, 2.0, 8.0]).unwrap();
        assert_eq!((t.median_ms, t.min_ms, t.max_ms), (3.0, 1.0, 8.0));
        assert!(Timing::of(&[]).is_none());
    }

    #[test]
    fn gemm_operands_are_random_nonzero_and_reproducible() {
        let a = random_matrix(1, 4096);
        assert_eq!(a, random_matrix(1, 4096));
        assert_ne!(a, random_matrix(2, 4096));
        let zeros = a.iter().filter(|x| x.to_f32() == 0.0).count();
        assert!(zeros < 8, "{zeros} zeros");
        assert!(a.iter().all(|x| (-1.0..=1.0).contains(&x.to_f32())));
        let mean: f32 = a.iter().map(|x| x.to_f32()).sum::<f32>() / a.len() as f32;
        assert!(mean.abs() < 0.05, "mean {mean}");
    }

    #[test]
    #[ignore = "needs an NVIDIA GPU"]
    fn peaks_are_measured_on_the_device() {
        let gpu = Gpu::open(0).unwrap();
        let p = measure_peaks(
            &gpu,
            &PeakOptions {
                copy_bytes: 1 << 30,
                gemm_size: 4096,
                warmup: 1,
                reps: 3,
            },
        )
        .unwrap();
        assert!(p.copy.gbps > 100.0 && p.gemm.tflops > 1.0, "{p:?}");
    }
}
