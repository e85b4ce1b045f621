//! The kernels' one by-value argument: the Rust mirror of `struct Params` in params.cuh. Every field
//! is 8 bytes except an f32 + i32 pair and the two 64-byte aligned tensor maps at the end, so
//! `#[repr(C)]` lays it out as the C struct.

#![deny(unsafe_code)]

/// Field names of the C struct in declaration order (checked against params.cuh by a test).
pub const FIELDS: [&str; 47] = [
    "q",
    "kv",
    "rel",
    "out",
    "block_table",
    "seqused_k",
    "cu_seqlens_q",
    "ws_o",
    "ws_lse",
    "shear",
    "ws_count",
    "T",
    "H",
    "Hkv",
    "G",
    "D",
    "E",
    "B",
    "bt_stride",
    "page_size",
    "k_off",
    "k_block",
    "k_slot",
    "k_head",
    "v_off",
    "v_block",
    "v_slot",
    "v_head",
    "window_left",
    "num_splits",
    "shear_width",
    "real_rows",
    "piece_keys",
    "q_size",
    "kv_size",
    "rel_size",
    "out_size",
    "bt_size",
    "ws_o_size",
    "ws_lse_size",
    "shear_size",
    "ws_count_size",
    "scale",
    "ring_stages",
    "tma",
    "tmap_k",
    "tmap_v",
];

/// A `CUtensorMap` as the kernels take it (`struct TensorMap` in params.cuh): 128 opaque bytes,
/// 64-byte aligned, encoded by the driver (`cuTensorMapEncodeTiled`).
#[repr(C, align(64))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TensorMap(pub [u64; 16]);

/// Device pointers are raw `CUdeviceptr` values; 0 for a buffer a launch does not use.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Params {
    pub q: u64,
    pub kv: u64,
    pub rel: u64,
    pub out: u64,
    pub block_table: u64,
    pub seqused_k: u64,
    pub cu_seqlens_q: u64,
    pub ws_o: u64,
    pub ws_lse: u64,
    pub shear: u64,
    /// `[B, Hkv]` u32 counters of the fallback decode kernel's finished splits (zeroed).
    pub ws_count: u64,
    pub t: i64,
    pub h: i64,
    pub hkv: i64,
    pub g: i64,
    pub d: i64,
    pub e: i64,
    pub b: i64,
    pub bt_stride: i64,
    pub page_size: i64,
    pub k_off: i64,
    pub k_block: i64,
    pub k_slot: i64,
    pub k_head: i64,
    pub v_off: i64,
    pub v_block: i64,
    pub v_slot: i64,
    pub v_head: i64,
    pub window_left: i64,
    pub num_splits: i64,
    pub shear_width: i64,
    pub real_rows: i64,
    /// Most keys of one fallback decode piece (`LaunchPlan::piece_keys`; 0 without decode).
    pub piece_keys: i64,
    pub q_size: i64,
    pub kv_size: i64,
    pub rel_size: i64,
    pub out_size: i64,
    pub bt_size: i64,
    pub ws_o_size: i64,
    pub ws_lse_size: i64,
    pub shear_size: i64,
    pub ws_count_size: i64,
    pub scale: f32,
    /// Stages of the single-query CTAs' K/V ring (`ring_stages`; sized into the launch's shared memory).
    pub ring_stages: i32,
    /// 1 when `tmap_k` and `tmap_v` describe the cache's K and V (the sm_90a query blocks then copy
    /// whole key tiles through them), else 0 and both maps zero.
    pub tma: i64,
    pub tmap_k: TensorMap,
    pub tmap_v: TensorMap,
}

/// Bytes of the C struct (43 eight-byte fields and one f32 + i32 pair, padded to 384 for the two
/// 128-byte tensor maps).
pub const PARAMS_BYTES: usize = 640;

/// The field names of `struct Params` as declared in a C source, in order.
pub fn c_struct_fields(source: &str) -> Option<Vec<String>> {
    let start = source.find("struct Params {")?;
    let body = &source[start + "struct Params {".len()..];
    let body = &body[..body.find("};")?];
    let mut names = Vec::new();
    for line in body.lines() {
        let code = line.split("//").next().unwrap_or("").trim();
        let Some(decl) = code.strip_suffix(';') else {
            continue;
        };
        // `const void* q` or `i64 T, H, Hkv`: names follow the type, comma separated.
        let mut parts = decl.split(',');
        let first = parts.next()?.trim();
        names.push(first.rsplit([' ', '*']).next()?.to_string());
        names.extend(parts.map(|p| p.trim().to_string()));
    }
    Some(names)
}
