//! `relattn gen --case` and `relattn judge`, run as a user runs them: a matrix case taken out as
//! a case file, and outputs made elsewhere judged against it (exit 0 pass, 1 fail, 2 bad file).

use crate::common;
use common::{relattn, text};

use ndarray::Array3;
use relattn_matrices::load_tier;
use relattn_reference::casefile::{read_case, write_impl_output};
use relattn_reference::{fast, gen, Problem};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Output;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The smoke tier's global-layer `mixed` case: (1, 700), (48, 48), (1, 33), (40, 1200), (1, 1).
fn mixed_case() -> relattn_matrices::Case {
    load_tier("smoke")
        .unwrap()
        .expand()
        .unwrap()
        .cases
        .into_iter()
        .find(|c| c.mix == "mixed" && !c.is_local() && c.sample_rows.is_none())
        .unwrap()
}

/// `relattn gen --case ID` into `dir`; returns the file and the problem read back.
fn gen_case(dir: &Path, id: &str) -> (PathBuf, Problem) {
    let file = dir.join("case.safetensors");
    let out = relattn(&["gen", "--case", id, "--output", s(&file)]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains(&format!("case {id} of `smoke`")));
    let problem = read_case(&file).unwrap().problem;
    (file, problem)
}

/// The f64 reference as f32, padding rows NaN: what a correct implementation writes.
fn exact_output(p: &Problem) -> Array3<f32> {
    let reference = fast::attention(p);
    let mut out = reference.out.mapv(|x| x as f32);
    for t in p.real_rows()..p.total_rows() {
        out.index_axis_mut(ndarray::Axis(0), t).fill(f32::NAN);
    }
    out
}

fn judge(case: &Path, output: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["judge", "--input", s(case), "--output", s(output)];
    args.extend_from_slice(extra);
    relattn(&args)
}

/// A safetensors file of one tensor `name` with the given dtype name, shape and bytes.
fn raw_tensor(path: &Path, name: &str, dtype: &str, shape: &[usize], data: &[u8]) {
    let header = serde_json::json!({
        name: { "dtype": dtype, "shape": shape, "data_offsets": [0, data.len()] },
    });
    let mut h = serde_json::to_vec(&header).unwrap();
    h.resize(h.len().div_ceil(8) * 8, b' ');
    let mut bytes = (h.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&h);
    bytes.extend_from_slice(data);
    std::fs::write(path, bytes).unwrap();
}

/// bf16 bits of `x`, rounded to nearest even (NaN stays NaN).
fn bf16_bits(x: f32) -> u16 {
    if x.is_nan() {
        return 0x7FC0;
    }
    let b = x.to_bits();
    ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) as u16
}

#[test]
fn gen_case_writes_the_matrix_case_as_run_generates_it() {
    let case = mixed_case();
    let dir = tempfile::tempdir().unwrap();
    let (file, back) = gen_case(dir.path(), &case.id);
    let meta = read_case(&file).unwrap().meta;
    assert_eq!(meta.case_id.as_deref(), Some(case.id.as_str()));
    assert_eq!(meta.seed, Some(case.seed()));
    assert_eq!(meta.cache_layout, case.facts().layout);
    let made = gen::generate(case.spec().unwrap()).unwrap();
    assert_eq!(back.q, made.q);
    assert_eq!(back.rel_logits, made.rel_logits);
    assert_eq!(back.block_table, made.block_table);
    assert_eq!(
        (back.seqused_k.clone(), back.cu_seqlens_q.clone()),
        (made.seqused_k.clone(), made.cu_seqlens_q.clone())
    );
    assert_eq!(
        (back.softmax_scale, back.rel_extent, back.window_left),
        (made.softmax_scale, made.rel_extent, made.window_left)
    );
    // Same keys and values where any request reads: the same reference, bit for bit.
    assert_eq!(fast::attention(&back), fast::attention(&made));
}

#[test]
fn judge_passes_the_reference_and_fails_one_planted_error() {
    let case = mixed_case();
    let dir = tempfile::tempdir().unwrap();
    let (file, p) = gen_case(dir.path(), &case.id);
    let output = dir.path().join("out.safetensors");
    let mut out = exact_output(&p);
    write_impl_output(&output, &out).unwrap();
    let pass = judge(&file, &output, &[]);
    let stdout = text(&pass.stdout);
    assert_eq!(
        pass.status.code(),
        Some(0),
        "{stdout}{}",
        text(&pass.stderr)
    );
    assert!(
        stdout.starts_with("PASS: rule (a) holds: max|out - ref64| = "),
        "{stdout}"
    );

    // A sample of rows, as run judges long cases.
    let sampled = judge(&file, &output, &["--sample-rows", "8", "--json"]);
    assert_eq!(sampled.status.code(), Some(0), "{}", text(&sampled.stderr));
    let v: Value = serde_json::from_str(&text(&sampled.stdout)).unwrap();
    assert_eq!((&v["pass"], &v["sampled"]), (&true.into(), &true.into()));
    assert!(v["judged_elements"].as_u64().unwrap() < 93184, "{v}");

    // The same output in BF16 (rounded) passes too.
    let bf16 = dir.path().join("out_bf16.safetensors");
    let bytes: Vec<u8> = out
        .iter()
        .flat_map(|&x| bf16_bits(x).to_le_bytes())
        .collect();
    raw_tensor(&bf16, "out", "BF16", out.shape(), &bytes);
    let pass = judge(&file, &bf16, &[]);
    assert_eq!(pass.status.code(), Some(0), "{}", text(&pass.stdout));

    out[[57, 5, 100]] += 0.25;
    write_impl_output(&output, &out).unwrap();
    let fail = judge(&file, &output, &[]);
    let stdout = text(&fail.stdout);
    assert_eq!(
        fail.status.code(),
        Some(1),
        "{stdout}{}",
        text(&fail.stderr)
    );
    let at = "request 3, position 7, head 5, dim 100 (row 57)";
    assert!(
        stdout.starts_with("FAIL: rule (a) fails: max|out - ref64| = 2.500e-1 > bound "),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "1 of 93184 elements (0.0011%) over it; worst at {at}"
        )),
        "{stdout}"
    );
    assert!(!text(&fail.stderr).contains("panicked"));

    let json = judge(&file, &output, &["--json"]);
    assert_eq!(json.status.code(), Some(1));
    let v: Value = serde_json::from_str(&text(&json.stdout)).unwrap();
    assert_eq!(v["pass"], false);
    assert_eq!(v["judged_elements"], 93184);
    assert_eq!(v["first_bad"], "57:5:100");
    let worst = &v["rule_b"]["worst"];
    assert_eq!(
        (
            &worst["request"],
            &worst["position"],
            &worst["head"],
            &worst["dim"],
            &worst["row"]
        ),
        (&3.into(), &7.into(), &5.into(), &100.into(), &57.into())
    );
    assert_eq!(v["rule_a"]["over"], 1);
    assert_eq!(v["tolerance"]["atol2"], 0.02);

    // A NaN in a real row is located like any other element.
    let mut out = exact_output(&p);
    out[[50, 0, 3]] = f32::NAN;
    write_impl_output(&output, &out).unwrap();
    let fail = judge(&file, &output, &[]);
    assert_eq!(fail.status.code(), Some(1));
    assert!(
        text(&fail.stdout).starts_with(
            "FAIL: 1 of 93184 real output elements are NaN/inf (unwritten or NaN leak), the \
             first at request 3, position 0, head 0, dim 3 (row 50)"
        ),
        "{}",
        text(&fail.stdout)
    );
}

/// Padding rows must come back NaN; a written one fails and the text says what judge expects.
#[test]
fn judge_holds_padding_rows_to_nan() {
    let case = load_tier("smoke")
        .unwrap()
        .expand()
        .unwrap()
        .cases
        .into_iter()
        .find(|c| c.mix == "padding" && !c.is_local())
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (file, p) = gen_case(dir.path(), &case.id);
    assert!(p.total_rows() > p.real_rows());
    let output = dir.path().join("out.safetensors");
    let mut out = exact_output(&p);
    out[[p.real_rows(), 0, 0]] = 0.0;
    write_impl_output(&output, &out).unwrap();
    let fail = judge(&file, &output, &[]);
    let stdout = text(&fail.stdout);
    assert_eq!(fail.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.starts_with("FAIL: padding rows were modified; rule (a) holds"),
        "{stdout}"
    );
    assert!(
        stdout.contains("poison `out` with NaN before the launch"),
        "{stdout}"
    );
}

/// Files judge cannot use end in exit 2 with one message naming the file and what is wrong.
#[test]
fn bad_output_files_exit_2_with_one_message() {
    let dir = tempfile::tempdir().unwrap();
    let (file, p) = gen_case(dir.path(), &mixed_case().id);
    let shape = [p.total_rows(), p.num_heads, p.head_dim];
    let path = |name: &str| dir.path().join(name);
    write_impl_output(
        path("short.safetensors"),
        &Array3::zeros((shape[0] - 1, shape[1], shape[2])),
    )
    .unwrap();
    let n: usize = shape.iter().product();
    raw_tensor(
        &path("int.safetensors"),
        "out",
        "I32",
        &shape,
        &vec![0u8; 4 * n],
    );
    raw_tensor(
        &path("named.safetensors"),
        "o",
        "F32",
        &shape,
        &vec![0u8; 4 * n],
    );
    std::fs::write(path("garbage.safetensors"), b"not a safetensors file").unwrap();
    for (output, says) in [
        (path("missing.safetensors"), "missing.safetensors"),
        (path("named.safetensors"), "missing tensor `out`"),
        (file.clone(), "it is not an output of this case"),
        (path("short.safetensors"), "shape"),
        (path("int.safetensors"), "dtype I32"),
        (path("garbage.safetensors"), "garbage.safetensors"),
    ] {
        let out = judge(&file, &output, &[]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{}: {stderr}", output.display());
        let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "{stderr}");
        assert!(
            lines[0].starts_with("error: ") && lines[0].contains(says),
            "{stderr}"
        );
    }
    // A case file that is not one.
    let out = judge(&path("garbage.safetensors"), &file, &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
}

/// A case whose real `q` row holds one NaN makes a NaN reference, against which every
/// comparison is false: once, `judge` printed PASS for an output of 12345s. Such a case is
/// invalid input for every command that reads it: exit 2 naming the tensor and index, before
/// any judging.
#[test]
fn a_case_with_a_non_finite_real_input_is_refused_before_judging() {
    let dir = tempfile::tempdir().unwrap();
    let (file, problem) = gen_case(dir.path(), &mixed_case().id);
    let mut data = problem.clone().into_data();
    data.q[[1, 2, 3]] = f32::NAN;
    let bad = Problem::new(data).unwrap();
    let bad_file = dir.path().join("nan_q.safetensors");
    relattn_reference::casefile::write_case(
        &bad_file,
        &bad,
        &relattn_reference::casefile::CaseMeta::of(&bad),
    )
    .unwrap();
    let mut garbage = Array3::from_elem(
        (problem.total_rows(), problem.num_heads, problem.head_dim),
        12345f32,
    );
    for t in problem.real_rows()..problem.total_rows() {
        garbage.index_axis_mut(ndarray::Axis(0), t).fill(f32::NAN);
    }
    let output = dir.path().join("garbage.safetensors");
    write_impl_output(&output, &garbage).unwrap();
    let out = judge(&bad_file, &output, &[]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("q[1, 2, 3] = NaN, read by row 1, position 0 of request 1"),
        "{err}"
    );
    assert!(!text(&out.stdout).contains("PASS"), "{}", text(&out.stdout));
    assert!(!err.contains("panicked"), "{err}");
    // The same case file for the reference command: refused the same way.
    let written = dir.path().join("ref.safetensors");
    let out = relattn(&[
        "reference",
        "--input",
        s(&bad_file),
        "--output",
        s(&written),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(!written.exists());
    // The finite case still judges the garbage as a failure (exit 1).
    let out = judge(&file, &output, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
}
