//! `relattn bench` on a machine without a GPU: `--from-json` prints and plots a table measured
//! elsewhere; anything that is not such a table exits 2.

use crate::common;
use common::{relattn, text};
use relattn_harness::bench::report::{BenchReport, BenchRow, DeviceSummary};
use relattn_harness::bench::shapes::Figures;
use relattn_kernels::gpu::{CopyPeak, GemmPeak, Peaks, Timing};

fn table() -> BenchReport {
    let time = |ms: f64| Timing::of(&[ms]).unwrap();
    let peaks = Peaks {
        copy: CopyPeak {
            bytes: 1 << 30,
            time: time(0.5),
            gbps: 4000.0,
        },
        gemm: GemmPeak {
            m: 8192,
            n: 8192,
            k: 8192,
            time: time(1.5),
            tflops: 700.0,
            worst_error_ratio: 0.1,
        },
        l2_bytes: 60 << 20,
    };
    let figures = Figures {
        visible_pairs: 1,
        flops: 1e12,
        kv_bytes: 1e8,
        min_bytes: 2e9,
    };
    let rows = ["score_mod", "fallback"]
        .iter()
        .enumerate()
        .map(|(i, path)| {
            BenchRow::timed(
                "prefill8k",
                path,
                figures,
                time(5.0 + i as f64),
                Some(&peaks),
            )
        })
        .collect();
    BenchReport {
        command: "relattn bench --json b.json".into(),
        device: DeviceSummary {
            index: 0,
            name: "NVIDIA H200".into(),
            capability: "9.0".into(),
            arch: "sm_90".into(),
            driver: "580".into(),
            cuda_version: None,
            nvrtc_version: None,
            memory_total_bytes: 1 << 37,
        },
        peaks: Some(peaks),
        reps: 20,
        warmup: 3,
        seed: 1,
        rows,
    }
}

#[test]
fn from_json_prints_the_table_and_draws_its_roofline() {
    let tmp = tempfile::tempdir().unwrap();
    let json = tmp.path().join("b.json");
    std::fs::write(&json, table().to_json().unwrap()).unwrap();
    let svg = tmp.path().join("roofline.svg");
    let (j, s) = (json.to_str().unwrap(), svg.to_str().unwrap());
    let out = relattn(&["bench", "--from-json", j, "--plot", s]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        stdout.contains("prefill8k") && stdout.contains("fastest path per shape"),
        "{stdout}"
    );
    let drawn = std::fs::read_to_string(&svg).unwrap();
    assert!(drawn.contains("score_mod\n</text>") && drawn.contains("fallback\n</text>"));
    assert!(drawn.contains("roofs: 700 TFLOP/s, 4000 GB/s"));
}

#[test]
fn from_json_refuses_what_is_not_a_table() {
    let tmp = tempfile::tempdir().unwrap();
    let bad = tmp.path().join("bad.json");
    std::fs::write(&bad, "{\"rows\": 3}").unwrap();
    let b = bad.to_str().unwrap();
    let missing = tmp.path().join("missing.json");
    let svg = tmp.path().join("p.svg");
    for args in [
        vec!["bench", "--from-json", b],
        vec!["bench", "--from-json", missing.to_str().unwrap()],
        vec!["bench", "--from-json", b, "--json", "x.json"],
        vec!["bench", "--json", "same.json", "--plot", "same.json"],
    ] {
        let out = relattn(&args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    assert!(!svg.exists());
}
