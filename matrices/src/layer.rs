//! Layer kinds: global (no window) or local (window `window_left`), each with its extent `E`.

use relattn_reference::limits::Dim;
use relattn_reference::Window;
use std::fmt;
use std::str::FromStr;

/// A layer's `rel_extent` and window (`window_left = -1`: global).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Layer {
    pub extent: usize,
    pub window_left: i64,
}

impl Layer {
    pub fn global(extent: usize) -> Layer {
        Layer {
            extent,
            window_left: -1,
        }
    }

    /// The model's local layer: window `extent - 1`, so every visible key carries a bias.
    /// (Extents past i64 are refused when a name is parsed; here they saturate.)
    pub fn local(extent: usize) -> Layer {
        Layer {
            extent,
            window_left: i64::try_from(extent).map_or(i64::MAX, |e| e - 1),
        }
    }

    pub fn is_local(&self) -> bool {
        self.window().is_local()
    }

    pub fn window(&self) -> Window {
        Window::from_left(self.window_left)
    }

    /// Keys a query can see at most (`None`: unbounded, global layer).
    pub fn span(&self) -> Option<usize> {
        self.window()
            .span()
            .map(|s| usize::try_from(s).unwrap_or(usize::MAX))
    }
}

/// `global_e1024`, `local_e512` (window 511), or `local_e512_w300` (any other window).
impl fmt::Display for Layer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.is_local() {
            write!(f, "global_e{}", self.extent)
        } else if relattn_reference::window_spans_extent(self.window_left, self.extent) {
            write!(f, "local_e{}", self.extent)
        } else {
            write!(f, "local_e{}_w{}", self.extent, self.window_left)
        }
    }
}

impl FromStr for Layer {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let usage = || {
            format!(
                "unknown layer `{s}` (expected global_e<E>, local_e<E> (window E - 1) or \
                 local_e<E>_w<window>, e.g. global_e1024, local_e512)"
            )
        };
        let number = |t: &str| t.parse::<usize>().map_err(|_| usage());
        // A window is an i64 (docs/operator.md's `window_left`): larger numbers are refused, not
        // wrapped.
        let window = |t: &str| t.parse::<i64>().ok().filter(|w| *w >= 0).ok_or_else(usage);
        let layer = if let Some(rest) = s.strip_prefix("global_e") {
            Layer::global(number(rest)?)
        } else if let Some(rest) = s.strip_prefix("local_e") {
            match rest.split_once("_w") {
                Some((e, w)) => Layer {
                    extent: number(e)?,
                    window_left: window(w)?,
                },
                None => Layer::local(number(rest)?),
            }
        } else {
            return Err(usage());
        };
        if layer.extent == 0 {
            return Err("the extent E must be at least 1".to_string());
        }
        // Checked before the layer is used: `local_e<2^64 - 1>` must not become a global layer.
        Dim::Extent
            .check("the extent E", layer.extent as u128)
            .map_err(|e| e.to_string())?;
        Ok(layer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_up_to_the_largest_window() {
        for name in [
            "global_e1024",
            "local_e512",
            "local_e512_w300",
            "local_e512_w4294967296",
            "local_e512_w9223372036854775807",
        ] {
            let layer: Layer = name.parse().unwrap();
            assert_eq!(layer.to_string(), name);
        }
        assert_eq!(
            "local_e512_w9223372036854775807"
                .parse::<Layer>()
                .unwrap()
                .window_left,
            i64::MAX
        );
        assert!("local_e512_w9223372036854775808".parse::<Layer>().is_err());
        assert!("local_e512_w-3".parse::<Layer>().is_err());
    }

    #[test]
    fn extents_past_int32_are_refused_not_read_as_global() {
        assert_eq!(
            "local_e2147483647".parse::<Layer>().unwrap().window_left,
            2147483646
        );
        for name in [
            "local_e2147483648",
            "local_e18446744073709551615",
            "global_e4294967296",
            "local_e18446744073709551615_w5",
        ] {
            let err = name.parse::<Layer>().unwrap_err();
            assert!(err.contains("out of range 1..=2147483647"), "{name}: {err}");
        }
        assert_eq!(Layer::local(usize::MAX).window_left, i64::MAX);
    }
}
