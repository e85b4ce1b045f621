//! Size limits of case files: dimensions out of the operator's ranges and cases over the
//! case-byte limit are refused from the shapes alone, naming the file, the tensor, the value
//! and the limit, before any tensor is decoded or any loop runs.

use super::*;
use relattn_reference::casefile::read_case_limited;
use relattn_reference::limits::{LimitError, INT32_MAX, MAX_HEAD_DIM};
use std::time::{Duration, Instant};

fn limit_err(path: &Path, limit: u64) -> (LimitError, String) {
    let start = Instant::now();
    let err = read_case_limited(path, limit).expect_err("an oversized case was accepted");
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "{:?}",
        start.elapsed()
    );
    let msg = err.to_string();
    assert!(msg.contains("case.safetensors"), "{msg}");
    match err {
        CaseFileError::Limit { error, .. } => (error, msg),
        other => panic!("expected a limit error, got {other:?}"),
    }
}

/// Issue 19, item 1: empty caches whose shapes claim 2^40 blocks of head dim 0 made the cache
/// copy loop run 2^40 times before anything was validated.
#[test]
fn empty_caches_claiming_2_40_blocks_are_refused_at_once() {
    let (_dir, path, _) = case_file();
    for name in ["key_cache", "value_cache"] {
        replace_with(
            &path,
            name,
            Dtype::BF16,
            Some(vec![1 << 40, 1, 1, 0]),
            Some(vec![]),
        );
    }
    let (err, msg) = limit_err(&path, u64::MAX);
    assert!(
        matches!(err, LimitError::Range { value, .. } if value == 1 << 40),
        "{err:?}"
    );
    assert!(
        msg.contains("`key_cache` dim 0 (num_blocks) = 1099511627776")
            && msg.contains("0..=2147483647"),
        "{msg}"
    );
}

/// The same with a block count in range: the zero head dim alone is refused, so no loop runs
/// over the other dimensions.
#[test]
fn a_zero_head_dim_is_refused_before_the_copy_loop() {
    let (_dir, path, _) = case_file();
    for name in ["key_cache", "value_cache"] {
        let shape = vec![INT32_MAX, 4096, 1024, 0];
        replace_with(&path, name, Dtype::BF16, Some(shape), Some(vec![]));
    }
    let (_, msg) = limit_err(&path, u64::MAX);
    assert!(msg.contains("`key_cache` dim 3 (D) = 0"), "{msg}");
}

#[test]
fn every_dimension_is_held_to_its_range() {
    let cases: [(&str, Dtype, Vec<usize>, &str); 5] = [
        (
            "q",
            Dtype::BF16,
            vec![0, 4, MAX_HEAD_DIM + 1],
            "`q` dim 2 (D) = 257",
        ),
        (
            "q",
            Dtype::BF16,
            vec![0, 1 << 20, 16],
            "`q` dim 1 (H) = 1048576",
        ),
        (
            "rel_logits",
            Dtype::BF16,
            vec![0, 4, 1 << 32],
            "`rel_logits` dim 2 (E) = 4294967296",
        ),
        (
            "block_table",
            Dtype::I32,
            vec![0, 1 << 31],
            "`block_table` dim 1 (max_pages) = 2147483648",
        ),
        (
            "block_table",
            Dtype::I32,
            vec![1 << 33, 0],
            "`block_table` dim 0 (B) = 8589934592",
        ),
    ];
    for (name, dtype, shape, want) in cases {
        let (_dir, path, _) = case_file();
        replace_with(&path, name, dtype, Some(shape), Some(vec![]));
        let (_, msg) = limit_err(&path, u64::MAX);
        assert!(msg.contains(want), "{msg}");
    }
}

#[test]
fn metadata_extent_past_int32_is_refused() {
    let (_dir, path, _) = case_file();
    rewrite(&path, |_, m| {
        m.insert("rel_extent".into(), "18446744073709551615".into());
    });
    let (_, msg) = limit_err(&path, u64::MAX);
    assert!(
        msg.contains("metadata `rel_extent` = 18446744073709551615"),
        "{msg}"
    );
}

#[test]
fn the_byte_limit_bounds_the_file_and_the_tensors() {
    let (_dir, path, p) = case_file();
    let file_len = std::fs::metadata(&path).unwrap().len();
    // The file alone over the limit: refused before it is read.
    let (err, msg) = limit_err(&path, file_len - 1);
    assert!(
        matches!(err, LimitError::TooLarge { bytes, limit, .. } if bytes == file_len && limit == file_len - 1),
        "{err:?}"
    );
    assert!(
        msg.contains("the file takes") && msg.contains("the limit given"),
        "{msg}"
    );
    // The file fits, its tensors in memory (f32, twice the bf16 bytes) do not.
    let (err, msg) = limit_err(&path, file_len);
    assert!(matches!(err, LimitError::TooLarge { .. }), "{err:?}");
    assert!(msg.contains("the case in memory takes"), "{msg}");
    // Empty tensors whose shapes claim gigabytes count at their claimed size.
    let (_dir, path, _) = case_file();
    replace_with(
        &path,
        "rel_logits",
        Dtype::BF16,
        Some(vec![0, p.num_heads, 1 << 30]),
        Some(vec![]),
    );
    replace_with(
        &path,
        "q",
        Dtype::BF16,
        Some(vec![0, p.num_heads, p.head_dim]),
        Some(vec![]),
    );
    // T = 0 makes both empty: they need nothing, and the case is refused for other reasons.
    assert!(!matches!(
        read_case_limited(&path, 1 << 20),
        Err(CaseFileError::Limit { .. })
    ));
    assert!(read_case_limited(&path, u64::MAX).is_err());
}

#[test]
fn a_case_at_the_limit_is_read() {
    let (_dir, path, p) = case_file();
    let file_len = std::fs::metadata(&path).unwrap().len();
    let size = relattn_reference::limits::CaseSize {
        rows: p.total_rows(),
        heads: p.num_heads,
        kv_heads: p.num_kv_heads,
        head_dim: p.head_dim,
        extent: p.rel_extent,
        page_size: p.page_size,
        blocks: p.num_blocks,
        batch: p.batch(),
        max_pages: p.max_pages(),
    };
    let limit = size.bytes().max(file_len);
    assert_same(&p, &read_case_limited(&path, limit).unwrap().problem);
    assert!(read_case_limited(&path, limit - 1).is_err());
}
