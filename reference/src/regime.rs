//! Input regimes: how far generated inputs stray from the model's producer facts, so that the
//! attention a case asks for is flat (`rms1`, the default) or peaked in the ways real heads are.
//!
//! With RMS-1 q and k and scale 1/D, `scale * q.k` lies in [-1, 1] and a unit-variance bias adds
//! little: softmax weights over hundreds of keys are nearly flat, every split, piece and tile of
//! a split-KV kernel gets about the same LSE, and an error in how partial results are weighted
//! moves the output far less than the tolerance. The other regimes put most of the weight on a
//! few keys, in different places:
//!
//! | regime | what | catches |
//! |---|---|---|
//! | `rms1` | the producer facts (docs/operator.md section 1) | the common case |
//! | `peaked` | per (row, head), three adjacent keys around a tile boundary (a multiple of 64) get a bias spike of 10 to 14 | split/piece/tile LSE weighting, combine rescale, online-softmax rescale |
//! | `sink` | the first 4 keys of every request get keys 8x as long, aligned with a direction every query of their KV head leans to | attention-sink heads: weight on keys far from the query, in the first split |
//! | `diagonal` | a bias spike of 8 at d = 0, 1, 2 | weight on the newest keys, the last tile/split |
//! | `large_logits` | q and k 16x as long, the bias 8192x (capped at 60,000, below fp16's 65,504) | overflow, a missing or wrong max subtraction, fp16 score arithmetic |
//!
//! A regime changes values only (no shape): draws come from their own ChaCha stream, so the
//! `rms1` draws of a spec are the same under every regime, and slots no request may read (NaN
//! poison) stay as they are.

use crate::dtype::DType;
use crate::window::Window;
use ndarray::{Array2, Array3};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::StandardNormal;
use serde::{Deserialize, Serialize};

/// How generated inputs are shaped (see the module docs).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Inputs {
    #[default]
    Rms1,
    Peaked,
    Sink,
    Diagonal,
    LargeLogits,
}

impl Inputs {
    pub const ALL: [Inputs; 5] = [
        Inputs::Rms1,
        Inputs::Peaked,
        Inputs::Sink,
        Inputs::Diagonal,
        Inputs::LargeLogits,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Inputs::Rms1 => "rms1",
            Inputs::Peaked => "peaked",
            Inputs::Sink => "sink",
            Inputs::Diagonal => "diagonal",
            Inputs::LargeLogits => "large_logits",
        }
    }
}

impl std::str::FromStr for Inputs {
    type Err = String;
    fn from_str(s: &str) -> Result<Inputs, String> {
        Inputs::ALL
            .into_iter()
            .find(|r| r.name() == s)
            .ok_or_else(|| {
                let known: Vec<&str> = Inputs::ALL.iter().map(|r| r.name()).collect();
                format!("unknown input regime (known: {})", known.join(", "))
            })
    }
}

/// Keys of each request that carry a sink.
pub const SINK_KEYS: usize = 4;
/// Length of a sink key against an RMS-1 key, and how much of each query leans to it.
const SINK_LENGTH: f32 = 8.0;
const SINK_LEAN: f64 = 0.8;
/// Bias spikes: `peaked` draws a height in [PEAK_LOW, PEAK_LOW + PEAK_SPREAD).
const PEAK_LOW: f64 = 10.0;
const PEAK_SPREAD: f64 = 4.0;
const DIAGONAL_SPIKE: f32 = 8.0;
/// Tiles whose boundaries `peaked` straddles (64 divides every kernel's KV tile).
const PEAK_TILE: usize = 64;
/// Powers of two, so scaled values stay exact in every dtype.
const LARGE_QK: f32 = 16.0;
const LARGE_BIAS: f32 = 8192.0;
/// Below fp16's largest finite value (65,504), so no scaled bias becomes infinite.
const BIAS_CAP: f32 = 60_000.0;
/// The ChaCha stream of regime draws (the generator uses 0 and 1 + block).
const STREAM: u64 = u64::MAX;

/// The generated tensors a regime reshapes, and the shape facts it needs.
pub struct Tensors<'a> {
    pub dtype: DType,
    pub head_dim: usize,
    pub rel_extent: usize,
    pub window_left: i64,
    pub page_size: usize,
    /// `(Lq_b, Lk_b)` per request.
    pub requests: &'a [(usize, usize)],
    pub q: &'a mut Array3<f32>,
    pub rel_logits: &'a mut Array3<f32>,
    pub kv: &'a mut [f32],
    pub block_table: &'a Array2<i32>,
    /// Element offset of key `c = 0` of (block, slot, kv head).
    pub key_at: &'a dyn Fn(usize, usize, usize) -> usize,
    pub num_blocks: usize,
    pub num_kv_heads: usize,
    pub seed: u64,
}

/// Reshape freshly generated inputs to the regime.
pub fn apply(regime: Inputs, t: &mut Tensors<'_>) {
    let mut rng = ChaCha8Rng::seed_from_u64(t.seed);
    rng.set_stream(STREAM);
    match regime {
        Inputs::Rms1 => {}
        Inputs::Peaked => peaked(t, &mut rng),
        Inputs::Sink => sink(t, &mut rng),
        Inputs::Diagonal => spikes(t, &|_p| {
            vec![
                (0, DIAGONAL_SPIKE),
                (1, DIAGONAL_SPIKE),
                (2, DIAGONAL_SPIKE),
            ]
        }),
        Inputs::LargeLogits => large(t),
    }
}

/// Rows of each request: `(first packed row, Lq, P = Lk - Lq)`.
fn rows(requests: &[(usize, usize)]) -> Vec<(usize, usize, usize)> {
    let mut start = 0;
    requests
        .iter()
        .map(|&(lq, lk)| {
            let r = (start, lq, lk - lq);
            start += lq;
            r
        })
        .collect()
}

/// Calls `f(packed row, position, reach)` for every real row, `reach` the largest distance its
/// bias entries cover (within the extent and the window). Nothing with an empty extent.
fn each_row(t: &Tensors<'_>, mut f: impl FnMut(usize, usize, usize)) {
    let Some(last) = t.rel_extent.checked_sub(1) else {
        return;
    };
    for (start, lq, prefix) in rows(t.requests) {
        for i in 0..lq {
            let pos = prefix + i;
            let window = Window::from_left(t.window_left);
            let reach = (pos - window.first_visible(pos)).min(last);
            f(start + i, pos, reach);
        }
    }
}

/// Adds `spikes(pos)` (distance, height) to the bias of every real row and head, where the
/// distance is visible and within the extent.
fn spikes(t: &mut Tensors<'_>, spikes: &dyn Fn(usize) -> Vec<(usize, f32)>) {
    let heads = t.q.shape()[1];
    let mut cells = Vec::new();
    each_row(t, |row, pos, reach| {
        for (d, height) in spikes(pos) {
            if d <= reach {
                cells.extend((0..heads).map(|h| ([row, h, d], height)));
            }
        }
    });
    add(t, &cells);
}

/// Adds each height to its rel_logits cell, rounded to the dtype.
fn add(t: &mut Tensors<'_>, cells: &[([usize; 3], f32)]) {
    for &(at, height) in cells {
        let x = &mut t.rel_logits[at];
        *x = t.dtype.round(*x + height);
    }
}

fn peaked(t: &mut Tensors<'_>, rng: &mut ChaCha8Rng) {
    let heads = t.q.shape()[1];
    let mut cells = Vec::new();
    each_row(t, |row, pos, reach| {
        let lowest = pos - reach;
        for h in 0..heads {
            // A tile boundary among the keys the bias reaches, else any such key.
            let first_boundary = lowest.div_ceil(PEAK_TILE).max(1) * PEAK_TILE;
            let centre = if first_boundary <= pos {
                let n = (pos - first_boundary) / PEAK_TILE + 1;
                first_boundary + PEAK_TILE * rng.random_range(0..n)
            } else {
                rng.random_range(lowest..=pos)
            };
            let height = (PEAK_LOW + PEAK_SPREAD * rng.random::<f64>()) as f32;
            for key in centre.saturating_sub(1).max(lowest)..=(centre + 1).min(pos) {
                cells.push(([row, h, pos - key], height));
            }
        }
    });
    add(t, &cells);
}

fn sink(t: &mut Tensors<'_>, rng: &mut ChaCha8Rng) {
    let (d, hkv) = (t.head_dim, t.num_kv_heads);
    let heads = t.q.shape()[1];
    if hkv == 0 || !heads.is_multiple_of(hkv) {
        return; // not a GQA layout: `Problem::new` refuses the case
    }
    let group = heads / hkv.max(1);
    // One unit direction per KV head.
    let dirs: Vec<Vec<f64>> = (0..hkv)
        .map(|_| {
            let v: Vec<f64> = (0..d).map(|_| rng.sample(StandardNormal)).collect();
            let n = v
                .iter()
                .map(|x| x * x)
                .sum::<f64>()
                .sqrt()
                .max(f64::MIN_POSITIVE);
            v.into_iter().map(|x| x / n).collect()
        })
        .collect();
    // Queries lean to their KV head's direction, keeping RMS 1.
    let real: usize = t.requests.iter().map(|r| r.0).sum();
    let root_d = (d as f64).sqrt();
    for row in 0..real {
        for h in 0..heads {
            let u = &dirs[h / group.max(1)];
            let own: Vec<f64> = (0..d)
                .map(|c| f64::from(t.q[[row, h, c]]) / root_d)
                .collect();
            let mixed: Vec<f64> = (0..d)
                .map(|c| SINK_LEAN * u[c] + (1.0 - SINK_LEAN * SINK_LEAN).sqrt() * own[c])
                .collect();
            let n = mixed
                .iter()
                .map(|x| x * x)
                .sum::<f64>()
                .sqrt()
                .max(f64::MIN_POSITIVE);
            for (c, x) in mixed.iter().enumerate() {
                t.q[[row, h, c]] = t.dtype.round((x / n * root_d) as f32);
            }
        }
    }
    // The first keys of every request point that way, long.
    let page = t.page_size.max(1);
    for (b, &(_, lk)) in t.requests.iter().enumerate() {
        for j in 0..SINK_KEYS.min(lk) {
            let block = t.block_table[[b, j / page]] as usize;
            for (kvh, u) in dirs.iter().enumerate() {
                let at = (t.key_at)(block, j % page, kvh);
                if t.kv[at].is_nan() {
                    continue; // a slot no request may read stays poisoned
                }
                for (x, uc) in t.kv[at..at + d].iter_mut().zip(u) {
                    *x = t.dtype.round((uc * root_d) as f32 * SINK_LENGTH);
                }
            }
        }
    }
}

fn large(t: &mut Tensors<'_>) {
    let dtype = t.dtype;
    let real: usize = t.requests.iter().map(|r| r.0).sum();
    for row in 0..real {
        t.q.index_axis_mut(ndarray::Axis(0), row)
            .mapv_inplace(|x| dtype.round(x * LARGE_QK));
        t.rel_logits
            .index_axis_mut(ndarray::Axis(0), row)
            .mapv_inplace(|x| dtype.round((x * LARGE_BIAS).clamp(-BIAS_CAP, BIAS_CAP)));
    }
    let d = t.head_dim;
    for block in 0..t.num_blocks {
        for slot in 0..t.page_size {
            for kvh in 0..t.num_kv_heads {
                let at = (t.key_at)(block, slot, kvh);
                for x in &mut t.kv[at..at + d] {
                    *x = dtype.round(*x * LARGE_QK); // NaN stays NaN
                }
            }
        }
    }
}
