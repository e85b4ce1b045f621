//! The shapes `relattn bench` times (D = 128, bf16, page 128 unless named), and the work each
//! one asks for: FLOP counted as 4 x visible (query, key) pairs x D x H, bytes as the K/V bytes the
//! requests must read, plus the fewest bytes any kernel must move (for the roofline floor).

use crate::engine::kv_bytes;
use relattn_reference::gen::{BiasMode, GenSpec};
use relattn_reference::Problem;
use serde::{Deserialize, Serialize};

/// Every shape, in the order they run.
pub const SHAPES: [&str; 7] = [
    "prefill8k",
    "prefill8k_local",
    "prefill8k_p16",
    "decode128k",
    "decode1m",
    "decode8k_b32",
    "mixed",
];

/// One line per shape, for help texts and reports.
pub fn about(name: &str) -> Option<&'static str> {
    Some(match name {
        "prefill8k" => "1 request, Lq = Lk = 8192, H 64 / Hkv 8, global E 1024",
        "prefill8k_local" => "1 request, Lq = Lk = 8192, H 64 / Hkv 8, local window 511, E 512",
        "prefill8k_p16" => "prefill8k with page 16",
        "decode128k" => "1 request, Lq 1, Lk 131072, H 64 / Hkv 8, global E 1024",
        "decode1m" => "1 request, Lq 1, Lk 1048576, H 8 / Hkv 1, global E 1024",
        "decode8k_b32" => "32 requests, Lq 1, Lk 8192, H 64 / Hkv 8, global E 1024",
        "mixed" => {
            "8 decodes at Lk 32768 + one 2048-token chunk over a 30720 prefix (Lk 32768), H 64 / Hkv 8, global E 1024"
        }
        _ => return None,
    })
}

/// The generation spec of shape `name`: the model's inputs (RMS-normed q and k, rank-16 bias,
/// scale 1/128, NHD packed cache, shuffled pages); no NaN poison in unread cache slots, which
/// timing does not need and which would cost a pass over the cache.
pub fn spec(name: &str, seed: u64) -> Option<GenSpec> {
    let global = |h, hkv, requests| GenSpec::global(h, hkv, requests, seed);
    let mut spec = match name {
        "prefill8k" | "prefill8k_p16" => global(64, 8, vec![(8192, 8192)]),
        "prefill8k_local" => GenSpec::local(64, 8, 512, vec![(8192, 8192)], seed),
        "decode128k" => global(64, 8, vec![(1, 131072)]),
        "decode1m" => global(8, 1, vec![(1, 1 << 20)]),
        "decode8k_b32" => global(64, 8, vec![(1, 8192); 32]),
        "mixed" => {
            let mut requests = vec![(1, 32768); 8];
            requests.push((2048, 30720 + 2048));
            global(64, 8, requests)
        }
        _ => return None,
    };
    spec.page_size = if name == "prefill8k_p16" { 16 } else { 128 };
    spec.bias = BiasMode::Normal;
    spec.poison = false;
    Some(spec)
}

/// `all` or a comma-separated list of shape names (each kept once, in the order given).
pub fn parse_shapes(list: &str) -> Result<Vec<&'static str>, String> {
    if list.trim() == "all" {
        return Ok(SHAPES.to_vec());
    }
    let mut out = Vec::new();
    for name in list.split(',').map(str::trim) {
        let Some(&known) = SHAPES.iter().find(|&&s| s == name) else {
            return Err(format!(
                "unknown shape `{name}`: use all, or some of {}",
                SHAPES.join(", ")
            ));
        };
        if !out.contains(&known) {
            out.push(known);
        }
    }
    Ok(out)
}

/// The work a problem asks for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Figures {
    /// Visible (query, key) pairs, summed over requests (one head).
    pub visible_pairs: u64,
    /// 4 x visible pairs x D x H (two matrix products of 2 FLOP per multiply-add).
    pub flops: f64,
    /// K/V bytes the requests must read (each visible key once, K and V, every KV head).
    pub kv_bytes: f64,
    /// The fewest bytes any kernel must move: the K/V bytes, q and out of the real rows, and the
    /// `rel_logits` cells of visible distances below E.
    pub min_bytes: f64,
}

impl Figures {
    pub fn of(p: &Problem) -> Figures {
        let width = p.dtype.size_bytes() as f64;
        let mut bias_cells = 0u64;
        for r in p.requests() {
            for i in 0..r.q_len {
                let (first, last) = p.visible_keys(&r, i);
                bias_cells += (last - first + 1).min(p.rel_extent) as u64;
            }
        }
        let row_elems = (p.real_rows() * p.num_heads * p.head_dim) as f64;
        let kv = kv_bytes(p);
        Figures {
            visible_pairs: p.visible_pairs(),
            flops: p.flops(),
            kv_bytes: kv,
            min_bytes: kv
                + 2.0 * row_elems * width
                + (bias_cells * p.num_heads as u64) as f64 * width,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use relattn_reference::gen::generate;
    use relattn_reference::DType;

    /// A copy of `spec` with one head of dimension 1 and no bias table wider than needed: the same
    /// requests, window and pages, cheap enough to generate in a unit test.
    fn skinny(spec: &GenSpec) -> GenSpec {
        GenSpec {
            num_heads: 1,
            num_kv_heads: 1,
            head_dim: 1,
            ..spec.clone()
        }
    }

    /// (name, H, Hkv, E, window_left, page, requests, visible pairs, K/V bytes), by hand.
    #[allow(clippy::type_complexity)]
    fn expected() -> Vec<(&'static str, usize, usize, usize, i64, usize, u64, f64)> {
        let causal_8k = 8192u64 * 8193 / 2;
        // Local: rows 0..511 see i + 1 keys, every later row 512.
        let local_8k = 512u64 * 513 / 2 + (8192 - 512) * 512;
        // Chunk rows see 30720 + i + 1 keys.
        let mixed = 8 * 32768 + 2048 * 30720 + 2048 * 2049 / 2;
        // Bytes per key: K and V, Hkv heads, D = 128, bf16.
        let key = |hkv: f64| 2.0 * hkv * 128.0 * 2.0;
        vec![
            (
                "prefill8k",
                64,
                8,
                1024,
                -1,
                128,
                causal_8k,
                8192.0 * key(8.0),
            ),
            (
                "prefill8k_local",
                64,
                8,
                512,
                511,
                128,
                local_8k,
                8192.0 * key(8.0),
            ),
            (
                "prefill8k_p16",
                64,
                8,
                1024,
                -1,
                16,
                causal_8k,
                8192.0 * key(8.0),
            ),
            (
                "decode128k",
                64,
                8,
                1024,
                -1,
                128,
                131072,
                131072.0 * key(8.0),
            ),
            (
                "decode1m",
                8,
                1,
                1024,
                -1,
                128,
                1 << 20,
                1048576.0 * key(1.0),
            ),
            (
                "decode8k_b32",
                64,
                8,
                1024,
                -1,
                128,
                32 * 8192,
                32.0 * 8192.0 * key(8.0),
            ),
            (
                "mixed",
                64,
                8,
                1024,
                -1,
                128,
                mixed,
                9.0 * 32768.0 * key(8.0),
            ),
        ]
    }

    #[test]
    fn shapes_match_their_definition_and_work_counts() {
        let table = expected();
        assert_eq!(table.len(), SHAPES.len());
        for (name, h, hkv, e, window, page, pairs, bytes) in table {
            let s = spec(name, 7).unwrap();
            let what = format!("shape {name}");
            assert_eq!((s.num_heads, s.num_kv_heads), (h, hkv), "{what}");
            assert_eq!((s.head_dim, s.dtype), (128, DType::Bf16), "{what}");
            assert_eq!(
                (s.rel_extent, s.window_left, s.page_size),
                (e, window, page),
                "{what}"
            );
            assert_eq!(s.softmax_scale, 1.0 / 128.0, "{what}");
            assert!(about(name).is_some(), "{what}");
            // Counts depend on requests and window only; scale the skinny problem's by H and D.
            let p = generate(&skinny(&s)).unwrap();
            let f = Figures::of(&p);
            assert_eq!(f.visible_pairs, pairs, "{what}");
            assert_eq!(
                f.flops * (h * 128) as f64,
                4.0 * pairs as f64 * 128.0 * h as f64
            );
            assert_eq!(f.kv_bytes * (hkv * 128) as f64, bytes, "{what}");
        }
        assert_eq!(spec("decode128k", 1).unwrap().requests, vec![(1, 131072)]);
        let mixed = spec("mixed", 1).unwrap().requests;
        assert_eq!(mixed.len(), 9);
        assert_eq!(mixed[8], (2048, 32768));
        assert!(mixed[..8].iter().all(|&r| r == (1, 32768)));
        assert_eq!(
            spec("decode8k_b32", 1).unwrap().requests,
            vec![(1, 8192); 32]
        );
        assert!(spec("prefill9k", 1).is_none());
    }

    #[test]
    fn figures_count_the_real_problem() {
        // A small problem at full width: FLOP and the fewest bytes, by hand.
        let mut s = GenSpec::local(4, 2, 4, vec![(6, 10), (1, 3)], 3);
        s.poison = false;
        let p = generate(&s).unwrap();
        let f = Figures::of(&p);
        // Request 0 (prefix 4, window 3): row i sees keys 1 + i ..= 4 + i, 4 keys each.
        // Request 1 (prefix 2): the one row sees keys 0..=2, 3 keys.
        assert_eq!(f.visible_pairs, 6 * 4 + 3);
        assert_eq!(f.flops, 4.0 * 27.0 * 128.0 * 4.0);
        // K/V: request 0 reads keys 1..10 (9 keys: the first row's window starts at 4 - 3),
        // request 1 keys 0..3; 2 (K, V) x 2 KV heads x 128 x 2 bytes each.
        let kv = (9.0 + 3.0) * 2.0 * 2.0 * 128.0 * 2.0;
        assert_eq!(f.kv_bytes, kv);
        // q and out: 7 rows x 4 heads x 128 x 2 bytes; bias: 27 cells (all distances < E = 4).
        assert_eq!(
            f.min_bytes,
            kv + 2.0 * 7.0 * 4.0 * 128.0 * 2.0 + 27.0 * 4.0 * 2.0
        );
    }

    #[test]
    fn shape_lists_parse() {
        assert_eq!(parse_shapes("all").unwrap(), SHAPES.to_vec());
        assert_eq!(
            parse_shapes("decode1m, prefill8k,decode1m").unwrap(),
            vec!["decode1m", "prefill8k"]
        );
        let e = parse_shapes("prefill8k,prefil").unwrap_err();
        assert!(e.contains("`prefil`") && e.contains("decode8k_b32"), "{e}");
        assert!(parse_shapes("").is_err());
    }
}
