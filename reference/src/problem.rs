//! `Problem`: the operator's inputs (docs/operator.md section 2), validated once.

use crate::batch::BatchShape;
use crate::dtype::DType;
use crate::window::Window;
use ndarray::{Array2, Array3};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::ops::Deref;
use std::str::FromStr;
use thiserror::Error;

/// How K and V sit in their physical buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheLayout {
    /// Two separate dense `[num_blocks, page, Hkv, D]` tensors (K first, then V, in one buffer).
    Contiguous,
    /// One buffer `[blocks, page, Hkv, 2D]`, rows `K(D) | V(D)`.
    NhdPacked,
    /// One buffer `[blocks, Hkv, page, 2D]`, rows `K(D) | V(D)`.
    HndPacked,
}

impl CacheLayout {
    pub const ALL: [CacheLayout; 3] = [
        CacheLayout::Contiguous,
        CacheLayout::NhdPacked,
        CacheLayout::HndPacked,
    ];

    pub fn name(self) -> &'static str {
        match self {
            CacheLayout::Contiguous => "contiguous",
            CacheLayout::NhdPacked => "nhd_packed",
            CacheLayout::HndPacked => "hnd_packed",
        }
    }

    /// K and V views of a buffer of this layout, plus the buffer's length in elements.
    pub fn views(
        self,
        num_blocks: usize,
        page_size: usize,
        num_kv_heads: usize,
        head_dim: usize,
    ) -> (KvView, KvView, usize) {
        let (b, p, h, d) = (num_blocks, page_size, num_kv_heads, head_dim);
        match self {
            CacheLayout::Contiguous => {
                let k = KvView {
                    offset: 0,
                    block_stride: p * h * d,
                    slot_stride: h * d,
                    head_stride: d,
                };
                let v = KvView {
                    offset: b * p * h * d,
                    ..k
                };
                (k, v, 2 * b * p * h * d)
            }
            CacheLayout::NhdPacked => {
                let k = KvView {
                    offset: 0,
                    block_stride: p * h * 2 * d,
                    slot_stride: h * 2 * d,
                    head_stride: 2 * d,
                };
                (k, KvView { offset: d, ..k }, 2 * b * p * h * d)
            }
            CacheLayout::HndPacked => {
                let k = KvView {
                    offset: 0,
                    block_stride: h * p * 2 * d,
                    slot_stride: 2 * d,
                    head_stride: p * 2 * d,
                };
                (k, KvView { offset: d, ..k }, 2 * b * p * h * d)
            }
        }
    }
}

impl fmt::Display for CacheLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for CacheLayout {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "contiguous" => Ok(CacheLayout::Contiguous),
            "nhd_packed" | "nhd" => Ok(CacheLayout::NhdPacked),
            "hnd_packed" | "hnd" => Ok(CacheLayout::HndPacked),
            other => Err(format!(
                "unknown cache layout `{other}` (expected contiguous, nhd_packed or hnd_packed)"
            )),
        }
    }
}

/// How the per-row tensors (q, rel_logits, out) sit in device memory when an implementation is
/// handed them. The values, and what the reference computes, are the same in every layout.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum RowLayout {
    /// `[T, ...]` buffers, the padding rows after `cu_seqlens_q[B]` in the same allocation (a
    /// serving engine's padded batch); workers hand the ops the first `cu_seqlens_q[B]` rows of
    /// each, as vLLM's Inkling layer does.
    #[default]
    Padded,
    /// q a view of a wider buffer whose rows are a fused q | k | v projection (row stride
    /// `(H + 2 Hkv) D`), out a row slice of a buffer with rows after it: q's and out's strides
    /// differ, so an op that mixes them up fails. Workers only (relattn's kernels take q dense).
    Strided,
    /// q, rel_logits and out hold exactly the real rows, each in an allocation of its own: a
    /// row read past the last real query (a tile's padding rows) is outside every allocation,
    /// which a sanitized run reports.
    Exact,
}

impl RowLayout {
    pub const ALL: [RowLayout; 3] = [RowLayout::Padded, RowLayout::Strided, RowLayout::Exact];

    pub fn name(self) -> &'static str {
        match self {
            RowLayout::Padded => "padded",
            RowLayout::Strided => "strided",
            RowLayout::Exact => "exact",
        }
    }
}

impl fmt::Display for RowLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for RowLayout {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        RowLayout::ALL
            .into_iter()
            .find(|r| r.name() == s)
            .ok_or_else(|| format!("unknown row layout `{s}` (expected padded, strided or exact)"))
    }
}

/// A strided view of K or V inside the cache buffer, in elements. The element `c` of
/// `(block, slot, kv_head)` is at `offset + block*block_stride + slot*slot_stride + head*head_stride + c`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct KvView {
    pub offset: usize,
    pub block_stride: usize,
    pub slot_stride: usize,
    pub head_stride: usize,
}

impl KvView {
    #[inline]
    pub fn at(&self, block: usize, slot: usize, head: usize) -> usize {
        self.offset + block * self.block_stride + slot * self.slot_stride + head * self.head_stride
    }
}

/// Every field of a problem; `Problem::new` validates it.
#[derive(Debug, Clone, PartialEq)]
pub struct ProblemData {
    pub dtype: DType,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    /// `E`: `rel_logits` has `E` entries per (row, head).
    pub rel_extent: usize,
    pub page_size: usize,
    pub num_blocks: usize,
    pub softmax_scale: f64,
    /// `-1` = no window (global layer).
    pub window_left: i64,
    /// `[T, H, D]`, values exactly representable in `dtype`. Padding rows hold NaN in tests.
    pub q: Array3<f32>,
    /// `[T, H, E]`, values exactly representable in `dtype`.
    pub rel_logits: Array3<f32>,
    /// The physical cache buffer holding both K and V (see `layout`, `k`, `v`).
    pub kv: Vec<f32>,
    pub layout: CacheLayout,
    /// How q, rel_logits and out are laid out for the implementations (not for the reference).
    pub rows: RowLayout,
    pub k: KvView,
    pub v: KvView,
    /// `[B, max_pages]`.
    pub block_table: Array2<i32>,
    /// `[B]`: `Lk_b`.
    pub seqused_k: Vec<i32>,
    /// `[B + 1]`.
    pub cu_seqlens_q: Vec<i32>,
}

/// Whether a window is the model's local one for extent `rel_extent`: `window_left + 1 == E`, so
/// every visible key carries a bias (false for `window_left = -1`, and no window overflows).
pub fn window_spans_extent(window_left: i64, rel_extent: usize) -> bool {
    Window::from_left(window_left).span() == Some(rel_extent as u64)
}

/// One request of the packed batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub index: usize,
    /// First packed row (`cu_seqlens_q[b]`).
    pub q_start: usize,
    /// `Lq_b`.
    pub q_len: usize,
    /// `Lk_b`.
    pub kv_len: usize,
}

impl Request {
    /// `P_b = Lk_b - Lq_b`, the cached prefix.
    pub fn prefix(&self) -> usize {
        self.kv_len - self.q_len
    }
}

/// Validated operator inputs. Read fields through `Deref`; change them with
/// `into_data` + `Problem::new`, which validates again.
#[derive(Debug, Clone, PartialEq)]
pub struct Problem(ProblemData);

impl Deref for Problem {
    type Target = ProblemData;
    fn deref(&self) -> &ProblemData {
        &self.0
    }
}

#[derive(Debug, Error, Clone, PartialEq)]
pub enum ProblemError {
    #[error("num_heads ({heads}) is not a positive multiple of num_kv_heads ({kv_heads})")]
    HeadsNotMultiple { heads: usize, kv_heads: usize },
    #[error("{field} must be positive, got 0")]
    Zero { field: &'static str },
    #[error("shape of `{tensor}` is {actual:?}, expected {expected:?}")]
    Shape {
        tensor: &'static str,
        actual: Vec<usize>,
        expected: Vec<usize>,
    },
    #[error("cache buffer has {actual} elements but the K/V views reach element {needed}")]
    CacheTooSmall { actual: usize, needed: usize },
    #[error("cu_seqlens_q must have B + 1 = {expected} entries (B from seqused_k), got {actual}")]
    CuSeqlensLen { expected: usize, actual: usize },
    #[error("cu_seqlens_q[0] must be 0, got {0}")]
    CuSeqlensStart(i32),
    #[error("cu_seqlens_q is not monotonic: cu_seqlens_q[{index}] = {value} < cu_seqlens_q[{prev_index}] = {prev}")]
    CuSeqlensNotMonotonic {
        index: usize,
        value: i32,
        prev_index: usize,
        prev: i32,
    },
    #[error(
        "cu_seqlens_q ends at {end}, past T = {t} (rows past its end are padding, not extra rows)"
    )]
    CuSeqlensPastT { end: i32, t: usize },
    #[error("seqused_k[{b}] = {value} is negative")]
    NegativeKvLen { b: usize, value: i32 },
    #[error("seqused_k[{b}] = {kv_len} < Lq_{b} = {q_len}: a request cannot have fewer keys than new queries")]
    KvShorterThanQ { b: usize, kv_len: i32, q_len: i32 },
    #[error("block_table has {actual} rows, expected B = {expected}")]
    BlockTableRows { expected: usize, actual: usize },
    #[error("block_table has {max_pages} pages per request but request {b} needs {needed} for Lk = {kv_len} at page size {page_size}")]
    BlockTableShort {
        b: usize,
        needed: usize,
        max_pages: usize,
        kv_len: i32,
        page_size: usize,
    },
    #[error("block_table[{b}, {page}] = {value} is out of range 0..{num_blocks} (needed for Lk = {kv_len})")]
    BlockOutOfRange {
        b: usize,
        page: usize,
        value: i32,
        num_blocks: usize,
        kv_len: i32,
    },
    #[error("window_left = {0} is invalid: use -1 for no window or a value >= 0")]
    WindowLeft(i64),
    #[error("softmax_scale = {0} is not finite")]
    Scale(f64),
    /// A NaN or infinity where a real row reads (`finite::check_finite_inputs`).
    #[error(
        "{tensor}{index:?} = {value}, read by {reader}: inputs must be finite wherever a real row \
         reads them (the reference would be NaN there and no verdict could mean anything); only \
         padding rows, pages no request reads and bias cells past the visible distances may hold \
         NaN"
    )]
    NonFinite {
        tensor: &'static str,
        index: Vec<usize>,
        value: f32,
        reader: String,
    },
    /// A dimension out of the operator's range, or a case over the case-byte limit.
    #[error(transparent)]
    Limit(#[from] crate::limits::LimitError),
}

impl Problem {
    pub fn new(data: ProblemData) -> Result<Problem, ProblemError> {
        validate(&data)?;
        Ok(Problem(data))
    }

    pub fn data(&self) -> &ProblemData {
        &self.0
    }

    pub fn into_data(self) -> ProblemData {
        self.0
    }

    /// `T`, rows of q (real and padding).
    pub fn total_rows(&self) -> usize {
        self.q.shape()[0]
    }

    /// `cu_seqlens_q[B]`: rows at or past it are padding.
    pub fn real_rows(&self) -> usize {
        *self.cu_seqlens_q.last().unwrap() as usize
    }

    pub fn batch(&self) -> usize {
        self.seqused_k.len()
    }

    /// `G = H / Hkv`.
    pub fn group(&self) -> usize {
        self.num_heads / self.num_kv_heads
    }

    pub fn max_pages(&self) -> usize {
        self.block_table.shape()[1]
    }

    pub fn request(&self, b: usize) -> Request {
        let q_start = self.cu_seqlens_q[b] as usize;
        Request {
            index: b,
            q_start,
            q_len: self.cu_seqlens_q[b + 1] as usize - q_start,
            kv_len: self.seqused_k[b] as usize,
        }
    }

    pub fn requests(&self) -> impl Iterator<Item = Request> + '_ {
        (0..self.batch()).map(|b| self.request(b))
    }

    /// The layer's window.
    pub fn window(&self) -> Window {
        Window::from_left(self.window_left)
    }

    /// The batch's lengths and window: maxima, visible pairs and FLOPs come from here.
    pub fn shape(&self) -> BatchShape {
        BatchShape::new(
            self.requests().map(|r| (r.q_len, r.kv_len)).collect(),
            self.window(),
        )
    }

    pub fn max_query_len(&self) -> usize {
        self.shape().max_query_len()
    }

    pub fn max_kv_len(&self) -> usize {
        self.shape().max_kv_len()
    }

    /// The request owning packed row `t`, or None for a padding row.
    pub fn request_of_row(&self, t: usize) -> Option<Request> {
        if t >= self.real_rows() {
            return None;
        }
        // cu_seqlens_q is monotonic: the last b with cu[b] <= t and a non-empty range.
        let b = self.cu_seqlens_q.partition_point(|&c| c as usize <= t) - 1;
        Some(self.request(b))
    }

    /// Inclusive range of keys visible to local query `i` of `r`: causal, and on local layers
    /// `d = (P + i) - j <= window_left`.
    pub fn visible_keys(&self, r: &Request, i: usize) -> (usize, usize) {
        self.window().visible_keys(r.prefix() + i)
    }

    /// Bias for packed row `t`, head `h`, distance `d >= 0`: `rel_logits[t,h,d]` if `d < E`, else 0.
    #[inline]
    pub fn bias(&self, t: usize, h: usize, d: usize) -> f32 {
        if d < self.rel_extent {
            self.rel_logits[[t, h, d]]
        } else {
            0.0
        }
    }

    /// Physical block holding key `j` of request `b`.
    #[inline]
    pub fn block_of(&self, b: usize, j: usize) -> usize {
        self.block_table[[b, j / self.page_size]] as usize
    }

    /// Slice of K for key `j` of request `b`, KV head `kvh` (length D).
    #[inline]
    pub fn key(&self, b: usize, j: usize, kvh: usize) -> &[f32] {
        let at = self.k.at(self.block_of(b, j), j % self.page_size, kvh);
        &self.kv[at..at + self.head_dim]
    }

    /// Slice of V for key `j` of request `b`, KV head `kvh` (length D).
    #[inline]
    pub fn value(&self, b: usize, j: usize, kvh: usize) -> &[f32] {
        let at = self.v.at(self.block_of(b, j), j % self.page_size, kvh);
        &self.kv[at..at + self.head_dim]
    }

    /// Number of visible (query, key) pairs over all real rows (per head).
    pub fn visible_pairs(&self) -> u64 {
        self.shape().visible_pairs()
    }

    /// Reference work in FLOP: 4 x visible pairs x D x H.
    pub fn flops(&self) -> f64 {
        self.shape().flops(self.num_heads, self.head_dim)
    }
}

fn validate(p: &ProblemData) -> Result<(), ProblemError> {
    for (field, v) in [
        ("num_heads", p.num_heads),
        ("num_kv_heads", p.num_kv_heads),
        ("head_dim", p.head_dim),
        ("rel_extent", p.rel_extent),
        ("page_size", p.page_size),
    ] {
        if v == 0 {
            return Err(ProblemError::Zero { field });
        }
    }
    if !p.num_heads.is_multiple_of(p.num_kv_heads) {
        return Err(ProblemError::HeadsNotMultiple {
            heads: p.num_heads,
            kv_heads: p.num_kv_heads,
        });
    }
    if !p.softmax_scale.is_finite() {
        return Err(ProblemError::Scale(p.softmax_scale));
    }
    if p.window_left < -1 {
        return Err(ProblemError::WindowLeft(p.window_left));
    }
    let t = p.q.shape()[0];
    let (h, d, e) = (p.num_heads, p.head_dim, p.rel_extent);
    if p.q.shape() != [t, h, d] {
        return Err(ProblemError::Shape {
            tensor: "q",
            actual: p.q.shape().to_vec(),
            expected: vec![t, h, d],
        });
    }
    if p.rel_logits.shape() != [t, h, e] {
        return Err(ProblemError::Shape {
            tensor: "rel_logits",
            actual: p.rel_logits.shape().to_vec(),
            expected: vec![t, h, e],
        });
    }
    if p.num_blocks > 0 {
        // Checked arithmetic: hand-built views with huge strides are an error, not a panic.
        let mut needed = 0usize;
        for view in [p.k, p.v] {
            let last = (p.num_blocks - 1)
                .checked_mul(view.block_stride)
                .and_then(|x| x.checked_add((p.page_size - 1).checked_mul(view.slot_stride)?))
                .and_then(|x| x.checked_add((p.num_kv_heads - 1).checked_mul(view.head_stride)?))
                .and_then(|x| x.checked_add(view.offset))
                .and_then(|x| x.checked_add(d))
                .unwrap_or(usize::MAX);
            needed = needed.max(last);
        }
        if needed > p.kv.len() {
            return Err(ProblemError::CacheTooSmall {
                actual: p.kv.len(),
                needed,
            });
        }
    }
    let batch = p.seqused_k.len();
    if p.cu_seqlens_q.len() != batch + 1 {
        return Err(ProblemError::CuSeqlensLen {
            expected: batch + 1,
            actual: p.cu_seqlens_q.len(),
        });
    }
    if p.cu_seqlens_q[0] != 0 {
        return Err(ProblemError::CuSeqlensStart(p.cu_seqlens_q[0]));
    }
    for i in 1..p.cu_seqlens_q.len() {
        let (prev, value) = (p.cu_seqlens_q[i - 1], p.cu_seqlens_q[i]);
        if value < prev {
            return Err(ProblemError::CuSeqlensNotMonotonic {
                index: i,
                value,
                prev_index: i - 1,
                prev,
            });
        }
    }
    let end = p.cu_seqlens_q[batch];
    if end as usize > t {
        return Err(ProblemError::CuSeqlensPastT { end, t });
    }
    if p.block_table.shape()[0] != batch {
        return Err(ProblemError::BlockTableRows {
            expected: batch,
            actual: p.block_table.shape()[0],
        });
    }
    let max_pages = p.block_table.shape()[1];
    for b in 0..batch {
        let kv_len = p.seqused_k[b];
        if kv_len < 0 {
            return Err(ProblemError::NegativeKvLen { b, value: kv_len });
        }
        let q_len = p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b];
        if kv_len < q_len {
            return Err(ProblemError::KvShorterThanQ { b, kv_len, q_len });
        }
        if q_len == 0 {
            continue; // a no-op request reads nothing
        }
        let first_needed =
            Window::from_left(p.window_left).first_visible((kv_len - q_len) as usize) / p.page_size;
        let needed = (kv_len as usize).div_ceil(p.page_size);
        if needed > max_pages {
            return Err(ProblemError::BlockTableShort {
                b,
                needed,
                max_pages,
                kv_len,
                page_size: p.page_size,
            });
        }
        for page in first_needed..needed {
            let value = p.block_table[[b, page]];
            if value < 0 || value as usize >= p.num_blocks {
                return Err(ProblemError::BlockOutOfRange {
                    b,
                    page,
                    value,
                    num_blocks: p.num_blocks,
                    kv_len,
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::window_spans_extent;

    #[test]
    fn only_a_window_of_e_minus_one_spans_the_extent() {
        assert!(window_spans_extent(511, 512));
        assert!(!window_spans_extent(300, 512));
        assert!(!window_spans_extent(-1, 0));
        assert!(!window_spans_extent(i64::MAX, usize::MAX));
        assert!(!window_spans_extent(i64::MAX, 512));
    }
}
