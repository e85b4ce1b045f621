//! The window rule of docs/operator.md section 1 in one place. On a local layer the query at
//! position `pos` sees key `j` when `d = pos - j` lies in `[0, window_left]`; on a global layer
//! (`window_left < 0`, the `-1` of the operator's signature and of the files) every `d >= 0` is
//! visible.

/// A layer's window, from its `window_left`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Window {
    /// The largest visible distance (`None`: no window).
    left: Option<u64>,
}

impl Window {
    /// No window: a global layer.
    pub const GLOBAL: Window = Window { left: None };

    /// The window of `window_left` (any negative value: none).
    pub fn from_left(window_left: i64) -> Window {
        Window {
            left: u64::try_from(window_left).ok(),
        }
    }

    /// The largest visible distance, `None` on a global layer.
    pub fn left(self) -> Option<u64> {
        self.left
    }

    pub fn is_local(self) -> bool {
        self.left.is_some()
    }

    /// Whether a key at distance `d >= 0` is visible.
    pub fn contains(self, d: u64) -> bool {
        self.left.is_none_or(|w| d <= w)
    }

    /// The first key visible to the query at position `pos`.
    pub fn first_visible(self, pos: usize) -> usize {
        match self.left {
            Some(w) => pos.saturating_sub(usize::try_from(w).unwrap_or(usize::MAX)),
            None => 0,
        }
    }

    /// The inclusive range of keys the query at position `pos` sees: causal, and the window.
    pub fn visible_keys(self, pos: usize) -> (usize, usize) {
        (self.first_visible(pos), pos)
    }

    /// How many keys a query sees at most (`None`: unbounded).
    pub fn span(self) -> Option<u64> {
        self.left.map(|w| w.saturating_add(1))
    }

    /// The keys the last query of a request with `kv_len` keys sees: all of them, or the window.
    pub fn visible_len(self, kv_len: usize) -> usize {
        match self.span() {
            Some(s) => kv_len.min(usize::try_from(s).unwrap_or(usize::MAX)),
            None => kv_len,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_negative_left_is_no_window() {
        for w in [-1, -7, i64::MIN] {
            let g = Window::from_left(w);
            assert_eq!(g, Window::GLOBAL);
            assert!(!g.is_local() && g.contains(u64::MAX));
            assert_eq!(
                (g.first_visible(1000), g.visible_len(1000), g.span()),
                (0, 1000, None)
            );
        }
    }

    #[test]
    fn a_window_sees_distances_zero_to_left() {
        let w = Window::from_left(511);
        assert!(w.is_local() && w.contains(0) && w.contains(511) && !w.contains(512));
        assert_eq!(w.first_visible(511), 0);
        assert_eq!(w.first_visible(600), 89);
        assert_eq!(
            (w.visible_keys(600), Window::GLOBAL.visible_keys(600)),
            ((89, 600), (0, 600))
        );
        assert_eq!(w.span(), Some(512));
        assert_eq!((w.visible_len(100), w.visible_len(8193)), (100, 512));
        // Window 0: only the key itself; a window past every length sees everything.
        let zero = Window::from_left(0);
        assert_eq!((zero.first_visible(9), zero.visible_len(9)), (9, 1));
        let huge = Window::from_left(i64::MAX);
        assert_eq!((huge.first_visible(9), huge.visible_len(9)), (0, 9));
    }
}
