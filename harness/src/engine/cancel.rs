//! Stopping a run: the first SIGINT (Ctrl-C), SIGTERM (a CI runner's timeout or cancel) or
//! SIGHUP (a closed terminal) asks the engine to start no more trials; the trials in flight
//! finish and the caller writes an INCOMPLETE report that `--resume` continues. A second signal
//! ends the process at once (exit 130), workers and their case folders first. Workers run in
//! process groups of their own, so a terminal's Ctrl-C reaches this process alone.

use std::sync::atomic::{AtomicBool, Ordering};

/// Set by the first signal: no trial starts after it.
static STOP: AtomicBool = AtomicBool::new(false);

/// Whether a stop was asked for.
pub fn stopping() -> bool {
    STOP.load(Ordering::SeqCst)
}

/// Install the handler of SIGINT, SIGTERM and SIGHUP (once per process); `command` names the
/// command in its messages.
pub fn on_signals(command: &'static str) {
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        let installed = ctrlc::set_handler(move || {
            if STOP.swap(true, Ordering::SeqCst) {
                eprintln!("relattn {command}: second interrupt, stopping now");
                crate::worker::end_all();
                std::process::exit(130);
            }
            eprintln!(
                "relattn {command}: interrupted (SIGINT, SIGTERM or SIGHUP): finishing the trials \
                 in flight, then writing an INCOMPLETE report (interrupt again to stop at once)"
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
