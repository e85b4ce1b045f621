//! Case and output files: round trips, metadata, and every kind of malformed file.

#[path = "casefile/limits.rs"]
mod limits;
#[path = "casefile/malformed.rs"]
mod malformed;
#[path = "casefile/output.rs"]
mod output;

use ndarray::{Array2, Array3};
use relattn_reference::casefile::{
    read_case, read_output, write_case, write_output, CaseFileError, CaseMeta,
};
use relattn_reference::gen::{generate, BiasMode, GenSpec};
use relattn_reference::{CacheLayout, DType, Problem, RefOutput, RowLayout};
use rstest::rstest;
use safetensors::{Dtype, SafeTensors, View};
use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// A small case with padding rows, poisoned slots (NaN), shuffled pages and a local window.
fn small(dtype: DType, layout: CacheLayout, seed: u64) -> Problem {
    let mut spec = GenSpec::local(4, 2, 12, vec![(3, 20), (0, 5), (2, 9)], seed);
    spec.head_dim = 16;
    spec.page_size = 4;
    spec.padding_rows = 2;
    spec.dtype = dtype;
    spec.layout = layout;
    spec.bias = BiasMode::Distinct;
    generate(&spec).unwrap()
}

fn bits(values: impl IntoIterator<Item = f32>) -> Vec<u32> {
    values.into_iter().map(f32::to_bits).collect()
}

/// Equal field by field, floats compared by bit pattern (NaN poison included).
fn assert_same(a: &Problem, b: &Problem) {
    assert_eq!(a.dtype, b.dtype);
    assert_eq!(
        (a.num_heads, a.num_kv_heads, a.head_dim, a.rel_extent),
        (b.num_heads, b.num_kv_heads, b.head_dim, b.rel_extent)
    );
    assert_eq!(
        (a.page_size, a.num_blocks, a.window_left),
        (b.page_size, b.num_blocks, b.window_left)
    );
    assert_eq!(a.softmax_scale.to_bits(), b.softmax_scale.to_bits());
    assert_eq!(a.q.shape(), b.q.shape());
    assert_eq!(bits(a.q.iter().copied()), bits(b.q.iter().copied()));
    assert_eq!(a.rel_logits.shape(), b.rel_logits.shape());
    assert_eq!(
        bits(a.rel_logits.iter().copied()),
        bits(b.rel_logits.iter().copied())
    );
    assert_eq!((a.layout, a.k, a.v), (b.layout, b.k, b.v));
    assert_eq!(bits(a.kv.iter().copied()), bits(b.kv.iter().copied()));
    assert_eq!(a.block_table, b.block_table);
    assert_eq!(a.seqused_k, b.seqused_k);
    assert_eq!(a.cu_seqlens_q, b.cu_seqlens_q);
}

/// Every key and value every request may address, by bit pattern.
fn assert_same_keys(a: &Problem, b: &Problem) {
    for r in a.requests() {
        for j in 0..r.kv_len {
            for h in 0..a.num_kv_heads {
                assert_eq!(
                    bits(a.key(r.index, j, h).to_vec()),
                    bits(b.key(r.index, j, h).to_vec())
                );
                assert_eq!(
                    bits(a.value(r.index, j, h).to_vec()),
                    bits(b.value(r.index, j, h).to_vec())
                );
            }
        }
    }
}

fn written(dir: &tempfile::TempDir, p: &Problem, meta: &CaseMeta) -> PathBuf {
    let path = dir.path().join("case.safetensors");
    write_case(&path, p, meta).unwrap();
    path
}

#[test]
fn round_trip_every_dtype_and_layout() {
    let dir = tempfile::tempdir().unwrap();
    for (i, dtype) in DType::ALL.into_iter().enumerate() {
        for (j, layout) in CacheLayout::ALL.into_iter().enumerate() {
            let p = small(dtype, layout, (10 * i + j) as u64);
            assert!(
                p.kv.iter().any(|x| x.is_nan()),
                "the case should carry poison"
            );
            let meta = CaseMeta {
                case_id: Some(format!("rt_{dtype}_{layout}")),
                seed: Some(u64::MAX - 1),
                cache_layout: layout,
            };
            let path = written(&dir, &p, &meta);
            let back = read_case(&path).unwrap();
            assert_eq!(back.meta, meta);
            assert_same(&p, &back.problem);
        }
    }
}

#[test]
fn cache_layout_metadata_decides_the_buffer_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let p = small(DType::Bf16, CacheLayout::NhdPacked, 7);
    for layout in CacheLayout::ALL {
        let meta = CaseMeta {
            cache_layout: layout,
            ..CaseMeta::default()
        };
        let back = read_case(written(&dir, &p, &meta)).unwrap().problem;
        assert_eq!(back.layout, layout);
        let (k, v, len) = layout.views(p.num_blocks, p.page_size, p.num_kv_heads, p.head_dim);
        assert_eq!((back.k, back.v, back.kv.len()), (k, v, len));
        assert_same_keys(&p, &back);
    }
}

#[test]
fn caches_are_stored_contiguous() {
    let dir = tempfile::tempdir().unwrap();
    let p = small(DType::F32, CacheLayout::HndPacked, 3);
    let path = written(&dir, &p, &CaseMeta::of(&p));
    let bytes = std::fs::read(&path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let keys = st.tensor("key_cache").unwrap();
    assert_eq!(
        keys.shape(),
        &[p.num_blocks, p.page_size, p.num_kv_heads, p.head_dim]
    );
    let values: Vec<f32> = keys
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let (block, slot, head) = (p.num_blocks - 1, 2, 1);
    let at = ((block * p.page_size + slot) * p.num_kv_heads + head) * p.head_dim;
    let want = p.k.at(block, slot, head);
    assert_eq!(
        bits(values[at..at + p.head_dim].to_vec()),
        bits(p.kv[want..want + p.head_dim].to_vec())
    );
    for (name, dtype) in [
        ("block_table", Dtype::I32),
        ("seqused_k", Dtype::I32),
        ("q", Dtype::F32),
    ] {
        assert_eq!(st.tensor(name).unwrap().dtype(), dtype);
    }
}

#[rstest]
#[case::power_of_two(0.0078125, Some("0.0078125"))]
#[case::a_third(1.0 / 3.0, None)]
#[case::tiny(1e-300, None)]
fn scale_round_trips_exactly(#[case] scale: f64, #[case] text: Option<&str>) {
    let dir = tempfile::tempdir().unwrap();
    let mut data = small(DType::Bf16, CacheLayout::Contiguous, 1).into_data();
    data.softmax_scale = scale;
    let p = Problem::new(data).unwrap();
    let path = written(&dir, &p, &CaseMeta::default());
    if let Some(text) = text {
        assert_eq!(metadata_of(&path)["softmax_scale"], text);
    }
    let back = read_case(&path).unwrap().problem;
    assert_eq!(back.softmax_scale.to_bits(), scale.to_bits());
}

#[test]
fn metadata_written() {
    let dir = tempfile::tempdir().unwrap();
    let p = small(DType::F16, CacheLayout::NhdPacked, 5);
    let meta = CaseMeta {
        case_id: Some("abc".into()),
        seed: Some(5),
        cache_layout: p.layout,
    };
    let m = metadata_of(&written(&dir, &p, &meta));
    assert_eq!(m["format_version"], "1");
    assert_eq!(m["rel_extent"], "12");
    assert_eq!(m["window_left"], "11");
    assert_eq!(m["causal"], "true");
    assert_eq!(m["case_id"], "abc");
    assert_eq!(m["seed"], "5");
    assert_eq!(m["cache_layout"], "nhd_packed");
    // A global layer writes window_left = -1; optional keys are omitted when absent.
    let g = generate(&GenSpec::global(2, 1, vec![(2, 3)], 0)).unwrap();
    let m = metadata_of(&written(&dir, &g, &CaseMeta::default()));
    assert_eq!(m["window_left"], "-1");
    assert!(!m.contains_key("case_id") && !m.contains_key("seed"));
}

fn metadata_of(path: &Path) -> HashMap<String, String> {
    let bytes = std::fs::read(path).unwrap();
    let (_, header) = SafeTensors::read_metadata(&bytes).unwrap();
    header.metadata().clone().unwrap()
}

/// An owned tensor of a rewritten file.
struct Owned {
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

impl Owned {
    fn new(dtype: Dtype, shape: Vec<usize>, data: Vec<u8>) -> Owned {
        Owned { dtype, shape, data }
    }
}

impl View for Owned {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

/// Rewrite a written file through safetensors after `edit` changes its tensors or metadata.
fn rewrite(
    path: &Path,
    edit: impl FnOnce(&mut Vec<(String, Owned)>, &mut HashMap<String, String>),
) {
    let bytes = std::fs::read(path).unwrap();
    let mut metadata = metadata_of(path);
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<(String, Owned)> = st
        .tensors()
        .into_iter()
        .map(|(n, v)| {
            (
                n,
                Owned::new(v.dtype(), v.shape().to_vec(), v.data().to_vec()),
            )
        })
        .collect();
    edit(&mut tensors, &mut metadata);
    let out = safetensors::serialize(tensors, Some(metadata)).unwrap();
    std::fs::write(path, out).unwrap();
}

/// A case file in a fresh directory (kept alive by the returned guard).
fn case_file() -> (tempfile::TempDir, PathBuf, Problem) {
    let dir = tempfile::tempdir().unwrap();
    let p = small(DType::Bf16, CacheLayout::Contiguous, 11);
    let path = written(&dir, &p, &CaseMeta::default());
    (dir, path, p)
}

fn read_err(path: &Path) -> (CaseFileError, String) {
    let err = read_case(path).expect_err("malformed file was accepted");
    let msg = err.to_string();
    assert!(
        msg.contains("case.safetensors"),
        "message {msg:?} does not name the file"
    );
    (err, msg)
}

/// Replace tensor `name` by the same bytes reinterpreted as `dtype` and `shape`.
fn replace_with(
    path: &Path,
    name: &str,
    dtype: Dtype,
    shape: Option<Vec<usize>>,
    data: Option<Vec<u8>>,
) {
    let bytes = std::fs::read(path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let old = st.tensor(name).unwrap();
    let data = data.unwrap_or_else(|| old.data().to_vec());
    let shape = shape.unwrap_or_else(|| old.shape().to_vec());
    rewrite(path, |t, _| {
        let slot = t.iter_mut().find(|(n, _)| n == name).unwrap();
        slot.1 = Owned::new(dtype, shape, data);
    });
}

#[test]
fn the_row_layout_is_written_only_away_from_padded_and_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let padded = small(DType::Bf16, CacheLayout::NhdPacked, 9);
    let m = metadata_of(&written(&dir, &padded, &CaseMeta::default()));
    assert!(!m.contains_key("row_layout"), "{m:?}");
    assert_eq!(
        read_case(written(&dir, &padded, &CaseMeta::default()))
            .unwrap()
            .problem
            .rows,
        RowLayout::Padded
    );
    for rows in [RowLayout::Strided, RowLayout::Exact] {
        let mut data = padded.data().clone();
        data.rows = rows;
        let p = Problem::new(data).unwrap();
        let path = written(&dir, &p, &CaseMeta::of(&p));
        assert_eq!(metadata_of(&path)["row_layout"], rows.name());
        let back = read_case(&path).unwrap().problem;
        assert_eq!(back.rows, rows);
        assert_same(&p, &back);
    }
}
