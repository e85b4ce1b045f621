//! Golden cases from an independent NumPy implementation (tests/golden/make_golden.py): the
//! references must reproduce its f64 results. The files are read here with the `safetensors`
//! crate directly, so this check depends on no other reader of the project.

mod common;

use common::{emulation_bound, max_abs, max_abs_diff};
use half::bf16;
use ndarray::{s, Array2, Array3};
use relattn_reference::{emulate, fast, oracle, CacheLayout, DType, Problem, ProblemData};
use safetensors::{Dtype, SafeTensors};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

struct Golden {
    name: String,
    problem: Problem,
    out: Array3<f64>,
    lse: Array2<f64>,
}

fn golden_files() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    files
}

fn floats(st: &SafeTensors, name: &str) -> (DType, Vec<usize>, Vec<f32>) {
    let t = st.tensor(name).unwrap();
    let data = t.data();
    let (dtype, values) = match t.dtype() {
        Dtype::BF16 => (
            DType::Bf16,
            data.chunks_exact(2)
                .map(|b| bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32())
                .collect(),
        ),
        Dtype::F32 => (
            DType::F32,
            data.chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect(),
        ),
        other => panic!("{name}: unexpected dtype {other:?}"),
    };
    (dtype, t.shape().to_vec(), values)
}

fn ints(st: &SafeTensors, name: &str) -> (Vec<usize>, Vec<i32>) {
    let t = st.tensor(name).unwrap();
    assert_eq!(t.dtype(), Dtype::I32, "{name}");
    (
        t.shape().to_vec(),
        t.data()
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes(b.try_into().unwrap()))
            .collect(),
    )
}

fn doubles(st: &SafeTensors, name: &str) -> (Vec<usize>, Vec<f64>) {
    let t = st.tensor(name).unwrap();
    assert_eq!(t.dtype(), Dtype::F64, "{name}");
    (
        t.shape().to_vec(),
        t.data()
            .chunks_exact(8)
            .map(|b| f64::from_le_bytes(b.try_into().unwrap()))
            .collect(),
    )
}

fn load(path: &Path) -> Golden {
    let bytes = std::fs::read(path).unwrap();
    let (_, header) = SafeTensors::read_metadata(&bytes).unwrap();
    let meta: HashMap<String, String> = header.metadata().clone().unwrap();
    assert_eq!(meta["format_version"], "1");
    assert_eq!(meta["cache_layout"], "contiguous");
    assert_eq!(meta["causal"], "true");
    let st = SafeTensors::deserialize(&bytes).unwrap();

    let (dtype, q_shape, q) = floats(&st, "q");
    let (kd, k_shape, k) = floats(&st, "key_cache");
    let (vd, v_shape, v) = floats(&st, "value_cache");
    let (rd, rel_shape, rel) = floats(&st, "rel_logits");
    assert!(kd == dtype && vd == dtype && rd == dtype && k_shape == v_shape);
    let (t_rows, h, d) = (q_shape[0], q_shape[1], q_shape[2]);
    let (num_blocks, page, hkv) = (k_shape[0], k_shape[1], k_shape[2]);
    let (table_shape, table) = ints(&st, "block_table");
    let (_, seqused_k) = ints(&st, "seqused_k");
    let (_, cu_seqlens_q) = ints(&st, "cu_seqlens_q");
    let (out_shape, out) = doubles(&st, "expected_out");
    let (lse_shape, lse) = doubles(&st, "expected_lse");

    let (kview, vview, len) = CacheLayout::Contiguous.views(num_blocks, page, hkv, d);
    let mut kv = k;
    kv.extend(v);
    assert_eq!(kv.len(), len);
    let problem = Problem::new(ProblemData {
        dtype,
        num_heads: h,
        num_kv_heads: hkv,
        head_dim: d,
        rel_extent: rel_shape[2],
        page_size: page,
        num_blocks,
        softmax_scale: meta["softmax_scale"].parse().unwrap(),
        window_left: meta["window_left"].parse().unwrap(),
        q: Array3::from_shape_vec((t_rows, h, d), q).unwrap(),
        rel_logits: Array3::from_shape_vec((rel_shape[0], rel_shape[1], rel_shape[2]), rel)
            .unwrap(),
        kv,
        layout: CacheLayout::Contiguous,
        rows: Default::default(),
        k: kview,
        v: vview,
        block_table: Array2::from_shape_vec((table_shape[0], table_shape[1]), table).unwrap(),
        seqused_k,
        cu_seqlens_q,
    })
    .unwrap();
    Golden {
        name: meta["case_id"].clone(),
        problem,
        out: Array3::from_shape_vec((out_shape[0], out_shape[1], out_shape[2]), out).unwrap(),
        lse: Array2::from_shape_vec((lse_shape[0], lse_shape[1]), lse).unwrap(),
    }
}

#[test]
fn golden_files_are_present_and_small() {
    let files = golden_files();
    assert!(
        files.len() >= 3,
        "expected the golden cases in tests/golden, found {files:?}"
    );
    for f in &files {
        assert!(
            std::fs::metadata(f).unwrap().len() < 200_000,
            "{f:?} is too large"
        );
    }
}

#[test]
fn oracle_and_fast_reproduce_the_golden_results() {
    for path in golden_files() {
        let g = load(&path);
        let p = &g.problem;
        assert!(
            p.kv.iter().any(|x| x.is_nan()),
            "{}: unread slots hold NaN",
            g.name
        );
        let tol = 1e-10 * max_abs(&g.out);
        for (name, res) in [
            ("oracle", oracle::attention(p)),
            ("fast", fast::attention(p)),
        ] {
            assert!(
                res.out.abs_diff_eq(&g.out, tol),
                "{} ({name}): max|out - expected| = {:e} > {tol:e}",
                g.name,
                max_abs_diff(&res.out, &g.out)
            );
            let lse_tol = 1e-10 * g.lse.iter().fold(1.0f64, |m, x| m.max(x.abs()));
            assert!(
                res.lse.abs_diff_eq(&g.lse, lse_tol),
                "{} ({name}): lse {:e} > {lse_tol:e}",
                g.name,
                max_abs_diff(&res.lse, &g.lse)
            );
        }
        let rows: Vec<usize> = (0..p.total_rows()).collect();
        let sampled = fast::attention_rows(p, &rows);
        let real = p.real_rows();
        let want = g.out.slice(s![..real, .., ..]).to_owned();
        assert!(
            sampled.out.abs_diff_eq(&want, tol),
            "{} (fast, sampled): {:e} > {tol:e}",
            g.name,
            max_abs_diff(&sampled.out, &want)
        );
    }
}

#[test]
fn emulation_is_within_the_dtype_bound_of_the_golden_results() {
    for path in golden_files() {
        let g = load(&path);
        let emu = emulate::attention(&g.problem);
        let bound = emulation_bound(&g.problem, &g.out);
        let err = max_abs_diff(&emu.out, &g.out);
        assert!(
            err <= bound,
            "{}: max|emu - expected| = {err:e} > {bound:e}",
            g.name
        );
        assert!(
            err > 0.0 || g.problem.dtype == DType::F32,
            "{}: emulation should round",
            g.name
        );
    }
}
