//! A worker's stderr, read on a thread of its own: its last lines, kept for messages, and, for
//! a worker whose `hello` says `stderr_marks`, the lines each request with an id wrote between
//! its marks (`relattn-mark begin ID` and `relattn-mark end ID`, ID the request's id as JSON).
//!
//! Without marks, the lines a failed trial's message quotes are whatever the reader thread had
//! read when the answer came: the end of this trial's traceback or none of it, lines of an
//! earlier trial of the same process or not, so the same trial's message changed from run to
//! run and with the pool's size. With marks, relattn waits for the request's end mark (written
//! before its answer) and quotes that request's lines only. End marks are counted: the n-th
//! request with an id is answered by the n-th end mark, so an earlier run of the same trial
//! (triage runs one again) whose end mark was read late is never taken for it.

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

/// A request's end mark as read (the `ends`-th): its id, and its lines (None when its begin
/// mark was not read: the lines cannot be told apart).
struct Closed {
    id: Value,
    lines: Option<VecDeque<String>>,
}

#[derive(Default)]
struct Lines {
    /// The process's last lines (marks left out).
    tail: VecDeque<String>,
    /// The request being handled (its id) and its lines so far.
    open: Option<(Value, VecDeque<String>)>,
    /// End marks read.
    ends: u64,
    /// The last request whose end mark was read (the `ends`-th).
    closed: Option<Closed>,
    /// stderr is closed.
    eof: bool,
}

impl Lines {
    /// A line that is no mark: the process's, and the open request's.
    fn text(&mut self, line: &str) {
        keep(&mut self.tail, line);
        if let Some((_, lines)) = &mut self.open {
            keep(lines, line);
        }
    }
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

/// A line split at a mark: the text before it (a partial line another writer left unfinished,
/// possibly empty), and the mark's kind and request id; None when the line holds no mark.
fn mark(line: &str) -> Option<(&str, bool, Value)> {
    let at = line.find(MARK)?;
    let rest = line[at + MARK.len()..].strip_prefix(' ')?;
    let (begin, id) = match rest.split_once(' ')? {
        ("begin", id) => (true, id),
        ("end", id) => (false, id),
        _ => return None,
    };
    let id = serde_json::from_str(id).ok()?;
    Some((&line[..at], begin, id))
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
        let Some((before, begin, id)) = mark(line) else {
            return l.text(line);
        };
        if !before.is_empty() {
            l.text(before);
        }
        if begin {
            l.open = Some((id, VecDeque::new()));
            return;
        }
        let lines = match l.open.take() {
            Some((open, lines)) if open == id => Some(lines),
            _ => None,
        };
        l.ends += 1;
        l.closed = Some(Closed { id, lines });
        drop(l);
        self.changed.notify_all();
    }

    /// The process's last `n` lines.
    pub fn tail(&self, n: usize) -> String {
        last(&self.lock().tail, n)
    }

    /// End marks read so far.
    pub fn ends(&self) -> u64 {
        self.lock().ends
    }

    /// The last `n` lines that request `id`, the `number`-th request with an id, wrote between
    /// its marks, waiting up to `wait` for its end mark. None when that mark was not read by
    /// then (or stderr closed first), or is not this request's, or came without its begin.
    pub fn of_request(&self, id: &Value, number: u64, n: usize, wait: Duration) -> Option<String> {
        let deadline = Instant::now() + wait;
        let mut l = self.lock();
        loop {
            if l.ends >= number {
                let c = l.closed.as_ref()?;
                return (l.ends == number && &c.id == id)
                    .then(|| c.lines.as_ref().map(|lines| last(lines, n)))
                    .flatten();
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

    const NOW: Duration = Duration::ZERO;

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
        assert_eq!(s.of_request(&json!("t2"), 2, 12, NOW).as_deref(), Some(""));
        assert_eq!(
            s.of_request(&json!("t1"), 1, 12, NOW),
            None,
            "only the last is kept"
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
        assert_eq!(
            s.of_request(&json!("t1"), 1, 2, NOW).as_deref(),
            Some("b\nc")
        );
    }

    #[test]
    fn an_earlier_run_of_the_same_request_is_not_taken_for_the_next() {
        // The second request with id "t" is sent before the first's end mark is read.
        let s = fed(&[
            r#"relattn-mark begin "t""#,
            "first",
            r#"relattn-mark end "t""#,
        ]);
        assert_eq!(s.of_request(&json!("t"), 2, 5, NOW), None);
        s.push(r#"relattn-mark begin "t""#);
        s.push("second");
        s.push(r#"relattn-mark end "t""#);
        assert_eq!(
            s.of_request(&json!("t"), 2, 5, NOW).as_deref(),
            Some("second")
        );
    }

    #[test]
    fn lines_that_only_look_like_marks_are_kept() {
        let s = fed(&[
            "relattn-mark begin not-json",
            "relattn-mark start \"t1\"",
            "relattn-markend \"t1\"",
        ]);
        assert_eq!(s.tail(5).lines().count(), 3);
        assert_eq!(s.of_request(&json!("t1"), 1, 5, NOW), None);
    }

    #[test]
    fn a_mark_after_another_writers_partial_line_is_read() {
        let s = fed(&[
            r#"unfinished printf textrelattn-mark begin "t""#,
            "own",
            r#"more of itrelattn-mark end "t""#,
        ]);
        assert_eq!(
            s.of_request(&json!("t"), 1, 5, NOW).as_deref(),
            Some("own\nmore of it")
        );
        assert_eq!(s.tail(5), "unfinished printf text\nown\nmore of it");
    }

    #[test]
    fn an_end_without_its_begin_or_another_ids_end_quotes_nothing() {
        let s = fed(&[
            r#"relattn-mark begin "t1""#,
            "x",
            r#"relattn-mark end "t2""#,
        ]);
        assert_eq!(s.of_request(&json!("t2"), 1, 5, NOW), None);
        assert_eq!(s.of_request(&json!("t1"), 1, 5, NOW), None);
        assert_eq!(s.ends(), 1);
    }

    #[test]
    fn the_end_mark_is_waited_for_and_the_wait_is_bounded() {
        use std::io::Write;
        let (r, mut w) = std::os::unix::net::UnixStream::pair().unwrap();
        let s = Stderr::read(r);
        writeln!(w, "relattn-mark begin 7").unwrap();
        writeln!(w, "late line").unwrap();
        let waiting = {
            let s = s.clone();
            std::thread::spawn(move || s.of_request(&json!(7), 1, 5, Duration::from_secs(10)))
        };
        std::thread::sleep(Duration::from_millis(200));
        writeln!(w, "relattn-mark end 7").unwrap();
        assert_eq!(waiting.join().unwrap().as_deref(), Some("late line"));
        let started = Instant::now();
        assert_eq!(
            s.of_request(&json!(8), 2, 5, Duration::from_millis(100)),
            None
        );
        assert!(started.elapsed() < Duration::from_secs(5));
        // A stderr that closes wakes a caller already waiting.
        let waiting = {
            let s = s.clone();
            std::thread::spawn(move || {
                let started = Instant::now();
                let got = s.of_request(&json!(9), 2, 5, Duration::from_secs(30));
                (got, started.elapsed())
            })
        };
        std::thread::sleep(Duration::from_millis(200));
        drop(w);
        let (got, took) = waiting.join().unwrap();
        assert_eq!(got, None);
        assert!(took < Duration::from_secs(10), "{took:?}");
    }
}
