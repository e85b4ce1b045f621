//! `relattn exec`, run as a user runs it. Without a GPU it must decide everything it can (bad
//! input, unsupported path x case) and exit 3 for the rest; with one it writes `out`.

use crate::common;
use common::relattn;

use relattn_kernels::gpu::Gpu;
use relattn_reference::casefile::{write_case, CaseMeta};
use relattn_reference::gen::{generate, GenSpec};
use relattn_reference::judge::{judge, padding_is_nan, Tolerance};
use relattn_reference::{emulate, fast, CacheLayout};
use std::path::{Path, PathBuf};
use std::process::Output;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A small global-layer case (E 256, GQA 2, a padding row) written with the HND layout hint.
fn write_small_case(dir: &Path) -> (PathBuf, relattn_reference::Problem) {
    let mut spec = GenSpec::global(4, 2, vec![(5, 40), (0, 7), (1, 300)], 3);
    spec.rel_extent = 256;
    spec.padding_rows = 1;
    let problem = generate(&spec).unwrap();
    let path = dir.join("case.safetensors");
    let meta = CaseMeta {
        cache_layout: CacheLayout::HndPacked,
        ..CaseMeta::of(&problem)
    };
    write_case(&path, &problem, &meta).unwrap();
    (path, problem)
}

fn stderr_of(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn unreadable_input_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.safetensors");
    let out_file = dir.path().join("out.safetensors");
    let out = relattn(&[
        "exec",
        "--path",
        "score_mod",
        "--input",
        s(&missing),
        "--output",
        s(&out_file),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
    assert!(!stderr_of(&out).contains("panicked"));
    let out = relattn(&[
        "exec",
        "--path",
        "no_such_path",
        "--input",
        s(&missing),
        "--output",
        s(&out_file),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
}

#[test]
fn unsupported_combinations_are_refused_before_any_gpu_work() {
    let dir = tempfile::tempdir().unwrap();
    let (case, _) = write_small_case(dir.path());
    let out_file = dir.path().join("out.safetensors");
    for (path, splits, why) in [
        ("score_mod", "2", "split"),
        ("fallback", "4", "decode-only"),
        ("sheared_bias", "0", "at least 1"),
    ] {
        let out = relattn(&[
            "exec",
            "--path",
            path,
            "--input",
            s(&case),
            "--output",
            s(&out_file),
            "--splits",
            splits,
        ]);
        let err = stderr_of(&out);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{path} --splits {splits}: {err}"
        );
        assert!(err.contains(why), "{path}: {err}");
    }
    assert!(!out_file.exists());
}

#[test]
fn runs_a_path_or_says_there_is_no_gpu() {
    let dir = tempfile::tempdir().unwrap();
    let (case, problem) = write_small_case(dir.path());
    let out_file = dir.path().join("out.safetensors");
    // The machine's own GPUs (the other command-line tests hide them from relattn).
    let out = crate::binary::relattn_seeing_gpus()
        .args([
            "exec",
            "--path",
            "sheared_bias",
            "--input",
            s(&case),
            "--output",
            s(&out_file),
            "--splits",
            "3",
        ])
        .output()
        .expect("the relattn binary runs");
    if !Gpu::available() {
        assert_eq!(out.status.code(), Some(3), "{}", stderr_of(&out));
        assert!(stderr_of(&out).contains("GPU"));
        return;
    }
    assert!(out.status.success(), "{}", stderr_of(&out));
    // Read the safetensors file back by hand: header length, JSON header, F32 data.
    let bytes = std::fs::read(&out_file).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let (t, h, d) = (problem.total_rows(), problem.num_heads, problem.head_dim);
    assert_eq!(header["out"]["dtype"], "F32");
    assert_eq!(header["out"]["shape"], serde_json::json!([t, h, d]));
    let data: Vec<f32> = bytes[8 + n..]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(data.len(), t * h * d);
    // docs/operator.md section 6 by the judge `run` uses, with the dtype's default tolerance; the
    // file's padding rows are NaN (the poison read back), as `relattn judge` expects.
    let out = ndarray::Array3::from_shape_vec((t, h, d), data).unwrap();
    let v = judge(
        &problem,
        &out,
        &fast::attention(&problem),
        &emulate::attention(&problem),
        &Tolerance::default_for(problem.dtype),
        padding_is_nan(&problem, &out),
        0,
    );
    assert!(v.pass, "{}", v.reason);
}

#[test]
fn output_file_is_valid_safetensors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("o.safetensors");
    let values = [1.5f32, -2.0, f32::NAN, 0.25, 3.0, 7.0];
    let array = ndarray::Array3::from_shape_vec((1, 2, 3), values.to_vec()).unwrap();
    relattn_reference::casefile::write_impl_output(&path, &array).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    assert_eq!(n % 8, 0, "header padded to 8 bytes");
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    assert_eq!(header["out"]["dtype"], "F32");
    assert_eq!(header["out"]["shape"], serde_json::json!([1, 2, 3]));
    assert_eq!(header["out"]["data_offsets"], serde_json::json!([0, 24]));
    let data: Vec<u32> = bytes[8 + n..]
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(data, values.map(f32::to_bits));
}

#[test]
fn a_malformed_arch_override_is_a_usage_error() {
    for args in [
        &["bench", "--no-peaks"][..],
        &["run", "--matrix", "smoke"][..],
        &["mutants"][..],
    ] {
        let out = crate::binary::relattn_command()
            .args(args)
            .env("RELATTN_ARCH", "sm90")
            .output()
            .expect("the relattn binary runs");
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = stderr_of(&out);
        assert!(err.contains("RELATTN_ARCH=sm90"), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}
