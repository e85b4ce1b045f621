//! Small reports built through the public API.

use relattn_reports::{Environment, ReportWriter, Row, Status};
use std::path::Path;

/// A judged GPU-like row: error 1e-3 against a bound of 2e-2, 100 TFLOP/s, 1000 GB/s.
pub fn row(trial: &str, path: &str, status: Status) -> Row {
    let mut r = Row::new(format!("id_{trial}"), trial, path, status);
    r.max_abs = Some(1e-3);
    r.mean_abs = Some(1e-4);
    r.rel_l2 = Some(2e-3);
    r.bound = Some(2e-2);
    r.ms = Some(1.5);
    r.wall_ms = Some(12.5);
    r.tflops = Some(100.0);
    r.gbps = Some(1000.0);
    r.seed = Some(7);
    r.params.insert("layer".into(), "global_e1024".into());
    r.params.insert("dtype".into(), "bf16".into());
    if status != Status::Pass {
        r.message = format!("{trial} did not pass");
    }
    r
}

pub fn env(shard: &str) -> Environment {
    Environment {
        gpu_name: Some("NVIDIA H200".into()),
        capability: Some("9.0".into()),
        git_revision: Some("abc123".into()),
        matrix: Some("nightly".into()),
        shard: Some(shard.into()),
        started: Some("2026-11-30T01:00:00Z".into()),
        seeds: vec![1],
        ..Environment::default()
    }
}

/// Writes and finishes one architecture report.
pub fn write(dir: &Path, arch: &str, shard: &str, rows: &[Row]) {
    let mut w = ReportWriter::create(dir, arch, env(shard)).unwrap();
    for r in rows {
        w.push(r.clone()).unwrap();
    }
    w.finish().unwrap();
}

/// Passing sheared_bias trials named `gpu::sheared_bias::<prefix><i>`.
pub fn trials(prefix: &str, range: std::ops::Range<usize>) -> Vec<Row> {
    range
        .map(|i| {
            row(
                &format!("gpu::sheared_bias::{prefix}{i}"),
                "sheared_bias",
                Status::Pass,
            )
        })
        .collect()
}
