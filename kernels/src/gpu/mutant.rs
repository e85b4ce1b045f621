//! Planted defects: each is a small edit of the kernel sources (`patches`), applied by the compile
//! plan to a copy of the sources, so a harness can prove its matrices catch the bug classes of
//! docs/operator.md section 5 while the production sources hold no trace of them.

#![deny(unsafe_code)]

use std::fmt;
use std::str::FromStr;

/// Where in the kernels a planted defect sits: which paths hold it is then each path's
/// descriptor's answer (`PathKernels::holds`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Site {
    /// Code every path runs: the attention loops, the CTA geometry, the parameters, and what
    /// every path's rows do (planted in each path's rows).
    Every,
    /// A merge of split partials: a combine kernel or the split-KV decode kernel's merge.
    SplitMerge,
    /// The combine kernel (`Stage::Combine`), which reads a partial per split.
    CombineKernel,
    /// The split-KV decode kernel (`Stage::Decode`): its counters and its pieces.
    DecodeKernel,
    /// Rows whose bias is `rel_logits` itself (`BiasSource::RelLogits`): its staged cells.
    RelLogitsRows,
}

/// One edit of a planted defect: in `file` (a path's `.cu` or a shared header), the production
/// text `from`, found exactly once, becomes `to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Patch {
    pub file: &'static str,
    pub from: &'static str,
    pub to: &'static str,
}

/// One planted defect. `define()` is its number (1..=24), as `relattn mutants --only` takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mutant {
    /// The bias index is `d - 1` instead of `d`.
    RelIndexMinusOne,
    /// The bias is applied at `d == E` too (`d <= E`, index clamped to `E - 1`).
    BiasAtExtent,
    /// `rel_logits` is read at the request's local row `i` instead of the packed row `t`.
    LocalRowBias,
    /// Query head `h` reads KV head `h % Hkv` instead of `h / G`.
    KvHeadModulo,
    /// The split combine averages the partials without the `exp(lse - max)` rescale.
    CombineNoRescale,
    /// The window keeps `d < window_left` instead of `d <= window_left`.
    WindowStrict,
    /// `rel_logits` is read for the row one past the request's last row (a tile padding row);
    /// the value is never used, so only the bounds check can see it.
    RelRowPastEnd,
    /// The fallback decode kernel's last CTA of a group leaves the group's merge counter set:
    /// this launch is right, the next on the same workspace would merge early; only the check
    /// that every counter is back at zero sees it.
    CounterNotReset,
    /// The online softmax forgets the earlier KV tiles at each tile (alpha = 0): docs/operator.md
    /// section 5 class 6.
    SoftmaxReset,
    /// The online softmax rescales earlier tiles by at most 2^-8 (a lazy rescale with no catch-up): only a running max that jumps by more than 8 (log2) shows it.
    RescaleClamped,
    /// The split combines weight partials by `exp(max(lse - m, -4))`: only splits whose LSEs differ by more than 4 show it.
    CombineClamped,
    /// sheared_bias's combine reads the partials of empty splits (uninitialised workspace):
    /// docs/operator.md section 5 class 7.
    EmptySplitPublished,
    /// Query blocks store the rows past the request's end (tile padding) into the rows that follow.
    WritesPaddingRows,
    /// fp16 builds mark masked staged bias cells with bf16's -inf bits (a NaN in fp16): only fp16 shows it.
    Fp16NegInfBits,
    /// The GQA mapping assumes G = 8 (`kvh * 8 + g`): only G != 8 shows it.
    GroupFixedEight,
    /// rel_logits is read for the KV head instead of the query head.
    BiasOfKvHead,
    /// The query's position is `i` instead of `P + i` (the cached prefix left out of d).
    PositionWithoutPrefix,
    /// Every request reads request 0's block-table row.
    BlockTableRowZero,
    /// Tiles load the keys outside [lo, hi) too (pre-window and past-the-end slots, NaN-poisoned):
    /// docs/operator.md section 5 class 7.
    UnmaskedKeysLoaded,
    /// The fallback decode merges a split's pieces without the `exp(lse - max)` rescale (the splits' merge keeps it).
    PiecesNoRescale,
    /// The query blocks multiply the bias by the softmax scale.
    BiasTimesScale,
    /// The output accumulator is rounded to bf16 after every KV tile (bf16 accumulation).
    Bf16Accumulator,
    /// Every CTA picks the single-query loop from request 0's q_len: a batch whose decodes come
    /// before a prefill (docs/operator.md section 5 class 8's 8 x decode + 1 prefill) runs the
    /// prefill's rows as decode rows.
    DispatchOnFirstRequest,
    /// The combine reads the warps' maxima from shared memory without the barrier after their
    /// stores: a read-after-write race. The maximum only shifts the exponentials, so the output
    /// is almost always right; compute-sanitizer's racecheck sees the race.
    CombineMaxUnsynced,
}

impl Mutant {
    pub const ALL: [Mutant; 24] = [
        Mutant::RelIndexMinusOne,
        Mutant::BiasAtExtent,
        Mutant::LocalRowBias,
        Mutant::KvHeadModulo,
        Mutant::CombineNoRescale,
        Mutant::WindowStrict,
        Mutant::RelRowPastEnd,
        Mutant::CounterNotReset,
        Mutant::SoftmaxReset,
        Mutant::RescaleClamped,
        Mutant::CombineClamped,
        Mutant::EmptySplitPublished,
        Mutant::WritesPaddingRows,
        Mutant::Fp16NegInfBits,
        Mutant::GroupFixedEight,
        Mutant::BiasOfKvHead,
        Mutant::PositionWithoutPrefix,
        Mutant::BlockTableRowZero,
        Mutant::UnmaskedKeysLoaded,
        Mutant::PiecesNoRescale,
        Mutant::BiasTimesScale,
        Mutant::Bf16Accumulator,
        Mutant::DispatchOnFirstRequest,
        Mutant::CombineMaxUnsynced,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Mutant::RelIndexMinusOne => "rel_index_minus_one",
            Mutant::BiasAtExtent => "bias_at_extent",
            Mutant::LocalRowBias => "local_row_bias",
            Mutant::KvHeadModulo => "kv_head_modulo",
            Mutant::CombineNoRescale => "combine_no_rescale",
            Mutant::WindowStrict => "window_strict",
            Mutant::RelRowPastEnd => "rel_row_past_end",
            Mutant::CounterNotReset => "counter_not_reset",
            Mutant::SoftmaxReset => "softmax_reset",
            Mutant::RescaleClamped => "rescale_clamped",
            Mutant::CombineClamped => "combine_clamped",
            Mutant::EmptySplitPublished => "empty_split_published",
            Mutant::WritesPaddingRows => "writes_padding_rows",
            Mutant::Fp16NegInfBits => "fp16_neg_inf_bits",
            Mutant::GroupFixedEight => "group_fixed_eight",
            Mutant::BiasOfKvHead => "bias_of_kv_head",
            Mutant::PositionWithoutPrefix => "position_without_prefix",
            Mutant::BlockTableRowZero => "block_table_row_zero",
            Mutant::UnmaskedKeysLoaded => "unmasked_keys_loaded",
            Mutant::PiecesNoRescale => "pieces_no_rescale",
            Mutant::BiasTimesScale => "bias_times_scale",
            Mutant::Bf16Accumulator => "bf16_accumulator",
            Mutant::DispatchOnFirstRequest => "dispatch_on_first_request",
            Mutant::CombineMaxUnsynced => "combine_max_unsynced",
        }
    }

    pub fn define(self) -> u32 {
        match self {
            Mutant::RelIndexMinusOne => 1,
            Mutant::BiasAtExtent => 2,
            Mutant::LocalRowBias => 3,
            Mutant::KvHeadModulo => 4,
            Mutant::CombineNoRescale => 5,
            Mutant::WindowStrict => 6,
            Mutant::RelRowPastEnd => 7,
            Mutant::CounterNotReset => 8,
            Mutant::SoftmaxReset => 9,
            Mutant::RescaleClamped => 10,
            Mutant::CombineClamped => 11,
            Mutant::EmptySplitPublished => 12,
            Mutant::WritesPaddingRows => 13,
            Mutant::Fp16NegInfBits => 14,
            Mutant::GroupFixedEight => 15,
            Mutant::BiasOfKvHead => 16,
            Mutant::PositionWithoutPrefix => 17,
            Mutant::BlockTableRowZero => 18,
            Mutant::UnmaskedKeysLoaded => 19,
            Mutant::PiecesNoRescale => 20,
            Mutant::BiasTimesScale => 21,
            Mutant::Bf16Accumulator => 22,
            Mutant::DispatchOnFirstRequest => 23,
            Mutant::CombineMaxUnsynced => 24,
        }
    }

    /// The kind of kernel code the defect's line is in.
    pub fn site(self) -> Site {
        match self {
            // Only the split merges rescale partials.
            Mutant::CombineNoRescale | Mutant::CombineClamped => Site::SplitMerge,
            // Only a combine kernel reads a partial per split, empty or not.
            Mutant::EmptySplitPublished | Mutant::CombineMaxUnsynced => Site::CombineKernel,
            // Only the split-KV decode kernel counts finished splits and cuts splits into pieces.
            Mutant::CounterNotReset | Mutant::PiecesNoRescale => Site::DecodeKernel,
            // Only rows that read rel_logits stage it (a prologue's buffer is not staged).
            Mutant::Fp16NegInfBits => Site::RelLogitsRows,
            Mutant::RelIndexMinusOne
            | Mutant::BiasAtExtent
            | Mutant::LocalRowBias
            | Mutant::KvHeadModulo
            | Mutant::WindowStrict
            | Mutant::RelRowPastEnd
            | Mutant::SoftmaxReset
            | Mutant::RescaleClamped
            | Mutant::WritesPaddingRows
            | Mutant::GroupFixedEight
            | Mutant::BiasOfKvHead
            | Mutant::PositionWithoutPrefix
            | Mutant::BlockTableRowZero
            | Mutant::UnmaskedKeysLoaded
            | Mutant::BiasTimesScale
            | Mutant::Bf16Accumulator
            | Mutant::DispatchOnFirstRequest => Site::Every,
        }
    }

    /// Whether the defect changes no number, so only a bounds-checked build can catch it.
    pub fn needs_bounds_check(self) -> bool {
        matches!(self, Mutant::RelRowPastEnd)
    }

    /// The compute-sanitizer tool without which the defect is seen only by chance (its output
    /// is almost always right, and no bounds check sees it): `relattn mutants` runs it only
    /// under that tool.
    pub fn seen_by_tool(self) -> Option<&'static str> {
        match self {
            Mutant::CombineMaxUnsynced => Some("racecheck"),
            _ => None,
        }
    }

    /// What kind of case exposes the defect (for reports and for choosing cases).
    pub fn exposed_by(self) -> &'static str {
        match self {
            Mutant::RelIndexMinusOne => "any case with a bias",
            Mutant::BiasAtExtent => "a global layer with Lk > E",
            Mutant::LocalRowBias => "a request that does not start at packed row 0",
            Mutant::KvHeadModulo => "GQA with 1 < Hkv < H",
            Mutant::CombineNoRescale => "split-KV with two or more non-empty splits",
            Mutant::WindowStrict => "a local layer with Lk > window",
            Mutant::RelRowPastEnd => {
                "a last request whose q_len is not a tile multiple and no padding rows, under the bounds check"
            }
            Mutant::CounterNotReset => "any split-KV decode on the fallback path",
            Mutant::SoftmaxReset => "a row whose keys span two or more KV tiles",
            Mutant::RescaleClamped => "peaked attention: a row whose running max jumps by several units",
            Mutant::CombineClamped => "split-KV where the splits' LSEs differ by more than 4 (peaked attention)",
            Mutant::EmptySplitPublished => "more splits than KV tiles",
            Mutant::WritesPaddingRows => "a last request whose rows do not fill its tile, with padding rows or the bounds check",
            Mutant::Fp16NegInfBits => "fp16 with staged bias on masked tiles (local layers, decode rows)",
            Mutant::GroupFixedEight => "GQA groups other than 8 with more than one KV head",
            Mutant::BiasOfKvHead => "more than one query head per KV head (G > 1)",
            Mutant::PositionWithoutPrefix => "chunked prefill or decode (P > 0)",
            Mutant::BlockTableRowZero => "two or more requests with their own pages",
            Mutant::UnmaskedKeysLoaded => "a tile straddling the window start or the last key, over poisoned slots",
            Mutant::PiecesNoRescale => "split decode whose splits are cut into pieces with different LSEs",
            Mutant::BiasTimesScale => "query blocks (q_len > 1) with a bias on a tile within E",
            Mutant::Bf16Accumulator => "a row whose keys span many KV tiles (long context)",
            Mutant::DispatchOnFirstRequest => {
                "a batch of decodes followed by a prefill in one launch (a warm-up shape)"
            }
            Mutant::CombineMaxUnsynced => "any split-KV run through a combine kernel, under racecheck",
        }
    }
}

impl fmt::Display for Mutant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Mutant {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        Mutant::ALL
            .into_iter()
            .find(|m| m.as_str() == s || m.define().to_string() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Mutant::ALL.iter().map(|m| m.as_str()).collect();
                format!(
                    "unknown mutant `{s}`: expected 1..={} or one of {}",
                    Mutant::ALL.len(),
                    names.join(", ")
                )
            })
    }
}
