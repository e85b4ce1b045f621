//! The shape of a batch in one place: per request its query and key lengths, and the layer's
//! window. Generation, `Problem`, a matrix `Case` and the kernels' launch geometry all read their
//! lengths, maxima, decode-only test, visible pairs and FLOPs from here.

use crate::window::Window;

/// Per request `(Lq, Lk)` (query rows, keys including them) and the window.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BatchShape {
    pub requests: Vec<(usize, usize)>,
    pub window: Window,
}

impl BatchShape {
    pub fn new(requests: Vec<(usize, usize)>, window: Window) -> BatchShape {
        BatchShape { requests, window }
    }

    /// `B`.
    pub fn batch(&self) -> usize {
        self.requests.len()
    }

    /// `cu_seqlens_q[B]`: the rows that belong to a request.
    pub fn real_rows(&self) -> usize {
        self.requests.iter().map(|r| r.0).sum()
    }

    pub fn max_query_len(&self) -> usize {
        self.requests.iter().map(|r| r.0).max().unwrap_or(0)
    }

    pub fn max_kv_len(&self) -> usize {
        self.requests.iter().map(|r| r.1).max().unwrap_or(0)
    }

    /// Every request has at most one new token (what a decode kernel takes).
    pub fn is_decode_only(&self) -> bool {
        self.max_query_len() <= 1
    }

    /// Some request has exactly one new token.
    pub fn has_decode_request(&self) -> bool {
        self.requests.iter().any(|r| r.0 == 1)
    }

    /// Inclusive range of keys visible to query `i` of a request with `(q_len, kv_len)`: causal
    /// from the cached prefix, and the window on local layers.
    pub fn visible_keys(&self, (q_len, kv_len): (usize, usize), i: usize) -> (usize, usize) {
        self.window.visible_keys(kv_len.saturating_sub(q_len) + i)
    }

    /// Visible (query, key) pairs over all real rows, per head.
    pub fn visible_pairs(&self) -> u64 {
        let mut pairs = 0u64;
        for &r in &self.requests {
            for i in 0..r.0 {
                let (first, last) = self.visible_keys(r, i);
                pairs += (last - first + 1) as u64;
            }
        }
        pairs
    }

    /// Work of one full evaluation in FLOP: 4 x visible pairs x D x H (QK^T and PV, a multiply
    /// and an add each).
    pub fn flops(&self, num_heads: usize, head_dim: usize) -> f64 {
        4.0 * self.visible_pairs() as f64 * head_dim as f64 * num_heads as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_maxima_and_pairs_of_a_mixed_batch() {
        // A decode over 10 keys, a 3-row chunk over 8 keys, an empty request.
        let global = BatchShape::new(vec![(1, 10), (3, 8), (0, 4)], Window::GLOBAL);
        assert_eq!((global.batch(), global.real_rows()), (3, 4));
        assert_eq!((global.max_query_len(), global.max_kv_len()), (3, 10));
        assert!(!global.is_decode_only() && global.has_decode_request());
        assert_eq!(global.visible_keys((3, 8), 0), (0, 5));
        // 10 + (6 + 7 + 8) keys seen.
        assert_eq!(global.visible_pairs(), 31);
        assert_eq!(global.flops(2, 4), 4.0 * 31.0 * 4.0 * 2.0);
        let local = BatchShape::new(global.requests.clone(), Window::from_left(2));
        assert_eq!(local.visible_keys((3, 8), 2), (5, 7));
        assert_eq!(local.visible_pairs(), 3 + 3 * 3);
        let decode = BatchShape::new(vec![(1, 5), (0, 0), (1, 1)], Window::GLOBAL);
        assert!(decode.is_decode_only());
        assert!(BatchShape::new(Vec::new(), Window::GLOBAL).is_decode_only());
    }
}
