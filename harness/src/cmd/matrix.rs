//! `relattn matrix`: the tiers and their case counts, or the cases of one tier or file.

use anyhow::Result;
use relattn_matrices::{load, load_tier, Expansion, Shard, TIERS};
use relattn_routing::PathId;
use std::fmt::Write;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print every tier with its cases, runnable trials per path and skipped trials (default).
    #[arg(long, conflicts_with = "show")]
    pub list: bool,
    /// Print the cases (id, then name) of a tier or a matrix file.
    #[arg(long, value_name = "TIER|FILE")]
    pub show: Option<String>,
    /// With --show: only shard K of N (1-based), as `relattn run --shard` would run it.
    #[arg(long, value_name = "K/N", requires = "show")]
    pub shard: Option<String>,
    /// With --show: also print every skipped trial with its reason.
    #[arg(long, requires = "show")]
    pub skipped: bool,
    /// With --show: only the cases a trial of `run --filter EXPR` could select (see `run
    /// --help`; `path` terms hold for the native paths a case is not excluded from).
    #[arg(long, value_name = "EXPR", requires = "show")]
    pub filter: Option<String>,
    /// Print which (path, kernel entry, dtype) the tier's trials reach, crossed with the
    /// features a launch can use, counted in cases from the launch plans; exit 1 if a cell the
    /// kernels support has no case.
    #[arg(long, value_name = "TIER|FILE", conflicts_with_all = ["show", "list"])]
    pub coverage: Option<String>,
    /// With --coverage: print JSON instead of the table.
    #[arg(long, requires = "coverage")]
    pub json: bool,
}

pub fn run(args: Args) -> Result<()> {
    if let Some(matrix) = &args.coverage {
        return coverage(matrix, args.json);
    }
    let text = match &args.show {
        Some(matrix) => {
            let filter = args
                .filter
                .as_deref()
                .map(crate::filter::Filter::parse)
                .transpose()
                .map_err(crate::exit::usage)?;
            show(matrix, args.shard.as_deref(), args.skipped, filter.as_ref())?
        }
        None => list()?,
    };
    crate::output::print(&text)?;
    Ok(())
}

fn coverage(matrix: &str, json: bool) -> Result<()> {
    let m = load(matrix).map_err(usage)?;
    let x = m.expand().map_err(usage)?;
    let cov = crate::coverage::of_cases(&x.cases);
    let gaps = cov.gaps();
    let text = if json {
        format!("{:#}\n", cov.json())
    } else {
        let mut t = cov.table();
        let _ = writeln!(
            t,
            "{}: {} cases; cells: cases whose trials reach the feature on that entry (-: the entry cannot use it)",
            m.name,
            x.cases.len()
        );
        for u in &cov.unplanned {
            let _ = writeln!(t, "not planned: {u}");
        }
        for (e, f) in &gaps {
            let _ = writeln!(
                t,
                "no case: {}/{}/{} with {}",
                e.path.as_str(),
                e.stage.as_str(),
                e.dtype.name(),
                f.name()
            );
        }
        t
    };
    crate::output::print(&text)?;
    if gaps.is_empty() {
        Ok(())
    } else {
        Err(crate::exit::failed(format!(
            "{} supported (entry, feature) cells have no case in {}",
            gaps.len(),
            m.name
        )))
    }
}

fn usage(err: relattn_matrices::MatrixError) -> anyhow::Error {
    crate::exit::usage(err.to_string())
}

fn list() -> Result<String> {
    let mut header = vec!["tier", "cases"];
    header.extend(PathId::ALL.iter().map(|p| p.as_str()));
    header.push("skipped");
    let mut table = crate::table::new(&header, &(1..header.len()).collect::<Vec<_>>());
    for tier in TIERS {
        let x = load_tier(tier).and_then(|m| m.expand()).map_err(usage)?;
        let per_path = x.trials_per_path();
        let mut row = vec![tier.to_string(), x.cases.len().to_string()];
        for path in PathId::ALL {
            row.push(per_path.get(&path).copied().unwrap_or(0).to_string());
        }
        row.push(x.skipped.len().to_string());
        table.add_row(row);
    }
    let mut out = crate::table::text(&table);
    let _ = writeln!(
        out,
        "(per path: runnable trials, one per case and split setting)"
    );
    Ok(out)
}

fn show(
    matrix: &str,
    shard: Option<&str>,
    with_skips: bool,
    filter: Option<&crate::filter::Filter>,
) -> Result<String> {
    let m = load(matrix).map_err(usage)?;
    let Expansion { cases, skipped } = m.expand().map_err(usage)?;
    let total = cases.len();
    let shard: Shard = match shard {
        Some(s) => s.parse().map_err(usage)?,
        None => Shard::ALL,
    };
    let mut cases = shard.select(&cases);
    if let Some(f) = filter {
        cases.retain(|c| f.matches_case(c));
    }
    let mut out = String::new();
    for c in &cases {
        let splits: Vec<String> = c.splits.iter().map(|s| s.to_string()).collect();
        let _ = writeln!(out, "{}  {}  [{}]", c.id, c.name, splits.join(" "));
    }
    if with_skips {
        for s in skipped
            .iter()
            .filter(|s| cases.iter().any(|c| c.id == s.case_id))
        {
            let _ = writeln!(out, "skip {}: {}", s.trial_name, s.reason);
        }
    }
    let _ = writeln!(
        out,
        "{}: {} of {total} cases (shard {shard})",
        m.name,
        cases.len()
    );
    Ok(out)
}
