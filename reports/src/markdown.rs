//! summary.md: what a person reads first. One table per path, one line per layer kind.

use crate::plot::{skipped_plots, PLOTS_DIR, REPORT_PLOTS};
use crate::row::{short_float, Row, Status};
use crate::summary::{cmp_ratio, worst_ratio, StatusCounts, Summary};
use crate::text::{one_line, visible};
use std::collections::BTreeMap;
use std::fmt::Write;

/// Failures listed per path before "and N more".
const MAX_FAILURES_LISTED: usize = 20;
/// Slowest trials listed per path.
const SLOWEST_LISTED: usize = 5;
/// Distinct skip reasons listed per path.
const SKIP_REASONS_LISTED: usize = 5;

fn counts_text(c: &StatusCounts) -> String {
    format!(
        "{} pass, {} fail, {} skip, {} error",
        c.pass, c.fail, c.skip, c.error
    )
}

/// Table cells must not break the row: pipes escaped, newlines folded, control characters
/// escaped.
fn cell(text: &str) -> String {
    one_line(&text.replace('|', "\\|").replace('\r', " "))
}

fn opt(v: Option<f64>) -> String {
    v.map(short_float).unwrap_or_else(|| "-".to_string())
}

/// Renders summary.md for one architecture, linking `plots` (file names in `plots/`).
pub fn render(summary: &Summary, rows: &[Row], plots: &[&str]) -> String {
    let mut s = String::new();
    let env = &summary.environment;
    let state = if summary.complete {
        ""
    } else {
        " (INCOMPLETE: interrupted, still running, or shards missing)"
    };
    let _ = writeln!(s, "# relattn report: {}{state}\n", summary.arch);
    let _ = writeln!(s, "- Machine: {}", one_line(&env.machine_line()));
    let mut run = Vec::new();
    for (label, v) in [
        ("relattn revision", &env.relattn_revision),
        ("working directory revision", &env.git_revision),
        ("matrix", &env.matrix),
        ("shard", &env.shard),
        ("relattn", &env.relattn_version),
        ("started", &env.started),
        ("finished", &env.finished),
    ] {
        if let Some(v) = v {
            run.push(format!("{label} {}", one_line(v)));
        }
    }
    if !run.is_empty() {
        let _ = writeln!(s, "- Run: {}", run.join(", "));
    }
    if !env.seeds.is_empty() {
        let seeds: Vec<String> = env.seeds.iter().map(u64::to_string).collect();
        let _ = writeln!(s, "- Seeds: {}", seeds.join(", "));
    }
    if let Some(serde_json::Value::Object(phases)) = env.extra.get("phases") {
        let secs = |k: &str| phases.get(k).and_then(|v| v.as_f64());
        // In the order the work happens (the map itself is sorted by name).
        let busy: Vec<String> = [
            "generate",
            "reference",
            "compile",
            "gpu",
            "judge",
            "self_checks",
        ]
        .iter()
        .filter_map(|k| Some(format!("{k} {:.1} s", secs(&format!("{k}_s"))?)))
        .collect();
        if let Some(wall) = secs("wall_s") {
            let _ = writeln!(
                s,
                "- Time: wall {wall:.1} s; busy, summed over threads: {}",
                busy.join(", ")
            );
        }
    }
    for note in &env.notes {
        let _ = writeln!(s, "- Note: {}", cell(note));
    }
    // An incomplete report is never a pass: the trials it lacks may be the failing ones.
    let verdict = match (summary.all_passed(), summary.complete) {
        (false, _) => "FAIL",
        (true, false) => "INCOMPLETE",
        (true, true) => "PASS",
    };
    let _ = writeln!(
        s,
        "\n**{verdict}**: {} trials: {}\n",
        summary.counts.total(),
        counts_text(&summary.counts)
    );
    compile_section(&mut s, summary);
    plots_line(&mut s, plots, rows);

    let mut by_path: BTreeMap<&str, Vec<&Row>> = BTreeMap::new();
    for r in rows {
        by_path.entry(r.path.as_str()).or_default().push(r);
    }
    for (path, prs) in &by_path {
        path_section(&mut s, summary, path, prs);
    }
    // Every field above is escaped where it is written; this pass keeps any text a later
    // change forgets from reaching a terminal raw.
    visible(&s).into_owned()
}

fn plots_line(s: &mut String, plots: &[&str], rows: &[Row]) {
    let links: Vec<String> = REPORT_PLOTS
        .iter()
        .filter(|(file, _, _)| plots.contains(file))
        .map(|(file, title, _)| format!("[{title}]({PLOTS_DIR}/{file})"))
        .collect();
    if !links.is_empty() {
        let _ = writeln!(s, "Plots: {}.\n", links.join(", "));
    }
    // Said where the link would be, so a missing plot is not taken for a failed one.
    for (file, why) in skipped_plots(rows) {
        let _ = writeln!(s, "Not drawn: `{file}`: {}.\n", cell(&why));
    }
}

fn compile_section(s: &mut String, summary: &Summary) {
    let checks = &summary.environment.compile_checks;
    if checks.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "Compile checks: {} ok, {} failed.\n",
        checks.len() - summary.compile_checks_failed,
        summary.compile_checks_failed
    );
    for c in checks.iter().filter(|c| !c.ok) {
        let _ = writeln!(
            s,
            "- `{}` for `{}`: {}",
            cell(&c.program),
            cell(&c.arch),
            cell(&c.message)
        );
    }
    if summary.compile_checks_failed > 0 {
        s.push('\n');
    }
}

fn path_section(s: &mut String, summary: &Summary, path: &str, rows: &[&Row]) {
    let Some(ps) = summary.by_path.get(path) else {
        return;
    };
    let _ = writeln!(s, "## Path `{}`: {}\n", cell(path), counts_text(&ps.counts));
    let _ = writeln!(
        s,
        "| layer | pass | fail | skip | error | worst ratio | worst trial |"
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---|");
    let mut by_layer: BTreeMap<&str, Vec<&Row>> = BTreeMap::new();
    for r in rows {
        by_layer.entry(r.layer()).or_default().push(r);
    }
    for (layer, lrs) in &by_layer {
        let c = ps.by_layer.get(*layer).copied().unwrap_or_default();
        let worst = worst_ratio(lrs);
        let (ratio, trial) = match &worst {
            Some(w) => (short_float(w.ratio), format!("`{}`", cell(&w.trial))),
            None => ("-".to_string(), String::new()),
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {ratio} | {trial} |",
            cell(layer),
            c.pass,
            c.fail,
            c.skip,
            c.error
        );
    }
    s.push('\n');
    if let Some(t) = &ps.timing {
        let mut line = format!(
            "Timing: {} timed trials, total {} ms, median {} ms",
            t.timed_trials,
            short_float(t.total_ms),
            short_float(t.median_ms)
        );
        // Throughput only where the rows carry it (GPU trials); CPU checks have times only.
        for (unit, median, best, pct) in [
            (
                "TFLOP/s",
                t.median_tflops,
                t.best_tflops,
                t.best_tflops_pct_of_peak,
            ),
            ("GB/s", t.median_gbps, t.best_gbps, t.best_gbps_pct_of_peak),
        ] {
            if let (Some(median), Some(best)) = (median, best) {
                let pct = pct
                    .map(|p| format!(" ({}% of peak)", short_float(p)))
                    .unwrap_or_default();
                let _ = write!(
                    line,
                    "; {unit} median {}, best {}{pct}",
                    short_float(median),
                    short_float(best)
                );
            }
        }
        let _ = writeln!(s, "{line}.\n");
        slowest(s, rows);
    }
    failures(s, rows);
    skips(s, rows);
}

fn slowest(s: &mut String, rows: &[&Row]) {
    let mut timed: Vec<&&Row> = rows
        .iter()
        .filter(|r| r.ms.is_some_and(f64::is_finite))
        .collect();
    timed.sort_by(|a, b| cmp_ratio(b.ms.unwrap_or(0.0), a.ms.unwrap_or(0.0)));
    let _ = writeln!(
        s,
        "| slowest trials | ms | TFLOP/s | GB/s |\n|---|---:|---:|---:|"
    );
    for r in timed.iter().take(SLOWEST_LISTED) {
        let _ = writeln!(
            s,
            "| `{}` | {} | {} | {} |",
            cell(&r.trial),
            opt(r.ms),
            opt(r.tflops),
            opt(r.gbps)
        );
    }
    s.push('\n');
}

fn failures(s: &mut String, rows: &[&Row]) {
    let bad: Vec<&&Row> = rows.iter().filter(|r| r.status.is_bad()).collect();
    if bad.is_empty() {
        return;
    }
    let _ = writeln!(s, "Failures ({}):\n", bad.len());
    for r in bad.iter().take(MAX_FAILURES_LISTED) {
        let figures = match (r.max_abs, r.bound) {
            (Some(e), Some(b)) => {
                format!(" [max_abs {}, bound {}]", short_float(e), short_float(b))
            }
            _ => String::new(),
        };
        // Continuation lines indented so a multi-line message stays inside its list item.
        let message = visible(r.message.trim_end()).replace('\n', "\n  ");
        let _ = writeln!(
            s,
            "- `{}` ({}){figures}: {message}",
            cell(&r.trial),
            r.status
        );
    }
    if bad.len() > MAX_FAILURES_LISTED {
        let _ = writeln!(
            s,
            "- ... and {} more: see results.csv",
            bad.len() - MAX_FAILURES_LISTED
        );
    }
    s.push('\n');
}

fn skips(s: &mut String, rows: &[&Row]) {
    let mut reasons: BTreeMap<&str, usize> = BTreeMap::new();
    for r in rows.iter().filter(|r| r.status == Status::Skip) {
        *reasons.entry(r.message.as_str()).or_default() += 1;
    }
    if reasons.is_empty() {
        return;
    }
    let mut reasons: Vec<(&str, usize)> = reasons.into_iter().collect();
    reasons.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let _ = writeln!(s, "Skip reasons:\n");
    for (reason, n) in reasons.iter().take(SKIP_REASONS_LISTED) {
        let reason = if reason.is_empty() {
            "(no reason given)"
        } else {
            reason
        };
        let _ = writeln!(s, "- {n} x {}", cell(reason));
    }
    if reasons.len() > SKIP_REASONS_LISTED {
        let _ = writeln!(
            s,
            "- ... and {} other reasons",
            reasons.len() - SKIP_REASONS_LISTED
        );
    }
    s.push('\n');
}
