//! Reference outputs.

use ndarray::{Array2, Array3};

/// Output of a reference computation.
///
/// Full mode: `rows` is None, `out` is `[T, H, D]` and `lse` is `[T, H]`; padding rows hold 0
/// in `out` and in `lse`. Sampled mode: `rows` lists the packed rows (ascending) and `out` /
/// `lse` have one entry per listed row, in that order.
#[derive(Debug, Clone, PartialEq)]
pub struct RefOutput {
    pub rows: Option<Vec<usize>>,
    /// Attention output (f64 reference), or the emulation's output (values rounded to the dtype).
    pub out: Array3<f64>,
    /// Natural-log log-sum-exp of the visible scores per (row, head).
    pub lse: Array2<f64>,
}

impl RefOutput {
    /// Packed row index of output row `k`.
    pub fn row(&self, k: usize) -> usize {
        match &self.rows {
            Some(rows) => rows[k],
            None => k,
        }
    }

    pub fn num_rows(&self) -> usize {
        self.out.shape()[0]
    }
}
