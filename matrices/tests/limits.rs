//! Size limits of matrix files (issue 19, item 2): every matrix the parser used to accept and
//! that then crashed `matrix --show` or `run` is refused at load, from the axis lengths and
//! values alone, naming the file, the key, the value and the limit.

use relattn_matrices::{
    Matrix, MatrixError, MAX_CASES, MAX_FORCED_SPLITS, MAX_SPLIT_SETTINGS, MAX_TRIALS,
};
use rstest::rstest;
use std::time::{Duration, Instant};

fn group(lines: &str) -> String {
    format!("[[group]]\n{lines}\n")
}

/// A group with the required axes, `extra` lines appended (later keys must not repeat these).
fn with(layers: &str, heads: &str, mixes: &str, extra: &str) -> String {
    group(&format!(
        "layers = {layers}\nheads = {heads}\nmixes = {mixes}\n{extra}"
    ))
}

fn refused(text: &str) -> (MatrixError, String) {
    let start = Instant::now();
    let err = match Matrix::parse(text, "bad", "bad.toml") {
        Ok(m) => panic!("accepted: {:?}", m.expand().map(|x| x.cases.len())),
        Err(e) => e,
    };
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "{:?}",
        start.elapsed()
    );
    let msg = err.to_string();
    assert!(msg.starts_with("bad.toml: "), "{msg}");
    (err, msg)
}

fn seeds(n: usize) -> String {
    let list: Vec<String> = (0..n).map(|i| i.to_string()).collect();
    format!("seeds = [{}]", list.join(", "))
}

#[test]
fn a_product_of_10_18_cases_is_counted_not_built() {
    let many_seeds = seeds(10_000);
    let ten_of = |axis: &str, v: &str| format!("{axis} = [{}]", [v; 10].join(", "));
    let extra = [
        many_seeds,
        ten_of("head_dims", "128"),
        ten_of("page_sizes", "16"),
        ten_of("layouts", "\"nhd_packed\""),
        ten_of("dtypes", "\"bf16\""),
        ten_of("bias", "\"normal\""),
    ]
    .join("\n");
    let text = with(
        &format!("[{}]", vec!["\"global_e1024\""; 1000].join(", ")),
        &format!("[{}]", vec!["[8, 1]"; 1000].join(", ")),
        &format!("[{}]", vec!["\"decode\""; 1000].join(", ")),
        &extra,
    );
    let (err, msg) = refused(&text);
    assert!(
        matches!(err, MatrixError::TooMany { count, limit, .. } if count == 1_000_000_000_000_000_000 && limit == MAX_CASES),
        "{err:?}"
    );
    assert!(
        msg.contains("[[group]] #1") && msg.contains("100000"),
        "{msg}"
    );
}

#[test]
fn a_product_of_10_8_cases_is_refused() {
    let hundred = |v: &str| format!("[{}]", vec![v; 100].join(", "));
    let text = with(
        &hundred("\"global_e1024\""),
        &hundred("[8, 1]"),
        &hundred("\"decode\""),
        &seeds(100),
    );
    let (err, _) = refused(&text);
    assert!(
        matches!(
            err,
            MatrixError::TooMany {
                count: 100_000_000,
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn groups_within_the_limit_alone_are_counted_together() {
    let one = with(
        "[\"global_e1024\"]",
        "[[8, 1]]",
        "[\"decode\"]",
        &seeds(60_000),
    );
    let (err, msg) = refused(&format!("{one}{one}"));
    assert!(
        matches!(err, MatrixError::TooMany { count: 120_000, .. }),
        "{err:?}"
    );
    assert!(msg.contains("2 groups together"), "{msg}");
    // Trials: cases x split settings x 3 paths.
    let splits: Vec<String> = (1..=MAX_SPLIT_SETTINGS).map(|i| i.to_string()).collect();
    let extra = format!("{}\nsplits = [{}]", seeds(20_000), splits.join(", "));
    let (err, _) = refused(&with(
        "[\"global_e1024\"]",
        "[[8, 1]]",
        "[\"decode\"]",
        &extra,
    ));
    assert!(
        matches!(err, MatrixError::TooMany { count, limit, .. } if count == 20_000 * 32 * 3 && limit == MAX_TRIALS),
        "{err:?}"
    );
}

#[test]
fn extents_page_sizes_and_spare_pages_past_their_ranges() {
    let cases = [
        (
            with("[\"global_e4294967296\"]", "[[8, 1]]", "[\"decode\"]", ""),
            "global_e4294967296",
        ),
        (
            with(
                "[\"global_e1024\"]",
                "[[8, 1]]",
                "[\"decode\"]",
                "page_sizes = [4294967296]",
            ),
            "page_sizes = 4294967296",
        ),
        (
            with(
                "[\"global_e1024\"]",
                "[[8, 1]]",
                "[\"decode\"]",
                "spare_pages = 9223372036854775807",
            ),
            "spare_pages = 9223372036854775807",
        ),
        (
            with(
                "[\"global_e1024\"]",
                "[[8, 1]]",
                "[\"decode\"]",
                "spare_pages = 2147483647",
            ),
            "num_blocks (1 + the pages of mixes + spare_pages)",
        ),
        (
            with(
                "[\"global_e1024\"]",
                "[[8, 1]]",
                "[\"decode\"]",
                "head_dims = [1000000000]",
            ),
            "head_dims = 1000000000",
        ),
        (
            with("[\"global_e1024\"]", "[[65536, 1]]", "[\"decode\"]", ""),
            "[65536, 1]",
        ),
        (
            with(
                "[\"global_e1024\"]",
                "[[8, 1]]",
                "[\"decode\"]",
                "sample_rows = 9223372036854775807",
            ),
            "sample_rows = 9223372036854775807",
        ),
    ];
    for (text, want) in cases {
        let (_, msg) = refused(&text);
        assert!(msg.contains(want) && msg.contains("out of range"), "{msg}");
    }
}

#[test]
fn an_extent_of_2_64_minus_1_is_refused_not_made_global() {
    let (_, msg) = refused(&with(
        "[\"local_e18446744073709551615\"]",
        "[[8, 1]]",
        "[\"decode\"]",
        "",
    ));
    assert!(
        msg.contains("layers") && msg.contains("local_e18446744073709551615"),
        "{msg}"
    );
    assert!(msg.contains("1..=2147483647"), "{msg}");
}

#[rstest]
#[case::three("[[8, 2, 1]]", 3)]
#[case::one("[[8]]", 1)]
#[case::none("[[]]", 0)]
fn head_pairs_of_the_wrong_arity_are_refused(#[case] heads: &str, #[case] arity: usize) {
    let (_, msg) = refused(&with("[\"global_e1024\"]", heads, "[\"decode\"]", ""));
    assert!(
        msg.contains("heads") && msg.contains(&format!("this one has {arity}")),
        "{msg}"
    );
}

#[test]
fn a_window_whose_keys_pass_int32_is_refused_at_load() {
    // window_edges puts Lk at the window + 260: past int32, it was generated as a negative
    // seqused_k at run time.
    let (err, msg) = refused(&with(
        "[\"local_e2147483647\"]",
        "[[8, 1]]",
        "[\"window_edges\"]",
        "",
    ));
    assert!(matches!(err, MatrixError::Limit { .. }), "{err:?}");
    assert!(
        msg.contains("layer local_e2147483647, mix window_edges, page size 16")
            && msg.contains("Lk of request")
            && msg.contains("0..=2147483647"),
        "{msg}"
    );
    // A window wider than any position is legal (the window_beyond_int32 regression) as long
    // as the mix's keys fit.
    Matrix::parse(
        &with(
            "[\"local_e512_w4294967296\"]",
            "[[8, 2]]",
            "[\"decode8_prefill9\"]",
            "",
        ),
        "ok",
        "ok.toml",
    )
    .unwrap();
}

#[test]
fn the_number_and_size_of_split_settings_are_bounded() {
    let list: Vec<String> = (1..=100_000).map(|i| i.to_string()).collect();
    let (_, msg) = refused(&with(
        "[\"global_e1024\"]",
        "[[8, 1]]",
        "[\"decode\"]",
        &format!("splits = [{}]", list.join(", ")),
    ));
    assert!(
        msg.contains("splits = a list of 100000 settings") && msg.contains("at most 32"),
        "{msg}"
    );
    let (_, msg) = refused(&with(
        "[\"global_e1024\"]",
        "[[8, 1]]",
        "[\"decode\"]",
        &format!("splits = [{}]", MAX_FORCED_SPLITS + 1),
    ));
    assert!(
        msg.contains("splits = 1025") && msg.contains("at most 1024"),
        "{msg}"
    );
}

#[test]
fn the_limits_themselves_are_accepted() {
    let splits: Vec<String> = (1..=MAX_SPLIT_SETTINGS).map(|i| i.to_string()).collect();
    let text = with(
        "[\"global_e2147483647\"]",
        "[[1024, 1024]]",
        "[\"decode\"]",
        &format!(
            "head_dims = [256]\npage_sizes = [4096]\nspare_pages = 2000000000\nsplits = [{}]",
            splits.join(", ")
        ),
    );
    let m = Matrix::parse(&text, "edge", "edge.toml").unwrap();
    let x = m.expand().unwrap();
    assert_eq!(x.cases.len(), 1);
    // Generated, it would be far too large: refused by the case-byte limit, not by the parser.
    let err = x.cases[0].check_bytes(1 << 40).unwrap_err();
    assert!(err.to_string().contains("in memory takes"), "{err}");
}
