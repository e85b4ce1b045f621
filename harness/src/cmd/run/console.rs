//! What `relattn run` says on standard error: what it runs where, a bar over the trials (drawn
//! once they take more than two seconds, and only on a terminal), each failure as it arrives,
//! and the closing lines.

use crate::case_set::CaseSet;
use crate::engine::{failure_text, Event, Reporter};
use crate::phases::Split;
use crate::progress::Tally;
use crate::sanitize::Sanitizer;
use crate::session::Session;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use relattn_reports::Status;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The lines a run starts with: the cases, the trials and the GPU; what runs without one; the
/// sanitizer.
pub(super) fn header(session: &Session, arch: &str, sanitizer: Option<&Sanitizer>) {
    eprintln!(
        "relattn run: {}, {} trials; {}",
        match &session.set {
            CaseSet::Matrix(m) => format!("matrix `{m}`"),
            CaseSet::Folder { dir, .. } => format!("case folder {}", dir.display()),
        },
        session.trials.len(),
        session.gpu_line()
    );
    if arch == "cpu" {
        let workers = session.workers.len();
        if workers == 0 {
            eprintln!(
                "relattn run: no usable GPU, running the CPU part (routing and reference checks) \
                 only"
            );
        } else {
            eprintln!(
                "relattn run: no usable GPU: the native paths do not run; the routing and \
                 reference checks and the trials of {workers} worker(s) do"
            );
        }
    }
    if let Some(s) = sanitizer {
        eprintln!(
            "relattn run: sanitized: every GPU trial runs under {} --tool {} (times are not \
             comparable with unsanitized runs)",
            s.program.display(),
            s.tool.as_str()
        );
    }
}

/// The console of the trials: the bar and the failure lines, then the closing lines from the
/// engine's tally.
pub(super) struct Console {
    tally: Arc<Mutex<Tally>>,
    bar: ProgressBar,
    started: Instant,
}

impl Console {
    pub(super) fn new(tally: Arc<Mutex<Tally>>) -> Console {
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::hidden());
        bar.set_style(
            ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {pos}/{len} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        Console {
            tally,
            bar,
            started: Instant::now(),
        }
    }

    /// The trials are over: the bar goes.
    pub(super) fn trials_over(&self) {
        self.bar.finish_and_clear();
    }

    /// The `--xfail` entries that decided no trial: the bug one names may be fixed, or its
    /// filter may have gone stale.
    pub(super) fn unmatched(&self, lines: &[String]) {
        for line in lines {
            eprintln!("relattn run: {line}");
        }
    }

    /// Where the time went, and the counts, the wall time (setup included) and the report.
    pub(super) fn closing(&self, split: &Split, report: &Path) {
        eprintln!("relattn run: time: {}", split.line());
        let counts: Vec<String> = self
            .tally
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .counts
            .iter()
            .map(|(k, v)| format!("{v} {k}"))
            .collect();
        eprintln!(
            "relattn run: {} in {:.1} s; report in {}",
            counts.join(", "),
            split.wall_s,
            report.display()
        );
    }
}

impl Reporter for Console {
    fn event(&mut self, event: &Event<'_>) -> anyhow::Result<()> {
        match event {
            Event::Planned { total, resumed, .. } => {
                self.bar.set_length(*total as u64);
                self.bar.inc(*resumed as u64);
            }
            Event::Row(row) => {
                if self.bar.is_hidden() && self.started.elapsed() > Duration::from_secs(2) {
                    self.bar.set_draw_target(ProgressDrawTarget::stderr());
                }
                // Failures, and an unexpected pass of a known bug (it may be fixed: its entry
                // may go).
                if row.status.is_bad() || row.status == Status::XPass {
                    self.bar.suspend(|| eprintln!("{}", failure_text(row)));
                }
                self.bar.inc(1);
            }
            Event::Phase(_) | Event::Stopped(_) => {}
        }
        Ok(())
    }
}
