//! Case files: a small valid case, then structured mutations of its tensors, header and bytes.

use crate::bounded::{relattn_in, Outcome};
use crate::run::*;
use proptest::prelude::*;
use relattn_reference::casefile::{read_output, write_case, CaseMeta};
use relattn_reference::gen::{generate, BiasMode, GenSpec, PageMode};
use relattn_reference::{CacheLayout, DType, Inputs};
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

#[derive(Debug, Clone)]
enum Mutation {
    /// New dimensions for tensor `tensor` (an index into the file's tensors); `keep` keeps
    /// its data, otherwise it becomes empty.
    Shape {
        tensor: usize,
        dims: Vec<u64>,
        keep: bool,
    },
    Dtype {
        tensor: usize,
        dtype: &'static str,
    },
    Drop {
        tensor: usize,
    },
    Meta {
        key: &'static str,
        value: String,
    },
    DropMeta {
        key: &'static str,
    },
    /// Overwrite 4 bytes of a tensor's data with an int32.
    Int {
        tensor: usize,
        at: usize,
        value: i32,
    },
    /// Raw `data_offsets` for a tensor (not recomputed).
    Offsets {
        tensor: usize,
        start: u64,
        end: u64,
    },
    /// Replace the 8-byte header length.
    HeaderLen(u64),
    /// Keep only this fraction (per mille) of the file.
    Truncate(u16),
    /// Overwrite one byte of the whole file.
    Byte {
        at: usize,
        value: u8,
    },
}

#[derive(Debug, Clone)]
struct CaseInput {
    spec: GenSpec,
    mutations: Vec<Mutation>,
    /// 0: reference, 1: reference --sample-rows, 2: exec.
    command: u8,
    sample_rows: u64,
}

fn small_spec() -> impl Strategy<Value = GenSpec> {
    let heads = prop::sample::select(vec![(1usize, 1usize), (2, 1), (4, 2), (4, 4), (8, 1)]);
    let requests = prop::collection::vec((0usize..5, 0usize..40), 1..4).prop_map(|r| {
        r.into_iter()
            .map(|(q, extra)| (q, q + extra))
            .collect::<Vec<_>>()
    });
    (
        heads,
        prop::sample::select(vec![4usize, 8, 16, 32, 128]),
        prop::sample::select(vec![1usize, 3, 8, 16, 64]),
        prop::sample::select(vec![-1i64, -2, 0, 3, 100, 7]),
        prop::sample::select(vec![1usize, 2, 4, 16]),
        prop::sample::select(DType::ALL.to_vec()),
        prop::sample::select(CacheLayout::ALL.to_vec()),
        requests,
        0usize..3,
        (
            prop::sample::select(vec![BiasMode::Normal, BiasMode::Distinct, BiasMode::Zero]),
            any::<bool>(),
            0usize..3,
            any::<u64>(),
            prop::sample::select(Inputs::ALL.to_vec()),
        ),
    )
        .prop_map(
            |(
                (h, hkv),
                d,
                e,
                w,
                page,
                dtype,
                layout,
                requests,
                padding,
                (bias, zero, spare, seed, inputs),
            )| {
                GenSpec {
                    dtype,
                    num_heads: h,
                    num_kv_heads: hkv,
                    head_dim: d,
                    rel_extent: e,
                    window_left: if w == 7 { e as i64 - 1 } else { w.max(-1) },
                    softmax_scale: 1.0 / d as f64,
                    page_size: page,
                    layout,
                    requests,
                    padding_rows: padding,
                    bias,
                    pages: if zero {
                        PageMode::AllZero
                    } else {
                        PageMode::Shuffled
                    },
                    spare_pages: spare,
                    poison: true,
                    seed,
                    inputs,
                    rows: relattn_reference::RowLayout::Padded,
                }
            },
        )
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let tensor = 0usize..8;
    let meta_keys = prop::sample::select(vec![
        "format_version",
        "softmax_scale",
        "rel_extent",
        "window_left",
        "causal",
        "cache_layout",
        "row_layout",
        "seed",
        "case_id",
    ]);
    let meta_value = prop_oneof![
        number().prop_map(|n| n.to_string()),
        signed().prop_map(|n| n.to_string()),
        prop::sample::select(vec![
            "",
            "-1",
            "true",
            "false",
            "NaN",
            "inf",
            "1e400",
            "0.0078125",
            "2",
            "nhd_packed",
            "hnd",
            "bogus",
            " 1 ",
            "18446744073709551616",
            "-9223372036854775809",
        ])
        .prop_map(str::to_string),
        "[ -~]{0,12}",
    ];
    let dtype = prop::sample::select(vec![
        "BF16", "F16", "F32", "F64", "I32", "I64", "U8", "BOOL", "F8_E4M3", "XYZ", "",
    ]);
    prop_oneof![
        4 => (tensor.clone(), prop::collection::vec(number(), 0..6), any::<bool>())
            .prop_map(|(tensor, dims, keep)| Mutation::Shape { tensor, dims, keep }),
        2 => (tensor.clone(), dtype).prop_map(|(tensor, dtype)| Mutation::Dtype { tensor, dtype }),
        1 => tensor.clone().prop_map(|tensor| Mutation::Drop { tensor }),
        3 => (meta_keys.clone(), meta_value).prop_map(|(key, value)| Mutation::Meta { key, value }),
        1 => meta_keys.prop_map(|key| Mutation::DropMeta { key }),
        4 => (tensor.clone(), any::<usize>(), prop::sample::select(vec![
                0i32, -1, 1, i32::MAX, i32::MIN, 1 << 30, 4096, 7, 100_000,
            ]))
            .prop_map(|(tensor, at, value)| Mutation::Int { tensor, at, value }),
        1 => (tensor, number(), number())
            .prop_map(|(tensor, start, end)| Mutation::Offsets { tensor, start, end }),
        1 => number().prop_map(Mutation::HeaderLen),
        1 => (0u16..1000).prop_map(Mutation::Truncate),
        1 => (any::<usize>(), any::<u8>()).prop_map(|(at, value)| Mutation::Byte { at, value }),
    ]
}

fn case_input() -> impl Strategy<Value = CaseInput> {
    (
        small_spec(),
        prop_oneof![
            3 => Just(Vec::new()),
            4 => prop::collection::vec(mutation(), 1..2),
            3 => prop::collection::vec(mutation(), 2..5),
        ],
        prop::sample::select(vec![0u8, 0, 1, 2]),
        number(),
    )
        .prop_map(|(spec, mutations, command, sample_rows)| CaseInput {
            spec,
            mutations,
            command,
            sample_rows,
        })
}

/// One tensor of a file taken apart.
struct Tensor {
    name: String,
    dtype: String,
    shape: Vec<serde_json::Value>,
    data: Vec<u8>,
    /// Raw `data_offsets` to write instead of the real ones.
    offsets: Option<[u64; 2]>,
}

/// A safetensors file taken apart: its tensors and metadata.
struct Parts {
    tensors: Vec<Tensor>,
    metadata: serde_json::Map<String, serde_json::Value>,
}

fn take_apart(bytes: &[u8]) -> Parts {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let data = &bytes[8 + n..];
    let mut tensors = Vec::new();
    let mut metadata = serde_json::Map::new();
    for (name, info) in header.as_object().unwrap() {
        if name == "__metadata__" {
            metadata = info.as_object().unwrap().clone();
            continue;
        }
        let off = info["data_offsets"].as_array().unwrap();
        let (a, b) = (
            off[0].as_u64().unwrap() as usize,
            off[1].as_u64().unwrap() as usize,
        );
        tensors.push(Tensor {
            name: name.clone(),
            dtype: info["dtype"].as_str().unwrap().to_string(),
            shape: info["shape"].as_array().unwrap().clone(),
            data: data[a..b].to_vec(),
            offsets: None,
        });
    }
    Parts { tensors, metadata }
}

fn put_together(p: &Parts) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for t in &p.tensors {
        let (a, b) = (data.len() as u64, (data.len() + t.data.len()) as u64);
        let [a, b] = t.offsets.unwrap_or([a, b]);
        header.insert(
            t.name.clone(),
            serde_json::json!({ "dtype": t.dtype, "shape": t.shape, "data_offsets": [a, b] }),
        );
        data.extend_from_slice(&t.data);
    }
    header.insert(
        "__metadata__".into(),
        serde_json::Value::Object(p.metadata.clone()),
    );
    let mut h = serde_json::to_vec(&header).unwrap();
    h.resize(h.len().div_ceil(8) * 8, b' ');
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    out.extend_from_slice(&data);
    out
}

/// The case file of an input: generated, then mutated.
fn case_bytes(input: &CaseInput, dir: &Path) -> Vec<u8> {
    let path = dir.join("base.safetensors");
    match generate(&input.spec) {
        Ok(p) => write_case(&path, &p, &CaseMeta::of(&p)).unwrap(),
        // An invalid spec (e.g. Lq > Lk, a window of -2): start from a tiny valid case.
        Err(_) => {
            let p = generate(&GenSpec::global(2, 1, vec![(1, 3)], 1)).unwrap();
            write_case(&path, &p, &CaseMeta::default()).unwrap()
        }
    }
    let base = std::fs::read(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    let mut parts = take_apart(&base);
    let mut raw: Vec<Mutation> = Vec::new();
    for m in &input.mutations {
        let count = parts.tensors.len().max(1);
        match m {
            Mutation::Shape { tensor, dims, keep } => {
                if let Some(t) = parts.tensors.get_mut(tensor % count) {
                    t.shape = dims.iter().map(|&d| serde_json::json!(d)).collect();
                    if !keep {
                        t.data.clear();
                    }
                }
            }
            Mutation::Dtype { tensor, dtype } => {
                if let Some(t) = parts.tensors.get_mut(tensor % count) {
                    t.dtype = dtype.to_string();
                }
            }
            Mutation::Drop { tensor } => {
                if !parts.tensors.is_empty() {
                    parts.tensors.remove(tensor % count);
                }
            }
            Mutation::Meta { key, value } => {
                parts
                    .metadata
                    .insert(key.to_string(), serde_json::Value::String(value.clone()));
            }
            Mutation::DropMeta { key } => {
                parts.metadata.remove(*key);
            }
            Mutation::Int { tensor, at, value } => {
                if let Some(t) = parts.tensors.get_mut(tensor % count) {
                    if t.data.len() >= 4 {
                        let i = (at % (t.data.len() / 4)) * 4;
                        t.data[i..i + 4].copy_from_slice(&value.to_le_bytes());
                    }
                }
            }
            Mutation::Offsets { tensor, start, end } => {
                if let Some(t) = parts.tensors.get_mut(tensor % count) {
                    t.offsets = Some([*start, *end]);
                }
            }
            other => raw.push(other.clone()),
        }
    }
    let mut bytes = put_together(&parts);
    for m in raw {
        match m {
            Mutation::HeaderLen(n) => bytes[..8].copy_from_slice(&n.to_le_bytes()),
            Mutation::Truncate(per_mille) => {
                let keep = bytes.len() * per_mille as usize / 1000;
                bytes.truncate(keep);
            }
            Mutation::Byte { at, value } if !bytes.is_empty() => {
                let i = at % bytes.len();
                bytes[i] = value;
            }
            _ => {}
        }
    }
    bytes
}

fn run_case(input: &CaseInput) -> (Outcome, Option<String>) {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(
        tmp.path().join("case.safetensors"),
        case_bytes(input, tmp.path()),
    )
    .unwrap();
    let rows = input.sample_rows.to_string();
    let (args, allowed): (Vec<String>, &[i32]) = match input.command {
        0 => (
            with_limit(&[
                "reference",
                "-i",
                "case.safetensors",
                "-o",
                "out.safetensors",
            ]),
            &[0, 2],
        ),
        1 => (
            with_limit(&[
                "reference",
                "-i",
                "case.safetensors",
                "-o",
                "out.safetensors",
                "--sample-rows",
                &rows,
            ]),
            &[0, 2],
        ),
        _ => (
            with_limit(&[
                "exec",
                "--path",
                "fallback",
                "--input",
                "case.safetensors",
                "--output",
                "out.safetensors",
            ]),
            &[0, 1, 2, 3],
        ),
    };
    let out = relattn_in(tmp.path(), &os(&args), None, INPUT_TIMEOUT);
    let mut violation = out.violation(allowed);
    let written = tmp.path().join("out.safetensors");
    if violation.is_none() && out.code == Some(0) && input.command < 2 {
        if let Err(e) = read_output(&written) {
            violation = Some(format!("exit 0 but its output does not read back: {e}"));
        }
    }
    if violation.is_none() && out.code != Some(0) && written.exists() {
        violation = Some(format!("exit {:?} and an output was written", out.code));
    }
    let left = leftovers(tmp.path());
    if violation.is_none() && !left.is_empty() {
        violation = Some(format!("temporary files left: {left:?}"));
    }
    (out, violation)
}

#[test]
fn fuzz_case_files() {
    let figures = Mutex::new(Figures::new("case files"));
    for file in [
        "case/empty_caches_2_40_blocks.safetensors",
        "case/zero_head_dim_in_range_blocks.safetensors",
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let case = corpus(file).display().to_string();
        for args in [
            with_limit(&["reference", "-i", &case, "-o", "o.safetensors"]),
            with_limit(&[
                "exec",
                "--path",
                "score_mod",
                "--input",
                &case,
                "--output",
                "o.safetensors",
            ]),
        ] {
            let out = relattn_in(tmp.path(), &os(&args), None, INPUT_TIMEOUT);
            out.check(&[2]);
            assert!(out.elapsed < Duration::from_secs(1), "{:?}", out.elapsed);
            figures.lock().unwrap().record(&out, true);
        }
    }
    fuzz(&figures, 1, case_input(), run_case);
}
