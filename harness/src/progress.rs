//! Progress of long CPU work on stderr: a bar while stderr is a terminal, else a line when a
//! phase starts, one every `EVERY` while it runs, and one when it ends (CI logs show a minute of
//! reference work as it happens).

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
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
