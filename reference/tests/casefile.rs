//! Case and output files: round trips, metadata, and every kind of malformed file.

use ndarray::{Array2, Array3};
use relattn_reference::casefile::{
    read_case, read_output, write_case, write_output, CaseFileError, CaseMeta,
};
use relattn_reference::gen::{generate, BiasMode, GenSpec};
use relattn_reference::{CacheLayout, DType, Problem, RefOutput};
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

#[test]
fn scale_round_trips_exactly() {
    let dir = tempfile::tempdir().unwrap();
    for (scale, text) in [
        (0.0078125, Some("0.0078125")),
        (1.0 / 3.0, None),
        (1e-300, None),
    ] {
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

#[test]
fn missing_format_version_reads_as_version_one() {
    let (_dir, path, p) = case_file();
    rewrite(&path, |_, m| {
        m.remove("format_version");
        m.remove("cache_layout");
    });
    let back = read_case(&path).unwrap();
    assert_eq!(back.meta, CaseMeta::default());
    assert_same_keys(&p, &back.problem);
}

#[test]
fn other_format_versions_are_refused() {
    let (_dir, path, _) = case_file();
    rewrite(&path, |_, m| {
        m.insert("format_version".into(), "2".into());
    });
    let (err, msg) = read_err(&path);
    assert!(
        matches!(err, CaseFileError::Version { ref version, .. } if version == "2"),
        "{err:?}"
    );
    assert!(msg.contains("format_version"), "{msg}");
}

#[test]
fn unknown_tensors_are_ignored() {
    let (_dir, path, p) = case_file();
    rewrite(&path, |t, _| {
        t.push(("notes".into(), Owned::new(Dtype::U8, vec![12], vec![0; 12])));
    });
    assert_same(&p, &read_case(&path).unwrap().problem);
}

#[test]
fn truncated_file() {
    let (_dir, path, _) = case_file();
    let bytes = std::fs::read(&path).unwrap();
    for keep in [bytes.len() - 1, bytes.len() / 2, 100, 9, 5, 0] {
        std::fs::write(&path, &bytes[..keep]).unwrap();
        let (err, msg) = read_err(&path);
        assert!(
            matches!(
                err,
                CaseFileError::Format { .. } | CaseFileError::Header { .. }
            ),
            "{keep} bytes: {err:?}"
        );
        assert!(msg.contains("not a valid safetensors file"), "{msg}");
    }
}

#[test]
fn header_not_utf8_or_not_json() {
    let (_dir, path, _) = case_file();
    for header in [&b"{\"q\":\xff\xfe}   "[..], b"not json"] {
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header);
        std::fs::write(&path, &bytes).unwrap();
        let (err, _) = read_err(&path);
        assert!(matches!(err, CaseFileError::Format { .. }), "{err:?}");
    }
}

/// A header whose offsets chain up to near `u64::MAX`: each tensor is valid on its own, but the
/// total overflows when added to the header length (safetensors 0.6 panics on it unguarded).
fn overflowing_file() -> Vec<u8> {
    let size = (1u64 << 61) - 1;
    let entries: Vec<String> = (0..8u64)
        .map(|i| {
            format!(
                "\"t{i}\":{{\"dtype\":\"U8\",\"shape\":[{size}],\"data_offsets\":[{},{}]}}",
                i * size,
                (i + 1) * size
            )
        })
        .collect();
    let header = format!("{{{}}}", entries.join(","));
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(&[0; 8]);
    bytes
}

#[test]
fn data_offsets_past_the_end_of_the_file() {
    let (_dir, path, _) = case_file();
    std::fs::write(&path, overflowing_file()).unwrap();
    let (err, msg) = read_err(&path);
    assert!(matches!(err, CaseFileError::Header { .. }), "{err:?}");
    assert!(msg.contains("past the end"), "{msg}");
}

#[test]
fn missing_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("case.safetensors");
    let (err, msg) = read_err(&path);
    assert!(matches!(err, CaseFileError::Io { .. }), "{err:?}");
    assert!(msg.contains("cannot read"), "{msg}");
}

#[test]
fn each_missing_tensor() {
    for name in [
        "q",
        "key_cache",
        "value_cache",
        "rel_logits",
        "block_table",
        "seqused_k",
        "cu_seqlens_q",
    ] {
        let (_dir, path, _) = case_file();
        rewrite(&path, |t, _| t.retain(|(n, _)| n != name));
        let (err, msg) = read_err(&path);
        assert!(
            matches!(err, CaseFileError::MissingTensor { tensor, .. } if tensor == name),
            "{err:?}"
        );
        assert!(msg.contains(&format!("missing tensor `{name}`")), "{msg}");
    }
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
fn floating_tensor_of_wrong_dtype() {
    let (_dir, path, _) = case_file();
    replace_with(&path, "q", Dtype::I16, None, None);
    let (err, msg) = read_err(&path);
    assert!(
        matches!(err, CaseFileError::Dtype { tensor: "q", .. }),
        "{err:?}"
    );
    assert!(
        msg.contains("`q`") && msg.contains("I16") && msg.contains("BF16, F16 or F32"),
        "{msg}"
    );
}

#[test]
fn floating_tensors_of_mixed_dtypes() {
    let (_dir, path, _) = case_file();
    replace_with(&path, "rel_logits", Dtype::F16, None, None);
    let (err, msg) = read_err(&path);
    assert!(
        matches!(
            err,
            CaseFileError::Dtype {
                tensor: "rel_logits",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        msg.contains("F16") && msg.contains("BF16 like `q`"),
        "{msg}"
    );
}

#[test]
fn integer_tensor_of_wrong_dtype() {
    let (_dir, path, p) = case_file();
    let wide: Vec<u8> = p
        .seqused_k
        .iter()
        .flat_map(|&x| i64::from(x).to_le_bytes())
        .collect();
    replace_with(&path, "seqused_k", Dtype::I64, None, Some(wide));
    let (err, msg) = read_err(&path);
    assert!(
        matches!(
            err,
            CaseFileError::Dtype {
                tensor: "seqused_k",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(msg.contains("I64") && msg.contains("expected I32"), "{msg}");
}

#[test]
fn tensor_of_wrong_rank() {
    let (_dir, path, p) = case_file();
    let (t, h, d) = (p.total_rows(), p.num_heads, p.head_dim);
    replace_with(&path, "q", Dtype::BF16, Some(vec![t, h * d]), None);
    let (err, msg) = read_err(&path);
    assert!(
        matches!(
            err,
            CaseFileError::Rank {
                tensor: "q",
                rank: 3,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(msg.contains("rank 2") && msg.contains("[T, H, D]"), "{msg}");

    let (_dir, path, p) = case_file();
    let n = p.block_table.len();
    replace_with(&path, "block_table", Dtype::I32, Some(vec![n]), None);
    let (err, _) = read_err(&path);
    assert!(
        matches!(
            err,
            CaseFileError::Rank {
                tensor: "block_table",
                rank: 2,
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn value_cache_shape_differs_from_key_cache() {
    let (_dir, path, p) = case_file();
    let s = [p.num_blocks, p.page_size, p.num_kv_heads, p.head_dim];
    replace_with(
        &path,
        "value_cache",
        Dtype::BF16,
        Some(vec![s[0], s[1], s[2] * 2, s[3] / 2]),
        None,
    );
    let (err, msg) = read_err(&path);
    assert!(
        matches!(
            err,
            CaseFileError::Shape {
                tensor: "value_cache",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(msg.contains("key_cache"), "{msg}");
}

#[test]
fn inconsistent_shapes_are_problem_errors() {
    // rel_logits [T, H, E] whose E disagrees with the rel_extent metadata.
    let (_dir, path, _) = case_file();
    rewrite(&path, |_, m| {
        m.insert("rel_extent".into(), "13".into());
    });
    let (err, msg) = read_err(&path);
    assert!(matches!(err, CaseFileError::Problem { .. }), "{err:?}");
    assert!(msg.contains("rel_logits") && msg.contains("13"), "{msg}");

    // seqused_k shorter than a request's queries.
    let (_dir, path, p) = case_file();
    let mut lens = p.seqused_k.clone();
    lens[0] = 1;
    let data: Vec<u8> = lens.iter().flat_map(|x| x.to_le_bytes()).collect();
    replace_with(&path, "seqused_k", Dtype::I32, None, Some(data));
    let (err, msg) = read_err(&path);
    assert!(matches!(err, CaseFileError::Problem { .. }), "{err:?}");
    assert!(msg.contains("seqused_k[0] = 1"), "{msg}");
}

#[test]
fn huge_dimensions_of_an_empty_tensor() {
    let (_dir, path, _) = case_file();
    let big = 1usize << 40;
    replace_with(
        &path,
        "key_cache",
        Dtype::BF16,
        Some(vec![0, big, big, 4]),
        Some(vec![]),
    );
    let (err, msg) = read_err(&path);
    assert!(
        matches!(
            err,
            CaseFileError::Shape {
                tensor: "key_cache",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(msg.contains("fits in memory"), "{msg}");
}

#[test]
fn bad_metadata_values() {
    let cases = [
        ("softmax_scale", "abc"),
        ("softmax_scale", ""),
        ("rel_extent", "-4"),
        ("window_left", "none"),
        ("causal", "false"),
        ("seed", "-1"),
        ("cache_layout", "striped"),
    ];
    for (key, value) in cases {
        let (_dir, path, _) = case_file();
        rewrite(&path, |_, m| {
            m.insert(key.into(), value.into());
        });
        let (err, msg) = read_err(&path);
        assert!(
            matches!(err, CaseFileError::BadMetadata { key: k, value: ref v, .. } if k == key && v == value),
            "{key}={value}: {err:?}"
        );
        assert!(
            msg.contains(&format!("`{key}`")) && msg.contains("expected"),
            "{msg}"
        );
    }
}

#[test]
fn non_finite_scale_metadata() {
    let (_dir, path, _) = case_file();
    rewrite(&path, |_, m| {
        m.insert("softmax_scale".into(), "inf".into());
    });
    let (err, msg) = read_err(&path);
    assert!(matches!(err, CaseFileError::Problem { .. }), "{err:?}");
    assert!(msg.contains("softmax_scale"), "{msg}");
}

#[test]
fn missing_metadata_keys() {
    for key in ["softmax_scale", "rel_extent", "window_left", "causal"] {
        let (_dir, path, _) = case_file();
        rewrite(&path, |_, m| {
            m.remove(key);
        });
        let (err, msg) = read_err(&path);
        assert!(
            matches!(err, CaseFileError::MissingMetadata { key: k, .. } if k == key),
            "{err:?}"
        );
        assert!(msg.contains(&format!("`{key}` is missing")), "{msg}");
    }
}

fn outputs(rows: Option<Vec<usize>>, dtype: DType) -> (RefOutput, RefOutput) {
    let n = rows.as_ref().map_or(5, Vec::len);
    let (h, d) = (3, 4);
    let out = Array3::from_shape_fn((n, h, d), |(t, h, c)| {
        ((t * 31 + h * 7 + c) as f64).sin() / 3.0
    });
    let lse = Array2::from_shape_fn((n, h), |(t, h)| (t as f64 + 0.1) * (h as f64 - 1.3));
    let low = out.mapv(|x| f64::from(dtype.round(x as f32)));
    let reference = RefOutput {
        rows: rows.clone(),
        out,
        lse: lse.clone(),
    };
    (
        reference,
        RefOutput {
            rows,
            out: low,
            lse,
        },
    )
}

#[test]
fn output_round_trip_full_and_sampled() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.safetensors");
    for dtype in DType::ALL {
        for rows in [None, Some(vec![0, 2, 3, 9])] {
            let (reference, emulation) = outputs(rows, dtype);
            write_output(&path, &reference, &emulation, dtype).unwrap();
            let back = read_output(&path).unwrap();
            assert_eq!(back.dtype, dtype);
            assert_eq!(back.reference, reference);
            assert_eq!(back.out_lp, emulation.out);
        }
    }
}

#[test]
fn output_rows_must_agree() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.safetensors");
    let (reference, _) = outputs(Some(vec![0, 1, 2]), DType::Bf16);
    let (_, emulation) = outputs(Some(vec![0, 1, 3]), DType::Bf16);
    let err = write_output(&path, &reference, &emulation, DType::Bf16).unwrap_err();
    assert!(matches!(err, CaseFileError::Mismatch { .. }), "{err:?}");
    assert!(!path.exists());
}

#[test]
fn malformed_output_files() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("case.safetensors");
    let (reference, emulation) = outputs(Some(vec![1, 4, 6]), DType::F16);
    let fresh = || write_output(&path, &reference, &emulation, DType::F16).unwrap();

    fresh();
    rewrite(&path, |t, _| t.retain(|(n, _)| n != "lse"));
    let err = read_output(&path).unwrap_err();
    assert!(
        matches!(err, CaseFileError::MissingTensor { tensor: "lse", .. }),
        "{err:?}"
    );

    fresh();
    let negative: Vec<u8> = [1i32, -4, 6].iter().flat_map(|x| x.to_le_bytes()).collect();
    replace_with(&path, "rows", Dtype::I32, None, Some(negative));
    let err = read_output(&path).unwrap_err();
    assert!(
        matches!(
            err,
            CaseFileError::Value {
                tensor: "rows",
                index: 1,
                value: -4,
                ..
            }
        ),
        "{err:?}"
    );

    fresh();
    replace_with(&path, "out_lp", Dtype::F16, Some(vec![3, 4, 3]), None);
    let err = read_output(&path).unwrap_err();
    assert!(
        matches!(
            err,
            CaseFileError::Shape {
                tensor: "out_lp",
                ..
            }
        ),
        "{err:?}"
    );

    fresh();
    replace_with(&path, "out", Dtype::F32, Some(vec![3, 3, 8]), None);
    let err = read_output(&path).unwrap_err();
    assert!(
        matches!(err, CaseFileError::Dtype { tensor: "out", .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("expected F64"), "{err}");
}
