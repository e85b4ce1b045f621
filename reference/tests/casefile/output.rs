//! Output files: round trips and malformed files.

use super::*;

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
            write_output(&path, &reference, Some(&emulation), dtype).unwrap();
            let back = read_output(&path).unwrap();
            let lp = back.out_lp.unwrap();
            assert_eq!(lp.dtype, dtype);
            assert_eq!(back.reference, reference);
            assert_eq!(lp.out, emulation.out);
            // Without the emulation (`relattn reference --no-emulation`).
            write_output(&path, &reference, None, dtype).unwrap();
            let back = read_output(&path).unwrap();
            assert_eq!(back.reference, reference);
            assert_eq!(back.out_lp, None);
        }
    }
}

#[test]
fn output_rows_must_agree() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.safetensors");
    let (reference, _) = outputs(Some(vec![0, 1, 2]), DType::Bf16);
    let (_, emulation) = outputs(Some(vec![0, 1, 3]), DType::Bf16);
    let err = write_output(&path, &reference, Some(&emulation), DType::Bf16).unwrap_err();
    assert!(matches!(err, CaseFileError::Mismatch { .. }), "{err:?}");
    assert!(!path.exists());
}

#[test]
fn malformed_output_files() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("case.safetensors");
    let (reference, emulation) = outputs(Some(vec![1, 4, 6]), DType::F16);
    let fresh = || write_output(&path, &reference, Some(&emulation), DType::F16).unwrap();

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
