//! A problem's tensors on the device, uploaded once in the case dtype and reused by every path,
//! split count and trial; plus the poison patterns `out` is reset to before each launch.

#![deny(unsafe_code)]

use super::device::Gpu;
use super::error::{driver, GpuError};
use super::geometry::Geometry;
use cudarc::driver::CudaSlice;
use half::{bf16, f16};
use ndarray::Array3;
use rayon::prelude::*;
use relattn_reference::{DType, Problem, RowLayout};

/// What unwritten real rows of `out` hold: a NaN payload no arithmetic produces (GPUs produce the
/// canonical NaN), so "never written" and "computed NaN" stay distinguishable.
pub fn unwritten_bits(dtype: DType) -> u32 {
    match dtype {
        DType::Bf16 => 0x7FA1,
        DType::F16 => 0x7DA1,
        DType::F32 => 0x7FA1_A1A1,
    }
}

/// What padding rows of `out` hold before a launch; they must read back bit-identical.
pub fn padding_bits(dtype: DType) -> u32 {
    match dtype {
        DType::Bf16 => 0xFFA5,
        DType::F16 => 0xFDA5,
        DType::F32 => 0xFFA5_A5A5,
    }
}

/// Little-endian bytes of `values` in `dtype` (values are exactly representable, so this is
/// exact), encoded in parallel chunks (a long-context cache holds billions of values).
pub fn encode(dtype: DType, values: &[f32]) -> Vec<u8> {
    const CHUNK: usize = 1 << 16;
    let width = dtype.size_bytes();
    let mut out = vec![0u8; values.len() * width];
    out.par_chunks_mut(CHUNK * width)
        .zip(values.par_chunks(CHUNK))
        .for_each(|(bytes, xs)| {
            for (b, &x) in bytes.chunks_exact_mut(width).zip(xs) {
                match dtype {
                    DType::Bf16 => b.copy_from_slice(&bf16::from_f32(x).to_bits().to_le_bytes()),
                    DType::F16 => b.copy_from_slice(&f16::from_f32(x).to_bits().to_le_bytes()),
                    DType::F32 => b.copy_from_slice(&x.to_bits().to_le_bytes()),
                }
            }
        });
    out
}

/// The bit pattern of element `i` of a little-endian `dtype` buffer.
pub fn bits_at(dtype: DType, bytes: &[u8], i: usize) -> u32 {
    match dtype.size_bytes() {
        2 => u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]) as u32,
        _ => u32::from_le_bytes([
            bytes[4 * i],
            bytes[4 * i + 1],
            bytes[4 * i + 2],
            bytes[4 * i + 3],
        ]),
    }
}

/// How many of the first `elements` elements of a little-endian `dtype` buffer of `[rows,
/// heads, dim]` still hold `poison`, and the first of them (row, head, column): one parallel
/// pass.
pub fn poisoned(
    dtype: DType,
    bytes: &[u8],
    elements: usize,
    (heads, dim): (usize, usize),
    poison: u32,
) -> (usize, Option<(usize, usize, usize)>) {
    let (count, first) = (0..elements)
        .into_par_iter()
        .filter(|&i| bits_at(dtype, bytes, i) == poison)
        .map(|i| (1usize, i))
        .reduce(|| (0, usize::MAX), |a, b| (a.0 + b.0, a.1.min(b.1)));
    let first = (count > 0).then(|| (first / (dim * heads), (first / dim) % heads, first % dim));
    (count, first)
}

/// The value of a bit pattern of `dtype`.
pub fn decode_bits(dtype: DType, bits: u32) -> f32 {
    match dtype {
        DType::Bf16 => bf16::from_bits(bits as u16).to_f32(),
        DType::F16 => f16::from_bits(bits as u16).to_f32(),
        DType::F32 => f32::from_bits(bits),
    }
}

/// The image `out` is reset to before each launch: real rows `unwritten_bits`, padding rows
/// `padding_bits`.
pub fn out_poison(g: &Geometry) -> Vec<u8> {
    let per_row = g.num_heads * g.head_dim;
    let (real, pad) = (unwritten_bits(g.dtype), padding_bits(g.dtype));
    let width = g.dtype.size_bytes();
    let mut out = Vec::with_capacity(g.total_rows * per_row * width);
    for row in 0..g.total_rows {
        let bits = if row < g.real_rows { real } else { pad };
        for _ in 0..per_row {
            out.extend_from_slice(&bits.to_le_bytes()[..width]);
        }
    }
    out
}

/// A problem uploaded to one GPU.
#[derive(Debug)]
pub struct DeviceProblem {
    pub(crate) geometry: Geometry,
    pub(crate) q: CudaSlice<u8>,
    pub(crate) kv: CudaSlice<u8>,
    pub(crate) rel: CudaSlice<u8>,
    pub(crate) block_table: CudaSlice<i32>,
    pub(crate) seqused_k: CudaSlice<i32>,
    pub(crate) cu_seqlens_q: CudaSlice<i32>,
    /// `[T, H, D]` as `out` is reset to before each launch; the first `allocated_rows` rows of
    /// it are uploaded.
    pub(crate) out_poison: Vec<u8>,
    /// Rows of q, rel_logits and out on the device: `T`, or the real rows alone for the exact
    /// row layout (`RowLayout::Exact`), whose padding rows exist only on the host.
    pub(crate) allocated_rows: usize,
    pub(crate) device: usize,
}

impl DeviceProblem {
    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    /// Decode `out` bytes read back into `[T, H, D]` f32.
    pub(crate) fn decode_out(&self, bytes: &[u8]) -> Array3<f32> {
        let g = &self.geometry;
        let n = g.total_rows * g.num_heads * g.head_dim;
        let values: Vec<f32> = (0..n)
            .into_par_iter()
            .map(|i| decode_bits(g.dtype, bits_at(g.dtype, bytes, i)))
            .collect();
        Array3::from_shape_vec((g.total_rows, g.num_heads, g.head_dim), values)
            .unwrap_or_else(|_| Array3::zeros((g.total_rows, g.num_heads, g.head_dim)))
    }
}

/// The values of the first `rows` rows of an array in logical order, borrowed when it is in
/// standard layout (a leading-row slice of one is too).
fn rows_slice(a: &Array3<f32>, rows: usize) -> std::borrow::Cow<'_, [f32]> {
    let rows = ndarray::s![..rows, .., ..];
    match a.slice(rows).to_slice() {
        Some(s) => std::borrow::Cow::Borrowed(s),
        None => std::borrow::Cow::Owned(a.slice(rows).iter().copied().collect()),
    }
}

/// Device allocations of zero length are refused by some drivers: keep every buffer non-empty
/// (the kernels never index past the logical sizes passed in `Params`).
fn upload<T: cudarc::driver::DeviceRepr + Copy + Default>(
    gpu: &Gpu,
    what: &str,
    mut host: Vec<T>,
) -> Result<CudaSlice<T>, GpuError> {
    if host.is_empty() {
        host.push(T::default());
    }
    gpu.stream
        .clone_htod(&host)
        .map_err(driver(format!("uploading {what}")))
}

impl Gpu {
    /// Upload a problem's tensors in its dtype (K and V as the one cache buffer with its views).
    /// With the exact row layout, q and rel_logits hold the real rows alone, each in its own
    /// allocation (as every tensor here is), so a read of a row past them is outside every
    /// allocation.
    pub fn upload(&self, p: &Problem) -> Result<DeviceProblem, GpuError> {
        let geometry = Geometry::of(p);
        let dt = p.dtype;
        let allocated_rows = match p.rows {
            RowLayout::Exact => geometry.real_rows,
            RowLayout::Padded | RowLayout::Strided => geometry.total_rows,
        };
        let q = upload(self, "q", encode(dt, &rows_slice(&p.q, allocated_rows)))?;
        let kv = upload(self, "the KV cache", encode(dt, &p.kv))?;
        let rel = upload(
            self,
            "rel_logits",
            encode(dt, &rows_slice(&p.rel_logits, allocated_rows)),
        )?;
        let out_poison = out_poison(&geometry);
        let block_table = upload(self, "block_table", p.block_table.iter().copied().collect())?;
        let seqused_k = upload(self, "seqused_k", p.seqused_k.clone())?;
        let cu_seqlens_q = upload(self, "cu_seqlens_q", p.cu_seqlens_q.clone())?;
        Ok(DeviceProblem {
            geometry,
            q,
            kv,
            rel,
            block_table,
            seqused_k,
            cu_seqlens_q,
            out_poison,
            allocated_rows,
            device: self.index(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poisoned_elements_are_counted_and_the_first_located_in_one_pass() {
        let (heads, dim) = (3, 4);
        let poison = unwritten_bits(DType::Bf16);
        let values = vec![1.5f32; 5 * heads * dim];
        let mut bytes = encode(DType::Bf16, &values);
        let (n, first) = poisoned(DType::Bf16, &bytes, values.len(), (heads, dim), poison);
        assert_eq!((n, first), (0, None));
        // Elements (row 1, head 2, column 3) and (row 4, head 0, column 1), and one past the
        // elements asked about.
        for i in [
            dim * heads + 2 * dim + 3,
            4 * dim * heads + 1,
            values.len() - 1,
        ] {
            bytes[2 * i..2 * i + 2].copy_from_slice(&(poison as u16).to_le_bytes());
        }
        let asked = values.len() - 1;
        assert_eq!(
            poisoned(DType::Bf16, &bytes, asked, (heads, dim), poison),
            (2, Some((1, 2, 3)))
        );
    }

    #[test]
    fn encode_then_decode_gives_every_value_back_across_chunk_boundaries() {
        // Values exact in every dtype, more of them than one parallel chunk holds.
        let values: Vec<f32> = (0..(1 << 16) * 3 + 5)
            .map(|i| ((i % 251) as f32 - 125.0) * 0.25)
            .collect();
        for dtype in [DType::Bf16, DType::F16, DType::F32] {
            let bytes = encode(dtype, &values);
            assert_eq!(bytes.len(), values.len() * dtype.size_bytes());
            for (i, &x) in values.iter().enumerate() {
                assert_eq!(
                    decode_bits(dtype, bits_at(dtype, &bytes, i)),
                    x,
                    "{dtype:?} {i}"
                );
            }
        }
        assert_eq!(
            encode(DType::Bf16, &[1.0]),
            bf16::from_f32(1.0).to_bits().to_le_bytes()
        );
    }
}
