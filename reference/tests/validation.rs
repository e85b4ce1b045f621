//! Each validation error of `Problem::new` names the field and the values at fault.

use ndarray::{Array2, Array3};
use relattn_reference::{CacheLayout, DType, Problem, ProblemData, ProblemError};
use rstest::rstest;

/// A small valid problem: H = 4, Hkv = 2, D = 4, E = 8, page 4, two requests
/// (Lq 2, Lk 5) and (Lq 1, Lk 3), one padding row (T = 4), four physical blocks.
fn valid() -> ProblemData {
    let (t, h, hkv, d, e, page, blocks) = (4, 4, 2, 4, 8, 4, 4);
    let (k, v, len) = CacheLayout::Contiguous.views(blocks, page, hkv, d);
    ProblemData {
        dtype: DType::F32,
        num_heads: h,
        num_kv_heads: hkv,
        head_dim: d,
        rel_extent: e,
        page_size: page,
        num_blocks: blocks,
        softmax_scale: 0.25,
        window_left: -1,
        q: Array3::zeros((t, h, d)),
        rel_logits: Array3::zeros((t, h, e)),
        kv: vec![0.0; len],
        layout: CacheLayout::Contiguous,
        rows: Default::default(),
        k,
        v,
        block_table: Array2::from_shape_vec((2, 2), vec![1, 2, 3, 0]).unwrap(),
        seqused_k: vec![5, 3],
        cu_seqlens_q: vec![0, 2, 3],
    }
}

/// The error `Problem::new` gives for `data`, and its message.
fn reject(data: ProblemData) -> (ProblemError, String) {
    let err = Problem::new(data).expect_err("invalid problem was accepted");
    let msg = err.to_string();
    (err, msg)
}

fn assert_mentions(msg: &str, parts: &[&str]) {
    for part in parts {
        assert!(
            msg.contains(part),
            "message {msg:?} does not mention {part:?}"
        );
    }
}

#[test]
fn baseline_is_valid() {
    let p = Problem::new(valid()).unwrap();
    assert_eq!(p.real_rows(), 3);
    assert_eq!(p.total_rows(), 4);
}

#[test]
fn heads_not_a_multiple_of_kv_heads() {
    let mut data = valid();
    data.num_heads = 3;
    let (err, msg) = reject(data);
    assert_eq!(
        err,
        ProblemError::HeadsNotMultiple {
            heads: 3,
            kv_heads: 2
        }
    );
    assert_mentions(&msg, &["num_heads (3)", "num_kv_heads (2)"]);
}

#[test]
fn more_kv_heads_than_heads() {
    let mut data = valid();
    data.num_kv_heads = 8;
    let (err, msg) = reject(data);
    assert_eq!(
        err,
        ProblemError::HeadsNotMultiple {
            heads: 4,
            kv_heads: 8
        }
    );
    assert_mentions(&msg, &["num_heads (4)", "num_kv_heads (8)"]);
}

#[rstest]
fn zero_sizes(#[values("num_heads", "num_kv_heads", "head_dim")] field: &'static str) {
    let mut data = valid();
    match field {
        "num_heads" => data.num_heads = 0,
        "num_kv_heads" => data.num_kv_heads = 0,
        _ => data.head_dim = 0,
    }
    let (err, msg) = reject(data);
    assert_eq!(err, ProblemError::Zero { field });
    assert_mentions(&msg, &[field, "0"]);
}

#[test]
fn rel_extent_zero() {
    let mut data = valid();
    data.rel_extent = 0;
    let (err, msg) = reject(data);
    assert_eq!(
        err,
        ProblemError::Zero {
            field: "rel_extent"
        }
    );
    assert_mentions(&msg, &["rel_extent", "0"]);
}

#[test]
fn page_size_zero() {
    let mut data = valid();
    data.page_size = 0;
    let (err, msg) = reject(data);
    assert_eq!(err, ProblemError::Zero { field: "page_size" });
    assert_mentions(&msg, &["page_size", "0"]);
}

#[test]
fn q_head_dim_differs_from_head_dim() {
    let mut data = valid();
    data.q = Array3::zeros((4, 4, 5));
    let (err, msg) = reject(data);
    assert_eq!(
        err,
        ProblemError::Shape {
            tensor: "q",
            actual: vec![4, 4, 5],
            expected: vec![4, 4, 4]
        }
    );
    assert_mentions(&msg, &["`q`", "[4, 4, 5]", "[4, 4, 4]"]);
}

#[test]
fn q_heads_differ_from_num_heads() {
    let mut data = valid();
    data.q = Array3::zeros((4, 2, 4));
    let (err, msg) = reject(data);
    assert_eq!(
        err,
        ProblemError::Shape {
            tensor: "q",
            actual: vec![4, 2, 4],
            expected: vec![4, 4, 4]
        }
    );
    assert_mentions(&msg, &["`q`", "[4, 2, 4]", "[4, 4, 4]"]);
}

#[test]
fn rel_logits_extent_differs_from_rel_extent() {
    let mut data = valid();
    data.rel_logits = Array3::zeros((4, 4, 7));
    let (err, msg) = reject(data);
    assert_eq!(
        err,
        ProblemError::Shape {
            tensor: "rel_logits",
            actual: vec![4, 4, 7],
            expected: vec![4, 4, 8]
        }
    );
    assert_mentions(&msg, &["`rel_logits`", "[4, 4, 7]", "[4, 4, 8]"]);
}

#[test]
fn rel_logits_rows_differ_from_q_rows() {
    let mut data = valid();
    data.rel_logits = Array3::zeros((3, 4, 8));
    let (err, msg) = reject(data);
    assert_eq!(
        err,
        ProblemError::Shape {
            tensor: "rel_logits",
            actual: vec![3, 4, 8],
            expected: vec![4, 4, 8]
        }
    );
    assert_mentions(&msg, &["`rel_logits`", "[3, 4, 8]", "[4, 4, 8]"]);
}

#[test]
fn rel_logits_heads_differ_from_num_heads() {
    // GQA does not share the bias: one row per query head.
    let mut data = valid();
    data.rel_logits = Array3::zeros((4, 2, 8));
    let (err, _) = reject(data);
    assert_eq!(
        err,
        ProblemError::Shape {
            tensor: "rel_logits",
            actual: vec![4, 2, 8],
            expected: vec![4, 4, 8]
        }
    );
}

#[test]
fn cache_smaller_than_its_views() {
    let mut data = valid();
    let full = data.kv.len();
    data.kv.truncate(full - 1);
    let (err, msg) = reject(data);
    assert_eq!(
        err,
        ProblemError::CacheTooSmall {
            actual: full - 1,
            needed: full
        }
    );
    assert_mentions(&msg, &[&(full - 1).to_string(), &full.to_string()]);
}

#[test]
fn cache_views_for_more_blocks_than_the_buffer() {
    let mut data = valid();
    data.num_blocks = 5;
    let (err, _) = reject(data);
    assert!(matches!(err, ProblemError::CacheTooSmall { actual: 256, needed } if needed > 256));
}

#[test]
fn cu_seqlens_wrong_length() {
    let mut data = valid();
    data.cu_seqlens_q = vec![0, 2];
    let (err, msg) = reject(data);
    assert_eq!(
        err,
        ProblemError::CuSeqlensLen {
            expected: 3,
            actual: 2
        }
    );
    assert_mentions(&msg, &["cu_seqlens_q", "3", "2"]);
}

#[test]
fn cu_seqlens_not_starting_at_zero() {
    let mut data = valid();
    data.cu_seqlens_q = vec![1, 2, 3];
    let (err, msg) = reject(data);
    assert_eq!(err, ProblemError::CuSeqlensStart(1));
    assert_mentions(&msg, &["cu_seqlens_q[0]", "got 1"]);
}

#[test]
fn cu_seqlens_not_monotonic() {
    // Also the form a negative query length takes: Lq_1 = 1 - 2 = -1.
    let mut data = valid();
    data.cu_seqlens_q = vec![0, 2, 1];
    let (err, msg) = reject(data);
    assert_eq!(
        err,
        ProblemError::CuSeqlensNotMonotonic {
            index: 2,
            value: 1,
            prev_index: 1,
            prev: 2
        }
    );
    assert_mentions(&msg, &["cu_seqlens_q[2] = 1", "cu_seqlens_q[1] = 2"]);
}

#[test]
fn cu_seqlens_ending_past_t() {
    let mut data = valid();
    data.cu_seqlens_q = vec![0, 2, 5];
    data.seqused_k = vec![5, 5];
    let (err, msg) = reject(data);
    assert_eq!(err, ProblemError::CuSeqlensPastT { end: 5, t: 4 });
    assert_mentions(&msg, &["cu_seqlens_q", "5", "T = 4"]);
}

#[test]
fn cu_seqlens_ending_at_t_leaves_no_padding() {
    let mut data = valid();
    data.cu_seqlens_q = vec![0, 2, 4];
    let p = Problem::new(data).unwrap();
    assert_eq!(p.real_rows(), p.total_rows());
}

#[test]
fn seqused_k_shorter_than_query() {
    let mut data = valid();
    data.seqused_k = vec![1, 3];
    let (err, msg) = reject(data);
    assert_eq!(
        err,
        ProblemError::KvShorterThanQ {
            b: 0,
            kv_len: 1,
            q_len: 2
        }
    );
    assert_mentions(&msg, &["seqused_k[0] = 1", "Lq_0 = 2"]);
}

#[test]
fn negative_kv_length() {
    let mut data = valid();
    data.seqused_k = vec![5, -3];
    let (err, msg) = reject(data);
    assert_eq!(err, ProblemError::NegativeKvLen { b: 1, value: -3 });
    assert_mentions(&msg, &["seqused_k[1] = -3", "negative"]);
}

#[test]
fn negative_start_of_cu_seqlens() {
    let mut data = valid();
    data.cu_seqlens_q = vec![-1, 2, 3];
    let (err, msg) = reject(data);
    assert_eq!(err, ProblemError::CuSeqlensStart(-1));
    assert_mentions(&msg, &["cu_seqlens_q[0]", "-1"]);
}

#[test]
fn block_table_entry_out_of_range() {
    let mut data = valid();
    data.block_table[[0, 1]] = 4;
    let (err, msg) = reject(data);
    assert_eq!(
        err,
        ProblemError::BlockOutOfRange {
            b: 0,
            page: 1,
            value: 4,
            num_blocks: 4,
            kv_len: 5
        }
    );
    assert_mentions(&msg, &["block_table[0, 1] = 4", "0..4", "Lk = 5"]);
}

#[test]
fn block_table_entry_negative() {
    let mut data = valid();
    data.block_table[[1, 0]] = -1;
    let (err, msg) = reject(data);
    assert_eq!(
        err,
        ProblemError::BlockOutOfRange {
            b: 1,
            page: 0,
            value: -1,
            num_blocks: 4,
            kv_len: 3
        }
    );
    assert_mentions(&msg, &["block_table[1, 0] = -1"]);
}

#[test]
fn block_table_entries_not_needed_are_not_checked() {
    // Request 1 needs one page (Lk = 3): its second entry is don't-care.
    let mut data = valid();
    data.block_table[[1, 1]] = 99;
    Problem::new(data).unwrap();
    // On a local layer, pages wholly before every query's window are don't-care as well.
    let mut data = valid();
    data.seqused_k = vec![8, 3];
    data.window_left = 1;
    data.block_table[[0, 0]] = -7;
    Problem::new(data).unwrap();
}

#[test]
fn block_table_page_inside_the_window_is_checked() {
    // Lk = 8, Lq = 2, window 3: query 0 at position 6 sees keys 3..=6, so page 0 is needed.
    let mut data = valid();
    data.seqused_k = vec![8, 3];
    data.window_left = 3;
    data.block_table[[0, 0]] = -7;
    let (err, _) = reject(data);
    assert_eq!(
        err,
        ProblemError::BlockOutOfRange {
            b: 0,
            page: 0,
            value: -7,
            num_blocks: 4,
            kv_len: 8
        }
    );
}

#[test]
fn block_table_too_short() {
    let mut data = valid();
    data.block_table = Array2::from_shape_vec((2, 1), vec![1, 3]).unwrap();
    let (err, msg) = reject(data);
    assert_eq!(
        err,
        ProblemError::BlockTableShort {
            b: 0,
            needed: 2,
            max_pages: 1,
            kv_len: 5,
            page_size: 4
        }
    );
    assert_mentions(
        &msg,
        &["1 pages", "request 0", "needs 2", "Lk = 5", "page size 4"],
    );
}

#[test]
fn block_table_rows_differ_from_batch() {
    let mut data = valid();
    data.block_table = Array2::from_shape_vec((1, 2), vec![1, 2]).unwrap();
    let (err, msg) = reject(data);
    assert_eq!(
        err,
        ProblemError::BlockTableRows {
            expected: 2,
            actual: 1
        }
    );
    assert_mentions(&msg, &["block_table", "1 rows", "B = 2"]);
}

#[test]
fn window_left_below_minus_one() {
    let mut data = valid();
    data.window_left = -2;
    let (err, msg) = reject(data);
    assert_eq!(err, ProblemError::WindowLeft(-2));
    assert_mentions(&msg, &["window_left = -2", "-1"]);
}

#[rstest]
fn non_finite_scale(#[values(f64::NAN, f64::INFINITY, f64::NEG_INFINITY)] scale: f64) {
    let mut data = valid();
    data.softmax_scale = scale;
    let (err, msg) = reject(data);
    assert!(matches!(err, ProblemError::Scale(s) if s.to_bits() == scale.to_bits()));
    assert_mentions(&msg, &["softmax_scale", &scale.to_string()]);
}

#[test]
fn zero_length_request_in_the_middle_is_valid() {
    let mut data = valid();
    data.seqused_k = vec![5, 0, 3];
    data.cu_seqlens_q = vec![0, 2, 2, 3];
    // The empty request reads nothing, so its table row may hold anything.
    data.block_table = Array2::from_shape_vec((3, 2), vec![1, 2, -5, 77, 3, 0]).unwrap();
    let p = Problem::new(data).unwrap();
    assert_eq!(p.request(1).q_len, 0);
}

/// Generation specs are held to the operator's ranges and the case-byte limit before anything
/// is allocated: every refusal names the field, the value and the range.
mod gen_limits {
    use relattn_reference::gen::{generate, GenSpec, PageMode};
    use relattn_reference::limits::{
        LimitError, INT32_MAX, MAX_HEADS, MAX_HEAD_DIM, MAX_PAGE_SIZE,
    };
    use relattn_reference::ProblemError;

    fn spec() -> GenSpec {
        GenSpec::global(4, 2, vec![(2, 40), (1, 7)], 0)
    }

    fn refused(s: &GenSpec) -> String {
        let err = generate(s).expect_err("an out-of-range spec was generated");
        assert!(matches!(err, ProblemError::Limit(_)), "{err:?}");
        err.to_string()
    }

    #[test]
    fn each_dimension_at_and_past_its_limit() {
        type Edit = fn(&mut GenSpec, usize);
        let fields: [(&str, usize, Edit); 4] = [
            ("num_heads", MAX_HEADS, |s, v| {
                s.num_heads = v;
                s.num_kv_heads = 1;
            }),
            ("head_dim", MAX_HEAD_DIM, |s, v| s.head_dim = v),
            ("page_size", MAX_PAGE_SIZE, |s, v| s.page_size = v),
            ("rel_extent", INT32_MAX, |s, v| s.rel_extent = v),
        ];
        for (name, max, edit) in fields {
            let mut s = spec();
            edit(&mut s, max);
            assert!(s.size().is_ok(), "{name} = {max}");
            for past in [max + 1, usize::MAX] {
                edit(&mut s, past);
                let msg = refused(&s);
                assert!(msg.contains(&format!("{name} = {past}")), "{msg}");
                assert!(msg.contains(&format!("..={max}")), "{msg}");
            }
        }
    }

    #[test]
    fn lengths_and_counts_that_pass_int32_are_refused_not_wrapped() {
        let mut s = spec();
        s.requests = vec![(1, INT32_MAX + 1)];
        assert!(refused(&s).contains("Lk of request 0 = 2147483648"));
        s.requests = vec![(1, usize::MAX)];
        assert!(refused(&s).contains("Lk of request 0 = 18446744073709551615"));
        // Query rows and padding rows add up past int32 (and past usize in a naive sum).
        let mut s = spec();
        s.padding_rows = usize::MAX;
        assert!(refused(&s).contains("T (the query rows"), "{}", refused(&s));
        let mut s = spec();
        s.spare_pages = usize::MAX;
        let msg = refused(&s);
        assert!(
            msg.contains("num_blocks") && msg.contains("18446744073709551620"),
            "{msg}"
        );
        // All-zero tables need no block per page, but the spare pages still count.
        let mut s = spec();
        s.pages = PageMode::AllZero;
        s.spare_pages = INT32_MAX;
        assert!(refused(&s).contains("num_blocks"));
    }

    #[test]
    fn the_byte_limit_is_checked_before_generation() {
        // In range, but 2^31 keys of 1024 KV heads: far over any machine's limit.
        let mut s = GenSpec::global(1024, 1024, vec![(1, INT32_MAX - 1024)], 0);
        s.page_size = 4096;
        s.spare_pages = 0;
        let size = s.size().unwrap();
        assert!(size.bytes() > 1 << 50);
        let start = std::time::Instant::now();
        let err = generate(&s).unwrap_err();
        assert!(start.elapsed().as_secs_f64() < 1.0);
        assert!(
            matches!(err, ProblemError::Limit(LimitError::TooLarge { .. })),
            "{err:?}"
        );
        assert!(err.to_string().contains("--max-case-bytes"), "{err}");
    }
}
