//! Tests of the report: rates, fastest paths, table and JSON, from a made-up result set.

use super::*;
use approx::assert_abs_diff_eq;
use relattn_kernels::gpu::{CopyPeak, GemmPeak};

fn timing(samples: &[f64]) -> Timing {
    Timing::of(samples).unwrap()
}

fn peaks() -> Peaks {
    Peaks {
        copy: CopyPeak {
            bytes: 4 << 30,
            time: timing(&[2.0, 2.1, 2.2]),
            gbps: 4000.0,
        },
        gemm: GemmPeak {
            m: 8192,
            n: 8192,
            k: 8192,
            time: timing(&[1.6]),
            tflops: 800.0,
            worst_error_ratio: 0.1,
        },
        l2_bytes: 60 << 20,
    }
}

fn figures(flops: f64, kv_bytes: f64, min_bytes: f64) -> Figures {
    Figures {
        visible_pairs: 1,
        flops,
        kv_bytes,
        min_bytes,
    }
}

/// prefill: 2e12 FLOP; decode: 4e9 K/V bytes.
fn fake() -> BenchReport {
    let p = peaks();
    let prefill = figures(2e12, 1e8, 2e9);
    let decode = figures(1e9, 4e9, 4.1e9);
    let mut fast = BenchRow::timed(
        "prefill",
        "score_mod",
        prefill,
        timing(&[10.0, 9.0, 11.0]),
        Some(&p),
    );
    fast.num_splits = Some(1);
    fast.input_sets = 2;
    let slow = BenchRow::timed(
        "prefill",
        "fallback",
        prefill,
        timing(&[20.0, 20.0]),
        Some(&p),
    );
    let mut unwritten = BenchRow::timed("decode", "fallback", decode, timing(&[0.5]), Some(&p));
    unwritten.status = RowStatus::Error;
    unwritten.message = "launch 0 left 3 output elements unwritten".into();
    let decode_ok = BenchRow::timed("decode", "sheared_bias", decode, timing(&[2.0]), Some(&p));
    let unsupported = BenchRow::not_timed(
        "decode",
        "score_mod",
        RowStatus::Unsupported,
        "E % 128 != 0",
        decode,
    );
    BenchReport {
        command: "relattn bench".into(),
        device: DeviceSummary {
            index: 0,
            name: "NVIDIA H200".into(),
            capability: "9.0".into(),
            arch: "sm_90".into(),
            driver: "580.65".into(),
            cuda_version: Some("13.0".into()),
            nvrtc_version: Some("13.0".into()),
            memory_total_bytes: 150_000_000_000,
        },
        peaks: Some(p),
        reps: 20,
        warmup: 3,
        seed: 1,
        rows: vec![slow, fast, unwritten, decode_ok, unsupported],
    }
}

#[test]
fn rates_and_percentages_come_from_the_median_and_the_peaks() {
    let r = fake();
    let fast = &r.rows[1];
    // 2e12 FLOP in 10 ms = 200 TFLOP/s = 25% of 800; 1e8 B in 10 ms = 10 GB/s = 0.25% of 4000.
    assert_eq!(fast.tflops, Some(200.0));
    assert_eq!(fast.tflops_pct_peak, Some(25.0));
    assert_eq!(fast.gbps, Some(10.0));
    assert_eq!(fast.gbps_pct_peak, Some(0.25));
    // Floor: 2e12 / 800e12 = 2.5 ms of compute against 2e9 / 4000e9 = 0.5 ms of memory.
    assert_eq!(fast.floor_ms, Some(2.5));
    assert_eq!(fast.bound.as_deref(), Some("compute"));
    let decode = &r.rows[3];
    // 4e9 B in 2 ms = 2000 GB/s = 50%; floor 4.1e9 / 4e12 s = 1.025 ms, memory-bound.
    assert_eq!(decode.gbps, Some(2000.0));
    assert_eq!(decode.gbps_pct_peak, Some(50.0));
    assert_abs_diff_eq!(decode.floor_ms.unwrap(), 1.025, epsilon = 1e-12);
    assert_eq!(decode.bound.as_deref(), Some("memory"));
    let no_peaks = BenchRow::timed("x", "y", figures(1e12, 1e9, 1e9), timing(&[1.0]), None);
    assert_eq!(no_peaks.tflops, Some(1000.0));
    assert_eq!((no_peaks.tflops_pct_peak, no_peaks.floor_ms), (None, None));
}

#[test]
fn fastest_is_the_smallest_median_among_valid_rows() {
    let r = fake();
    let best: Vec<(&str, &str)> = r
        .fastest()
        .iter()
        .map(|row| (row.shape.as_str(), row.path.as_str()))
        .collect();
    // The 0.5 ms decode row did not write its outputs: it cannot win.
    assert_eq!(
        best,
        vec![("prefill", "score_mod"), ("decode", "sheared_bias")]
    );
}

#[test]
fn the_table_shows_every_row_and_the_fastest_paths() {
    let text = format_report(&fake());
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].contains("NVIDIA H200") && lines[0].contains("20 timed"),
        "{text}"
    );
    assert!(
        lines[1].contains("4000 GB/s") && lines[1].contains("800.0 TFLOP/s"),
        "{text}"
    );
    assert!(
        lines[2].starts_with("| shape") && lines[2].contains("%peak"),
        "{text}"
    );
    let fast = lines
        .iter()
        .find(|l| l.contains("prefill") && l.contains("score_mod"))
        .unwrap();
    let cells: Vec<&str> = fast
        .split('|')
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect();
    assert_eq!(
        cells,
        [
            "prefill",
            "score_mod",
            "1",
            "2",
            "10.000",
            "9.000",
            "11.000",
            "200.0",
            "25.0",
            "10",
            "0.2",
            "2.500",
            "-"
        ]
    );
    assert!(text.contains("INVALID: launch 0 left 3"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.contains(" score_mod ") && l.contains("| unsupported: E % 128 != 0")),
        "{text}"
    );
    let tail = &text[text.find("fastest path per shape").unwrap()..];
    assert!(
        tail.contains("prefill") && tail.contains("score_mod") && tail.contains("4.0x the floor"),
        "{tail}"
    );
    assert!(
        tail.contains("sheared_bias") && tail.contains("(memory-bound)"),
        "{tail}"
    );
    assert!(!tail.contains("fallback"), "{tail}");
}

#[test]
fn json_carries_device_peaks_and_rows() {
    let r = fake();
    let text = r.to_json().unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["device"]["name"], "NVIDIA H200");
    assert_eq!(v["peaks"]["copy"]["gbps"], 4000.0);
    assert_eq!(v["peaks"]["gemm"]["tflops"], 800.0);
    assert_eq!(v["rows"].as_array().unwrap().len(), 5);
    assert_eq!(v["rows"][1]["timing"]["median_ms"], 10.0);
    assert_eq!(
        v["rows"][1]["timing"]["samples_ms"],
        serde_json::json!([10.0, 9.0, 11.0])
    );
    assert_eq!(v["rows"][2]["status"], "error");
    assert_eq!(v["rows"][4]["status"], "unsupported");
    // Reads back (serde_json may move the last bit of some floats).
    let back: BenchReport = serde_json::from_str(&text).unwrap();
    assert_eq!((&back.device, back.rows.len()), (&r.device, 5));
    assert_eq!(back.rows[1].timing, r.rows[1].timing);
}

#[test]
fn worker_rows_are_compared_with_the_fastest_native_path() {
    let p = peaks();
    let f = figures(2e12, 1e8, 2e9);
    let mut rows = vec![
        BenchRow::timed("prefill", "score_mod", f, timing(&[10.0]), Some(&p)),
        BenchRow::timed("prefill", "fallback", f, timing(&[8.0]), Some(&p)),
        BenchRow::timed("prefill", "vllm/vllm_op", f, timing(&[12.0]), Some(&p)),
        BenchRow::timed("decode", "vllm/vllm_op", f, timing(&[1.0]), Some(&p)),
        BenchRow::not_timed(
            "prefill",
            "fa4/fa4_score_mod",
            RowStatus::Unsupported,
            "x",
            f,
        ),
    ];
    fill_vs_native(&mut rows);
    let ratios: Vec<Option<f64>> = rows.iter().map(|r| r.vs_native).collect();
    // Against fallback's 8 ms; no native row on decode; nothing for an untimed row.
    assert_eq!(ratios, [Some(1.25), Some(1.0), Some(1.5), None, None]);
    assert!(!rows[2].is_native() && rows[0].is_native());
    let line = format_row(&rows[2]);
    assert!(
        line.contains("vllm/vllm_op") && line.trim_end().ends_with("x native 1.50"),
        "{line}"
    );
    let table = format_table(&rows);
    let header = table.lines().next().unwrap();
    assert!(header.contains("| x native |"), "{table}");
    let worker = table.lines().find(|l| l.contains("vllm/vllm_op")).unwrap();
    assert!(worker.contains("|     1.50 |"), "{table}");
    // The fastest path of a shape is a native one, even when a worker row is faster.
    rows[2].timing = Some(timing(&[1.0]));
    let report = BenchReport { rows, ..fake() };
    let fastest: Vec<&str> = report
        .fastest()
        .iter()
        .filter(|r| r.shape == "prefill")
        .map(|r| r.path.as_str())
        .collect();
    assert_eq!(fastest, ["fallback"]);
}

#[test]
fn the_roofline_has_a_series_per_path_the_roofs_and_a_label_per_point() {
    // Through the JSON `--json` writes: a table measured elsewhere plots the same.
    let r: BenchReport = serde_json::from_str(&fake().to_json().unwrap()).unwrap();
    let svg = roofline_svg(&r).unwrap();
    assert_eq!(svg, roofline_svg(&fake()).unwrap());
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    assert!(svg.contains("roofline: NVIDIA H200 (sm_90)"));
    // Timed, valid rows only: the errored and unsupported rows are not points.
    for path in ["score_mod", "fallback", "sheared_bias"] {
        assert!(
            svg.contains(&format!("{path}\n</text>")),
            "no series {path}"
        );
    }
    assert_eq!(svg.matches("prefill\n</text>").count(), 2);
    assert_eq!(svg.matches("decode\n</text>").count(), 1);
    // Three points, and the legend's mark of each of the three series.
    assert_eq!(svg.matches("<circle").count(), 3 + 3);
    assert_eq!(svg.matches("r=\"3\"").count(), 3);
    assert!(svg.contains("roofs: 800 TFLOP/s, 4000 GB/s"));
    // Without peaks: the points alone.
    let mut bare = fake();
    bare.peaks = None;
    let svg = roofline_svg(&bare).unwrap();
    assert!(!svg.contains("roofs:") && svg.matches("<circle").count() == 3 + 3);
}
