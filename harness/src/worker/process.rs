//! One worker child process: JSON lines to its stdin, answers read from its stdout by a reader
//! thread (so a silent worker costs a timeout, not a hang), and the tail of its stderr kept for
//! reports. Lines are bounded in length, so a worker cannot make relattn hold unbounded memory.

use serde_json::Value;
use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Longest answer line read (longer ones are a protocol violation).
const MAX_LINE: usize = 1 << 20;
/// Lines of stderr kept, and the longest kept line.
const TAIL_LINES: usize = 30;
const TAIL_LINE_CHARS: usize = 400;

/// Why a worker stopped being usable: the current request is lost and the process is killed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Death {
    /// stdout closed (the process exited or closed it).
    Closed(String),
    /// A line that is not a JSON object of the protocol.
    Garbage(String),
    /// No answer in time.
    Timeout(Duration),
    /// Writing the request failed (the process is gone).
    Write(String),
}

impl std::fmt::Display for Death {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Death::Closed(status) => write!(f, "the worker closed its stdout ({status})"),
            Death::Garbage(line) => {
                write!(f, "the worker printed a line outside the protocol: {line}")
            }
            Death::Timeout(t) => {
                write!(f, "the worker did not answer within {} s", t.as_secs_f64())
            }
            Death::Write(e) => write!(f, "cannot write to the worker: {e}"),
        }
    }
}

enum Line {
    Text(String),
    TooLong,
    Eof,
}

pub struct Process {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<Line>,
    tail: Arc<Mutex<VecDeque<String>>>,
}

impl Process {
    /// Start `command` (program and arguments). A program that cannot be started is an error
    /// naming it.
    pub fn spawn(command: &[String]) -> Result<Process, String> {
        let (program, args) = command
            .split_first()
            .ok_or_else(|| "empty worker command".to_string())?;
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .env("PYTHONUNBUFFERED", "1")
            .spawn()
            .map_err(|e| format!("cannot start worker `{}`: {e}", command.join(" ")))?;
        let stdout = child.stdout.take().ok_or("worker has no stdout")?;
        let stderr = child.stderr.take().ok_or("worker has no stderr")?;
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            loop {
                let line = read_bounded_line(&mut reader);
                let end = matches!(line, Line::Eof | Line::TooLong);
                if tx.send(line).is_err() || end {
                    break;
                }
            }
        });
        let tail = Arc::new(Mutex::new(VecDeque::new()));
        let keep = tail.clone();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stderr);
            loop {
                match read_bounded_line(&mut reader) {
                    Line::Eof => break,
                    Line::TooLong => continue,
                    Line::Text(l) => {
                        let mut t = keep.lock().unwrap_or_else(|e| e.into_inner());
                        if t.len() == TAIL_LINES {
                            t.pop_front();
                        }
                        t.push_back(l.chars().take(TAIL_LINE_CHARS).collect());
                    }
                }
            }
        });
        Ok(Process {
            stdin: child.stdin.take(),
            child,
            lines,
            tail,
        })
    }

    /// Send one request and wait up to `timeout` for its answer, a JSON object.
    pub fn request(&mut self, message: &Value, timeout: Duration) -> Result<Value, Death> {
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| Death::Write("stdin closed".into()))?;
        let mut line = message.to_string();
        line.push('\n');
        stdin
            .write_all(line.as_bytes())
            .and_then(|()| stdin.flush())
            .map_err(|e| Death::Write(e.to_string()))?;
        match self.lines.recv_timeout(timeout) {
            Ok(Line::Text(text)) => match serde_json::from_str::<Value>(&text) {
                Ok(v) if v.is_object() => Ok(v),
                _ => Err(Death::Garbage(text.chars().take(200).collect())),
            },
            Ok(Line::TooLong) => Err(Death::Garbage(format!(
                "a line longer than {MAX_LINE} bytes"
            ))),
            Ok(Line::Eof) | Err(RecvTimeoutError::Disconnected) => {
                Err(Death::Closed(self.exit_status()))
            }
            Err(RecvTimeoutError::Timeout) => Err(Death::Timeout(timeout)),
        }
    }

    /// The last lines the worker wrote to stderr.
    pub fn stderr_tail(&self, lines: usize) -> String {
        let t = self.tail.lock().unwrap_or_else(|e| e.into_inner());
        let skip = t.len().saturating_sub(lines);
        t.iter().skip(skip).cloned().collect::<Vec<_>>().join("\n")
    }

    /// How the process ended, waiting briefly for it (it closed stdout, so it is usually gone).
    fn exit_status(&mut self) -> String {
        for _ in 0..20 {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.to_string();
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        "still running".into()
    }

    /// Say bye and give the worker a moment to exit; kill it otherwise.
    pub fn close(mut self) {
        if let Some(mut stdin) = self.stdin.take() {
            let _ = stdin.write_all(b"{\"op\":\"bye\"}\n");
            let _ = stdin.flush();
        }
        for _ in 0..40 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        self.kill();
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// One line without its newline, at most `MAX_LINE` bytes (a longer one is drained and
/// reported as too long), lossily decoded.
fn read_bounded_line(reader: &mut impl BufRead) -> Line {
    let mut buf = Vec::new();
    let mut limited = reader.take(MAX_LINE as u64 + 1);
    match limited.read_until(b'\n', &mut buf) {
        Ok(0) => return Line::Eof,
        Ok(_) => {}
        Err(_) => return Line::Eof,
    }
    if buf.last() == Some(&b'\n') {
        buf.pop();
        if buf.last() == Some(&b'\r') {
            buf.pop();
        }
    } else if buf.len() > MAX_LINE {
        return Line::TooLong;
    }
    Line::Text(String::from_utf8_lossy(&buf).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Vec<String> {
        vec!["sh".into(), "-c".into(), script.into()]
    }

    #[test]
    fn echo_answers_and_garbage_and_eof() {
        let mut p = Process::spawn(&sh(
            "read l; echo '{\"ok\":true}'; read l; echo nope; read l; echo err >&2",
        ))
        .unwrap();
        let t = Duration::from_secs(5);
        assert_eq!(
            p.request(&serde_json::json!({"op":"x"}), t).unwrap()["ok"],
            true
        );
        assert!(matches!(
            p.request(&serde_json::json!({}), t),
            Err(Death::Garbage(_))
        ));
        assert!(matches!(
            p.request(&serde_json::json!({}), t),
            Err(Death::Closed(_))
        ));
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(p.stderr_tail(5), "err");
    }

    #[test]
    fn a_silent_worker_times_out() {
        let mut p = Process::spawn(&sh("sleep 30")).unwrap();
        let started = std::time::Instant::now();
        let r = p.request(&serde_json::json!({}), Duration::from_millis(200));
        assert!(matches!(r, Err(Death::Timeout(_))));
        assert!(started.elapsed() < Duration::from_secs(5));
        p.kill();
    }

    #[test]
    fn a_missing_program_is_named() {
        let e = Process::spawn(&["/nonexistent/worker".to_string()])
            .err()
            .unwrap();
        assert!(e.contains("/nonexistent/worker"), "{e}");
    }
}
