//! A run's timeline, to see where its wall time goes (`RELATTN_TRACE=FILE`): one JSON line per
//! span of work (a phase of a trial as `phases` counts it, a worker process's start, a case
//! file written, a wait for memory) with its thread, the trial the thread was on, and its start
//! and end in seconds since the run began. Off, and costing one check per span, unless set.

use std::cell::RefCell;
use std::fs::File;
use std::io::{LineWriter, Write};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

/// The variable naming the trace file.
pub const ENV: &str = "RELATTN_TRACE";

struct Sink {
    origin: Instant,
    file: Mutex<LineWriter<File>>,
}

static SINK: OnceLock<Option<Sink>> = OnceLock::new();

thread_local! {
    /// The trial this thread works on, for the spans it records.
    static LABEL: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Open the trace file `RELATTN_TRACE` names (created anew), if it names one; the run's clock
/// starts now. A file that cannot be created is the user's error, said once.
pub fn init() -> Result<(), String> {
    let path = std::env::var_os(ENV).filter(|p| !p.is_empty());
    let sink = match path {
        None => None,
        Some(p) => {
            let file = File::create(&p).map_err(|e| {
                format!(
                    "{ENV}={}: cannot create the trace file: {e}",
                    p.to_string_lossy()
                )
            })?;
            Some(Sink {
                origin: Instant::now(),
                file: Mutex::new(LineWriter::new(file)),
            })
        }
    };
    let _ = SINK.set(sink);
    Ok(())
}

fn sink() -> Option<&'static Sink> {
    SINK.get().and_then(Option::as_ref)
}

/// The trial this thread is on until the guard drops (the label before comes back).
pub fn on_trial(trial: &str) -> LabelGuard {
    let before = LABEL.with(|l| std::mem::replace(&mut *l.borrow_mut(), trial.to_string()));
    LabelGuard { before }
}

pub struct LabelGuard {
    before: String,
}

impl Drop for LabelGuard {
    fn drop(&mut self) {
        let before = std::mem::take(&mut self.before);
        LABEL.with(|l| *l.borrow_mut() = before);
    }
}

/// Record the span `name` of this thread from `started` to now.
pub fn record(name: &str, started: Instant) {
    let Some(sink) = sink() else {
        return;
    };
    let end = sink.origin.elapsed().as_secs_f64();
    let start = started
        .checked_duration_since(sink.origin)
        .map_or(0.0, |d| d.as_secs_f64());
    let thread = format!("{:?}", std::thread::current().id());
    let trial = LABEL.with(|l| l.borrow().clone());
    let line = serde_json::json!({
        "span": name,
        "start": (start * 1e3).round() / 1e3,
        "end": (end * 1e3).round() / 1e3,
        "thread": thread.trim_start_matches("ThreadId(").trim_end_matches(')'),
        "trial": trial,
    });
    let mut file = sink.file.lock().unwrap_or_else(|e| e.into_inner());
    // A line that cannot be written is left out; the run goes on.
    let _ = writeln!(file, "{line}");
}

/// Run `f` as the span `name`.
pub fn span<T>(name: &str, f: impl FnOnce() -> T) -> T {
    let started = Instant::now();
    let out = f();
    record(name, started);
    out
}
