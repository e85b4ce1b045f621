//! The named presets of `relattn gen`: complete specs of typical shapes.

use relattn_reference::gen::{BiasMode, GenSpec, PageMode};

/// Global layers' `E` (docs/operator.md section 1).
pub(super) const GLOBAL_EXTENT: usize = 1024;
/// Local layers' `E = local_extent` (docs/operator.md section 1).
pub(super) const LOCAL_EXTENT: usize = 512;

/// Named presets: (name, what it is).
pub const PRESETS: [(&str, &str); 10] = [
    (
        "tiny",
        "H 4/2, D 32, E 16, page 4, three requests (one empty), 2 padding rows",
    ),
    ("decode", "H 8/1, 8 decode requests, Lk 1..2047"),
    ("prefill", "H 8/1, one 256-token prefill"),
    (
        "prefill2k",
        "H 8/1, one 2048-token prefill (the bench-reference shape)",
    ),
    (
        "chunked",
        "H 8/1, chunked prefills with cached prefixes past E",
    ),
    ("mixed", "H 16/2, 8 decodes + 1 prefill, 7 padding rows"),
    (
        "local",
        "H 8/2, local layer (E 512, window 511), long prefixes",
    ),
    ("gqa16", "H 16/1 (group 16), a prefill chunk and a decode"),
    (
        "verify",
        "H 8/1, speculative-decode verify: 4 requests of 9 queries",
    ),
    (
        "zero_table",
        "H 8/1, all-zero block table (every request aliases block 0)",
    ),
];

/// The spec of a preset, without overrides.
pub fn preset(name: &str) -> Option<GenSpec> {
    let global =
        |h, hkv, requests: &[(usize, usize)]| GenSpec::global(h, hkv, requests.to_vec(), 0);
    let spec = match name {
        "tiny" => GenSpec {
            head_dim: 32,
            rel_extent: 16,
            softmax_scale: 1.0 / 32.0,
            page_size: 4,
            padding_rows: 2,
            bias: BiasMode::Distinct,
            ..global(4, 2, &[(3, 7), (0, 4), (2, 21)])
        },
        "decode" => global(
            8,
            1,
            &[
                (1, 17),
                (1, 100),
                (1, 513),
                (1, 1024),
                (1, 1025),
                (1, 2047),
                (1, 1),
                (1, 64),
            ],
        ),
        "prefill" => global(8, 1, &[(256, 256)]),
        "prefill2k" => global(8, 1, &[(2048, 2048)]),
        "chunked" => global(8, 1, &[(64, 1100), (96, 96), (17, 300)]),
        "mixed" => {
            let mut requests = vec![
                (1, 40),
                (1, 300),
                (1, 1023),
                (1, 1500),
                (1, 7),
                (1, 640),
                (1, 129),
                (1, 2000),
            ];
            requests.push((128, 128));
            GenSpec {
                padding_rows: 7,
                ..global(16, 2, &requests)
            }
        }
        "local" => GenSpec::local(
            8,
            2,
            LOCAL_EXTENT,
            vec![(128, 1200), (1, 700), (40, 40), (1, 512)],
            0,
        ),
        "gqa16" => global(16, 1, &[(33, 300), (1, 1100)]),
        "verify" => global(8, 1, &[(9, 9), (9, 200), (9, 1030), (9, 64)]),
        "zero_table" => GenSpec {
            pages: PageMode::AllZero,
            ..global(8, 1, &[(5, 40), (1, 33), (16, 16)])
        },
        _ => return None,
    };
    Some(spec)
}
