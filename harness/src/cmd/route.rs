//! `relattn route`: the routing decision for one capability and shape (no GPU needed).

use crate::exit;
use relattn_kernels::routing::{decide, lookup, Capability, Decision, Shape};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Compute capability, e.g. 9.0, 10.0, 12.1.
    #[arg(long, value_name = "X.Y")]
    pub cc: Capability,
    /// A local (sliding-window) layer; its window is --window-left.
    #[arg(long)]
    pub local: bool,
    /// Requests in the batch.
    #[arg(long, value_name = "N")]
    pub batch: usize,
    /// Longest new-token count of the batch (raw; routing buckets it).
    #[arg(long, value_name = "N")]
    pub max_query_len: usize,
    /// Query heads (per tensor-parallel rank).
    #[arg(long, value_name = "N")]
    pub heads: usize,
    /// KV heads (per tensor-parallel rank).
    #[arg(long, value_name = "N")]
    pub kv_heads: usize,
    /// Longest KV length, including the new tokens.
    #[arg(long, value_name = "N")]
    pub max_kv_len: usize,
    /// Tokens per KV-cache page.
    #[arg(long, value_name = "N", default_value_t = 16)]
    pub page_size: usize,
    /// Left window of a local layer (default 511 with --local; only with --local).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub window_left: Option<i64>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
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
        let shape = Shape {
            batch: self.batch,
            max_query_len: self.max_query_len,
            num_heads: self.heads,
            num_kv_heads: self.kv_heads,
            max_kv_len: self.max_kv_len,
            page_size: self.page_size,
            window_left,
            is_local: self.local,
        };
        shape.validate().map_err(|e| exit::usage(e.to_string()))?;
        Ok(shape)
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let shape = args.shape()?;
    let decision = decide(args.cc, &shape);
    if args.json {
        println!("{}", serde_json::to_string(&decision)?);
    } else {
        print!("{}", render(args.cc, &shape, &decision));
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
