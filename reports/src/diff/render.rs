//! The text of a diff: correctness first, timing after it.

use super::timing::{slowdown_line, NOT_JUDGED};
use super::DiffResult;
use crate::row::short_float;
use std::fmt::Write;

/// Entries listed per section before "and N more".
const LISTED: usize = 30;

fn section<T>(s: &mut String, title: &str, items: &[T], line: impl Fn(&T) -> String) {
    if items.is_empty() {
        return;
    }
    let _ = writeln!(s, "\n{title} ({}):", items.len());
    for it in items.iter().take(LISTED) {
        let _ = writeln!(s, "  {}", line(it));
    }
    if items.len() > LISTED {
        let _ = writeln!(
            s,
            "  ... and {} more (use --json for all)",
            items.len() - LISTED
        );
    }
}

fn first_line(m: &str) -> String {
    m.lines().next().unwrap_or("").to_string()
}

impl DiffResult {
    /// Text for a terminal or a CI log: a verdict line, a timing line, then the correctness
    /// sections, and the timing sections last, so a real regression is never below noise.
    pub fn render(&self) -> String {
        let o = &self.options;
        let mut s = format!(
            "{}: {} trials compared, {} new failures, {} new causes, {} error growths (> {}x, or \
             over the bound), {} missing, {} added, {} newly skipped, {} fixed\n",
            if self.is_regression() {
                "REGRESSION"
            } else {
                "no regression"
            },
            self.compared,
            self.new_failures.len(),
            self.new_causes.len(),
            self.error_growth.len(),
            o.error_factor,
            self.missing.len(),
            self.added.len(),
            self.newly_skipped.len(),
            self.fixed.len()
        );
        if o.timing {
            let _ = writeln!(
                s,
                "Timing (--timing): {} slowdowns (> {}%), {} timing noise (under {} ms); a \
                 row stores no spread of its time, so a drop may be run-to-run noise",
                self.slowdowns.len(),
                o.throughput_drop_pct,
                self.timing_noise.len(),
                o.time_floor_ms
            );
        } else {
            let _ = writeln!(s, "{NOT_JUDGED}");
        }
        self.render_coverage_notes(&mut s);
        self.render_correctness(&mut s);
        section(&mut s, "Slowdowns", &self.slowdowns, slowdown_line);
        section(
            &mut s,
            "Timing noise (not regressions)",
            &self.timing_noise,
            |x| format!("{} at {} ms", slowdown_line(&x.drop), short_float(x.ms)),
        );
        s
    }

    fn render_coverage_notes(&self, s: &mut String) {
        let o = &self.options;
        if !self.incomplete.is_empty() {
            let _ = writeln!(
                s,
                "\nINCOMPLETE new report ({}): an interrupted run or a merge of shards that do \
                 not cover the shard set{}",
                self.incomplete.join(", "),
                if o.allow_missing {
                    " (allowed by --allow-missing)"
                } else {
                    ""
                }
            );
        }
        if !self.missing.is_empty() && !o.allow_missing {
            let _ = writeln!(
                s,
                "\n{} trial(s) of the baseline are missing from the new report: a regression \
                 unless --allow-missing",
                self.missing.len()
            );
        }
    }

    fn render_correctness(&self, s: &mut String) {
        section(s, "New failures", &self.new_failures, |c| {
            format!(
                "[{}] {} ({} -> {}): {}",
                c.arch,
                c.trial,
                c.base,
                c.new,
                first_line(&c.message)
            )
        });
        section(
            s,
            "New causes (failing in both, for another cause)",
            &self.new_causes,
            |c| {
                format!(
                    "[{}] {} ({} -> {}): {}",
                    c.arch,
                    c.trial,
                    c.base_cause,
                    c.new_cause,
                    first_line(&c.message)
                )
            },
        );
        section(s, "Error growth", &self.error_growth, |g| {
            let ratio = g
                .new_ratio
                .map(|r| format!(", {} of bound", short_float(r)))
                .unwrap_or_default();
            let crossed = if g.crossed_bound {
                ", crossed the bound"
            } else {
                ""
            };
            format!(
                "[{}] {}: max_abs {} -> {} ({}x{ratio}{crossed})",
                g.arch,
                g.trial,
                short_float(g.base_max_abs),
                short_float(g.new_max_abs),
                short_float(g.factor)
            )
        });
        section(s, "Missing from the new report", &self.missing, |t| {
            format!("[{}] {} ({})", t.arch, t.trial, t.status)
        });
        section(s, "Newly skipped", &self.newly_skipped, |c| {
            format!("[{}] {}: {}", c.arch, c.trial, first_line(&c.message))
        });
        section(s, "Added", &self.added, |t| {
            format!("[{}] {} ({})", t.arch, t.trial, t.status)
        });
        section(s, "Fixed", &self.fixed, |c| {
            format!("[{}] {} ({} -> pass)", c.arch, c.trial, c.base)
        });
    }
}
