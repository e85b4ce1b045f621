//! Case files: `write_case` and `read_case`.

use super::tensors::{
    decode_floats, float_tensor, i32_tensor, read_bytes, write_file, Links, Owned, Reader,
};
use super::{CaseFile, CaseFileError, CaseMeta, FORMAT_VERSION};
use crate::limits::{max_case_bytes, CaseSize, Dim, LimitError};
use crate::problem::{CacheLayout, Problem, ProblemData, RowLayout};
use ndarray::{Array2, Array3};
use std::collections::HashMap;
use std::path::Path;

/// Write `problem` as a case file. The caches are stored contiguous `[num_blocks, page, Hkv, D]`
/// whatever the problem's layout; `meta.cache_layout` records how GPU runs should place them.
pub fn write_case(
    path: impl AsRef<Path>,
    problem: &Problem,
    meta: &CaseMeta,
) -> Result<(), CaseFileError> {
    let path = path.as_ref();
    let p = problem;
    let (nb, page, hkv, d) = (p.num_blocks, p.page_size, p.num_kv_heads, p.head_dim);
    let cache_shape = vec![nb, page, hkv, d];
    // Rows of D floats in the file's order (block, slot, head), read through the layout's view
    // and encoded only as they are written.
    let cache = |view: crate::problem::KvView| {
        Owned::float_rows(
            nb * page * hkv,
            move |i| {
                let (block, slot, head) = (i / (page * hkv), i / hkv % page, i % hkv);
                let at = view.at(block, slot, head);
                &p.kv[at..at + d]
            },
            p.dtype,
            cache_shape.clone(),
        )
    };
    let batch = p.seqused_k.len();
    let tensors = vec![
        ("q", floats(&p.q, p.dtype)),
        ("key_cache", cache(p.k)),
        ("value_cache", cache(p.v)),
        ("rel_logits", floats(&p.rel_logits, p.dtype)),
        (
            "block_table",
            i32_tensor(
                p.block_table.iter().copied(),
                p.block_table.shape().to_vec(),
            ),
        ),
        (
            "seqused_k",
            i32_tensor(p.seqused_k.iter().copied(), vec![batch]),
        ),
        (
            "cu_seqlens_q",
            i32_tensor(p.cu_seqlens_q.iter().copied(), vec![batch + 1]),
        ),
    ];
    let mut metadata = HashMap::from([
        ("format_version".to_string(), FORMAT_VERSION.to_string()),
        // `{}` of an f64 prints the shortest decimal that parses back to the same value.
        ("softmax_scale".to_string(), format!("{}", p.softmax_scale)),
        ("rel_extent".to_string(), p.rel_extent.to_string()),
        ("window_left".to_string(), p.window_left.to_string()),
        ("causal".to_string(), "true".to_string()),
        (
            "cache_layout".to_string(),
            meta.cache_layout.name().to_string(),
        ),
    ]);
    // Written only away from the default, so files of padded cases keep their bytes (and ids).
    if p.rows != RowLayout::Padded {
        metadata.insert("row_layout".into(), p.rows.name().to_string());
    }
    if let Some(id) = &meta.case_id {
        metadata.insert("case_id".into(), id.clone());
    }
    if let Some(seed) = meta.seed {
        metadata.insert("seed".into(), seed.to_string());
    }
    write_file(path, tensors, metadata)
}

/// `a` stored as `dtype`, rows of its last extent encoded as they are written (copied first
/// only when `a` is not in standard layout).
fn floats(a: &Array3<f32>, dtype: crate::dtype::DType) -> Owned<'_> {
    match a.as_slice() {
        Some(all) => {
            let width = a.shape()[2].max(1);
            Owned::float_rows(
                all.len() / width,
                move |i| &all[i * width..(i + 1) * width],
                dtype,
                a.shape().to_vec(),
            )
        }
        None => float_tensor(a.iter().copied(), dtype, a.shape().to_vec()),
    }
}

/// Read and validate a case file, under the case-byte limit in force
/// (`limits::max_case_bytes`). The caches are placed in a buffer of the layout the file's
/// `cache_layout` asks for (contiguous when absent). A case with a NaN or infinity where a real
/// row reads is refused (`finite::check_finite_inputs`).
pub fn read_case(path: impl AsRef<Path>) -> Result<CaseFile, CaseFileError> {
    read_case_limited(path, max_case_bytes())
}

/// `read_case` with the case-byte limit given: the file's size and the bytes its tensors take
/// in memory (as f32 and i32) must both be at most `limit`.
pub fn read_case_limited(path: impl AsRef<Path>, limit: u64) -> Result<CaseFile, CaseFileError> {
    let path = path.as_ref();
    let bytes = read_bytes(path, limit, Links::Follow)?;
    parse_case(path, &bytes, limit)
}

/// The bytes of the case file at `path`, read as `read_case_limited` reads them (a regular file
/// of at most `limit` bytes) but never through a symbolic link: the files of a case folder,
/// whose ids are hashes of these bytes, parsed with `parse_case`.
pub fn read_case_bytes_nofollow(path: &Path, limit: u64) -> Result<Vec<u8>, CaseFileError> {
    read_bytes(path, limit, Links::Refuse)
}

/// Parse and validate `bytes`, the contents of the case file at `path` (named in errors):
/// `read_case_limited` once the file is read.
pub fn parse_case(path: &Path, bytes: &[u8], limit: u64) -> Result<CaseFile, CaseFileError> {
    let r = Reader::new(path, bytes)?;
    let meta = read_meta(&r)?;

    let causal = r.required_meta("causal")?;
    if causal.trim() != "true" {
        return Err(CaseFileError::BadMetadata {
            path: r.path(),
            key: "causal",
            value: causal.to_string(),
            expected: "\"true\" (the operator is causal only)",
        });
    }
    let scale = r.required_meta("softmax_scale")?;
    let softmax_scale: f64 = r.parse_meta("softmax_scale", scale, "a decimal number")?;
    let extent = r.required_meta("rel_extent")?;
    let rel_extent: usize = r.parse_meta("rel_extent", extent, "a non-negative integer")?;
    Dim::Extent
        .check("metadata `rel_extent`", rel_extent as u128)
        .map_err(|error| CaseFileError::Limit {
            path: r.path(),
            error,
        })?;
    let window = r.required_meta("window_left")?;
    let window_left: i64 = r.parse_meta("window_left", window, "an integer (-1 = no window)")?;

    let q = r.tensor("q", 3, "[T, H, D]")?;
    let key_cache = r.tensor("key_cache", 4, "[num_blocks, page_size, Hkv, D]")?;
    let value_cache = r.tensor("value_cache", 4, "[num_blocks, page_size, Hkv, D]")?;
    let rel = r.tensor("rel_logits", 3, "[T, H, E]")?;
    let block_table = r.tensor("block_table", 2, "[B, max_pages]")?;
    let seqused_k = r.tensor("seqused_k", 1, "[B]")?;
    let cu_seqlens_q = r.tensor("cu_seqlens_q", 1, "[B + 1]")?;
    if value_cache.shape() != key_cache.shape() {
        return Err(CaseFileError::Shape {
            path: r.path(),
            tensor: "value_cache",
            actual: value_cache.shape().to_vec(),
            expected: format!("{:?} (the shape of `key_cache`)", key_cache.shape()),
        });
    }
    // Every dimension in its range and the bytes under the limit, from the shapes alone:
    // nothing below allocates or loops more than the limit allows.
    let shapes = [
        ("q", q.shape()),
        ("key_cache", key_cache.shape()),
        ("rel_logits", rel.shape()),
        ("block_table", block_table.shape()),
        ("seqused_k", seqused_k.shape()),
        ("cu_seqlens_q", cu_seqlens_q.shape()),
    ];
    case_size(&shapes)
        .and_then(|size| size.check_bytes("the case in memory", limit))
        .map_err(|error| CaseFileError::Limit {
            path: r.path(),
            error,
        })?;

    let dtype = r.case_dtype("q", &q)?;
    let like_q = "`q`";
    let q_values = r.floats("q", &q, dtype, like_q)?;
    // The caches are decoded straight into their place in `kv`, a row at a time: no float copy
    // of them beside `kv` (a case file's caches can be gigabytes).
    let k_bytes = r.float_bytes("key_cache", &key_cache, dtype, like_q)?;
    let v_bytes = r.float_bytes("value_cache", &value_cache, dtype, like_q)?;
    let size = dtype.size_bytes();
    let rel_values = r.floats("rel_logits", &rel, dtype, like_q)?;

    let (t, h, qd) = (q.shape()[0], q.shape()[1], q.shape()[2]);
    let (rt, rh, re) = (rel.shape()[0], rel.shape()[1], rel.shape()[2]);
    let cs = key_cache.shape();
    let (num_blocks, page_size, num_kv_heads, head_dim) = (cs[0], cs[1], cs[2], cs[3]);
    let (views_k, views_v, len) =
        meta.cache_layout
            .views(num_blocks, page_size, num_kv_heads, head_dim);
    let mut kv = vec![0f32; len];
    for block in 0..num_blocks {
        for slot in 0..page_size {
            for head in 0..num_kv_heads {
                let src = ((block * page_size + slot) * num_kv_heads + head) * head_dim * size;
                let row = src..src + head_dim * size;
                let (ka, va) = (views_k.at(block, slot, head), views_v.at(block, slot, head));
                decode_floats(dtype, &k_bytes[row.clone()], &mut kv[ka..ka + head_dim]);
                decode_floats(dtype, &v_bytes[row], &mut kv[va..va + head_dim]);
            }
        }
    }

    let shape_error = |tensor, actual: &[usize]| CaseFileError::Shape {
        path: r.path(),
        tensor,
        actual: actual.to_vec(),
        expected: "a shape matching its data".into(),
    };
    let table_shape = (block_table.shape()[0], block_table.shape()[1]);
    let data = ProblemData {
        dtype,
        num_heads: h,
        num_kv_heads,
        head_dim,
        rel_extent,
        page_size,
        num_blocks,
        softmax_scale,
        window_left,
        q: Array3::from_shape_vec((t, h, qd), q_values).map_err(|_| shape_error("q", q.shape()))?,
        rel_logits: Array3::from_shape_vec((rt, rh, re), rel_values)
            .map_err(|_| shape_error("rel_logits", rel.shape()))?,
        kv,
        layout: meta.cache_layout,
        rows: match r.meta("row_layout") {
            Some(s) => r.parse_meta("row_layout", s, "padded, strided or exact")?,
            None => RowLayout::Padded,
        },
        k: views_k,
        v: views_v,
        block_table: Array2::from_shape_vec(table_shape, r.i32s("block_table", &block_table)?)
            .map_err(|_| shape_error("block_table", block_table.shape()))?,
        seqused_k: r.i32s("seqused_k", &seqused_k)?,
        cu_seqlens_q: r.i32s("cu_seqlens_q", &cu_seqlens_q)?,
    };
    let problem = Problem::new(data)
        .and_then(|p| crate::finite::check_finite_inputs(&p).map(|()| p))
        .map_err(|error| CaseFileError::Problem {
            path: r.path(),
            error,
        })?;
    Ok(CaseFile { problem, meta })
}

fn read_meta(r: &Reader) -> Result<CaseMeta, CaseFileError> {
    let seed = match r.meta("seed") {
        Some(s) => Some(r.parse_meta("seed", s, "an unsigned 64-bit integer")?),
        None => None,
    };
    let cache_layout = match r.meta("cache_layout") {
        Some(s) => r.parse_meta("cache_layout", s, "contiguous, nhd_packed or hnd_packed")?,
        None => CacheLayout::Contiguous,
    };
    Ok(CaseMeta {
        case_id: r.meta("case_id").map(str::to_string),
        seed,
        cache_layout,
    })
}

/// The case's dimensions from the shapes of its tensors (`(name, shape)` in the order of
/// `read_case`, ranks already checked), each against its range (`limits::Dim`).
fn case_size(shapes: &[(&'static str, &[usize]); 6]) -> Result<CaseSize, LimitError> {
    let axes: [&[(Dim, &str)]; 6] = [
        &[(Dim::Rows, "T"), (Dim::Heads, "H"), (Dim::HeadDim, "D")],
        &[
            (Dim::Blocks, "num_blocks"),
            (Dim::PageSize, "page_size"),
            (Dim::KvHeads, "Hkv"),
            (Dim::HeadDim, "D"),
        ],
        &[(Dim::Rows, "T"), (Dim::Heads, "H"), (Dim::Extent, "E")],
        &[(Dim::Batch, "B"), (Dim::MaxPages, "max_pages")],
        &[(Dim::Batch, "B")],
        &[(Dim::Batch, "B + 1")],
    ];
    for ((tensor, shape), axes) in shapes.iter().zip(axes) {
        for (k, ((dim, name), &value)) in axes.iter().zip(shape.iter()).enumerate() {
            // cu_seqlens_q holds B + 1 entries: its range is the batch's, shifted by one.
            let value = if *tensor == "cu_seqlens_q" {
                value.saturating_sub(1)
            } else {
                value
            };
            dim.check(format!("tensor `{tensor}` dim {k} ({name})"), value as u128)?;
        }
    }
    let [q, cache, rel, table, seqused, _] = shapes.map(|(_, s)| s);
    Ok(CaseSize {
        rows: q[0],
        heads: q[1],
        kv_heads: cache[2],
        head_dim: cache[3],
        extent: rel[2],
        page_size: cache[1],
        blocks: cache[0],
        batch: seqused[0],
        max_pages: table[1],
    })
}
