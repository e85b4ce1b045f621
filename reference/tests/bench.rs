//! Reference throughput (run in release: `cargo test --release -p relattn-reference -- --ignored
//! bench --nocapture`). Ignored by default: tests assert correctness, benchmarks measure.

use relattn_reference::bench::bench_reference;

#[test]
#[ignore = "measures throughput; run with --release --ignored"]
fn bench_reference_ratio() {
    let report = bench_reference(3);
    println!("{}", serde_json::to_string_pretty(&report).unwrap());
    assert!(report.reference_gflops.is_finite() && report.gemm_gflops.is_finite());
}
