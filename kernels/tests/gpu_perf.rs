//! Timing of every GPU path on shapes of the model (CUDA events around each path's launches,
//! prologue and combine included), with the work each one must do: TFLOP/s over the reference
//! FLOP count and GB/s over the K/V bytes a request must read. A measurement, not a check: it
//! asserts only that every run succeeded and wrote every output.
//!
//! Needs an NVIDIA GPU with driver and NVRTC:
//! `cargo test -p relattn-kernels --test gpu_perf -- --ignored --nocapture`
//! `RELATTN_PERF_SHAPES=prefill8k,decode128k` picks shapes and their order;
//! `RELATTN_PERF_BUDGET_S=N` starts no shape after N seconds.

use relattn_kernels::gpu::{compile, run_path, CompilePlan, Gpu, Splits, Variant};
use relattn_kernels::routing::PathId;
use relattn_reference::gen::{generate, GenSpec};
use relattn_reference::Problem;
use std::time::Instant;

/// (name, spec, timed repetitions).
fn shapes() -> Vec<(&'static str, GenSpec, usize)> {
    let global = |h, hkv, requests: Vec<(usize, usize)>, page| {
        let mut s = GenSpec::global(h, hkv, requests, 31);
        s.page_size = page;
        s.poison = false;
        s
    };
    let mut local = GenSpec::local(64, 8, 512, vec![(8192, 8192)], 32);
    local.page_size = 128;
    local.poison = false;
    let mut mixed_requests = vec![(1, 32768); 8];
    mixed_requests.push((2048, 32768));
    vec![
        // The shapes the kernels were first timed on (same specs as gpu_paths' timing print).
        (
            "prefill2k_h16_kv2",
            global(16, 2, vec![(2048, 2048)], 128),
            10,
        ),
        ("decode32k_h8_kv1", global(8, 1, vec![(1, 32768)], 16), 10),
        // The benchmark shapes of the performance issue.
        ("prefill8k", global(64, 8, vec![(8192, 8192)], 128), 5),
        ("prefill8k_local", local, 5),
        ("decode128k", global(64, 8, vec![(1, 131072)], 128), 10),
        ("decode8k_b32", global(64, 8, vec![(1, 8192); 32], 128), 10),
        ("mixed", global(64, 8, mixed_requests, 128), 5),
    ]
}

/// Bytes of K and V every request must read: its keys visible to any of its queries, once.
fn kv_bytes(p: &Problem) -> f64 {
    let keys: usize = p
        .requests()
        .filter(|r| r.q_len > 0)
        .map(|r| {
            let (first, _) = p.visible_keys(&r, 0);
            r.kv_len - first
        })
        .sum();
    (keys * p.num_kv_heads * p.head_dim * 2 * p.dtype.size_bytes()) as f64
}

#[test]
#[ignore = "needs an NVIDIA GPU with driver and NVRTC"]
fn perf_table() {
    let started = Instant::now();
    let budget = std::env::var("RELATTN_PERF_BUDGET_S")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap_or(f64::INFINITY);
    // The shapes named (in that order), else all.
    let mut list = shapes();
    if let Ok(names) = std::env::var("RELATTN_PERF_SHAPES") {
        let mut picked = Vec::new();
        for name in names.split(',') {
            if let Some(k) = list.iter().position(|s| s.0 == name) {
                picked.push(list.swap_remove(k));
            }
        }
        list = picked;
    }
    let gpu = Gpu::open(0).unwrap();
    let plan = CompilePlan::all_paths(&gpu.arch(), Variant::PLAIN).unwrap();
    let loaded = gpu.load(&compile(&plan).unwrap()).unwrap();
    println!("perf on {} ({})", gpu.name(), gpu.arch());
    for (name, spec, reps) in list {
        if started.elapsed().as_secs_f64() > budget {
            println!("perf {name:<18} not started: budget spent");
            continue;
        }
        let t0 = Instant::now();
        let p = generate(&spec).unwrap();
        let dp = gpu.upload(&p).unwrap();
        let (flops, bytes) = (p.flops(), kv_bytes(&p));
        drop(p);
        let setup_s = t0.elapsed().as_secs_f64();
        for path in PathId::ALL {
            let first = match run_path(&gpu, &loaded, &dp, path, Splits::Policy) {
                Ok(r) => r,
                Err(e) => {
                    println!("perf {name:<18} {:<13} error: {e}", path.as_str());
                    continue;
                }
            };
            assert_eq!(first.unwritten, 0, "{name} {path}: unwritten outputs");
            let mut ms: Vec<f32> = (0..reps)
                .map(|_| {
                    run_path(&gpu, &loaded, &dp, path, Splits::Policy)
                        .unwrap()
                        .ms
                })
                .collect();
            ms.sort_by(f32::total_cmp);
            let median = ms[ms.len() / 2] as f64;
            println!(
                "perf {name:<18} {:<13} splits {:>3}  median {median:9.3} ms  (min {:8.3} max {:8.3})  {:7.1} TFLOP/s  {:7.0} GB/s  [setup {setup_s:.0} s]",
                path.as_str(),
                first.num_splits,
                ms[0],
                ms[ms.len() - 1],
                flops / (median * 1e-3) / 1e12,
                bytes / (median * 1e-3) / 1e9,
            );
        }
    }
}
