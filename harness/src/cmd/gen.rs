//! `relattn gen`: write a case file from a matrix case (`--case ID`), a named preset or explicit
//! parameters.
//!
//! A matrix case is generated exactly as `relattn run` generates it. A preset gives a complete
//! spec; any explicit parameter given with it overrides that field.
//! Without a preset, `--heads`, `--kv-heads` and `--requests` are required and the rest take the
//! model's defaults (bf16, D = 128, scale 1/D, page 16, NHD-packed caches, normal bias, shuffled
//! pages, poisoned unreadable slots).

mod presets;

pub use presets::{preset, PRESETS};

use crate::case_by_id;
use crate::exit::usage;
use crate::progress::Phase;
use anyhow::Context;
use presets::{GLOBAL_EXTENT, LOCAL_EXTENT};
use relattn_reference::casefile::{write_case, CaseMeta};
use relattn_reference::gen::{generate, BiasMode, GenSpec, PageMode};
use relattn_reference::limits::max_case_bytes;
use relattn_reference::{CacheLayout, DType, RowLayout};
use std::path::PathBuf;

/// Cases at least this large (their tensors in memory) take seconds to generate: the command
/// shows its progress.
const LONG_CASE_BYTES: u64 = 256 << 20;

/// Every flag that describes a case, which `--case` takes from its matrix instead.
const SPEC_FLAGS: [&str; 21] = [
    "preset",
    "heads",
    "kv_heads",
    "head_dim",
    "extent",
    "window_left",
    "local",
    "scale",
    "page_size",
    "layout",
    "rows",
    "dtype",
    "requests",
    "padding_rows",
    "bias",
    "all_zero_pages",
    "no_poison",
    "spare_pages",
    "seed",
    "inputs",
    "case_id",
];

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Case file to write (safetensors).
    #[arg(long, short)]
    pub output: PathBuf,
    /// A matrix case by its id, as `relattn matrix --show` lists it (or a prefix naming one
    /// case): written exactly as `relattn run` generates it.
    #[arg(long, value_name = "ID", conflicts_with_all = SPEC_FLAGS)]
    pub case: Option<String>,
    /// The tier or matrix file that --case looks in [default: every built-in tier].
    #[arg(long, value_name = "TIER|FILE", requires = "case")]
    pub matrix: Option<String>,
    /// Named preset: tiny, decode, prefill, prefill2k, chunked, mixed, local, gqa16, verify,
    /// zero_table.
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(PRESETS.map(|p| p.0)))]
    pub preset: Option<String>,
    /// Query heads H.
    #[arg(long)]
    pub heads: Option<usize>,
    /// KV heads Hkv (H must be a multiple).
    #[arg(long)]
    pub kv_heads: Option<usize>,
    /// Head dimension D [default: 128].
    #[arg(long)]
    pub head_dim: Option<usize>,
    /// rel_extent E [default: 1024, or 512 with --local].
    #[arg(long)]
    pub extent: Option<usize>,
    /// Left window (-1 = none, global layer).
    #[arg(long, allow_hyphen_values = true, conflicts_with = "local")]
    pub window_left: Option<i64>,
    /// Local layer: window_left = E - 1 (and E = 512 unless --extent or a local preset says).
    #[arg(long)]
    pub local: bool,
    /// softmax_scale, a decimal or a fraction like 1/128 [default: 1/D].
    #[arg(long, value_parser = parse_scale)]
    pub scale: Option<f64>,
    /// Tokens per page [default: 16].
    #[arg(long)]
    pub page_size: Option<usize>,
    /// How GPU runs place the caches: contiguous, nhd_packed, hnd_packed [default: nhd_packed].
    #[arg(long)]
    pub layout: Option<CacheLayout>,
    /// How implementations get q, rel_logits and out: padded, strided, exact [default: padded].
    #[arg(long)]
    pub rows: Option<RowLayout>,
    /// bf16, fp16 or fp32 [default: bf16].
    #[arg(long)]
    pub dtype: Option<DType>,
    /// Requests as LQ:LK pairs, comma separated (Lq new queries, Lk keys including them).
    #[arg(long, value_parser = parse_requests)]
    pub requests: Option<Requests>,
    /// Padding rows after the last request (NaN inputs).
    #[arg(long)]
    pub padding_rows: Option<usize>,
    /// rel_logits fill: normal, distinct or zero [default: normal].
    #[arg(long, value_parser = parse_bias)]
    pub bias: Option<BiasMode>,
    /// Make every block-table entry 0 (every request aliases block 0).
    #[arg(long)]
    pub all_zero_pages: bool,
    /// Do not fill unreadable cache slots with NaN.
    #[arg(long)]
    pub no_poison: bool,
    /// Extra unused physical blocks and block-table slack [default: 1].
    #[arg(long)]
    pub spare_pages: Option<usize>,
    /// Seed of the inputs [default: 0].
    #[arg(long)]
    pub seed: Option<u64>,
    /// Input regime: rms1, peaked, sink, diagonal or large_logits [default: rms1].
    #[arg(long)]
    pub inputs: Option<relattn_reference::Inputs>,
    /// Case id recorded in the file [default: the preset name].
    #[arg(long)]
    pub case_id: Option<String>,
}

/// `(Lq, Lk)` per request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requests(pub Vec<(usize, usize)>);

pub fn run(args: Args) -> anyhow::Result<()> {
    let (spec, case_id, matrix_case) = match &args.case {
        Some(prefix) => {
            let case = case_by_id::find(args.matrix.as_deref(), prefix)?;
            case.check_bytes(max_case_bytes())
                .map_err(|e| usage(e.to_string()))?;
            let spec = case
                .spec()
                .cloned()
                .ok_or_else(|| usage(format!("case {} is not generated from a spec", case.id)))?;
            (spec, Some(case.id.clone()), Some(case))
        }
        None => {
            let spec = spec_of(&args)?;
            check(&spec)?;
            let id = args.case_id.clone().or_else(|| args.preset.clone());
            (spec, id, None)
        }
    };
    let long = spec.size().is_ok_and(|s| s.bytes() >= LONG_CASE_BYTES);
    let phase = long.then(|| Phase::start("gen", "generating the case", 0));
    let problem = generate(&spec).map_err(|e| usage(format!("invalid case: {e}")))?;
    phase.map(Phase::finish);
    let meta = CaseMeta {
        case_id,
        seed: Some(spec.seed),
        cache_layout: spec.layout,
    };
    write_case(&args.output, &problem, &meta)?;
    let size = std::fs::metadata(&args.output)
        .with_context(|| format!("{}: cannot read back", args.output.display()))?
        .len();
    let p = &problem;
    let pages: usize = p.requests().map(|r| r.kv_len.div_ceil(p.page_size)).sum();
    println!(
        "wrote {}: T={} ({} real + {} padding rows), B={}, H/Hkv={}/{}, D={}, E={}, \
         window_left={}, {} pages of {} in {} blocks, {}, {}, seed {}, {} bytes",
        args.output.display(),
        p.total_rows(),
        p.real_rows(),
        p.total_rows() - p.real_rows(),
        p.batch(),
        p.num_heads,
        p.num_kv_heads,
        p.head_dim,
        p.rel_extent,
        p.window_left,
        pages,
        p.page_size,
        p.num_blocks,
        p.dtype,
        spec.layout,
        spec.seed,
        size
    );
    if let Some(case) = matrix_case {
        let sample = case.sample_rows.map_or(String::new(), |n| {
            format!(
                "; `relattn run` judges a sample of {n} rows: `relattn judge --sample-rows {n}` \
                 does the same"
            )
        });
        println!("case {} of `{}`: {}{sample}", case.id, case.tier, case.name);
    }
    Ok(())
}

/// Preset (or defaults) with the explicit parameters applied.
fn spec_of(a: &Args) -> anyhow::Result<GenSpec> {
    let base = match &a.preset {
        Some(name) => preset(name).ok_or_else(|| usage(format!("unknown preset `{name}`")))?,
        None => {
            let missing: Vec<&str> = [
                ("--heads", a.heads.is_none()),
                ("--kv-heads", a.kv_heads.is_none()),
                ("--requests", a.requests.is_none()),
            ]
            .into_iter()
            .filter_map(|(flag, missing)| missing.then_some(flag))
            .collect();
            if !missing.is_empty() {
                return Err(usage(format!(
                    "without --preset, {} must be given (presets: {})",
                    missing.join(", "),
                    PRESETS.map(|p| p.0).join(", ")
                )));
            }
            GenSpec::global(1, 1, Vec::new(), 0)
        }
    };
    let base_local = relattn_reference::window_spans_extent(base.window_left, base.rel_extent);
    let local = a.local || (a.window_left.is_none() && base_local);
    let head_dim = a.head_dim.unwrap_or(base.head_dim);
    // A preset keeps its own E unless it is made local here: local layers have E = 512.
    let from_preset = a.preset.is_some() && (base_local || !local);
    let rel_extent = match a.extent {
        Some(e) => e,
        None if from_preset => base.rel_extent,
        None if local => LOCAL_EXTENT,
        None => GLOBAL_EXTENT,
    };
    let window_left = if local {
        // An extent past i64 is refused by `check`; it must not overflow here first.
        i64::try_from(rel_extent).map_or(i64::MAX, |e| e - 1)
    } else {
        a.window_left.unwrap_or(if a.preset.is_some() {
            base.window_left
        } else {
            -1
        })
    };
    let softmax_scale = match a.scale {
        Some(s) => s,
        None if a.head_dim.is_some() || a.preset.is_none() => 1.0 / head_dim as f64,
        None => base.softmax_scale,
    };
    Ok(GenSpec {
        dtype: a.dtype.unwrap_or(base.dtype),
        num_heads: a.heads.unwrap_or(base.num_heads),
        num_kv_heads: a.kv_heads.unwrap_or(base.num_kv_heads),
        head_dim,
        rel_extent,
        window_left,
        softmax_scale,
        page_size: a.page_size.unwrap_or(base.page_size),
        layout: a.layout.unwrap_or(base.layout),
        requests: a.requests.clone().map_or(base.requests.clone(), |r| r.0),
        padding_rows: a.padding_rows.unwrap_or(base.padding_rows),
        bias: a.bias.unwrap_or(base.bias),
        pages: if a.all_zero_pages {
            PageMode::AllZero
        } else {
            base.pages
        },
        spare_pages: a.spare_pages.unwrap_or(base.spare_pages),
        poison: base.poison && !a.no_poison,
        seed: a.seed.unwrap_or(base.seed),
        inputs: a.inputs.unwrap_or(base.inputs),
        rows: a.rows.unwrap_or(base.rows),
    })
}

/// The flag that sets a `GenSpec` field, for messages.
fn flag_of(field: &'static str) -> String {
    let flag = match field {
        "num_heads" => "--heads",
        "num_kv_heads" => "--kv-heads",
        "head_dim" => "--head-dim",
        "rel_extent" => "--extent",
        "page_size" => "--page-size",
        "padding_rows" => "--padding-rows",
        "spare_pages" => "--spare-pages",
        "requests" => "--requests",
        other => other,
    };
    flag.to_string()
}

/// Checks with the command's own flag names, before any generation work: every dimension in
/// its range (`limits::Dim`), then the case's bytes against the case-byte limit.
fn check(s: &GenSpec) -> anyhow::Result<()> {
    let size = s.size_with(&flag_of).map_err(|e| usage(e.to_string()))?;
    if !s.num_heads.is_multiple_of(s.num_kv_heads) {
        return Err(usage(format!(
            "--heads {} is not a multiple of --kv-heads {}",
            s.num_heads, s.num_kv_heads
        )));
    }
    if s.window_left < -1 {
        return Err(usage(format!(
            "--window-left {} is invalid: use -1 for no window or a value >= 0",
            s.window_left
        )));
    }
    if !s.softmax_scale.is_finite() {
        return Err(usage(format!("--scale {} is not finite", s.softmax_scale)));
    }
    if s.requests.is_empty() {
        return Err(usage("--requests needs at least one LQ:LK pair"));
    }
    for (b, &(lq, lk)) in s.requests.iter().enumerate() {
        if lq > lk {
            return Err(usage(format!(
                "--requests entry {b} is {lq}:{lk}: Lq = {lq} exceeds Lk = {lk} \
                 (Lk counts the new tokens, so Lk >= Lq)"
            )));
        }
    }
    size.check_bytes("the case in memory", max_case_bytes())
        .map_err(|e| usage(e.to_string()))
}

fn parse_requests(s: &str) -> Result<Requests, String> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (lq, lk) = part
            .split_once(':')
            .ok_or_else(|| format!("`{part}` is not LQ:LK (e.g. 1:4096 or 128:128)"))?;
        let num = |x: &str, what: &str| {
            x.trim()
                .parse::<usize>()
                .map_err(|_| format!("`{part}`: {what} `{x}` is not a count"))
        };
        out.push((num(lq, "LQ")?, num(lk, "LK")?));
    }
    if out.is_empty() {
        return Err("expected at least one LQ:LK pair".into());
    }
    Ok(Requests(out))
}

/// A decimal, or `a/b` with decimal `a` and `b`.
fn parse_scale(s: &str) -> Result<f64, String> {
    let value = match s.split_once('/') {
        Some((a, b)) => {
            let a: f64 = a
                .trim()
                .parse()
                .map_err(|_| format!("`{a}` is not a number"))?;
            let b: f64 = b
                .trim()
                .parse()
                .map_err(|_| format!("`{b}` is not a number"))?;
            a / b
        }
        None => s
            .trim()
            .parse()
            .map_err(|_| format!("`{s}` is not a number"))?,
    };
    if value.is_finite() {
        Ok(value)
    } else {
        Err(format!("`{s}` is not finite"))
    }
}

fn parse_bias(s: &str) -> Result<BiasMode, String> {
    match s {
        "normal" => Ok(BiasMode::Normal),
        "distinct" => Ok(BiasMode::Distinct),
        "zero" => Ok(BiasMode::Zero),
        _ => Err(format!("`{s}` is not one of normal, distinct, zero")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn spec(args: &[&str]) -> GenSpec {
        let cli = Cli::try_parse_from(["gen", "-o", "x"].iter().chain(args)).unwrap();
        spec_of(&cli.args).unwrap()
    }

    #[test]
    fn extent_and_window() {
        let s = spec(&["--heads", "8", "--kv-heads", "1", "--requests", "1:5"]);
        assert_eq!(
            (s.rel_extent, s.window_left, s.softmax_scale),
            (1024, -1, 1.0 / 128.0)
        );
        let s = spec(&[
            "--heads",
            "8",
            "--kv-heads",
            "1",
            "--requests",
            "1:5",
            "--local",
        ]);
        assert_eq!((s.rel_extent, s.window_left), (512, 511));
        let s = spec(&["--preset", "prefill", "--local"]);
        assert_eq!((s.rel_extent, s.window_left), (512, 511));
        let s = spec(&["--preset", "local", "--extent", "256"]);
        assert_eq!((s.rel_extent, s.window_left), (256, 255));
        let s = spec(&["--preset", "local", "--window-left", "-1"]);
        assert_eq!((s.rel_extent, s.window_left), (512, -1));
        let s = spec(&["--preset", "tiny", "--head-dim", "64"]);
        assert_eq!((s.head_dim, s.softmax_scale), (64, 1.0 / 64.0));
        let s = spec(&["--preset", "tiny"]);
        assert_eq!(
            (s.head_dim, s.softmax_scale, s.bias),
            (32, 1.0 / 32.0, BiasMode::Distinct)
        );
    }

    /// `--case` takes the whole case from its matrix: every other flag that describes a case
    /// must conflict with it rather than be ignored.
    #[test]
    fn case_conflicts_with_every_flag_that_describes_a_case() {
        use clap::CommandFactory;
        let cmd = Cli::command();
        let others = ["output", "case", "matrix", "help"];
        for arg in cmd.get_arguments() {
            let id = arg.get_id().as_str();
            assert!(
                others.contains(&id) || SPEC_FLAGS.contains(&id),
                "--{id} is not in SPEC_FLAGS: --case would ignore it"
            );
        }
        let err = Cli::try_parse_from(["gen", "-o", "x", "--case", "c1", "--heads", "8"]);
        assert!(err.is_err());
    }

    #[test]
    fn every_preset_is_valid() {
        for (name, _) in PRESETS {
            let spec = preset(name).unwrap();
            check(&spec).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }

    #[test]
    fn parsers() {
        assert_eq!(
            parse_requests("1:4, 128:128").unwrap(),
            Requests(vec![(1, 4), (128, 128)])
        );
        assert!(parse_requests("1-4").is_err());
        assert!(parse_requests("").is_err());
        assert_eq!(parse_scale("1/3").unwrap(), 1.0 / 3.0);
        assert_eq!(parse_scale("0.0078125").unwrap(), 1.0 / 128.0);
        assert!(parse_scale("1/0").is_err());
        assert!(parse_bias("gauss").is_err());
    }
}
