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
/// Distinct skip reasons listed (the rest are counted, each in results.csv).
const SKIP_REASONS_LISTED: usize = 100;

fn counts_text(c: &StatusCounts) -> String {
    format!(
        "{} pass, {} fail, {} skip, {} error{}",
        c.pass,
        c.fail,
        c.skip,
        c.error,
        if c.xfail + c.xpass > 0 {
            format!(", {} xfail, {} xpass", c.xfail, c.xpass)
        } else {
            String::new()
        }
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
    if let Some(serde_json::Value::Object(san)) = env.extra.get("sanitize") {
        let tool = san.get("tool").and_then(|v| v.as_str()).unwrap_or("?");
        let _ = writeln!(
            s,
            "- **Sanitized** (`--sanitize {}`): every GPU trial ran under compute-sanitizer {}; \
             its times are not comparable with unsanitized runs",
            one_line(tool),
            one_line(tool)
        );
    }
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
            "workers",
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
    let ran = what_ran(rows);
    let scope = if ran.starts_with("CPU only") {
        " (CPU only)"
    } else {
        ""
    };
    let _ = writeln!(
        s,
        "\n**{verdict}{scope}**: {} trials: {}\n\n{ran}\n",
        summary.counts.total(),
        counts_text(&summary.counts),
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
    skips(&mut s, rows, &env.notes);
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
    if ps.counts.skip == ps.counts.total() {
        let _ = writeln!(
            s,
            "## Path `{}`: not run ({} trials skipped)\n",
            cell(path),
            ps.counts.skip
        );
        return;
    }
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

/// `cause N, cause N` over `rows` that triage gave a cause (empty when none has one).
fn causes_text(rows: &[&&Row]) -> String {
    let mut by_cause: BTreeMap<&str, usize> = BTreeMap::new();
    for r in rows {
        if let Some(c) = r.params.get("cause") {
            *by_cause.entry(c.as_str()).or_default() += 1;
        }
    }
    let parts: Vec<String> = by_cause.iter().map(|(c, n)| format!("{c} {n}")).collect();
    parts.join(", ")
}

fn failures(s: &mut String, rows: &[&Row]) {
    let expected: Vec<&&Row> = rows.iter().filter(|r| r.status == Status::XFail).collect();
    if !expected.is_empty() {
        let _ = writeln!(
            s,
            "Expected failures (--xfail): {}, by cause: {}\n",
            expected.len(),
            causes_text(&expected)
        );
    }
    let bad: Vec<&&Row> = rows.iter().filter(|r| r.status.is_bad()).collect();
    if bad.is_empty() {
        return;
    }
    let _ = writeln!(s, "Failures ({}):\n", bad.len());
    let causes = causes_text(&bad);
    if !causes.is_empty() {
        let _ = writeln!(s, "By cause (triage): {causes}\n");
    }
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

/// Every skip reason of the report once, with its count over all paths, most common first; a
/// reason that is one of the report's notes is named as that note instead of repeated.
fn skips(s: &mut String, rows: &[Row], notes: &[String]) {
    let mut reasons: BTreeMap<&str, usize> = BTreeMap::new();
    for r in rows.iter().filter(|r| r.status == Status::Skip) {
        *reasons.entry(r.message.as_str()).or_default() += 1;
    }
    if reasons.is_empty() {
        return;
    }
    let mut reasons: Vec<(&str, usize)> = reasons.into_iter().collect();
    reasons.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let _ = writeln!(s, "## Skipped trials\n");
    for (reason, n) in reasons.iter().take(SKIP_REASONS_LISTED) {
        let reason = if reason.is_empty() {
            "(no reason given)".to_string()
        } else if notes.iter().any(|note| note == reason) {
            format!("{} (the note above)", cell(first_clause(reason)))
        } else {
            cell(reason)
        };
        let _ = writeln!(s, "- {n} x {reason}");
    }
    if reasons.len() > SKIP_REASONS_LISTED {
        let _ = writeln!(
            s,
            "- {} more reasons, each in the `message` column of results.csv",
            reasons.len() - SKIP_REASONS_LISTED
        );
    }
    s.push('\n');
}

/// The text before the first `:` (`no GPU` of `no GPU: no NVIDIA driver ...`).
fn first_clause(text: &str) -> &str {
    text.split(':').next().unwrap_or(text)
}

/// What the report's trials ran, by kind: routing checks, reference self-checks, native GPU
/// paths and workers (`<worker>/<path>`), so a report whose GPU trials were all skipped never
/// reads as a GPU pass.
fn what_ran(rows: &[Row]) -> String {
    let (mut routing, mut reference, mut native, mut workers, mut skipped) = (0, 0, 0, 0, 0);
    for r in rows {
        if r.status == Status::Skip {
            skipped += 1;
            continue;
        }
        match r.path.as_str() {
            "routing" => routing += 1,
            "reference" => reference += 1,
            p if p.contains('/') => workers += 1,
            _ => native += 1,
        }
    }
    let not_run = if skipped > 0 {
        format!("; {skipped} not run (Skipped trials below)")
    } else {
        String::new()
    };
    if native == 0 && workers == 0 {
        return format!(
            "CPU only: {routing} routing checks and {reference} reference self-checks; 0 GPU \
             trials{not_run}"
        );
    }
    format!(
        "Ran: {routing} routing checks, {reference} reference self-checks, {native} native GPU \
         trials, {workers} worker trials{not_run}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Environment;

    fn row(trial: &str, path: &str, status: Status, message: &str) -> Row {
        let mut r = Row::new("c1", trial, path, status);
        r.message = message.to_string();
        r
    }

    /// A run without a GPU says so in its headline, a path none of whose trials ran is one line,
    /// and each skip reason is listed once for the whole report (a reason that is a note is
    /// named, not repeated).
    #[test]
    fn a_cpu_only_report_headlines_what_ran_and_lists_each_skip_reason_once() {
        let no_gpu = "no GPU: no NVIDIA driver: NVML could not be loaded";
        let rows = vec![
            row("routing::sm_90", "routing", Status::Pass, ""),
            row("reference::oracle::a", "reference", Status::Pass, ""),
            row("gpu::fallback::a", "fallback", Status::Skip, no_gpu),
            row("gpu::score_mod::a", "score_mod", Status::Skip, no_gpu),
            row(
                "gpu::score_mod::b",
                "score_mod",
                Status::Skip,
                "no split-KV",
            ),
        ];
        let env = Environment {
            notes: vec![no_gpu.to_string()],
            ..Environment::default()
        };
        let summary = Summary::of("cpu", env, &rows, true);
        let text = render(&summary, &rows, &[]);
        assert!(text.contains("**PASS (CPU only)**: 5 trials"), "{text}");
        assert!(
            text.contains(
                "CPU only: 1 routing checks and 1 reference self-checks; 0 GPU trials; 3 not run"
            ),
            "{text}"
        );
        assert!(
            text.contains("## Path `fallback`: not run (1 trials skipped)"),
            "{text}"
        );
        assert_eq!(
            text.matches("NVML could not be loaded").count(),
            1,
            "{text}"
        );
        assert!(text.contains("- 2 x no GPU (the note above)"), "{text}");
        assert!(text.contains("- 1 x no split-KV"), "{text}");
        // With a GPU trial run, the headline says so.
        let mut gpu = rows.clone();
        gpu.push(row("gpu::fallback::b", "fallback", Status::Pass, ""));
        gpu.push(row("impl::numpy::x", "numpy/numpy", Status::Pass, ""));
        let summary = Summary::of("sm90", Environment::default(), &gpu, true);
        let text = render(&summary, &gpu, &[]);
        assert!(text.contains("**PASS**: 7 trials"), "{text}");
        assert!(text.contains("Ran: 1 routing checks, 1 reference self-checks, 1 native GPU trials, 1 worker trials; 3 not run"), "{text}");
    }
}
