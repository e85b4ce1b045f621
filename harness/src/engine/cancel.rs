//! Stopping a run: the first SIGINT (Ctrl-C), SIGTERM (a CI runner's timeout or cancel) or
//! SIGHUP (a closed terminal) asks the engine to start no more trials; the trials in flight
//! finish and the caller writes an INCOMPLETE report that `--resume` continues. A signal more
//! than [`TOGETHER`] after the first ends the process at once (exit 130), workers and their case
//! folders first. Signals that arrive together count as one: GNU `timeout` and several CI
//! runners signal the child and then its process group, so one timeout delivers two SIGTERMs
//! within milliseconds, and it must still leave one whole INCOMPLETE report. Workers run in
//! process groups of their own, so a terminal's Ctrl-C reaches this process alone.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Set by the first signal: no trial starts after it.
static STOP: AtomicBool = AtomicBool::new(false);

/// When the first signal came.
static FIRST: OnceLock<Instant> = OnceLock::new();

/// Signals within this time of the first are the same request to stop.
pub const TOGETHER: Duration = Duration::from_secs(1);

/// Whether a stop was asked for.
pub fn stopping() -> bool {
    STOP.load(Ordering::SeqCst)
}

/// Install the handler of SIGINT, SIGTERM and SIGHUP (once per process); `command` names the
/// command in its messages.
pub fn on_signals(command: &'static str) {
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        // ctrlc calls this on one thread of its own, one signal after another.
        let installed = ctrlc::set_handler(move || {
            if let Some(first) = FIRST.get() {
                if first.elapsed() < TOGETHER {
                    return;
                }
                eprintln!("relattn {command}: second interrupt, stopping now");
                crate::worker::end_all();
                std::process::exit(130);
            }
            let _ = FIRST.set(Instant::now());
            STOP.store(true, Ordering::SeqCst);
            eprintln!(
                "relattn {command}: interrupted (SIGINT, SIGTERM or SIGHUP): finishing the trials \
                 in flight, then writing an INCOMPLETE report (interrupt again, a second or more later, to stop at once)"
            );
        });
        if let Err(e) = installed {
            eprintln!(
                "relattn {command}: cannot handle SIGINT, SIGTERM and SIGHUP ({e}); an interrupt \
                 ends the run at once"
            );
        }
    });
}
