//! Reference-output files: `write_output` and `read_output`.

use super::tensors::{f64_tensor, float_tensor, i32_tensor, read_bytes, write_file, Links, Reader};
use super::{CaseFileError, EmulatedOutput, OutputFile, FORMAT_VERSION};
use crate::dtype::DType;
use crate::limits::{check_bytes, max_case_bytes, Dim};
use crate::output::RefOutput;
use ndarray::{Array2, Array3};
use std::collections::HashMap;
use std::path::Path;

/// Write the f64 reference (`out`, `lse`, and `rows` in sampled mode) and, when given, the
/// same-precision emulation's output (`out_lp`, stored as `dtype`). Both must cover the same
/// rows.
pub fn write_output(
    path: impl AsRef<Path>,
    reference: &RefOutput,
    emulation: Option<&RefOutput>,
    dtype: DType,
) -> Result<(), CaseFileError> {
    let path = path.as_ref();
    let mismatch = |what: String| CaseFileError::Mismatch {
        path: path.to_path_buf(),
        what,
    };
    let shape = reference.out.shape().to_vec();
    if let Some(emulation) = emulation {
        if reference.rows != emulation.rows {
            return Err(mismatch(
                "the reference and the emulation cover different rows".into(),
            ));
        }
        if emulation.out.shape() != shape.as_slice() {
            return Err(mismatch(format!(
                "emulation output shape {:?} differs from the reference's {shape:?}",
                emulation.out.shape()
            )));
        }
    }
    if reference.lse.shape() != &shape[..2] {
        return Err(mismatch(format!(
            "lse shape {:?} does not match out shape {shape:?}",
            reference.lse.shape()
        )));
    }
    let mut tensors = vec![
        (
            "out",
            f64_tensor(reference.out.iter().copied(), shape.clone()),
        ),
        (
            "lse",
            f64_tensor(reference.lse.iter().copied(), shape[..2].to_vec()),
        ),
    ];
    if let Some(emulation) = emulation {
        // The emulation's values are already values of `dtype`; the f32 step is exact.
        tensors.push((
            "out_lp",
            float_tensor(
                emulation.out.iter().map(|&x| x as f32),
                dtype,
                shape.clone(),
            ),
        ));
    }
    if let Some(rows) = &reference.rows {
        if rows.len() != shape[0] {
            return Err(mismatch(format!(
                "{} rows listed for {} output rows",
                rows.len(),
                shape[0]
            )));
        }
        let rows: Vec<i32> = rows
            .iter()
            .map(|&r| i32::try_from(r).map_err(|_| mismatch(format!("row {r} exceeds I32"))))
            .collect::<Result<_, _>>()?;
        tensors.push(("rows", i32_tensor(rows.into_iter(), vec![shape[0]])));
    }
    let metadata = HashMap::from([("format_version".to_string(), FORMAT_VERSION.to_string())]);
    write_file(path, tensors, metadata)
}

/// Read an output file written by `write_output` (or any tool writing the same tensors; `out_lp`
/// may be absent), under
/// the case-byte limit in force (`limits::max_case_bytes`): the file's size and the bytes of
/// its tensors in memory (as f64) must both be at most the limit.
pub fn read_output(path: impl AsRef<Path>) -> Result<OutputFile, CaseFileError> {
    let path = path.as_ref();
    let limit = max_case_bytes();
    let bytes = read_bytes(path, limit, Links::Follow)?;
    let r = Reader::new(path, &bytes)?;
    let out = r.tensor("out", 3, "[N, H, D]")?;
    let lse = r.tensor("lse", 2, "[N, H]")?;
    let out_lp = if r.has("out_lp") {
        Some(r.tensor("out_lp", 3, "[N, H, D]")?)
    } else {
        None
    };
    let limit_error = |error| CaseFileError::Limit {
        path: r.path(),
        error,
    };
    let s = out.shape();
    for (k, (dim, name)) in [(Dim::Rows, "N"), (Dim::Heads, "H"), (Dim::HeadDim, "D")]
        .into_iter()
        .enumerate()
    {
        dim.check(format!("tensor `out` dim {k} ({name})"), s[k] as u128)
            .map_err(limit_error)?;
    }
    // out and out_lp as f64, lse: every factor is in range, so this cannot overflow.
    let cells = (s[0] * s[1]) as u64;
    check_bytes(
        "the output in memory",
        cells * (2 * s[2] as u64 + 1) * 8,
        limit,
    )
    .map_err(limit_error)?;
    // Dtypes first: a wrong dtype usually explains a wrong shape too.
    let out_values = r.f64s("out", &out)?;
    let lse_values = r.f64s("lse", &lse)?;
    let dtype = out_lp
        .as_ref()
        .map(|view| r.case_dtype("out_lp", view))
        .transpose()?;
    let shape = out.shape().to_vec();
    let (n, h, d) = (shape[0], shape[1], shape[2]);
    let check_shape = |tensor, actual: &[usize], expected: &[usize]| {
        if actual == expected {
            Ok(())
        } else {
            Err(CaseFileError::Shape {
                path: r.path(),
                tensor,
                actual: actual.to_vec(),
                expected: format!("{expected:?} (from `out`)"),
            })
        }
    };
    check_shape("lse", lse.shape(), &[n, h])?;
    if let Some(view) = &out_lp {
        check_shape("out_lp", view.shape(), &shape)?;
    }
    let rows = if r.has("rows") {
        let view = r.tensor("rows", 1, "[N]")?;
        check_shape("rows", view.shape(), &[n])?;
        let rows = r.i32s("rows", &view)?;
        let mut out = Vec::with_capacity(rows.len());
        for (index, &row) in rows.iter().enumerate() {
            let row = usize::try_from(row).map_err(|_| CaseFileError::Value {
                path: r.path(),
                tensor: "rows",
                index,
                value: row.into(),
                expected: "a row index >= 0",
            })?;
            out.push(row);
        }
        Some(out)
    } else {
        None
    };
    let shape_error = |tensor| CaseFileError::Shape {
        path: r.path(),
        tensor,
        actual: shape.clone(),
        expected: "a shape matching its data".into(),
    };
    let reference = RefOutput {
        rows,
        out: Array3::from_shape_vec((n, h, d), out_values).map_err(|_| shape_error("out"))?,
        lse: Array2::from_shape_vec((n, h), lse_values).map_err(|_| shape_error("lse"))?,
    };
    let out_lp = match (out_lp, dtype) {
        (Some(view), Some(dtype)) => {
            let lp: Vec<f64> = r
                .floats("out_lp", &view, dtype, "itself")?
                .into_iter()
                .map(f64::from)
                .collect();
            let out = Array3::from_shape_vec((n, h, d), lp).map_err(|_| shape_error("out_lp"))?;
            Some(EmulatedOutput { out, dtype })
        }
        _ => None,
    };
    Ok(OutputFile { reference, out_lp })
}
