//! Throughput of the fast f64 reference next to the f64 matrix product of the same binary.
//!
//! The reference does two GEMM-shaped products per visible (query, key) pair and head, so
//! `Problem::flops()` (4 x visible pairs x D x H) makes its GFLOP/s directly comparable with a
//! plain `dot`'s: the ratio says how much the masking, softmax and gathers cost on top.

use crate::dtype::DType;
use crate::fast;
use crate::gen::{generate, GenSpec};
use crate::problem::{CacheLayout, Problem};
use ndarray::Array2;
use serde::Serialize;
use std::time::Instant;

/// Side of the benchmark's square-ish GEMM: `[N, D] x [D, N]`.
const GEMM_N: usize = 2048;
const GEMM_K: usize = 128;
/// Seed of the benchmark's prefill case.
const SEED: u64 = 20_261_130;

/// Measured figures of `bench_reference`; seconds are the best of `reps`.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReferenceReport {
    /// The benchmark case, in words.
    pub case: String,
    /// Reference work of the case: 4 x visible pairs x D x H.
    pub reference_flop: f64,
    pub reference_seconds: f64,
    /// Single-threaded fast reference.
    pub reference_gflops: f64,
    /// `2 * M * N * K` of the `[2048, 128] x [128, 2048]` f64 product.
    pub gemm_flop: f64,
    pub gemm_seconds: f64,
    /// Single-threaded ndarray `dot` (matrixmultiply backend).
    pub gemm_gflops: f64,
    /// `reference_gflops / gemm_gflops` (single thread).
    pub ratio: f64,
    pub multi_thread_seconds: f64,
    /// Fast reference over all rayon threads.
    pub multi_thread_gflops: f64,
    pub threads: usize,
    pub reps: usize,
}

/// The prefill case: 1 request, Lq = Lk = 2048, H = 8, Hkv = 1, D = 128, global (E = 1024),
/// bf16, fixed seed.
pub fn bench_problem() -> Problem {
    let spec = GenSpec {
        dtype: DType::Bf16,
        layout: CacheLayout::NhdPacked,
        ..GenSpec::global(8, 1, vec![(2048, 2048)], SEED)
    };
    // A fixed, valid spec: generation cannot fail.
    generate(&spec).expect("the benchmark case is valid")
}

/// Time the fast reference (single thread and all threads) and the f64 GEMM, best of `reps`
/// (at least 1) each.
pub fn bench_reference(reps: usize) -> BenchReferenceReport {
    let reps = reps.max(1);
    let p = bench_problem();
    let reference_flop = p.flops();
    // Deterministic, well-scaled operands; the values do not matter to the timing.
    let a = Array2::from_shape_fn((GEMM_N, GEMM_K), |(i, j)| {
        ((i * 7 + j * 3) % 17) as f64 / 17.0 - 0.5
    });
    let b = Array2::from_shape_fn((GEMM_K, GEMM_N), |(i, j)| {
        ((i * 5 + j * 11) % 13) as f64 / 13.0 - 0.5
    });
    let gemm_flop = 2.0 * (GEMM_N * GEMM_N * GEMM_K) as f64;

    // Single-thread reference and GEMM alternate, so a busy machine slows both alike.
    let (mut reference_seconds, mut gemm_seconds) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..reps {
        reference_seconds = reference_seconds.min(time(|| {
            std::hint::black_box(fast::attention_serial(&p));
        }));
        gemm_seconds = gemm_seconds.min(time(|| {
            std::hint::black_box(a.dot(&b));
        }));
    }
    let multi_thread_seconds = (0..reps)
        .map(|_| {
            time(|| {
                std::hint::black_box(fast::attention(&p));
            })
        })
        .fold(f64::INFINITY, f64::min);

    let reference_gflops = reference_flop / reference_seconds / 1e9;
    let gemm_gflops = gemm_flop / gemm_seconds / 1e9;
    BenchReferenceReport {
        case: "prefill: 1 request, Lq = Lk = 2048, H = 8, Hkv = 1, D = 128, global E = 1024, bf16"
            .to_string(),
        reference_flop,
        reference_seconds,
        reference_gflops,
        gemm_flop,
        gemm_seconds,
        gemm_gflops,
        ratio: reference_gflops / gemm_gflops,
        multi_thread_seconds,
        multi_thread_gflops: reference_flop / multi_thread_seconds / 1e9,
        threads: rayon::current_num_threads(),
        reps,
    }
}

fn time(f: impl FnOnce()) -> f64 {
    let start = Instant::now();
    f();
    start.elapsed().as_secs_f64()
}
