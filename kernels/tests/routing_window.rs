//! Routing states docs/operator.md section 1's window rule on its own (it depends on no other crate
//! of the workspace); here it is held to the reference's `Window`, which the oracle uses.

use relattn_kernels::routing::{is_local, visible_len, window_spans_extent};
use relattn_reference::{window_spans_extent as reference_spans, Window};

#[test]
fn routing_and_the_reference_agree_on_windows() {
    let windows = [i64::MIN, -2, -1, 0, 1, 127, 511, 1023, 1 << 31, i64::MAX];
    let lengths = [0usize, 1, 2, 128, 511, 512, 513, 1 << 20, usize::MAX];
    let extents = [0usize, 1, 128, 512, 1024, 1 << 31];
    for w in windows {
        let window = Window::from_left(w);
        assert_eq!(is_local(w), window.is_local(), "window_left {w}");
        for kv in lengths {
            assert_eq!(visible_len(kv, w), window.visible_len(kv), "kv {kv} w {w}");
        }
        for e in extents {
            assert_eq!(
                window_spans_extent(w, e),
                reference_spans(w, e),
                "w {w} E {e}"
            );
        }
    }
}
