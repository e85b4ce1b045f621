//! `relattn route`: the routing decision for one capability and shape (no GPU needed).

use crate::exit;
use relattn_routing::{decide, lookup, Capability, Decision, Shape};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Compute capability, e.g. 9.0, 10.0, 12.1.
    #[arg(long, value_name = "X.Y", required_unless_present = "check")]
    pub cc: Option<Capability>,
    /// A local (sliding-window) layer; its window is --window-left.
    #[arg(long)]
    pub local: bool,
    /// Requests in the batch.
    #[arg(long, value_name = "N", required_unless_present = "check")]
    pub batch: Option<usize>,
    /// Longest new-token count of the batch (raw; routing buckets it).
    #[arg(long, value_name = "N", required_unless_present = "check")]
    pub max_query_len: Option<usize>,
    /// Query heads (per tensor-parallel rank).
    #[arg(long, value_name = "N", required_unless_present = "check")]
    pub heads: Option<usize>,
    /// KV heads (per tensor-parallel rank).
    #[arg(long, value_name = "N", required_unless_present = "check")]
    pub kv_heads: Option<usize>,
    /// Longest KV length, including the new tokens.
    #[arg(long, value_name = "N", required_unless_present = "check")]
    pub max_kv_len: Option<usize>,
    /// Tokens per KV-cache page.
    #[arg(long, value_name = "N", default_value_t = 16)]
    pub page_size: usize,
    /// Left window of a local layer (default 511 with --local; only with --local).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub window_left: Option<i64>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// Compare a worker's routing (--impl or --worker) with relattn's model on every
    /// capability of the table and every shape of the routing trials; exit 1 on any
    /// disagreement.
    #[arg(long, conflicts_with_all = ["cc", "batch", "max_query_len", "heads", "kv_heads", "max_kv_len", "local", "window_left"])]
    pub check: bool,
    #[arg(
        long = "impl",
        value_name = "NAME",
        requires = "check",
        conflicts_with = "worker",
        help = crate::worker::impl_help("With --check: a shipped worker")
    )]
    pub implementation: Option<String>,
    /// With --check: a worker command speaking worker protocol v1.
    #[arg(long, value_name = "COMMAND", requires = "check")]
    pub worker: Option<String>,
    /// With --check: seconds the worker may take to answer one request.
    #[arg(long, default_value_t = crate::worker::DEFAULT_TIMEOUT_S)]
    pub worker_timeout_s: f64,
}

/// The window of a local layer when --window-left is not given (local_extent 512 - 1).
const DEFAULT_LOCAL_WINDOW: i64 = 511;

impl Args {
    fn shape(&self) -> anyhow::Result<Shape> {
        let window_left = match (self.local, self.window_left) {
            (false, Some(_)) => return Err(exit::usage(
                "--window-left applies to local layers only: add --local, or drop --window-left",
            )),
            (false, None) => -1,
            (true, w) => w.unwrap_or(DEFAULT_LOCAL_WINDOW),
        };
        let need = |v: Option<usize>, flag: &str| {
            v.ok_or_else(|| exit::usage(format!("--{flag} is required without --check")))
        };
        let shape = Shape {
            batch: need(self.batch, "batch")?,
            max_query_len: need(self.max_query_len, "max-query-len")?,
            num_heads: need(self.heads, "heads")?,
            num_kv_heads: need(self.kv_heads, "kv-heads")?,
            max_kv_len: need(self.max_kv_len, "max-kv-len")?,
            page_size: self.page_size,
            window_left,
            is_local: self.local,
        };
        shape.validate().map_err(|e| exit::usage(e.to_string()))?;
        Ok(shape)
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if args.check {
        return check(&args);
    }
    let cc = args
        .cc
        .ok_or_else(|| exit::usage("--cc is required without --check"))?;
    let shape = args.shape()?;
    let decision = decide(cc, &shape);
    if args.json {
        println!("{}", serde_json::to_string(&decision)?);
    } else {
        print!("{}", render(cc, &shape, &decision));
    }
    Ok(())
}

/// `--check`: the worker's routing against the model; exit 1 when anything disagrees.
fn check(args: &Args) -> anyhow::Result<()> {
    use crate::worker::{timeout, WorkerRunner, WorkerSpec};
    let spec = match (&args.implementation, &args.worker) {
        (Some(name), _) => WorkerSpec::from_impl(name),
        (None, Some(command)) => WorkerSpec::from_command(command),
        (None, None) => Err("--check needs a worker: --impl NAME or --worker COMMAND".into()),
    }
    .map_err(exit::usage)?;
    let worker = WorkerRunner::start(spec, timeout(args.worker_timeout_s).map_err(exit::usage)?)
        .map_err(exit::usage)?;
    let tallies = super::route_check::check(&worker)?;
    if args.json {
        println!("{}", super::route_check::to_json(&worker, &tallies));
    } else {
        print!("{}", super::route_check::render(&worker, &tallies));
    }
    let disagree: usize = tallies.iter().map(|(_, t)| t.disagree).sum();
    if disagree > 0 {
        return Err(exit::failed(format!(
            "worker {} disagrees with relattn's routing on {disagree} (capability, shape) pairs",
            worker.name()
        )));
    }
    Ok(())
}

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

/// A few readable lines: the outcome first, then the policy values.
fn render(cc: Capability, shape: &Shape, d: &Decision) -> String {
    let family = lookup(cc).map_or(String::new(), |row| format!(" ({})", row.family));
    let layer = if shape.is_local {
        format!("local layer, window_left {}", shape.window_left)
    } else {
        "global layer".to_string()
    };
    let mut out = String::new();
    match (&d.path, &d.reason) {
        (Some(path), _) => out.push_str(&format!("SM {cc}{family}: route {path} ({layer})\n")),
        (None, reason) => out.push_str(&format!(
            "SM {cc}{family}: rejected: {}\n",
            reason.as_deref().unwrap_or("no reason given")
        )),
    }
    if let Some(n) = d.num_splits {
        out.push_str(&format!("  num_splits           {n}\n"));
    }
    if let Some(n) = d.decode_splits {
        out.push_str(&format!(
            "  split-KV decode      {} ({n} split{})\n",
            yes_no(d.split_kv_decode),
            if n == 1 { "" } else { "s" }
        ));
    }
    out.push_str(&format!(
        "  max_seqlen_q bucket  {} (raw {})\n",
        d.max_seqlen_q_bucket, shape.max_query_len
    ));
    out
}
