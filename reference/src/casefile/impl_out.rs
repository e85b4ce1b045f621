//! Output files of an implementation under test (`relattn exec`, worker protocol): one tensor
//! `out` `[T, H, D]`, F32 or the case's dtype (BF16, F16), padding rows included.

use super::tensors::{float_tensor, read_bytes, write_file, Links, Reader};
use super::CaseFileError;
use crate::dtype::DType;
use ndarray::Array3;
use std::collections::HashMap;
use std::path::Path;

/// Write `out` as F32.
pub fn write_impl_output(path: impl AsRef<Path>, out: &Array3<f32>) -> Result<(), CaseFileError> {
    let tensor = float_tensor(out.iter().copied(), DType::F32, out.shape().to_vec());
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    write_file(path.as_ref(), vec![("out", tensor)], metadata)
}

/// Read `out`, which must have shape `expected` (`[T, H, D]` of the case). The file's size is
/// checked against the shape before it is read, so a wrong or huge file costs no memory; it
/// must be a regular file (symbolic links resolved).
pub fn read_impl_output(
    path: impl AsRef<Path>,
    expected: [usize; 3],
) -> Result<Array3<f32>, CaseFileError> {
    read_output_file(path.as_ref(), expected, Links::Follow)
}

/// [`read_impl_output`] of a file another process wrote (a worker's `out`): a symbolic link
/// there is refused, never followed.
pub fn read_worker_output(
    path: impl AsRef<Path>,
    expected: [usize; 3],
) -> Result<Array3<f32>, CaseFileError> {
    read_output_file(path.as_ref(), expected, Links::Refuse)
}

fn read_output_file(
    path: &Path,
    expected: [usize; 3],
    links: Links,
) -> Result<Array3<f32>, CaseFileError> {
    // 4 bytes per element at most, plus a header far below 1 MiB.
    let elements = expected.iter().product::<usize>();
    let limit = elements.saturating_mul(4).saturating_add(1 << 20) as u64;
    let bytes = read_bytes(path, limit, links).map_err(|e| match e {
        CaseFileError::Limit { path, .. } => CaseFileError::OutputTooLarge {
            bytes: std::fs::metadata(&path).map_or(0, |m| m.len()),
            path,
            shape: expected,
            most: limit,
        },
        other => other,
    })?;
    let r = Reader::new(path, &bytes)?;
    let view = r.tensor("out", 3, "[T, H, D]")?;
    if view.shape() != expected {
        return Err(CaseFileError::Shape {
            path: r.path(),
            tensor: "out",
            actual: view.shape().to_vec(),
            expected: format!("{expected:?} (the case's [T, H, D])"),
        });
    }
    let dtype = r.case_dtype("out", &view)?;
    let values = r.floats("out", &view, dtype, "F32, BF16 or F16")?;
    Array3::from_shape_vec(expected, values).map_err(|e| CaseFileError::Mismatch {
        path: r.path(),
        what: e.to_string(),
    })
}
