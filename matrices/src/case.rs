//! `Case`: one problem of a tier (generated from a matrix's spec, or read from a case file of a
//! case folder), with its trials' split settings, tolerance and the paths (or split settings)
//! that are excluded for it.

use crate::layer::Layer;
use relattn_reference::judge::Tolerance;
use relattn_reference::limits::LimitError;
use relattn_reference::{
    BatchShape, BiasMode, CacheLayout, DType, GenSpec, Inputs, PageMode, Problem, RowLayout, Window,
};
use relattn_routing::PathId;
use relattn_routing::SplitSetting;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::PathBuf;

/// The letter every case id starts with, so that no spreadsheet or dataframe reads an id as a
/// number (`394362e594` is a float to pandas, `c394362e594` is text).
pub const ID_PREFIX: &str = "c";

/// Hex digits of a case id after its prefix: 40 bits, so a 20,000-case tier has a collision
/// chance near 2e-4 (and `expand` reports one rather than merging two cases).
pub const ID_DIGITS: usize = 10;

/// One case of a tier: everything needed to build its inputs, run its trials and judge them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Case {
    /// `c` and a hash: of the canonical parameters and seed (`case_id`) for a generated case, of
    /// the file's bytes (`file_case_id`) for a case file.
    pub id: String,
    /// `layer::heads[::dD]::pageP::layout::dtype::mix::bias::seedN[::extras]`, without the id;
    /// regression cases start with their bug class; a case file's is its file's stem.
    pub name: String,
    pub tier: String,
    /// The named batch mix (empty for a case file).
    pub mix: String,
    /// Where the inputs come from.
    pub source: CaseSource,
    /// Each GPU path runs one trial per setting.
    pub splits: Vec<SplitSetting>,
    /// Long cases: how many query rows the reference checks (`None`: all rows).
    pub sample_rows: Option<usize>,
    pub tolerance: Tolerance,
    /// Paths that cannot take this case at all, with the reason.
    pub excluded: BTreeMap<PathId, String>,
    /// Split settings a path cannot take for this case, with the reason.
    pub excluded_splits: BTreeMap<PathId, BTreeMap<SplitSetting, String>>,
    /// The bug class (docs/operator.md section 5) a regression case stands for.
    pub regression: Option<String>,
}

/// Where a case's inputs come from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum CaseSource {
    /// Generated from a spec (every case of a matrix).
    Spec(GenSpec),
    /// Read from a case file (every case of a case folder).
    File(FileCase),
}

/// A case file of a case folder, as it was when the folder was read: the trials read it again
/// and check that its bytes still hash to the case's id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileCase {
    /// The file: the folder as given, joined with `relative`.
    pub path: PathBuf,
    /// Its path under the folder (the reports' `file` column).
    pub relative: String,
    pub facts: Facts,
    /// The file's `seed` metadata.
    pub seed: Option<u64>,
    /// Bytes of its tensors in memory (`CaseSize::bytes`).
    pub bytes: u64,
}

/// What a case is, whichever its source: the operator's parameters and the batch. The trial
/// lists, the exclusion rules and the reports read these; nothing here needs the inputs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Facts {
    pub dtype: DType,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rel_extent: usize,
    /// -1 = global layer.
    pub window_left: i64,
    pub softmax_scale: f64,
    pub page_size: usize,
    pub layout: CacheLayout,
    /// `(Lq_b, Lk_b)` per request.
    pub requests: Vec<(usize, usize)>,
    /// Rows after `cu_seqlens_q[B]`.
    pub padding_rows: usize,
    /// How q, rel_logits and out are laid out for the implementations.
    #[serde(default)]
    pub rows: RowLayout,
}

impl Facts {
    /// A generated case's: the spec's own values. Every field of the spec by name, none with
    /// `..`: a field added to `GenSpec` does not compile here until it is a fact or, like the
    /// values' fills and the seed, says how the inputs are made rather than what the case is.
    pub fn of_spec(s: &GenSpec) -> Facts {
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
            rows,
            bias: _,
            pages: _,
            spare_pages: _,
            poison: _,
            seed: _,
            inputs: _,
        } = s;
        Facts {
            dtype: *dtype,
            num_heads: *num_heads,
            num_kv_heads: *num_kv_heads,
            head_dim: *head_dim,
            rel_extent: *rel_extent,
            window_left: *window_left,
            softmax_scale: *softmax_scale,
            page_size: *page_size,
            layout: *layout,
            requests: requests.clone(),
            padding_rows: *padding_rows,
            rows: *rows,
        }
    }

    /// A case file's: those of the problem it holds.
    pub fn of_problem(p: &Problem) -> Facts {
        Facts {
            dtype: p.dtype,
            num_heads: p.num_heads,
            num_kv_heads: p.num_kv_heads,
            head_dim: p.head_dim,
            rel_extent: p.rel_extent,
            window_left: p.window_left,
            softmax_scale: p.softmax_scale,
            page_size: p.page_size,
            layout: p.layout,
            requests: p.requests().map(|r| (r.q_len, r.kv_len)).collect(),
            padding_rows: p.total_rows() - p.real_rows(),
            rows: p.rows,
        }
    }
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
    /// The spec a generated case is made from (None for a case file).
    pub fn spec(&self) -> Option<&GenSpec> {
        match &self.source {
            CaseSource::Spec(spec) => Some(spec),
            CaseSource::File(_) => None,
        }
    }

    /// The case file a case folder's case is read from (None for a generated case).
    pub fn file(&self) -> Option<&FileCase> {
        match &self.source {
            CaseSource::Spec(_) => None,
            CaseSource::File(file) => Some(file),
        }
    }

    /// The operator's parameters and the batch.
    pub fn facts(&self) -> Facts {
        match &self.source {
            CaseSource::Spec(spec) => Facts::of_spec(spec),
            CaseSource::File(file) => file.facts.clone(),
        }
    }

    /// The seed of the inputs (a case file's `seed`, else 0: the rows `judge` samples by default).
    pub fn seed(&self) -> u64 {
        match &self.source {
            CaseSource::Spec(spec) => spec.seed,
            CaseSource::File(file) => file.seed.unwrap_or(0),
        }
    }

    /// Bytes of the case's tensors in memory (0 for a spec out of range, which `check_bytes`
    /// refuses).
    pub fn bytes(&self) -> u64 {
        match &self.source {
            CaseSource::Spec(spec) => spec.size().map_or(0, |s| s.bytes()),
            CaseSource::File(file) => file.bytes,
        }
    }

    pub fn layer(&self) -> Layer {
        let f = self.facts();
        Layer {
            extent: f.rel_extent,
            window_left: f.window_left,
        }
    }

    pub fn is_local(&self) -> bool {
        self.window().is_local()
    }

    fn window(&self) -> Window {
        Window::from_left(self.facts().window_left)
    }

    pub fn batch(&self) -> usize {
        self.shape().batch()
    }

    /// The batch's lengths and window, from the facts (nothing is generated or read): maxima,
    /// visible pairs and FLOPs come from here.
    pub fn shape(&self) -> BatchShape {
        let f = self.facts();
        BatchShape::new(f.requests, Window::from_left(f.window_left))
    }

    /// `cu_seqlens_q[B]`.
    pub fn real_rows(&self) -> usize {
        self.shape().real_rows()
    }

    /// `T`: real and padding rows.
    pub fn total_rows(&self) -> usize {
        self.real_rows() + self.facts().padding_rows
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

    /// Work of one full evaluation in FLOP (as `Problem::flops`), computed from the facts
    /// without generating or reading anything.
    pub fn flops(&self) -> f64 {
        let f = self.facts();
        self.shape().flops(f.num_heads, f.head_dim)
    }

    /// Elements of the K/V cache buffer (both K and V) `generate` allocates for a generated
    /// case (None for a case file).
    pub fn cache_elements(&self) -> Option<u64> {
        let spec = self.spec()?;
        let page = spec.page_size.max(1);
        let pages: usize = spec.requests.iter().map(|r| r.1.div_ceil(page)).sum();
        let blocks = match spec.pages {
            PageMode::Shuffled => 1 + pages + spec.spare_pages,
            PageMode::AllZero => 1 + spec.spare_pages,
        };
        Some(2 * (blocks * page * spec.num_kv_heads * spec.head_dim) as u64)
    }

    /// Refuse the case when, generated, it would take more than `limit` bytes in memory (the
    /// case-byte limit, `relattn_reference::limits::max_case_bytes`).
    pub fn check_bytes(&self, limit: u64) -> Result<(), LimitError> {
        let what = format!("case {} ({}) in memory", self.id, self.name);
        match &self.source {
            CaseSource::Spec(spec) => spec.size()?.check_bytes(what, limit),
            CaseSource::File(file) => {
                relattn_reference::limits::check_bytes(what, file.bytes, limit)
            }
        }
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
    pub const PARAM_KEYS: [&'static str; 22] = [
        "tier",
        "layer",
        "rel_extent",
        "window_left",
        "num_heads",
        "num_kv_heads",
        "head_dim",
        "page_size",
        "layout",
        "rows",
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
        "file",
    ];

    /// The parameters as (column, value) pairs, for report columns and listings; their names
    /// are `PARAM_KEYS`. What a source does not say is empty: a case file's bias and input
    /// regime, a generated case's file.
    pub fn params(&self) -> Vec<(&'static str, String)> {
        let f = self.facts();
        let shape = self.shape();
        let splits: Vec<String> = self.splits.iter().map(|x| x.to_string()).collect();
        let (bias, inputs, file) = match &self.source {
            CaseSource::Spec(s) => (bias_name(s.bias), s.inputs.name(), ""),
            CaseSource::File(file) => ("", "", file.relative.as_str()),
        };
        vec![
            ("tier", self.tier.clone()),
            ("layer", self.layer().to_string()),
            ("rel_extent", f.rel_extent.to_string()),
            ("window_left", f.window_left.to_string()),
            ("num_heads", f.num_heads.to_string()),
            ("num_kv_heads", f.num_kv_heads.to_string()),
            ("head_dim", f.head_dim.to_string()),
            ("page_size", f.page_size.to_string()),
            ("layout", f.layout.name().to_string()),
            ("rows", f.rows.name().to_string()),
            ("dtype", f.dtype.name().to_string()),
            ("mix", self.mix.clone()),
            ("bias", bias.to_string()),
            ("inputs", inputs.to_string()),
            ("batch", shape.batch().to_string()),
            ("max_query_len", shape.max_query_len().to_string()),
            ("max_kv_len", shape.max_kv_len().to_string()),
            ("padding_rows", f.padding_rows.to_string()),
            ("splits", splits.join(" ")),
            (
                "sample_rows",
                self.sample_rows.map_or(String::new(), |n| n.to_string()),
            ),
            ("regression", self.regression.clone().unwrap_or_default()),
            ("file", file.to_string()),
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
        rows,
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
    if *rows != RowLayout::Padded {
        let _ = write!(s, ";rows={}", rows.name());
    }
    s
}

/// `ID_PREFIX`, then the first `ID_DIGITS` hex digits of the SHA-256 of the canonical form.
pub fn case_id(spec: &GenSpec, sample_rows: Option<usize>) -> String {
    id_of(canonical_form(spec, sample_rows).as_bytes())
}

/// A case file's id: `ID_PREFIX`, then the first `ID_DIGITS` hex digits of the SHA-256 of its
/// bytes (`sha256sum FILE` prints them), so a file keeps its id when renamed or moved.
pub fn file_case_id(bytes: &[u8]) -> String {
    id_of(bytes)
}

fn id_of(bytes: &[u8]) -> String {
    let mut hex = hex::encode(Sha256::digest(bytes));
    hex.truncate(ID_DIGITS);
    format!("{ID_PREFIX}{hex}")
}
