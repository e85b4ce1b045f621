//! A worker's stderr, read on a thread of its own: its last lines, kept for messages, and, for
//! a worker whose `hello` says `stderr_marks`, the lines each request wrote between its marks
//! (`relattn-mark begin ID` and `relattn-mark end ID`, ID the request's id as JSON).
//!
//! Without marks, the lines a failed trial's message quotes are whatever the reader thread had
//! read when the answer came: the end of this trial's traceback or none of it, lines of an
//! earlier trial of the same process or not, so the same trial's message changed from run to
//! run and with the pool's size. With marks, relattn waits for the request's end mark (written
//! before its answer) and quotes that request's lines only.

use serde_json::Value;
use std::collections::VecDeque;
use std::io::{BufReader, Read};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The first word of a mark line.
pub const MARK: &str = "relattn-mark";
/// Lines kept (of the process, and of one request), and the longest kept line.
const TAIL_LINES: usize = 30;
const TAIL_LINE_CHARS: usize = 400;

#[derive(Default)]
struct Lines {
    /// The process's last lines (marks left out).
    tail: VecDeque<String>,
    /// The request being handled (its id) and its lines so far.
    open: Option<(Value, VecDeque<String>)>,
    /// The last request whose end mark was read, and its lines.
    closed: Option<(Value, VecDeque<String>)>,
    /// stderr is closed.
    eof: bool,
}

#[derive(Default)]
pub struct Stderr {
    lines: Mutex<Lines>,
    changed: Condvar,
}

fn keep(lines: &mut VecDeque<String>, line: &str) {
    if lines.len() == TAIL_LINES {
        lines.pop_front();
    }
    lines.push_back(super::text::one_line(line, TAIL_LINE_CHARS));
}

fn last(lines: &VecDeque<String>, n: usize) -> String {
    let skip = lines.len().saturating_sub(n);
    lines
        .iter()
        .skip(skip)
        .cloned()
        .collect::<Vec<_>>()
        .join("\n")
}

/// A mark's kind and request id; None for any other line.
fn mark(line: &str) -> Option<(bool, Value)> {
    let rest = line.strip_prefix(MARK)?.strip_prefix(' ')?;
    let (begin, id) = match rest.split_once(' ')? {
        ("begin", id) => (true, id),
        ("end", id) => (false, id),
        _ => return None,
    };
    serde_json::from_str(id).ok().map(|id| (begin, id))
}

impl Stderr {
    /// Read `stream` line by line on a thread of its own until it closes.
    pub fn read(stream: impl Read + Send + 'static) -> Arc<Stderr> {
        let me = Arc::new(Stderr::default());
        let reader = me.clone();
        std::thread::spawn(move || {
            let mut stream = BufReader::new(stream);
            loop {
                match super::process::read_bounded_line(&mut stream) {
                    super::process::Line::Eof => break,
                    super::process::Line::TooLong => continue,
                    super::process::Line::Text(l) => reader.push(&l),
                }
            }
            reader.lock().eof = true;
            reader.changed.notify_all();
        });
        me
    }

    fn lock(&self) -> MutexGuard<'_, Lines> {
        self.lines.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn push(&self, line: &str) {
        let mut l = self.lock();
        match mark(line) {
            Some((true, id)) => l.open = Some((id, VecDeque::new())),
            Some((false, id)) => {
                let lines = match l.open.take() {
                    Some((open, lines)) if open == id => lines,
                    _ => VecDeque::new(),
                };
                l.closed = Some((id, lines));
                drop(l);
                self.changed.notify_all();
            }
            None => {
                keep(&mut l.tail, line);
                if let Some((_, lines)) = &mut l.open {
                    keep(lines, line);
                }
            }
        }
    }

    /// The process's last `n` lines.
    pub fn tail(&self, n: usize) -> String {
        last(&self.lock().tail, n)
    }

    /// The last `n` lines request `id` wrote between its marks, waiting up to `wait` for its
    /// end mark; None when it was not read by then (or stderr closed first).
    pub fn of_request(&self, id: &Value, n: usize, wait: Duration) -> Option<String> {
        let deadline = Instant::now() + wait;
        let mut l = self.lock();
        loop {
            if let Some((closed, lines)) = &l.closed {
                if closed == id {
                    return Some(last(lines, n));
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if l.eof || left.is_zero() {
                return None;
            }
            l = self
                .changed
                .wait_timeout(l, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fed(lines: &[&str]) -> Stderr {
        let s = Stderr::default();
        for l in lines {
            s.push(l);
        }
        s
    }

    #[test]
    fn a_requests_lines_are_those_between_its_marks() {
        let s = fed(&[
            "warm-up said this",
            r#"relattn-mark begin "t1""#,
            "Traceback of t1",
            "ValueError: t1",
            r#"relattn-mark end "t1""#,
            "a background thread",
            r#"relattn-mark begin "t2""#,
            r#"relattn-mark end "t2""#,
        ]);
        let none = Duration::ZERO;
        assert_eq!(s.of_request(&json!("t2"), 12, none).as_deref(), Some(""));
        assert_eq!(
            s.of_request(&json!("t1"), 12, none),
            None,
            "only the last request is kept"
        );
        assert_eq!(
            s.tail(12),
            "warm-up said this\nTraceback of t1\nValueError: t1\na background thread"
        );
        let s = fed(&[
            r#"relattn-mark begin "t1""#,
            "a",
            "b",
            "c",
            r#"relattn-mark end "t1""#,
        ]);
        assert_eq!(s.of_request(&json!("t1"), 2, none).as_deref(), Some("b\nc"));
    }

    #[test]
    fn lines_that_only_look_like_marks_are_kept() {
        let s = fed(&[
            "relattn-mark begin not-json",
            "relattn-mark start \"t1\"",
            "relattn-markend \"t1\"",
        ]);
        assert_eq!(s.tail(5).lines().count(), 3);
        assert_eq!(s.of_request(&json!("t1"), 5, Duration::ZERO), None);
    }

    #[test]
    fn an_end_without_its_begin_has_no_lines_and_another_ids_end_is_not_taken() {
        let s = fed(&[
            r#"relattn-mark begin "t1""#,
            "x",
            r#"relattn-mark end "t2""#,
        ]);
        assert_eq!(
            s.of_request(&json!("t2"), 5, Duration::ZERO).as_deref(),
            Some("")
        );
        assert_eq!(s.of_request(&json!("t1"), 5, Duration::ZERO), None);
    }

    #[test]
    fn the_end_mark_is_waited_for_and_the_wait_is_bounded() {
        let (r, mut w) = std::io::pipe().unwrap();
        let s = Stderr::read(r);
        let writer = std::thread::spawn(move || {
            use std::io::Write;
            writeln!(w, "relattn-mark begin 7").unwrap();
            writeln!(w, "late line").unwrap();
            std::thread::sleep(Duration::from_millis(200));
            writeln!(w, "relattn-mark end 7").unwrap();
            w
        });
        let got = s.of_request(&json!(7), 5, Duration::from_secs(10));
        assert_eq!(got.as_deref(), Some("late line"));
        let w = writer.join().unwrap();
        let started = Instant::now();
        assert_eq!(s.of_request(&json!(8), 5, Duration::from_millis(100)), None);
        assert!(started.elapsed() < Duration::from_secs(5));
        drop(w);
        // A closed stderr ends the wait at once.
        let started = Instant::now();
        while !s.lock().eof && started.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(10));
        }
        let started = Instant::now();
        assert_eq!(s.of_request(&json!(9), 5, Duration::from_secs(30)), None);
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
