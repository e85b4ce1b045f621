//! Named batch mixes: the request lists of a case, parameterised by its layer.
//!
//! A mix is a function of the layer because some shapes only mean something relative to the
//! extent or the window (`Lk` at `E - 1`, `E`, `E + 1`; window edges). Add a mix by writing a
//! function below and a row in `MIXES`; matrix files then name it in `mixes = [...]`.

use crate::layer::Layer;
use relattn_reference::PageMode;

/// What a mix decides about a case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MixShape {
    /// `(Lq_b, Lk_b)` per request, `Lk_b >= Lq_b`.
    pub requests: Vec<(usize, usize)>,
    /// NaN rows after the last request.
    pub padding_rows: usize,
    pub pages: PageMode,
    /// Query rows the reference checks when the case is too large for a full check.
    pub sample_rows: Option<usize>,
}

/// A named mix.
#[derive(Debug)]
pub struct Mix {
    pub name: &'static str,
    pub about: &'static str,
    build: fn(Layer) -> MixShape,
}

impl Mix {
    pub fn shape(&self, layer: Layer) -> MixShape {
        (self.build)(layer)
    }
}

/// Every named mix, in the order `relattn matrix` lists them.
pub static MIXES: &[Mix] = &[
    Mix {
        name: "decode",
        about: "decode only, Lk from 1 to 1500",
        build: decode,
    },
    Mix {
        name: "prefill",
        about: "full prefills (P = 0), last one not a tile multiple",
        build: prefill,
    },
    Mix {
        name: "chunked",
        about: "chunked prefill: new tokens over a cached prefix",
        build: chunked,
    },
    Mix {
        name: "mixed",
        about: "decodes, a full prefill and a chunk in one batch",
        build: mixed,
    },
    Mix {
        name: "zero_len_middle",
        about: "requests with Lq = 0 between real ones",
        build: zero_len_middle,
    },
    Mix {
        name: "all_zero_table",
        about: "every block-table entry 0 (warm-up shape)",
        build: all_zero_table,
    },
    Mix {
        name: "prefill_128x16",
        about: "128 prefills of 16 tokens (warm-up shape)",
        build: prefill_128x16,
    },
    Mix {
        name: "decode8_prefill9",
        about: "8 decodes and one (Lq 8, Lk 9) prefill",
        build: decode8_prefill9,
    },
    Mix {
        name: "spec_verify9",
        about: "speculative verify, q_len 9 (bucketed to 16)",
        build: spec_verify9,
    },
    Mix {
        name: "extent_edges",
        about: "Lk at E - 1, E and E + 1",
        build: extent_edges,
    },
    Mix {
        name: "tile_edges",
        about: "Lk and Lq at 127, 128, 129",
        build: tile_edges,
    },
    Mix {
        name: "window_edges",
        about: "first visible key at page and tile edges",
        build: window_edges,
    },
    Mix {
        name: "decode_8193",
        about: "decode at Lk 8193 next to short ones (empty splits)",
        build: decode_8193,
    },
    Mix {
        name: "padding",
        about: "13 NaN padding rows after the last request",
        build: padding,
    },
    Mix {
        name: "decode_padding",
        about: "a decode batch padded to 8 rows (graph replay), Lk up to 3000",
        build: decode_padding,
    },
    Mix {
        name: "empty_kv_requests",
        about: "decodes with seqused_k = 0 requests between them and after them (graph-padded requests), padding rows",
        build: empty_kv_requests,
    },
    Mix {
        name: "zero_len_shift",
        about: "decodes with a zero-length request of 500 keys between them: a kernel that takes packed row t as request t reads the wrong request's keys, finite and wrong",
        build: zero_len_shift,
    },
    Mix {
        name: "empty_kv_batch",
        about: "a graph-replay batch of 8 requests, every one with seqused_k = 0: no real row, 8 padding rows",
        build: empty_kv_batch,
    },
    Mix {
        name: "long_decode_128k",
        about: "decodes over 131072 keys, sampled rows",
        build: long_decode_128k,
    },
    Mix {
        name: "long_chunk_128k",
        about: "a 2048-token chunk over 131072 keys, sampled rows",
        build: long_chunk_128k,
    },
    Mix {
        name: "long_decode_1m",
        about: "decodes over 1048576 keys, sampled rows",
        build: long_decode_1m,
    },
    Mix {
        name: "long_chunk_1m",
        about: "a 2048-token chunk over 1048576 keys, sampled rows",
        build: long_chunk_1m,
    },
    Mix {
        name: "prefill_8k",
        about: "one 8192-token prefill (the benchmark's prefill8k), sampled rows",
        build: prefill_8k,
    },
    Mix {
        name: "mixed_32k",
        about:
            "8 decodes at 32768 keys and a 2048-token chunk over a 30720-token prefix, sampled rows",
        build: mixed_32k,
    },
];

/// Mixes that stand for one regression case each and that the `ci` tier does not run (its
/// coverage test exempts them): their cases exist for the `regressions` tier's bug classes.
pub const REGRESSION_ONLY_MIXES: &[&str] =
    &["empty_kv_requests", "zero_len_shift", "empty_kv_batch"];

/// The mix called `name`.
pub fn mix(name: &str) -> Option<&'static Mix> {
    MIXES.iter().find(|m| m.name == name)
}

/// Requests with `Lk` raised to `Lq` where a layer-relative length would be too short, so every
/// mix is valid input for every extent.
fn shape(requests: &[(usize, usize)]) -> MixShape {
    MixShape {
        requests: requests.iter().map(|&(q, k)| (q, k.max(q))).collect(),
        padding_rows: 0,
        pages: PageMode::Shuffled,
        sample_rows: None,
    }
}

fn sampled(requests: &[(usize, usize)], rows: usize) -> MixShape {
    MixShape {
        sample_rows: Some(rows),
        ..shape(requests)
    }
}

fn decode(_: Layer) -> MixShape {
    shape(&[(1, 1), (1, 77), (1, 640), (1, 1500)])
}

fn prefill(_: Layer) -> MixShape {
    shape(&[(37, 37), (200, 200)])
}

fn chunked(_: Layer) -> MixShape {
    shape(&[(64, 700), (32, 1800)])
}

fn mixed(_: Layer) -> MixShape {
    shape(&[(1, 700), (48, 48), (1, 33), (40, 1200), (1, 1)])
}

fn zero_len_middle(_: Layer) -> MixShape {
    shape(&[(5, 300), (0, 0), (0, 200), (7, 7), (0, 50), (3, 900)])
}

fn all_zero_table(_: Layer) -> MixShape {
    MixShape {
        pages: PageMode::AllZero,
        ..shape(&[(16, 16), (1, 40), (8, 100), (0, 30), (1, 1)])
    }
}

fn prefill_128x16(_: Layer) -> MixShape {
    shape(&[(16, 16); 128])
}

fn decode8_prefill9(_: Layer) -> MixShape {
    shape(&[
        (1, 30),
        (1, 200),
        (1, 513),
        (1, 1),
        (1, 1025),
        (1, 64),
        (1, 129),
        (1, 900),
        (8, 9),
    ])
}

fn spec_verify9(_: Layer) -> MixShape {
    shape(&[(9, 9), (9, 130), (9, 1000)])
}

fn extent_edges(layer: Layer) -> MixShape {
    let e = layer.extent;
    shape(&[
        (1, e.saturating_sub(1)),
        (1, e),
        (1, e + 1),
        (3, e + 1),
        (2, e),
    ])
}

fn tile_edges(_: Layer) -> MixShape {
    shape(&[
        (1, 127),
        (1, 128),
        (1, 129),
        (127, 127),
        (128, 128),
        (129, 129),
    ])
}

/// Decodes whose oldest visible key sits just before, on and after page (16) and tile (128)
/// edges; on global layers the same lengths past `E`.
fn window_edges(layer: Layer) -> MixShape {
    let b = layer.span().unwrap_or(layer.extent);
    shape(&[
        (1, b + 15),
        (1, b + 16),
        (1, b + 17),
        (1, b + 127),
        (1, b + 128),
        (1, b + 129),
        (4, b + 260),
    ])
}

fn decode_8193(_: Layer) -> MixShape {
    shape(&[(1, 8193), (1, 3), (1, 100)])
}

fn padding(_: Layer) -> MixShape {
    MixShape {
        padding_rows: 13,
        ..shape(&[(3, 50), (1, 400), (20, 20)])
    }
}

fn decode_padding(_: Layer) -> MixShape {
    MixShape {
        padding_rows: 3,
        ..shape(&[(1, 900), (1, 3000), (1, 17), (1, 2048), (1, 1)])
    }
}

/// A decode batch as a graph replay hands it over: requests with `seqused_k = 0` (so `Lq = 0`:
/// they have no rows) between real decodes and after them (the requests a batch is padded with),
/// and padding rows after the last real row. Nothing may be written for the empty requests.
fn empty_kv_requests(_: Layer) -> MixShape {
    MixShape {
        padding_rows: 3,
        ..shape(&[(1, 700), (0, 0), (1, 3000), (1, 77), (0, 0), (0, 0)])
    }
}

/// Decodes with a zero-length request between them whose cache is not empty (`Lq = 0`,
/// `Lk = 500`: a request with nothing new to compute): every row after it belongs to the next
/// request. A decode kernel that takes packed row t as request t (never reading `cu_seqlens_q`)
/// gives those rows the previous request's keys: finite, wrong values, no NaN, which tells that
/// defect from one that leaves an empty split's partials unwritten (`empty_kv_requests` gives
/// NaN either way).
fn zero_len_shift(_: Layer) -> MixShape {
    shape(&[(1, 700), (0, 500), (1, 3000), (1, 77)])
}

/// A batch with no real row at all: 8 requests of `seqused_k = 0` and the 8 padding rows of a
/// graph replay. The right output is no write: every row is padding and stays as it was.
fn empty_kv_batch(_: Layer) -> MixShape {
    MixShape {
        padding_rows: 8,
        ..shape(&[(0, 0); 8])
    }
}

fn long_decode_128k(_: Layer) -> MixShape {
    sampled(&[(1, 131072), (1, 100_003)], 16)
}

fn long_chunk_128k(_: Layer) -> MixShape {
    sampled(&[(2048, 131072)], 32)
}

fn long_decode_1m(_: Layer) -> MixShape {
    sampled(&[(1, 1 << 20), (1, (1 << 19) + 1)], 16)
}

fn long_chunk_1m(_: Layer) -> MixShape {
    sampled(&[(2048, 1 << 20)], 32)
}

fn prefill_8k(_: Layer) -> MixShape {
    sampled(&[(8192, 8192)], 64)
}

fn mixed_32k(_: Layer) -> MixShape {
    let mut requests = vec![(1, 32768); 8];
    requests.push((2048, 32768));
    sampled(&requests, 64)
}
