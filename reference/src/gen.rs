//! Seeded realistic inputs (docs/operator.md section 1 "producer facts").

use crate::batch::BatchShape;
use crate::dtype::DType;
use crate::limits::{max_case_bytes, CaseSize, Dim, LimitError};
use crate::problem::{CacheLayout, Problem, ProblemData, ProblemError, RowLayout};
use crate::regime::{self, Inputs};
use crate::window::Window;
use ndarray::{Array2, Array3};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::StandardNormal;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

/// How `rel_logits` is filled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BiasMode {
    /// `r[t,h,0..16] @ proj[16,E]`, r and proj standard normal (scaled so entries have unit
    /// variance), rounded to the dtype (the model's producer).
    Normal,
    /// Every (t, h, e) cell holds a different value, so index errors cannot cancel.
    Distinct,
    /// All zero (plain causal attention).
    Zero,
}

/// How logical pages map to physical blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PageMode {
    /// Every needed page gets its own physical block, shuffled; block 0 is never used.
    Shuffled,
    /// Every entry of the block table is 0 (every request aliases block 0).
    AllZero,
}

/// Everything that determines a generated case. Equal specs give bit-identical problems.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GenSpec {
    pub dtype: DType,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rel_extent: usize,
    /// -1 = global layer.
    pub window_left: i64,
    pub softmax_scale: f64,
    pub page_size: usize,
    pub layout: CacheLayout,
    /// `(Lq_b, Lk_b)` per request.
    pub requests: Vec<(usize, usize)>,
    /// Padding rows after `cu_seqlens_q[B]` (filled with NaN).
    pub padding_rows: usize,
    pub bias: BiasMode,
    pub pages: PageMode,
    /// Extra unused physical blocks and block-table slack (pages past the last needed one).
    pub spare_pages: usize,
    /// Fill every cache slot no request may read with NaN.
    pub poison: bool,
    pub seed: u64,
    /// How the values are shaped (`rms1`: the producer facts of docs/operator.md section 1).
    #[serde(default)]
    pub inputs: Inputs,
    /// How q, rel_logits and out are laid out for the implementations.
    #[serde(default)]
    pub rows: RowLayout,
}

impl GenSpec {
    /// A small global-layer spec with the model's defaults (bf16, D = 128, scale 1/D,
    /// page 16, NHD packed, normal bias, shuffled pages, poison on).
    pub fn global(
        num_heads: usize,
        num_kv_heads: usize,
        requests: Vec<(usize, usize)>,
        seed: u64,
    ) -> GenSpec {
        GenSpec {
            dtype: DType::Bf16,
            num_heads,
            num_kv_heads,
            head_dim: 128,
            rel_extent: 1024,
            window_left: -1,
            softmax_scale: 1.0 / 128.0,
            page_size: 16,
            layout: CacheLayout::NhdPacked,
            requests,
            padding_rows: 0,
            bias: BiasMode::Normal,
            pages: PageMode::Shuffled,
            spare_pages: 1,
            poison: true,
            seed,
            inputs: Inputs::Rms1,
            rows: RowLayout::Padded,
        }
    }

    /// Same as `global` with a local layer: window `extent - 1`, `E = extent`.
    pub fn local(
        num_heads: usize,
        num_kv_heads: usize,
        extent: usize,
        requests: Vec<(usize, usize)>,
        seed: u64,
    ) -> GenSpec {
        GenSpec {
            rel_extent: extent,
            // Extents past i64 are out of range (`size` refuses them); no overflow here.
            window_left: i64::try_from(extent).map_or(i64::MAX, |e| e - 1),
            ..GenSpec::global(num_heads, num_kv_heads, requests, seed)
        }
    }
}

impl GenSpec {
    /// Every dimension of the case against its range (`limits::Dim`), then the dimensions that
    /// size it, computed without overflow. `name` says what a field is called where the spec
    /// came from (a command-line flag, a matrix key) for messages.
    pub fn size_with(&self, name: &dyn Fn(&'static str) -> String) -> Result<CaseSize, LimitError> {
        let n = |x: usize| x as u128;
        Dim::Heads.check(name("num_heads"), n(self.num_heads))?;
        Dim::KvHeads.check(name("num_kv_heads"), n(self.num_kv_heads))?;
        Dim::HeadDim.check(name("head_dim"), n(self.head_dim))?;
        Dim::Extent.check(name("rel_extent"), n(self.rel_extent))?;
        Dim::PageSize.check(name("page_size"), n(self.page_size))?;
        let requests = name("requests");
        Dim::Batch.check(
            format!("{requests}: the number of requests"),
            n(self.requests.len()),
        )?;
        let (mut rows, mut pages, mut longest) = (n(self.padding_rows), 0u128, 0u128);
        for (b, &(lq, lk)) in self.requests.iter().enumerate() {
            Dim::KvLen.check(format!("{requests}: Lk of request {b}"), n(lk))?;
            rows += n(lq);
            let needed = n(lk.div_ceil(self.page_size));
            pages += needed;
            longest = longest.max(needed);
        }
        let padding = name("padding_rows");
        Dim::Rows.check(
            format!("T (the query rows of {requests} and {padding})"),
            rows,
        )?;
        let spare = name("spare_pages");
        let blocks = match self.pages {
            PageMode::Shuffled => 1 + pages + n(self.spare_pages),
            PageMode::AllZero => 1 + n(self.spare_pages),
        };
        Dim::Blocks.check(
            format!("num_blocks (1 + the pages of {requests} + {spare})"),
            blocks,
        )?;
        let max_pages = longest + n(self.spare_pages);
        Dim::MaxPages.check(
            format!("max_pages (the longest request's pages + {spare})"),
            max_pages,
        )?;
        // Every value is now within int32, so the casts below are exact.
        Ok(CaseSize {
            rows: rows as usize,
            heads: self.num_heads,
            kv_heads: self.num_kv_heads,
            head_dim: self.head_dim,
            extent: self.rel_extent,
            page_size: self.page_size,
            blocks: blocks as usize,
            batch: self.requests.len(),
            max_pages: max_pages as usize,
        })
    }

    /// `size_with` naming the fields as `GenSpec` does.
    pub fn size(&self) -> Result<CaseSize, LimitError> {
        self.size_with(&|field| field.to_string())
    }
}

/// Build the problem a spec describes. Equal specs give bit-identical problems. A spec with a
/// dimension out of range, or over the case-byte limit in force (`limits::max_case_bytes`), is
/// refused before anything is allocated.
///
/// Draws come from ChaCha8 seeded with `spec.seed`: stream 0 for q, rel_logits and the page
/// permutation, stream `1 + block` for the cache contents of each physical block (so large
/// caches are generated in parallel and stay reproducible).
pub fn generate(spec: &GenSpec) -> Result<Problem, ProblemError> {
    spec.size()?
        .check_bytes("the case in memory", max_case_bytes())?;
    for (b, &(lq, lk)) in spec.requests.iter().enumerate() {
        match (i32::try_from(lq), i32::try_from(lk)) {
            (Ok(q_len), Ok(kv_len)) if lq > lk => {
                return Err(ProblemError::KvShorterThanQ { b, kv_len, q_len })
            }
            (Ok(_), Ok(_)) => {}
            _ => return Err(ProblemError::NegativeKvLen { b, value: -1 }),
        }
    }
    let (h, hkv, d, e) = (
        spec.num_heads,
        spec.num_kv_heads,
        spec.head_dim,
        spec.rel_extent,
    );
    let page = spec.page_size.max(1);
    let shape = BatchShape::new(spec.requests.clone(), Window::from_left(spec.window_left));
    let real_rows = shape.real_rows();
    let t = real_rows + spec.padding_rows;
    let dtype = spec.dtype;
    let mut rng = ChaCha8Rng::seed_from_u64(spec.seed);

    // q: RMS 1 per (row, head); padding rows NaN.
    let mut q = Array3::<f32>::from_elem((t, h, d), f32::NAN);
    for row in 0..real_rows {
        for head in 0..h {
            let v = rms_one(&mut rng, d);
            for c in 0..d {
                q[[row, head, c]] = dtype.round(v[c]);
            }
        }
    }

    let rel_logits = rel_logits(spec, &mut rng, real_rows, t);

    // Page assignment.
    let needed: Vec<usize> = spec.requests.iter().map(|r| r.1.div_ceil(page)).collect();
    let total_pages: usize = needed.iter().sum();
    let max_pages = needed.iter().copied().max().unwrap_or(0) + spec.spare_pages;
    let batch = spec.requests.len();
    let (num_blocks, block_table) = match spec.pages {
        PageMode::Shuffled => {
            let num_blocks = 1 + total_pages + spec.spare_pages;
            let mut ids: Vec<i32> = (1..num_blocks as i32).collect();
            ids.shuffle(&mut rng);
            // Slack entries point at block 0, which no request uses (poisoned when poison is on).
            let mut table = Array2::<i32>::zeros((batch, max_pages));
            let mut next = 0;
            for (b, &n) in needed.iter().enumerate() {
                for p in 0..n {
                    table[[b, p]] = ids[next];
                    next += 1;
                }
            }
            (num_blocks, table)
        }
        PageMode::AllZero => (
            1 + spec.spare_pages,
            Array2::<i32>::zeros((batch, max_pages)),
        ),
    };

    // Which (block, slot) some request may read: keys of its visible union.
    let mut readable = vec![false; num_blocks * page];
    for (b, &(lq, lk)) in shape.requests.iter().enumerate() {
        if lq > 0 {
            let (first, _) = shape.visible_keys((lq, lk), 0);
            for j in first..lk {
                let block = block_table[[b, j / page]] as usize;
                readable[block * page + j % page] = true;
            }
        }
    }

    // Cache contents, per physical block from its own stream, written in place in parallel.
    let (kview, vview, len) = spec.layout.views(num_blocks, page, hkv, d);
    let mut kv = vec![0f32; len];
    let fill = Fill {
        seed: spec.seed,
        dtype,
        page,
        hkv,
        d,
        poison: spec.poison,
        readable: &readable,
    };
    match spec.layout {
        // K of every block, then V of every block: a block's K and V are chunks of the halves.
        CacheLayout::Contiguous => {
            let (k, v) = kv.split_at_mut(len / 2);
            // K's view starts at 0: within a block, K and V sit at the same place of their chunks.
            k.par_chunks_mut(kview.block_stride)
                .zip(v.par_chunks_mut(vview.block_stride))
                .enumerate()
                .for_each(|(block, (kc, vc))| {
                    fill.block(block, |slot, head, key, value| {
                        let at = kview.at(0, slot, head);
                        kc[at..at + d].copy_from_slice(key);
                        vc[at..at + d].copy_from_slice(value);
                    })
                });
        }
        // Each block holds its K and V rows: one chunk per block.
        CacheLayout::NhdPacked | CacheLayout::HndPacked => {
            kv.par_chunks_mut(kview.block_stride)
                .enumerate()
                .for_each(|(block, chunk)| {
                    fill.block(block, |slot, head, key, value| {
                        let (ka, va) = (kview.at(0, slot, head), vview.at(0, slot, head));
                        chunk[ka..ka + d].copy_from_slice(key);
                        chunk[va..va + d].copy_from_slice(value);
                    })
                });
        }
    }

    let mut rel_logits = rel_logits;
    regime::apply(
        spec.inputs,
        &mut regime::Tensors {
            dtype,
            head_dim: d,
            rel_extent: e,
            window_left: spec.window_left,
            page_size: page,
            requests: &spec.requests,
            q: &mut q,
            rel_logits: &mut rel_logits,
            kv: &mut kv,
            block_table: &block_table,
            key_at: &|block, slot, head| kview.at(block, slot, head),
            num_blocks,
            num_kv_heads: hkv,
            seed: spec.seed,
        },
    );

    let mut cu_seqlens_q = Vec::with_capacity(batch + 1);
    cu_seqlens_q.push(0i32);
    for &(lq, _) in &spec.requests {
        cu_seqlens_q.push(cu_seqlens_q.last().unwrap() + lq as i32);
    }
    Problem::new(ProblemData {
        dtype,
        num_heads: h,
        num_kv_heads: hkv,
        head_dim: d,
        rel_extent: e,
        page_size: spec.page_size,
        num_blocks,
        softmax_scale: spec.softmax_scale,
        window_left: spec.window_left,
        q,
        rel_logits,
        kv,
        layout: spec.layout,
        rows: spec.rows,
        k: kview,
        v: vview,
        block_table,
        seqused_k: spec.requests.iter().map(|r| r.1 as i32).collect(),
        cu_seqlens_q,
    })
}

/// How one physical block of the cache is filled: its own ChaCha8 stream (`1 + block`), per
/// slot and KV head an RMS-1 key and a standard-normal value in the dtype, NaN where no request
/// reads the slot and poison is on.
struct Fill<'a> {
    seed: u64,
    dtype: DType,
    page: usize,
    hkv: usize,
    d: usize,
    poison: bool,
    /// Per (block, slot): some request may read it.
    readable: &'a [bool],
}

impl Fill<'_> {
    /// Draw the block's contents in stream order, handing each (slot, head)'s key and value to
    /// `put`.
    fn block(&self, block: usize, mut put: impl FnMut(usize, usize, &[f32], &[f32])) {
        let nan = vec![f32::NAN; self.d];
        let slots = &self.readable[block * self.page..(block + 1) * self.page];
        if self.poison && !slots.iter().any(|&r| r) {
            // No request may read the block (a spare one): NaN throughout, without drawing what
            // would be dropped. Each block has a stream of its own, so no other block changes.
            for slot in 0..self.page {
                for head in 0..self.hkv {
                    put(slot, head, &nan, &nan);
                }
            }
            return;
        }
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        rng.set_stream(1 + block as u64);
        let mut value = vec![0f32; self.d];
        for slot in 0..self.page {
            let poisoned = self.poison && !self.readable[block * self.page + slot];
            for head in 0..self.hkv {
                let mut key = rms_one(&mut rng, self.d);
                key.iter_mut().for_each(|x| *x = self.dtype.round(*x));
                for x in value.iter_mut() {
                    *x = self.dtype.round(rng.sample::<f32, _>(StandardNormal));
                }
                if poisoned {
                    put(slot, head, &nan, &nan);
                } else {
                    put(slot, head, &key, &value);
                }
            }
        }
    }
}

/// A standard-normal vector rescaled to RMS 1 (L2 norm sqrt(n)), as the model's RMS norm makes q and k.
fn rms_one(rng: &mut ChaCha8Rng, n: usize) -> Vec<f32> {
    let v: Vec<f64> = (0..n)
        .map(|_| rng.sample::<f64, _>(StandardNormal))
        .collect();
    let norm = v
        .iter()
        .map(|x| x * x)
        .sum::<f64>()
        .sqrt()
        .max(f64::MIN_POSITIVE);
    let k = (n as f64).sqrt() / norm;
    v.into_iter().map(|x| (x * k) as f32).collect()
}

fn rel_logits(spec: &GenSpec, rng: &mut ChaCha8Rng, real_rows: usize, t: usize) -> Array3<f32> {
    let (h, e, dtype) = (spec.num_heads, spec.rel_extent, spec.dtype);
    let mut rel = Array3::<f32>::from_elem((t, h, e), f32::NAN);
    match spec.bias {
        BiasMode::Zero => {
            for row in 0..real_rows {
                rel.index_axis_mut(ndarray::Axis(0), row).fill(0.0);
            }
        }
        BiasMode::Normal => {
            // rel = r[.,16] @ proj[16,E] / 4: unit variance, rank 16 like the model's producer.
            let proj: Vec<f64> = (0..16 * e)
                .map(|_| rng.sample::<f64, _>(StandardNormal))
                .collect();
            // The draws in stream order first (16 per real row and head), then the products in
            // parallel over rows: the same values as drawing each row's 16 just before its use.
            let r: Vec<f64> = (0..real_rows * h * 16)
                .map(|_| rng.sample::<f64, _>(StandardNormal))
                .collect();
            // proj transposed to [E, 16], so each output reads 16 adjacent values.
            let proj_t: Vec<f64> = (0..e * 16).map(|i| proj[(i % 16) * e + i / 16]).collect();
            rel.outer_iter_mut()
                .into_par_iter()
                .take(real_rows)
                .enumerate()
                .for_each(|(row, mut heads)| {
                    for (head, mut out) in heads.outer_iter_mut().enumerate() {
                        let r = &r[(row * h + head) * 16..][..16];
                        for (x, o) in out.iter_mut().enumerate() {
                            let pj = &proj_t[x * 16..][..16];
                            let s: f64 = (0..16).map(|k| r[k] * pj[k]).sum();
                            *o = dtype.round((s / 4.0) as f32);
                        }
                    }
                });
        }
        BiasMode::Distinct => {
            // All values of the dtype with magnitude in [1/64, 4): distinct within every row
            // (E <= the count), rows rotated against each other by a random offset.
            let values = distinct_values(dtype);
            let n = values.len();
            for row in 0..real_rows {
                for head in 0..h {
                    let offset = rng.random_range(0..n);
                    for x in 0..e {
                        rel[[row, head, x]] = values[(offset + x * 7919) % n];
                    }
                }
            }
        }
    }
    rel
}

/// Representable values with magnitude in [2^-6, 4), in a fixed scrambled order.
fn distinct_values(dtype: DType) -> Vec<f32> {
    let mantissa_bits = match dtype {
        DType::Bf16 => 7,
        DType::F16 => 10,
        DType::F32 => 12, // enough distinct values; more would only cost memory
    };
    let mut out = Vec::new();
    for exp in -6..2 {
        for m in 0..(1 << mantissa_bits) {
            let x = 2f32.powi(exp) * (1.0 + m as f32 / (1 << mantissa_bits) as f32);
            out.push(x);
            out.push(-x);
        }
    }
    debug_assert!(out.iter().all(|&x| dtype.round(x) == x));
    out
}
