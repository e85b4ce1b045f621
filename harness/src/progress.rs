//! Progress of long CPU work on stderr: a bar while stderr is a terminal, else a line when a
//! phase starts, one every `EVERY` while it runs, and one when it ends (CI logs show a minute of
//! reference work as it happens).

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often a phase prints a line when stderr is not a terminal.
const EVERY: Duration = Duration::from_secs(10);

/// One phase of a command (generating a case, the f64 reference, the emulation).
pub struct Phase {
    /// `relattn <command>: <phase>`, the start of every line.
    label: String,
    total: u64,
    done: AtomicU64,
    started: Instant,
    bar: Option<ProgressBar>,
    /// When the last line was printed (not on a terminal).
    last_line: Mutex<Instant>,
}

impl Phase {
    /// Start phase `what` of `relattn command`, `total` units of work long (0: not counted, a
    /// spinner with the time on a terminal).
    pub fn start(command: &str, what: &str, total: u64) -> Phase {
        let label = format!("relattn {command}: {what}");
        let bar = std::io::stderr().is_terminal().then(|| {
            let (length, template) = if total == 0 {
                (None, "{msg} {spinner} {elapsed}")
            } else {
                (
                    Some(total),
                    "{msg} [{bar:30}] {percent}% {elapsed} (eta {eta})",
                )
            };
            let bar = ProgressBar::with_draw_target(length, ProgressDrawTarget::stderr());
            bar.set_style(
                ProgressStyle::with_template(template)
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .progress_chars("=> "),
            );
            bar.set_message(label.clone());
            if total == 0 {
                bar.enable_steady_tick(Duration::from_millis(200));
            }
            bar
        });
        if bar.is_none() {
            eprintln!("{label} ...");
        }
        let started = Instant::now();
        Phase {
            label,
            total,
            done: AtomicU64::new(0),
            started,
            bar,
            last_line: Mutex::new(started),
        }
    }

    /// `units` more done (from any thread).
    pub fn add(&self, units: u64) {
        let done = self.done.fetch_add(units, Ordering::Relaxed) + units;
        if let Some(bar) = &self.bar {
            bar.set_position(done);
            return;
        }
        let Ok(mut last) = self.last_line.try_lock() else {
            return;
        };
        if last.elapsed() >= EVERY {
            *last = Instant::now();
            eprintln!(
                "{}: {:.0}% after {:.0} s",
                self.label,
                100.0 * done as f64 / self.total.max(1) as f64,
                self.started.elapsed().as_secs_f64()
            );
        }
    }

    /// End the phase with a line saying how long it took; returns the seconds.
    pub fn finish(self) -> f64 {
        let seconds = self.started.elapsed().as_secs_f64();
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        eprintln!("{}: done in {seconds:.2} s", self.label);
        seconds
    }
}

/// How often `relattn run` prints a progress line when stderr is not a terminal:
/// `RELATTN_PROGRESS_S` seconds (default 10).
pub fn line_interval() -> Duration {
    std::env::var("RELATTN_PROGRESS_S")
        .ok()
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .map_or(EVERY, Duration::from_secs_f64)
}

/// What a run has done so far, for its progress lines.
#[derive(Debug, Default)]
pub struct Tally {
    pub phase: &'static str,
    pub total: usize,
    /// Rows of this process (a resumed run's earlier rows are in `resumed`).
    pub done: usize,
    pub resumed: usize,
    pub counts: std::collections::BTreeMap<&'static str, usize>,
    /// When the trials began (the ETA counts from there).
    pub trials_started: Option<Instant>,
    /// Trials of this process that will run (not ignored when listed): the ETA's work. Ignored
    /// trials come back as skips at once and would make the rate look faster than it is.
    pub to_run: usize,
    /// Rows of this process's trials that were not ignored: the work done so far.
    pub ran: usize,
}

/// Seconds left when `ran` of `to_run` trials took `elapsed` seconds; None before the first.
pub fn eta_seconds(elapsed: f64, ran: usize, to_run: usize) -> Option<f64> {
    (ran > 0).then(|| to_run.saturating_sub(ran) as f64 * elapsed / ran as f64)
}

impl Tally {
    /// `relattn run: trials 981/3961 (24.8%): 950 pass, 31 skip; 45 s elapsed, eta 137 s`
    pub fn line(&self, elapsed: Duration) -> String {
        let done = self.done + self.resumed;
        let mut s = format!("relattn run: {}", self.phase);
        if self.phase == "trials" {
            let pct = 100.0 * done as f64 / self.total.max(1) as f64;
            s.push_str(&format!(" {done}/{} ({pct:.1}%)", self.total));
            let counts: Vec<String> = self
                .counts
                .iter()
                .map(|(k, v)| format!("{v} {k}"))
                .collect();
            if !counts.is_empty() {
                s.push_str(&format!(": {}", counts.join(", ")));
            }
        }
        s.push_str(&format!("; {:.0} s elapsed", elapsed.as_secs_f64()));
        let since = self.trials_started.map(|t0| t0.elapsed().as_secs_f64());
        if let Some(left) = since.and_then(|e| eta_seconds(e, self.ran, self.to_run)) {
            s.push_str(&format!(", eta {left:.0} s"));
        }
        s
    }
}

/// A thread printing the tally's line every `line_interval()` while stderr is not a terminal
/// (a terminal has the bar); stops when dropped.
pub struct Ticker {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Ticker {
    pub fn start(tally: std::sync::Arc<Mutex<Tally>>) -> Ticker {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let thread = (!std::io::stderr().is_terminal()).then(|| {
            let stop = stop.clone();
            let every = line_interval();
            std::thread::spawn(move || {
                let started = Instant::now();
                let mut last = started;
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(every.min(Duration::from_millis(100)));
                    if last.elapsed() >= every {
                        last = Instant::now();
                        let line = tally
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .line(started.elapsed());
                        // Not eprintln!: a full disk under the log must not end the lines.
                        let _ = writeln!(std::io::stderr(), "{line}");
                    }
                }
            })
        });
        Ticker { stop, thread }
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tally_line_says_done_total_counts_and_eta() {
        let mut t = Tally {
            phase: "trials",
            total: 200,
            done: 50,
            resumed: 50,
            trials_started: Some(Instant::now()),
            to_run: 120,
            ran: 20,
            ..Tally::default()
        };
        t.counts.insert("pass", 99);
        t.counts.insert("fail", 1);
        let line = t.line(Duration::from_secs(12));
        assert!(
            line.starts_with(
                "relattn run: trials 100/200 (50.0%): 1 fail, 99 pass; 12 s elapsed, eta "
            ),
            "{line}"
        );
        let compile = Tally {
            phase: "compile",
            ..Tally::default()
        };
        assert_eq!(
            compile.line(Duration::from_secs(3)),
            "relattn run: compile; 3 s elapsed"
        );
    }

    #[test]
    fn the_eta_counts_trials_that_run_not_the_skips_that_return_at_once() {
        // 2 of 4 trials that run took 30 s; the 300 ignored ones came back as instant skips.
        assert_eq!(eta_seconds(30.0, 2, 4), Some(30.0));
        assert_eq!(eta_seconds(30.0, 0, 4), None);
        assert_eq!(eta_seconds(30.0, 4, 4), Some(0.0));
    }
}
