//! Malformed case files: each ends in a `CaseFileError` naming the file and what is wrong.

use super::*;

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
        ("row_layout", "sideways"),
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
