//! `Case`: one generated problem of a matrix, with its trials' split settings, tolerance and
//! the paths (or split settings) that are excluded for it.

use crate::layer::Layer;
use relattn_reference::judge::Tolerance;
use relattn_reference::limits::LimitError;
use relattn_reference::{BatchShape, BiasMode, GenSpec, Inputs, PageMode, Window};
use relattn_routing::PathId;
use relattn_routing::SplitSetting;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::fmt::Write;

/// The letter every case id starts with, so that no spreadsheet or dataframe reads an id as a
/// number (`394362e594` is a float to pandas, `c394362e594` is text).
pub const ID_PREFIX: &str = "c";

/// Hex digits of a case id after its prefix: 40 bits, so a 20,000-case tier has a collision
/// chance near 2e-4 (and `expand` reports one rather than merging two cases).
pub const ID_DIGITS: usize = 10;

/// One case of a matrix: everything needed to generate it, run its trials and judge them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Case {
    /// `c` and a hash of the canonical parameters and seed (`case_id`).
    pub id: String,
    /// `layer::heads[::dD]::pageP::layout::dtype::mix::bias::seedN[::extras]`, without the id;
    /// regression cases start with their bug class.
    pub name: String,
    pub tier: String,
    pub mix: String,
    pub spec: GenSpec,
    /// Each GPU path runs one trial per setting.
    pub splits: Vec<SplitSetting>,
    /// Long cases: how many query rows the reference checks (`None`: all rows).
    pub sample_rows: Option<usize>,
    pub tolerance: Tolerance,
    /// Paths that cannot take this case at all, with the reason.
    pub excluded: BTreeMap<PathId, String>,
    /// Split settings a path cannot take for this case, with the reason.
    pub excluded_splits: BTreeMap<PathId, BTreeMap<SplitSetting, String>>,
    /// The bug class (SPEC section 5) a regression case stands for.
    pub regression: Option<String>,
}

/// One (path, split) trial of a case and, when it cannot run, why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrialPlan {
    pub path: PathId,
    pub split: SplitSetting,
    pub name: String,
    pub skip: Option<String>,
}

impl Case {
    pub fn layer(&self) -> Layer {
        Layer {
            extent: self.spec.rel_extent,
            window_left: self.spec.window_left,
        }
    }

    pub fn is_local(&self) -> bool {
        Window::from_left(self.spec.window_left).is_local()
    }

    pub fn batch(&self) -> usize {
        self.spec.requests.len()
    }

    /// The batch's lengths and window, from the spec (nothing is generated): maxima, visible
    /// pairs and FLOPs come from here.
    pub fn shape(&self) -> BatchShape {
        BatchShape::new(
            self.spec.requests.clone(),
            Window::from_left(self.spec.window_left),
        )
    }

    /// `cu_seqlens_q[B]`.
    pub fn real_rows(&self) -> usize {
        self.shape().real_rows()
    }

    /// `T`: real and padding rows.
    pub fn total_rows(&self) -> usize {
        self.real_rows() + self.spec.padding_rows
    }

    pub fn max_query_len(&self) -> usize {
        self.shape().max_query_len()
    }

    pub fn max_kv_len(&self) -> usize {
        self.shape().max_kv_len()
    }

    /// Every request has `Lq <= 1` (what the fallback's split-KV decode kernel takes).
    pub fn is_decode_only(&self) -> bool {
        self.shape().is_decode_only()
    }

    /// Visible (query, key) pairs over all real rows, per head (causal, window on local layers).
    pub fn visible_pairs(&self) -> u64 {
        self.shape().visible_pairs()
    }

    /// Work of one full evaluation in FLOP (as `Problem::flops`), computed from the spec without
    /// generating anything.
    pub fn flops(&self) -> f64 {
        self.shape().flops(self.spec.num_heads, self.spec.head_dim)
    }

    /// Elements of the K/V cache buffer (both K and V), as `generate` allocates it.
    pub fn cache_elements(&self) -> u64 {
        let page = self.spec.page_size.max(1);
        let pages: usize = self.spec.requests.iter().map(|r| r.1.div_ceil(page)).sum();
        let blocks = match self.spec.pages {
            PageMode::Shuffled => 1 + pages + self.spec.spare_pages,
            PageMode::AllZero => 1 + self.spec.spare_pages,
        };
        2 * (blocks * page * self.spec.num_kv_heads * self.spec.head_dim) as u64
    }

    /// Refuse the case when, generated, it would take more than `limit` bytes in memory (the
    /// case-byte limit, `relattn_reference::limits::max_case_bytes`).
    pub fn check_bytes(&self, limit: u64) -> Result<(), LimitError> {
        let what = format!("case {} ({}) in memory", self.id, self.name);
        self.spec.size()?.check_bytes(what, limit)
    }

    /// The trial name of (path, split): `gpu::{path}::{name}::{split}::{id}`.
    pub fn trial_name(&self, path: PathId, split: SplitSetting) -> String {
        format!("gpu::{path}::{}::{split}::{}", self.name, self.id)
    }

    /// Why `path` cannot run this case with `split`, if it cannot.
    pub fn exclusion(&self, path: PathId, split: SplitSetting) -> Option<&str> {
        if let Some(reason) = self.excluded.get(&path) {
            return Some(reason);
        }
        self.excluded_splits
            .get(&path)
            .and_then(|m| m.get(&split))
            .map(String::as_str)
    }

    /// Every (path, split) trial of this case, in path then split order, runnable or not.
    pub fn trials(&self) -> Vec<TrialPlan> {
        let mut out = Vec::with_capacity(PathId::ALL.len() * self.splits.len());
        for path in PathId::ALL {
            for &split in &self.splits {
                out.push(TrialPlan {
                    path,
                    split,
                    name: self.trial_name(path, split),
                    skip: self.exclusion(path, split).map(str::to_string),
                });
            }
        }
        out
    }

    /// The names of `params`, in order (the keys a trial filter takes).
    pub const PARAM_KEYS: [&'static str; 20] = [
        "tier",
        "layer",
        "rel_extent",
        "window_left",
        "num_heads",
        "num_kv_heads",
        "head_dim",
        "page_size",
        "layout",
        "dtype",
        "mix",
        "bias",
        "inputs",
        "batch",
        "max_query_len",
        "max_kv_len",
        "padding_rows",
        "splits",
        "sample_rows",
        "regression",
    ];

    /// The parameters as (column, value) pairs, for report columns and listings; their names
    /// are `PARAM_KEYS`.
    pub fn params(&self) -> Vec<(&'static str, String)> {
        let s = &self.spec;
        let splits: Vec<String> = self.splits.iter().map(|x| x.to_string()).collect();
        vec![
            ("tier", self.tier.clone()),
            ("layer", self.layer().to_string()),
            ("rel_extent", s.rel_extent.to_string()),
            ("window_left", s.window_left.to_string()),
            ("num_heads", s.num_heads.to_string()),
            ("num_kv_heads", s.num_kv_heads.to_string()),
            ("head_dim", s.head_dim.to_string()),
            ("page_size", s.page_size.to_string()),
            ("layout", s.layout.name().to_string()),
            ("dtype", s.dtype.name().to_string()),
            ("mix", self.mix.clone()),
            ("bias", bias_name(s.bias).to_string()),
            ("inputs", s.inputs.name().to_string()),
            ("batch", self.batch().to_string()),
            ("max_query_len", self.max_query_len().to_string()),
            ("max_kv_len", self.max_kv_len().to_string()),
            ("padding_rows", s.padding_rows.to_string()),
            ("splits", splits.join(" ")),
            (
                "sample_rows",
                self.sample_rows.map_or(String::new(), |n| n.to_string()),
            ),
            ("regression", self.regression.clone().unwrap_or_default()),
        ]
    }
}

pub(crate) fn bias_name(bias: BiasMode) -> &'static str {
    match bias {
        BiasMode::Normal => "normal",
        BiasMode::Distinct => "distinct",
        BiasMode::Zero => "zero",
    }
}

fn pages_name(pages: PageMode) -> &'static str {
    match pages {
        PageMode::Shuffled => "shuffled",
        PageMode::AllZero => "all_zero",
    }
}

/// The text a case id hashes: every field of the spec, in a fixed order, as integers, names
/// and the bit pattern of the scale, so it does not depend on map order, float formatting or
/// the platform. `sample_rows` is included (it changes what is judged); split settings,
/// tolerances and exclusions are not: they say how the case is run, not what it is.
///
/// Changing this text changes every id (and breaks baselines keyed by id): bump the `v1`.
pub fn canonical_form(spec: &GenSpec, sample_rows: Option<usize>) -> String {
    // Every field by name, none with `..`: a field added to `GenSpec` does not compile here
    // until it has its place in the id (two cases differing only in it would share one id, and
    // `expand` would merge them silently).
    let GenSpec {
        dtype,
        num_heads,
        num_kv_heads,
        head_dim,
        rel_extent,
        window_left,
        softmax_scale,
        page_size,
        layout,
        requests,
        padding_rows,
        bias,
        pages,
        spare_pages,
        poison,
        seed,
        inputs,
    } = spec;
    let mut s = String::from("relattn-case-v1");
    let requests: Vec<String> = requests.iter().map(|(q, k)| format!("{q}:{k}")).collect();
    let _ = write!(
        s,
        ";dtype={};h={num_heads};hkv={num_kv_heads};d={head_dim};e={rel_extent};w={window_left};\
         scale={:016x};page={page_size};layout={};requests={};padding={padding_rows};bias={};\
         pages={};spare={spare_pages};poison={};seed={seed};sample={}",
        dtype.name(),
        softmax_scale.to_bits(),
        layout.name(),
        requests.join(","),
        bias_name(*bias),
        pages_name(*pages),
        u8::from(*poison),
        sample_rows.map_or("all".to_string(), |n| n.to_string()),
    );
    // Appended only away from the default, so ids from before the axis stand.
    if *inputs != Inputs::Rms1 {
        let _ = write!(s, ";inputs={}", inputs.name());
    }
    s
}

/// `ID_PREFIX`, then the first `ID_DIGITS` hex digits of the SHA-256 of the canonical form.
pub fn case_id(spec: &GenSpec, sample_rows: Option<usize>) -> String {
    let digest = Sha256::digest(canonical_form(spec, sample_rows).as_bytes());
    let mut hex = hex::encode(digest);
    hex.truncate(ID_DIGITS);
    format!("{ID_PREFIX}{hex}")
}
