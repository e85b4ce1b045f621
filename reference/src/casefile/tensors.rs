//! Tensor encoding and checked decoding shared by case and output files.

use super::{CaseFileError, FORMAT_VERSION};
use crate::dtype::DType;
use crate::limits::check_bytes;
use half::{bf16, f16};
use rayon::prelude::*;
use relattn_common::files::write_atomic;
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors, View};
use std::borrow::Cow;
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// A tensor to serialize: its bytes, or rows of floats encoded only as the file is written
/// (the KV caches of a large case: never a second copy of them in memory).
pub(super) struct Owned<'a> {
    dtype: Dtype,
    shape: Vec<usize>,
    data: Data<'a>,
}

enum Data<'a> {
    Bytes(Vec<u8>),
    /// `rows` rows of `row(i)`'s floats, encoded as `dtype`; `len` bytes in all.
    Rows {
        rows: usize,
        row: Box<dyn Fn(usize) -> &'a [f32] + Sync + 'a>,
        dtype: DType,
        len: usize,
    },
}

impl<'a> Owned<'a> {
    /// A float tensor of `rows` rows, row `i` being `row(i)` (each of `shape`'s last extent),
    /// stored as `dtype` and encoded while it is written.
    pub(super) fn float_rows(
        rows: usize,
        row: impl Fn(usize) -> &'a [f32] + Sync + 'a,
        dtype: DType,
        shape: Vec<usize>,
    ) -> Owned<'a> {
        let len = shape.iter().product::<usize>() * dtype.size_bytes();
        Owned {
            dtype: storage_dtype(dtype),
            shape,
            data: Data::Rows {
                rows,
                row: Box::new(row),
                dtype,
                len,
            },
        }
    }

    fn len(&self) -> usize {
        match &self.data {
            Data::Bytes(b) => b.len(),
            Data::Rows { len, .. } => *len,
        }
    }

    /// Write the tensor's bytes, encoding rows in parallel a few megabytes at a time.
    fn write_to(&self, w: &mut dyn Write) -> std::io::Result<()> {
        let (rows, row, dtype) = match &self.data {
            Data::Bytes(b) => return w.write_all(b),
            Data::Rows {
                rows, row, dtype, ..
            } => (*rows, row, *dtype),
        };
        let row_bytes = self.len().checked_div(rows).unwrap_or(0);
        let per_chunk = (CHUNK_BYTES / row_bytes.max(1)).max(1);
        let starts: Vec<usize> = (0..rows).step_by(per_chunk).collect();
        let mut written = 0;
        // At most BATCH_BYTES encoded before they are written, whatever the core count.
        let per_batch = (rayon::current_num_threads() * 2).clamp(1, BATCH_BYTES / CHUNK_BYTES);
        for batch in starts.chunks(per_batch) {
            let encoded: Vec<Vec<u8>> = batch
                .par_iter()
                .map(|&start| {
                    let mut out = Vec::with_capacity(per_chunk * row_bytes);
                    for i in start..(start + per_chunk).min(rows) {
                        encode(row(i).iter().copied(), dtype, &mut out);
                    }
                    out
                })
                .collect();
            for chunk in encoded {
                written += chunk.len();
                w.write_all(&chunk)?;
            }
        }
        if written != self.len() {
            return Err(std::io::Error::other(format!(
                "{written} bytes of rows where the header says {}",
                self.len()
            )));
        }
        Ok(())
    }
}

/// Bytes of rows encoded at once by one thread.
const CHUNK_BYTES: usize = 4 << 20;
/// Most bytes encoded and held before they are written.
const BATCH_BYTES: usize = 64 << 20;

fn encode(values: impl Iterator<Item = f32>, dtype: DType, out: &mut Vec<u8>) {
    match dtype {
        DType::Bf16 => values.for_each(|x| out.extend(bf16::from_f32(x).to_le_bytes())),
        DType::F16 => values.for_each(|x| out.extend(f16::from_f32(x).to_le_bytes())),
        DType::F32 => values.for_each(|x| out.extend(x.to_le_bytes())),
    }
}

/// A tensor as the header sees it: its dtype, shape and length, no data (the data follow the
/// header, written by `Owned::write_to`).
struct HeaderOnly<'t, 'a>(&'t Owned<'a>);

impl View for HeaderOnly<'_, '_> {
    fn dtype(&self) -> Dtype {
        self.0.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.0.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&[])
    }
    fn data_len(&self) -> usize {
        self.0.len()
    }
}

pub(super) fn storage_dtype(dtype: DType) -> Dtype {
    match dtype {
        DType::Bf16 => Dtype::BF16,
        DType::F16 => Dtype::F16,
        DType::F32 => Dtype::F32,
    }
}

fn case_dtype(dtype: Dtype) -> Option<DType> {
    match dtype {
        Dtype::BF16 => Some(DType::Bf16),
        Dtype::F16 => Some(DType::F16),
        Dtype::F32 => Some(DType::F32),
        _ => None,
    }
}

/// Values (exactly representable in `dtype`) stored as `dtype`.
pub(super) fn float_tensor<'a>(
    values: impl Iterator<Item = f32>,
    dtype: DType,
    shape: Vec<usize>,
) -> Owned<'a> {
    let mut data = Vec::with_capacity(shape.iter().product::<usize>() * dtype.size_bytes());
    encode(values, dtype, &mut data);
    Owned {
        dtype: storage_dtype(dtype),
        shape,
        data: Data::Bytes(data),
    }
}

pub(super) fn f64_tensor<'a>(values: impl Iterator<Item = f64>, shape: Vec<usize>) -> Owned<'a> {
    let data = values.flat_map(f64::to_le_bytes).collect();
    Owned {
        dtype: Dtype::F64,
        shape,
        data: Data::Bytes(data),
    }
}

pub(super) fn i32_tensor<'a>(values: impl Iterator<Item = i32>, shape: Vec<usize>) -> Owned<'a> {
    let data = values.flat_map(i32::to_le_bytes).collect();
    Owned {
        dtype: Dtype::I32,
        shape,
        data: Data::Bytes(data),
    }
}

/// Write tensors and string metadata to `path`, atomically (`files::write_atomic`): the header
/// safetensors makes for them, then each tensor's bytes in the order of its offsets, encoded as
/// they are written.
pub(super) fn write_file(
    path: &Path,
    tensors: Vec<(&'static str, Owned<'_>)>,
    metadata: HashMap<String, String>,
) -> Result<(), CaseFileError> {
    let serialize = |error| CaseFileError::Serialize {
        path: path.to_path_buf(),
        error,
    };
    let header = safetensors::serialize(
        tensors.iter().map(|(name, t)| (*name, HeaderOnly(t))),
        Some(metadata),
    )
    .map_err(serialize)?;
    // Where the header puts each tensor's data (its JSON after the 8-byte length).
    let json: serde_json::Value = header
        .get(8..)
        .and_then(|h| serde_json::from_slice(h).ok())
        .unwrap_or_default();
    let mut order = Vec::with_capacity(tensors.len());
    for (name, t) in &tensors {
        let Some(at) = json[*name]["data_offsets"][0].as_u64() else {
            return Err(CaseFileError::Io {
                path: path.to_path_buf(),
                action: "cannot write",
                error: std::io::Error::other(format!(
                    "no offset for tensor `{name}` in the header"
                )),
            });
        };
        order.push((at, t));
    }
    order.sort_by_key(|(at, _)| *at);
    write_atomic(path, |w| {
        let mut w = std::io::BufWriter::with_capacity(1 << 20, w);
        w.write_all(&header)?;
        for (_, t) in order {
            t.write_to(&mut w)?;
        }
        w.flush()
    })
    .map_err(|error| CaseFileError::Io {
        path: path.to_path_buf(),
        action: "cannot write",
        error,
    })
}

/// Whether a file's path may be a symbolic link: the user's own files may, files another
/// process wrote (a worker's output) may not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Links {
    Follow,
    Refuse,
}

/// The whole file, refused before reading when it is not a regular file (a FIFO, a device, a
/// directory) or larger than `limit` bytes, and read no further than `limit` bytes.
pub(super) fn read_bytes(path: &Path, limit: u64, links: Links) -> Result<Vec<u8>, CaseFileError> {
    let io = |error| CaseFileError::Io {
        path: path.to_path_buf(),
        action: "cannot read",
        error,
    };
    let (file, len) = match links {
        Links::Follow => relattn_common::files::open_regular(path),
        Links::Refuse => relattn_common::files::open_regular_nofollow(path),
    }
    .map_err(io)?;
    check_bytes("the file", len, limit).map_err(|error| CaseFileError::Limit {
        path: path.to_path_buf(),
        error,
    })?;
    relattn_common::files::read_limited(file, limit).map_err(io)
}

/// A parsed file with checked accessors; every error names the file.
pub(super) struct Reader<'a> {
    path: PathBuf,
    tensors: SafeTensors<'a>,
    metadata: HashMap<String, String>,
}

impl<'a> Reader<'a> {
    pub(super) fn new(path: &Path, bytes: &'a [u8]) -> Result<Reader<'a>, CaseFileError> {
        let path = path.to_path_buf();
        check_offsets(&path, bytes)?;
        let format = |error| CaseFileError::Format {
            path: path.clone(),
            error,
        };
        let (_, header) = SafeTensors::read_metadata(bytes).map_err(format)?;
        let tensors = SafeTensors::deserialize(bytes).map_err(format)?;
        let metadata = header.metadata().clone().unwrap_or_default();
        let reader = Reader {
            path,
            tensors,
            metadata,
        };
        reader.check_version()?;
        Ok(reader)
    }

    pub(super) fn path(&self) -> PathBuf {
        self.path.clone()
    }

    /// Files written by other tools may omit `format_version`: they are read as version 1.
    fn check_version(&self) -> Result<(), CaseFileError> {
        match self.metadata.get("format_version") {
            None => Ok(()),
            Some(v) if v.trim() == FORMAT_VERSION => Ok(()),
            Some(v) => Err(CaseFileError::Version {
                path: self.path(),
                version: v.clone(),
            }),
        }
    }

    pub(super) fn meta(&self, key: &str) -> Option<&str> {
        self.metadata.get(key).map(String::as_str)
    }

    pub(super) fn required_meta(&self, key: &'static str) -> Result<&str, CaseFileError> {
        self.meta(key)
            .ok_or_else(|| CaseFileError::MissingMetadata {
                path: self.path(),
                key,
            })
    }

    /// Parse the value `value` of metadata `key`; `expected` says what a valid value looks like.
    pub(super) fn parse_meta<T: std::str::FromStr>(
        &self,
        key: &'static str,
        value: &str,
        expected: &'static str,
    ) -> Result<T, CaseFileError> {
        value
            .trim()
            .parse()
            .map_err(|_| CaseFileError::BadMetadata {
                path: self.path(),
                key,
                value: value.to_string(),
                expected,
            })
    }

    pub(super) fn has(&self, name: &str) -> bool {
        self.tensors.names().contains(&name)
    }

    /// Tensor `name` with rank `dims.len()`; `dims` names the axes for messages.
    pub(super) fn tensor(
        &self,
        name: &'static str,
        rank: usize,
        dims: &'static str,
    ) -> Result<TensorView<'a>, CaseFileError> {
        let view = self
            .tensors
            .tensor(name)
            .map_err(|_| CaseFileError::MissingTensor {
                path: self.path(),
                tensor: name,
            })?;
        if view.shape().len() != rank {
            return Err(CaseFileError::Rank {
                path: self.path(),
                tensor: name,
                actual: view.shape().to_vec(),
                rank,
                dims,
            });
        }
        // Zero-sized tensors carry arbitrary dimensions without data; keep every later size
        // computation (views, strides, array shapes) free of overflow.
        let fits = view
            .shape()
            .iter()
            .try_fold(16usize, |acc, &d| acc.checked_mul(d.max(1)))
            .is_some_and(|n| n <= isize::MAX as usize);
        if !fits {
            return Err(CaseFileError::Shape {
                path: self.path(),
                tensor: name,
                actual: view.shape().to_vec(),
                expected: "dimensions whose product fits in memory".into(),
            });
        }
        Ok(view)
    }

    fn dtype_error(
        &self,
        name: &'static str,
        view: &TensorView,
        expected: String,
    ) -> CaseFileError {
        CaseFileError::Dtype {
            path: self.path(),
            tensor: name,
            actual: view.dtype().to_string(),
            expected,
        }
    }

    /// The case dtype of a floating tensor of the case (BF16, F16 or F32).
    pub(super) fn case_dtype(
        &self,
        name: &'static str,
        view: &TensorView,
    ) -> Result<DType, CaseFileError> {
        case_dtype(view.dtype())
            .ok_or_else(|| self.dtype_error(name, view, "BF16, F16 or F32".into()))
    }

    /// Values of a BF16/F16/F32 tensor that must have dtype `dtype`.
    pub(super) fn floats(
        &self,
        name: &'static str,
        view: &TensorView,
        dtype: DType,
        like: &str,
    ) -> Result<Vec<f32>, CaseFileError> {
        let data = self.float_bytes(name, view, dtype, like)?;
        let mut out = vec![0f32; data.len() / dtype.size_bytes()];
        decode_floats(dtype, data, &mut out);
        Ok(out)
    }

    /// The stored bytes of a BF16/F16/F32 tensor that must have dtype `dtype` (for
    /// `decode_floats`, a piece at a time).
    pub(super) fn float_bytes<'v>(
        &self,
        name: &'static str,
        view: &'v TensorView,
        dtype: DType,
        like: &str,
    ) -> Result<&'v [u8], CaseFileError> {
        if view.dtype() != storage_dtype(dtype) {
            let expected = format!("{} like {like}", storage_dtype(dtype));
            return Err(self.dtype_error(name, view, expected));
        }
        Ok(view.data())
    }

    pub(super) fn f64s(
        &self,
        name: &'static str,
        view: &TensorView,
    ) -> Result<Vec<f64>, CaseFileError> {
        if view.dtype() != Dtype::F64 {
            return Err(self.dtype_error(name, view, "F64".into()));
        }
        Ok(view
            .data()
            .chunks_exact(8)
            .map(|b| f64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
            .collect())
    }

    pub(super) fn i32s(
        &self,
        name: &'static str,
        view: &TensorView,
    ) -> Result<Vec<i32>, CaseFileError> {
        if view.dtype() != Dtype::I32 {
            return Err(self.dtype_error(name, view, "I32".into()));
        }
        Ok(view
            .data()
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect())
    }
}

/// Reject headers whose data offsets point past the end of the file before the safetensors
/// crate sees them: it adds them to the header length unchecked, which overflows (a panic in
/// checked builds) for offsets near `usize::MAX`. Anything this cannot parse is left to the
/// crate, which reports it as an error.
fn check_offsets(path: &Path, bytes: &[u8]) -> Result<(), CaseFileError> {
    let Some(len) = bytes.get(..8) else {
        return Ok(());
    };
    let n = u64::from_le_bytes(len.try_into().unwrap_or([0; 8]));
    let Some(header) = usize::try_from(n)
        .ok()
        .and_then(|n| bytes.get(8..n.checked_add(8)?))
    else {
        return Ok(());
    };
    let Ok(serde_json::Value::Object(entries)) = serde_json::from_slice(header) else {
        return Ok(());
    };
    for (name, info) in &entries {
        let Some(offsets) = info.get("data_offsets").and_then(|o| o.as_array()) else {
            continue;
        };
        for o in offsets {
            if o.as_u64().is_some_and(|o| o > bytes.len() as u64) {
                return Err(CaseFileError::Header {
                    path: path.to_path_buf(),
                    reason: format!(
                        "tensor `{name}` has data offset {o} past the end of the {}-byte file \
                         (truncated or corrupt)",
                        bytes.len()
                    ),
                });
            }
        }
    }
    Ok(())
}

/// Decode little-endian stored values of `dtype` from `bytes` into `out` (as many as `out`
/// holds).
pub(super) fn decode_floats(dtype: DType, bytes: &[u8], out: &mut [f32]) {
    match dtype {
        DType::Bf16 => out
            .iter_mut()
            .zip(bytes.chunks_exact(2))
            .for_each(|(o, b)| *o = bf16::from_le_bytes([b[0], b[1]]).to_f32()),
        DType::F16 => out
            .iter_mut()
            .zip(bytes.chunks_exact(2))
            .for_each(|(o, b)| *o = f16::from_le_bytes([b[0], b[1]]).to_f32()),
        DType::F32 => out
            .iter_mut()
            .zip(bytes.chunks_exact(4))
            .for_each(|(o, b)| *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows encoded as they are written give the bytes of the same values encoded at once,
    /// over several chunks and batches of chunks.
    #[test]
    fn rows_written_in_chunks_are_the_values_encoded_at_once() {
        let width = 24;
        let rows = 3 * CHUNK_BYTES / (width * 2) + 7;
        let values: Vec<f32> = (0..rows * width).map(|i| (i % 977) as f32 * 0.25).collect();
        for dtype in [DType::Bf16, DType::F16, DType::F32] {
            let at_once = float_tensor(values.iter().copied(), dtype, vec![rows, width]);
            let streamed = Owned::float_rows(
                rows,
                |i| &values[i * width..(i + 1) * width],
                dtype,
                vec![rows, width],
            );
            let (mut a, mut b) = (Vec::new(), Vec::new());
            at_once.write_to(&mut a).unwrap();
            streamed.write_to(&mut b).unwrap();
            assert_eq!(streamed.len(), a.len());
            assert!(a == b, "{dtype:?}");
        }
    }
}
