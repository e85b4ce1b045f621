//! The source edits of each planted defect (`Mutant::patches`).

use super::mutant::{Mutant, Patch};

// Text that more than one defect edits or writes, kept once.
/// The fallback kernel's checked load of a bias cell.
const FALLBACK_REL_LOAD: &str = r#"            check_index(this->rel_row + d, p.rel_size);
            b = to_f32(cu.at[-x]);
"#;
/// The score_mod kernel's checked gather of a bias cell.
const SCORE_MOD_REL_LOAD: &str = r#"            check_index(this->rel_row + dc, p.rel_size);
            gathered = to_f32(cu.at[-x]);
"#;
/// The same gather without the index check.
const SCORE_MOD_REL_LOAD_UNCHECKED: &str = r#"            gathered = ld_rel<T>(p, this->rel_row + dc);
"#;
/// Where a query row's bias cells start (int).
const REL_ROW: &str = r#"        rel_row = (t * p.H + h) * p.E;
"#;
/// Where a query row's bias cells start (64-bit).
const REL_ROW_I64: &str = r#"        const i64 rel_row = (t * p.H + h) * p.E;
"#;
/// An output row's head: query head g of KV head kvh.
const PLACE_HEAD: &str = r#"        place(p, c, vr, c.kvh * p.G + g);
"#;
/// The same with the head index's two parts swapped.
const PLACE_HEAD_SWAPPED: &str = r#"        place(p, c, vr, g * p.Hkv + c.kvh);
"#;
/// A softmax weight.
const EXP_WEIGHT: &str = r#"            w = expf(e);
"#;
/// A softmax weight (a constant of its loop).
const EXP_WEIGHT_CONST: &str = r#"                    const float w = expf(e);
"#;
/// The rescale factor of the running sum.
const ALPHA_EXP2: &str = r#"        alpha[r] = fast_exp2(drop);
"#;
/// An output row's head with groups of 8.
const PLACE_HEAD_G8: &str = r#"        place(p, c, vr, c.kvh * 8 + g);
"#;

/// The edits that plant each defect, generated from the CUDA sources once and kept by hand
/// since: each `from` must occur exactly once in its file (a test checks it).
fn patches_of(m: Mutant) -> &'static [Patch] {
    match m {
        Mutant::RelIndexMinusOne => &[
            Patch {
                file: "fallback.cu",
                from: FALLBACK_REL_LOAD,
                to: r#"            b = ld_rel<T>(p, this->rel_row + min(max(d - 1, 0), clamp_i32(p.E) - 1));
"#,
            },
            Patch {
                file: "score_mod.cu",
                from: SCORE_MOD_REL_LOAD,
                to: SCORE_MOD_REL_LOAD_UNCHECKED,
            },
            Patch {
                file: "query_bias.cuh",
                from: r#"        const int at = 2 * (63 - 2 * tq);
"#,
                to: r#"        const int at = 2 * (63 - 2 * tq) - 2;
"#,
            },
            Patch {
                file: "decode.cuh",
                from: r#"        bs + (unsigned)((16 * warp + r) * DEC_BIAS_ROW + 2 * (d - 8 * ((D - 15) >> 3)));
"#,
                to: r#"        bs + (unsigned)((16 * warp + r) * DEC_BIAS_ROW + 2 * (d - 8 * ((D - 15) >> 3)) - 2);
"#,
            },
            Patch {
                file: "score_mod.cu",
                from: r#"        const int dc = min(max(d, 0), E - 1);
"#,
                to: r#"        const int dc = min(max(d - 1, 0), E - 1);
"#,
            },
            Patch {
                file: "sheared_bias.cu",
                from: r#"            const i64 di = imin(d, p.E - 1);
"#,
                to: r#"            const i64 di = imin(imax(d - 1, 0), p.E - 1);
"#,
            },
        ],
        Mutant::BiasAtExtent => &[
            Patch {
                file: "fallback.cu",
                from: FALLBACK_REL_LOAD,
                to: r#"            b = ld_rel<T>(p, this->rel_row + min(d, clamp_i32(p.E) - 1));
"#,
            },
            Patch {
                file: "score_mod.cu",
                from: SCORE_MOD_REL_LOAD,
                to: SCORE_MOD_REL_LOAD_UNCHECKED,
            },
            Patch {
                file: "params.cuh",
                from: r#"    __device__ __forceinline__ bool in_extent(int d) const { return (unsigned)d < extent; }
"#,
                to: r#"    __device__ __forceinline__ bool in_extent(int d) const { return (unsigned)d <= extent; }
"#,
            },
            Patch {
                file: "params.cuh",
                from: r#"    __device__ __forceinline__ bool in_extent(i64 d) const { return (unsigned long long)d < extent; }
"#,
                to: r#"    __device__ __forceinline__ bool in_extent(i64 d) const { return (unsigned long long)d <= extent; }
"#,
            },
            Patch {
                file: "decode.cuh",
                from: r#"    const unsigned b0 = rel_cell<T>(p, d, ld_shared_u16(at));
"#,
                to: r#"    const unsigned b0 = rel_cell<T>(p, d, ld_shared_u16(at - (d == clamp_i32(p.E) ? 2 : 0)));
"#,
            },
            Patch {
                file: "decode.cuh",
                from: r#"    const unsigned b1 = rel_cell<T>(p, d - 1, ld_shared_u16(at - 2));
"#,
                to: r#"    const unsigned b1 = rel_cell<T>(p, d - 1, ld_shared_u16(at - 2 - (d - 1 == clamp_i32(p.E) ? 2 : 0)));
"#,
            },
        ],
        Mutant::LocalRowBias => &[
            Patch {
                file: "rel_row.cuh",
                from: REL_ROW,
                to: r#"        rel_row = ((i64)i * p.H + h) * p.E;
"#,
            },
            Patch {
                file: "sheared_bias.cu",
                from: REL_ROW_I64,
                to: r#"        const i64 rel_row = (i * p.H + h) * p.E;
"#,
            },
        ],
        Mutant::KvHeadModulo => &[
            Patch {
                file: "rel_row.cuh",
                from: PLACE_HEAD,
                to: PLACE_HEAD_SWAPPED,
            },
            Patch {
                file: "sheared_bias.cu",
                from: PLACE_HEAD,
                to: PLACE_HEAD_SWAPPED,
            },
        ],
        Mutant::CombineNoRescale => &[
            Patch {
                file: "combine.cuh",
                from: EXP_WEIGHT,
                to: r#"            w = 1.f;
"#,
            },
            Patch {
                file: "fallback.cu",
                from: EXP_WEIGHT_CONST,
                to: r#"                    const float w = 1.f;
"#,
            },
        ],
        Mutant::WindowStrict => &[
            Patch {
                file: "params.cuh",
                from: r#"    __device__ __forceinline__ bool visible(int d) const { return (unsigned)d <= last; }
"#,
                to: r#"    __device__ __forceinline__ bool visible(int d) const { return (unsigned)d < last; }
"#,
            },
            Patch {
                file: "params.cuh",
                from: r#"    __device__ __forceinline__ bool visible(i64 d) const { return (unsigned long long)d <= last; }
"#,
                to: r#"    __device__ __forceinline__ bool visible(i64 d) const { return (unsigned long long)d < last; }
"#,
            },
        ],
        Mutant::RelRowPastEnd => &[
            Patch {
                file: "rel_row.cuh",
                from: r#"        rel_ok = in_block && (i < c.r.q_len);
"#,
                to: r#"        rel_ok = in_block && (i <= c.r.q_len);
"#,
            },
            Patch {
                file: "sheared_bias.cu",
                from: r#"        const bool rel_ok = valid;
"#,
                to: r#"        const bool rel_ok = i <= r.q_len;
"#,
            },
        ],
        Mutant::CounterNotReset => &[Patch {
            file: "fallback.cu",
            from: r#"        if (last) p.ws_count[i] = 0u;
"#,
            to: r#"        if (false) p.ws_count[i] = 0u;
"#,
        }],
        Mutant::SoftmaxReset => &[Patch {
            file: "softmax.cuh",
            from: ALPHA_EXP2,
            to: r#"        alpha[r] = 0.f;
"#,
        }],
        Mutant::RescaleClamped => &[Patch {
            file: "softmax.cuh",
            from: ALPHA_EXP2,
            to: r#"        alpha[r] = fast_exp2(fmaxf(drop, -8.f));
"#,
        }],
        Mutant::CombineClamped => &[
            Patch {
                file: "combine.cuh",
                from: EXP_WEIGHT,
                to: r#"            w = expf(fmaxf(e, -4.f));
"#,
            },
            Patch {
                file: "fallback.cu",
                from: EXP_WEIGHT_CONST,
                to: r#"                    const float w = expf(fmaxf(e, -4.f));
"#,
            },
        ],
        Mutant::CombineMaxUnsynced => &[Patch {
            file: "combine.cuh",
            from: r#"    if ((c & 31) == 0) red[c >> 5] = m;
    __syncthreads();
"#,
            to: r#"    if ((c & 31) == 0) red[c >> 5] = m;
"#,
        }],
        Mutant::EmptySplitPublished => &[Patch {
            file: "combine.cuh",
            from: r#"        if (s < p.num_splits && nonempty(s)) {
"#,
            to: r#"        if (s < p.num_splits && true) {
"#,
        }],
        Mutant::WritesPaddingRows => &[Patch {
            file: "softmax.cuh",
            from: r#"    if (!row.valid) return;
"#,
            to: r#"    if (!row.in_block) return;
"#,
        }],
        Mutant::Fp16NegInfBits => &[Patch {
            file: "ptx.cuh",
            from: r#"    static constexpr unsigned NEG_INF_BITS = 0xfc00u;
"#,
            to: r#"    static constexpr unsigned NEG_INF_BITS = 0xff80u;
"#,
        }],
        Mutant::GroupFixedEight => &[
            Patch {
                file: "rel_row.cuh",
                from: PLACE_HEAD,
                to: PLACE_HEAD_G8,
            },
            Patch {
                file: "sheared_bias.cu",
                from: PLACE_HEAD,
                to: PLACE_HEAD_G8,
            },
        ],
        Mutant::BiasOfKvHead => &[
            Patch {
                file: "rel_row.cuh",
                from: REL_ROW,
                to: r#"        rel_row = (t * p.H + c.kvh) * p.E;
"#,
            },
            Patch {
                file: "sheared_bias.cu",
                from: REL_ROW_I64,
                to: r#"        const i64 rel_row = (t * p.H + h / p.G) * p.E;
"#,
            },
        ],
        Mutant::PositionWithoutPrefix => &[
            Patch {
                file: "cta.cuh",
                from: r#"        pos = (int)(c.r.prefix() + i);
"#,
                to: r#"        pos = (int)(i);
"#,
            },
            Patch {
                file: "sheared_bias.cu",
                from: r#"        const i64 pos = r.prefix() + i;
"#,
                to: r#"        const i64 pos = i;
"#,
            },
        ],
        Mutant::BlockTableRowZero => &[Patch {
            file: "params.cuh",
            from: r#"    return p.block_table[i];
"#,
            to: r#"    return p.block_table[i % p.bt_stride];
"#,
        }],
        Mutant::UnmaskedKeysLoaded => &[
            Patch {
                file: "paged_kv.cuh",
                from: r#"                t.block[k] = (off + Rows::STEP * k < span) ? t.block0 : -1;
"#,
                to: r#"                t.block[k] = (true) ? t.block0 : -1;
"#,
            },
            Patch {
                file: "paged_kv.cuh",
                from: r#"            t.block[k] = in ? (int)ld_block(p, row0 + page) : -1;
"#,
                to: r#"            t.block[k] = true ? (int)ld_block(p, row0 + page) : -1;
"#,
            },
        ],
        Mutant::PiecesNoRescale => &[Patch {
            file: "fallback.cu",
            from: EXP_WEIGHT_CONST,
            to: r#"                    const float w = to_slot >= 0 ? 1.f : expf(e);
"#,
        }],
        Mutant::BiasTimesScale => &[Patch {
            file: "query_bias.cuh",
            from: r#"    const float to_log2 = LOG2E;
"#,
            to: r#"    const float to_log2 = scale2;
"#,
        }],
        Mutant::Bf16Accumulator => &[Patch {
            file: "query_bias.cuh",
            from: r#"    if (__all_sync(0xffffffffu, alpha[0] == 1.f && alpha[1] == 1.f)) return;
"#,
            to: r#"    // The accumulator kept in bf16 between tiles.
#pragma unroll
    for (int n = 0; n < NO; ++n)
#pragma unroll
        for (int k = 0; k < 4; ++k) o[n][k] = to_f32(from_f32<bf16>(o[n][k]));
    if (__all_sync(0xffffffffu, alpha[0] == 1.f && alpha[1] == 1.f)) return;
"#,
        }],
        Mutant::DispatchOnFirstRequest => &[Patch {
            file: "attention.cuh",
            from: r#"    const int q_len = c.r.q_len;
"#,
            to: r#"    const int q_len = p.cu_seqlens_q[1] - p.cu_seqlens_q[0];
"#,
        }],
    }
}

impl Mutant {
    /// The edits that plant the defect.
    pub fn patches(self) -> &'static [Patch] {
        patches_of(self)
    }
}
