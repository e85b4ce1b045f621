//! The `relattn gen`, `reference` and `bench-reference` commands, run as a user runs them.

use crate::common;
use common::relattn;
use rstest::rstest;

use relattn_reference::casefile::{read_case, read_output};
use relattn_reference::{emulate, fast, sample, CacheLayout, DType};
use std::path::{Path, PathBuf};

fn ok(args: &[&str]) -> String {
    let out = relattn(args);
    assert!(
        out.status.success(),
        "relattn {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Runs a command that must fail with exit code 2 and one clear line on stderr; returns it.
fn usage_error(args: &[&str]) -> String {
    let out = relattn(args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "relattn {args:?}: {stderr}");
    assert!(
        !stderr.contains("panicked") && !stderr.contains("backtrace"),
        "{stderr}"
    );
    stderr
}

/// A usage error printed by the command itself: exactly one line, starting with `error:`.
fn one_line_error(args: &[&str]) -> String {
    let stderr = usage_error(args);
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "expected one line, got {stderr:?}");
    assert!(lines[0].starts_with("error: "), "{stderr}");
    lines[0].to_string()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn gen_tiny(dir: &Path) -> PathBuf {
    let case = dir.join("tiny.safetensors");
    let summary = ok(&["gen", "--preset", "tiny", "--output", s(&case)]);
    assert!(
        summary.contains("T=7") && summary.contains("H/Hkv=4/2"),
        "{summary}"
    );
    case
}

fn bits(values: impl IntoIterator<Item = f64>) -> Vec<u64> {
    values.into_iter().map(f64::to_bits).collect()
}

#[test]
fn reference_of_a_preset_matches_the_library() {
    let dir = tempfile::tempdir().unwrap();
    let case = gen_tiny(dir.path());
    let out = dir.path().join("out.safetensors");
    ok(&["reference", "--input", s(&case), "--output", s(&out)]);

    let p = read_case(&case).unwrap().problem;
    let back = read_output(&out).unwrap();
    let (t, h, d) = (p.total_rows(), p.num_heads, p.head_dim);
    let out_lp = back.out_lp.as_ref().unwrap();
    assert_eq!(out_lp.dtype, DType::Bf16);
    assert_eq!(back.reference.rows, None);
    assert_eq!(back.reference.out.shape(), &[t, h, d]);
    assert_eq!(back.reference.lse.shape(), &[t, h]);
    assert_eq!(out_lp.out.shape(), &[t, h, d]);
    let want = fast::attention(&p);
    assert_eq!(
        bits(back.reference.out.iter().copied()),
        bits(want.out.iter().copied())
    );
    assert_eq!(
        bits(back.reference.lse.iter().copied()),
        bits(want.lse.iter().copied())
    );
    let lp = emulate::attention(&p);
    assert_eq!(
        bits(out_lp.out.iter().copied()),
        bits(lp.out.iter().copied())
    );
    // Padding rows of `out` are 0; real rows are not.
    for row in p.real_rows()..t {
        assert!(back
            .reference
            .out
            .index_axis(ndarray::Axis(0), row)
            .iter()
            .all(|&x| x == 0.0));
    }
    assert!(back.reference.out.iter().any(|&x| x != 0.0));
}

#[test]
fn sampled_reference() {
    let dir = tempfile::tempdir().unwrap();
    let case = gen_tiny(dir.path());
    let out = dir.path().join("sampled.safetensors");
    let full = dir.path().join("full.safetensors");
    ok(&[
        "reference",
        "-i",
        s(&case),
        "-o",
        s(&out),
        "--sample-rows",
        "4",
        "--seed",
        "5",
    ]);
    ok(&["reference", "-i", s(&case), "-o", s(&full)]);

    let p = read_case(&case).unwrap().problem;
    let back = read_output(&out).unwrap();
    let full = read_output(&full).unwrap();
    let rows = sample::sample_rows(&p, 4, 5);
    assert_eq!(back.reference.rows.as_deref(), Some(rows.as_slice()));
    assert_eq!(
        back.reference.out.shape(),
        &[rows.len(), p.num_heads, p.head_dim]
    );
    assert_eq!(back.reference.lse.shape(), &[rows.len(), p.num_heads]);
    let (lp, full_lp) = (
        &back.out_lp.as_ref().unwrap().out,
        &full.out_lp.unwrap().out,
    );
    assert_eq!(lp.shape(), back.reference.out.shape());
    for (k, &row) in rows.iter().enumerate() {
        let pick =
            |a: &ndarray::Array3<f64>, r| bits(a.index_axis(ndarray::Axis(0), r).iter().copied());
        assert_eq!(
            pick(&back.reference.out, k),
            pick(&full.reference.out, row),
            "row {row}"
        );
        assert_eq!(pick(lp, k), pick(full_lp, row), "row {row}");
    }
}

/// `--no-emulation` writes the f64 reference alone; each phase says on stderr (not a terminal
/// here) when it starts and how long it took.
#[test]
fn reference_without_emulation_and_its_progress_lines() {
    let dir = tempfile::tempdir().unwrap();
    let case = gen_tiny(dir.path());
    let out = dir.path().join("out.safetensors");
    let run = relattn(&["reference", "-i", s(&case), "-o", s(&out), "--no-emulation"]);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    assert!(
        String::from_utf8_lossy(&run.stdout).contains("no emulation"),
        "{run:?}"
    );
    assert!(
        stderr.contains("relattn reference: f64 reference ...")
            && stderr.contains("relattn reference: f64 reference: done in "),
        "{stderr}"
    );
    assert!(!stderr.contains("emulation"), "{stderr}");
    let back = read_output(&out).unwrap();
    assert_eq!(back.out_lp, None);
    let p = read_case(&case).unwrap().problem;
    assert_eq!(back.reference.out, fast::attention(&p).out);
    let run = relattn(&["reference", "-i", s(&case), "-o", s(&out)]);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        stderr.contains("relattn reference: same-precision emulation: done in "),
        "{stderr}"
    );
}

#[test]
fn gen_from_explicit_parameters() {
    let dir = tempfile::tempdir().unwrap();
    let case = dir.path().join("explicit.safetensors");
    let args = [
        "gen",
        "--output",
        s(&case),
        "--heads",
        "4",
        "--kv-heads",
        "2",
        "--head-dim",
        "16",
        "--extent",
        "8",
        "--local",
        "--page-size",
        "4",
        "--layout",
        "hnd_packed",
        "--dtype",
        "fp16",
        "--requests",
        "3:20,0:2,1:5",
        "--padding-rows",
        "1",
        "--bias",
        "zero",
        "--scale",
        "1/3",
        "--seed",
        "7",
        "--case-id",
        "explicit",
    ];
    ok(&args);
    let c = read_case(&case).unwrap();
    let p = &c.problem;
    assert_eq!((p.num_heads, p.num_kv_heads, p.head_dim), (4, 2, 16));
    assert_eq!((p.rel_extent, p.window_left, p.page_size), (8, 7, 4));
    assert_eq!(p.dtype, DType::F16);
    assert_eq!(p.softmax_scale.to_bits(), (1.0f64 / 3.0).to_bits());
    assert_eq!(p.layout, CacheLayout::HndPacked);
    assert_eq!(p.seqused_k, vec![20, 2, 5]);
    assert_eq!(p.cu_seqlens_q, vec![0, 3, 3, 4]);
    assert_eq!(p.total_rows(), 5);
    assert_eq!(
        (c.meta.seed, c.meta.case_id.as_deref()),
        (Some(7), Some("explicit"))
    );
    assert!(p
        .rel_logits
        .slice(ndarray::s![..4, .., ..])
        .iter()
        .all(|&x| x == 0.0));
    assert!(
        p.kv.iter().any(|x| x.is_nan()),
        "unreadable slots are poisoned by default"
    );

    // The same parameters give the same case (the header's key order may differ).
    let first = format!("{c:?}");
    ok(&args);
    let again = format!("{:?}", read_case(&case).unwrap());
    assert!(first == again, "the same parameters gave a different case");
}

#[test]
fn gen_page_and_poison_switches() {
    let dir = tempfile::tempdir().unwrap();
    let case = dir.path().join("c.safetensors");
    ok(&[
        "gen",
        "-o",
        s(&case),
        "--preset",
        "tiny",
        "--all-zero-pages",
        "--no-poison",
    ]);
    let p = read_case(&case).unwrap().problem;
    assert!(p.block_table.iter().all(|&b| b == 0));
    assert!(p.kv.iter().all(|x| x.is_finite()));
}

#[test]
fn malformed_case_files_exit_2_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let case = gen_tiny(dir.path());
    let out = dir.path().join("out.safetensors");
    let bytes = std::fs::read(&case).unwrap();

    let truncated = dir.path().join("truncated.safetensors");
    std::fs::write(&truncated, &bytes[..bytes.len() - 100]).unwrap();
    let garbage = dir.path().join("garbage.safetensors");
    std::fs::write(&garbage, b"this is not a safetensors file").unwrap();
    let empty = dir.path().join("empty.safetensors");
    std::fs::write(&empty, b"").unwrap();
    let missing = dir.path().join("missing.safetensors");

    for input in [&truncated, &garbage, &empty, &missing] {
        let line = one_line_error(&["reference", "-i", s(input), "-o", s(&out)]);
        let name = input.file_name().unwrap().to_str().unwrap();
        assert!(line.contains(name), "{line}");
        assert!(!out.exists(), "no output is written for a bad case");
    }
    // An output file is not a case file: its tensors are named differently.
    let other = dir.path().join("other.safetensors");
    ok(&["reference", "-i", s(&case), "-o", s(&other)]);
    let line = one_line_error(&["reference", "-i", s(&other), "-o", s(&out)]);
    assert!(line.contains("missing"), "{line}");
}

#[rstest]
#[case::heads_not_a_multiple(
    &["--heads", "6", "--kv-heads", "4", "--requests", "1:5"],
    &["--heads 6", "--kv-heads 4"]
)]
#[case::more_queries_than_keys(
    &["--preset", "tiny", "--requests", "5:3"],
    &["5:3", "Lq = 5", "Lk = 3"]
)]
#[case::more_queries_than_keys_local(
    &["--preset", "tiny", "--local", "--requests", "5:3"],
    &["5:3"]
)]
#[case::page_size_zero(&["--preset", "tiny", "--page-size", "0"], &["--page-size"])]
#[case::extent_zero(&["--preset", "tiny", "--extent", "0"], &["--extent"])]
#[case::window_below_minus_one(
    &["--preset", "tiny", "--window-left", "-3"],
    &["--window-left -3"]
)]
#[case::scale_not_finite(&["--preset", "tiny", "--scale", "1/0"], &["--scale", "1/0"])]
#[case::kv_heads_missing(&["--heads", "8", "--requests", "1:5"], &["--kv-heads"])]
#[case::requests_with_a_dash(
    &["--preset", "tiny", "--requests", "1-5"],
    &["--requests", "1-5"]
)]
fn bad_gen_parameters_exit_2(#[case] args: &[&str], #[case] mentions: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let case = dir.path().join("bad.safetensors");
    let mut full = vec!["gen", "--output", s(&case)];
    full.extend_from_slice(args);
    let stderr = usage_error(&full);
    for m in mentions {
        assert!(
            stderr.contains(m),
            "relattn {full:?}: {stderr:?} does not mention {m:?}"
        );
    }
    assert!(!case.exists(), "relattn {full:?} wrote a file");
}

/// Zero repetitions, and so many that the command would run for ever, are usage errors.
#[rstest]
#[case("0")]
#[case("101")]
#[case("18446744073709551615")]
fn bench_reference_rejects_reps_out_of_range(#[case] reps: &str) {
    let started = std::time::Instant::now();
    let line = one_line_error(&["bench-reference", "--reps", reps]);
    assert!(line.contains("--reps"), "{line}");
    assert!(started.elapsed().as_secs() < 10);
}
