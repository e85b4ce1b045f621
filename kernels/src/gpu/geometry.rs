//! The host-side facts of a problem that launches need (sizes, lengths, strides), kept after the
//! tensors are uploaded so a `DeviceProblem` can be planned and run without the `Problem`.

#![deny(unsafe_code)]

use relattn_reference::limits::LimitError;
use relattn_reference::{BatchShape, DType, GenSpec, KvView, Problem, Window};

/// Scalars and per-request lengths of one problem.
#[derive(Debug, Clone, PartialEq)]
pub struct Geometry {
    pub dtype: DType,
    /// `T`: rows of q and out, padding included.
    pub total_rows: usize,
    /// `cu_seqlens_q[B]`.
    pub real_rows: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rel_extent: usize,
    pub page_size: usize,
    pub window_left: i64,
    pub softmax_scale: f64,
    /// Per request `(Lq_b, Lk_b)`, and the window.
    pub shape: BatchShape,
    /// Entries per block-table row (`max_pages`).
    pub max_pages: usize,
    pub num_blocks: usize,
    /// Elements of the cache buffer.
    pub kv_elems: usize,
    pub k: KvView,
    pub v: KvView,
}

impl Geometry {
    pub fn of(p: &Problem) -> Geometry {
        Geometry {
            dtype: p.dtype,
            total_rows: p.total_rows(),
            real_rows: p.real_rows(),
            num_heads: p.num_heads,
            num_kv_heads: p.num_kv_heads,
            head_dim: p.head_dim,
            rel_extent: p.rel_extent,
            page_size: p.page_size,
            window_left: p.window_left,
            softmax_scale: p.softmax_scale,
            shape: p.shape(),
            max_pages: p.max_pages(),
            num_blocks: p.num_blocks,
            kv_elems: p.kv.len(),
            k: p.k,
            v: p.v,
        }
    }

    /// The geometry `generate(spec)` would give, from the spec alone (nothing is generated), for
    /// planning a matrix's launches without a GPU or the memory its cases take.
    pub fn of_spec(spec: &GenSpec) -> Result<Geometry, LimitError> {
        let size = spec.size()?;
        let shape = BatchShape::new(spec.requests.clone(), Window::from_left(spec.window_left));
        let (k, v, kv_elems) = spec.layout.views(
            size.blocks,
            spec.page_size,
            spec.num_kv_heads,
            spec.head_dim,
        );
        Ok(Geometry {
            dtype: spec.dtype,
            total_rows: size.rows,
            real_rows: shape.real_rows(),
            num_heads: spec.num_heads,
            num_kv_heads: spec.num_kv_heads,
            head_dim: spec.head_dim,
            rel_extent: spec.rel_extent,
            page_size: spec.page_size,
            window_left: spec.window_left,
            softmax_scale: spec.softmax_scale,
            shape,
            max_pages: size.max_pages,
            num_blocks: size.blocks,
            kv_elems,
            k,
            v,
        })
    }

    pub fn batch(&self) -> usize {
        self.shape.batch()
    }

    /// `G = H / Hkv`.
    pub fn group(&self) -> usize {
        self.num_heads / self.num_kv_heads
    }

    pub fn max_query_len(&self) -> usize {
        self.shape.max_query_len()
    }

    pub fn max_kv_len(&self) -> usize {
        self.shape.max_kv_len()
    }

    pub fn is_local(&self) -> bool {
        self.shape.window.is_local()
    }

    /// Every request has at most one new token.
    pub fn decode_only(&self) -> bool {
        self.shape.is_decode_only()
    }

    /// The shape routing's policies look at.
    pub fn shape(&self) -> crate::routing::Shape {
        crate::routing::Shape {
            batch: self.batch(),
            max_query_len: self.max_query_len(),
            num_heads: self.num_heads,
            num_kv_heads: self.num_kv_heads,
            max_kv_len: self.max_kv_len(),
            page_size: self.page_size,
            window_left: self.window_left,
            is_local: self.is_local(),
        }
    }
}
