//! One worker child process: JSON lines to its stdin, answers read from its stdout by a reader
//! thread (so a silent worker costs a timeout, not a hang), and the tail of its stderr kept for
//! reports. Lines are bounded in length, so a worker cannot make relattn hold unbounded memory.
//!
//! Each worker runs in a process group of its own: a Ctrl-C in the terminal reaches relattn
//! (which finishes the trials in flight) but not the worker, a worker's `kill 0` reaches only
//! its own group, and ending a worker ends every process it started in that group.

use super::stderr::Stderr;
use rustix::process::{kill_process_group, test_kill_process_group, Pid, Signal};
use serde_json::Value;
use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest answer line read (longer ones are a protocol violation).
const MAX_LINE: usize = 1 << 20;
/// How long the answer of a worker with stderr marks waits for the request's end mark (written
/// before the answer, so only the reader thread's delay).
const MARK_WAIT: Duration = Duration::from_secs(2);
/// Answers carrying the id of an earlier request (a worker that answered one twice) dropped
/// while waiting for one answer; one more is a protocol violation.
pub const MAX_STALE: usize = 4;
/// Ids of earlier requests remembered to recognise stale answers.
const IDS_KEPT: usize = 16;
/// How long a worker's process group has to exit after SIGTERM before it gets SIGKILL, and how
/// long the worker is then waited for.
const TERM_GRACE: Duration = Duration::from_millis(500);
const KILL_WAIT: Duration = Duration::from_secs(2);

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

pub(super) enum Line {
    Text(String),
    TooLong,
    Eof,
}

pub struct Process {
    child: Child,
    /// The worker's process group (its own pid).
    group: Pid,
    /// Ids of the last requests sent, newest last.
    sent_ids: VecDeque<Value>,
    /// Whether the group has been ended (nothing is signalled twice).
    ended: bool,
    stdin: Option<ChildStdin>,
    lines: Receiver<Line>,
    stderr: Arc<Stderr>,
    /// When the worker marks each request's lines on stderr (`hello`'s `stderr_marks`): the
    /// place among its end marks of the last request with an id sent.
    marked: Option<u64>,
}

impl Process {
    /// Start `command` (program and arguments). A program that cannot be started is an error
    /// naming it.
    pub fn spawn(command: &[String]) -> Result<Process, String> {
        Process::spawn_with(command, &[])
    }

    /// `spawn` with more environment variables.
    pub fn spawn_with(command: &[String], env: &[(String, String)]) -> Result<Process, String> {
        let (program, args) = command
            .split_first()
            .ok_or_else(|| "empty worker command".to_string())?;
        let mut child = Command::new(program)
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .env("PYTHONUNBUFFERED", "1")
            .process_group(0)
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
        let stderr = Stderr::read(stderr);
        let group = Pid::from_child(&child);
        super::live::add_group(group);
        Ok(Process {
            stdin: child.stdin.take(),
            group,
            sent_ids: VecDeque::new(),
            ended: false,
            child,
            lines,
            stderr,
            marked: None,
        })
    }

    /// Send one request and wait up to `timeout` for its answer, a JSON object. When the request
    /// has an `id`, answers carrying the id of an earlier request are dropped (up to
    /// `MAX_STALE`); any other answer is returned for the caller to check.
    pub fn request(&mut self, message: &Value, timeout: Duration) -> Result<Value, Death> {
        let deadline = Instant::now() + timeout;
        self.send(message)?;
        let id = message.get("id").cloned();
        let mut stale = 0;
        loop {
            let answer = self.answer(deadline, timeout)?;
            let got = answer.get("id");
            let is_stale = id.is_some()
                && got != id.as_ref()
                && got.is_some_and(|g| self.sent_ids.iter().rev().skip(1).any(|s| s == g));
            if !is_stale || stale == MAX_STALE {
                return Ok(answer);
            }
            stale += 1;
        }
    }

    fn send(&mut self, message: &Value) -> Result<(), Death> {
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
        if let Some(id) = message.get("id") {
            if let Some(n) = &mut self.marked {
                *n += 1;
            }
            if self.sent_ids.len() == IDS_KEPT {
                self.sent_ids.pop_front();
            }
            self.sent_ids.push_back(id.clone());
        }
        Ok(())
    }

    /// The next answer line, a JSON object, read before `deadline`.
    fn answer(&mut self, deadline: Instant, timeout: Duration) -> Result<Value, Death> {
        let left = deadline.saturating_duration_since(Instant::now());
        match self.lines.recv_timeout(left) {
            Ok(Line::Text(text)) => match serde_json::from_str::<Value>(&text) {
                Ok(v) if v.is_object() => Ok(v),
                _ => Err(Death::Garbage(super::text::one_line(&text, 200))),
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
        self.stderr.tail(lines)
    }

    /// From now on, the worker marks each request with an id on stderr.
    pub fn use_marks(&mut self) {
        self.marked = Some(self.stderr.ends());
    }

    /// The last lines the answered request `id` (the last one sent) wrote to stderr: between
    /// its marks when the worker marks them (and the end mark comes in time), else the
    /// process's last lines. A worker whose marks fell out of step (one missing, one too many)
    /// is counted from the marks read so far again.
    pub fn stderr_of(&mut self, id: &Value, lines: usize) -> String {
        if let Some(n) = self.marked {
            match self.stderr.of_request(id, n, lines, MARK_WAIT) {
                Some(own) => return own,
                None => self.marked = Some(self.stderr.ends()),
            }
        }
        self.stderr.tail(lines)
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

    /// Say bye and give the worker a moment to exit; then end its process group (whatever the
    /// worker started and left behind goes with it).
    pub fn close(mut self) {
        if let Some(mut stdin) = self.stdin.take() {
            let _ = stdin.write_all(b"{\"op\":\"bye\"}\n");
            let _ = stdin.flush();
        }
        for _ in 0..40 {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        self.kill();
    }

    /// End the worker's whole process group: SIGTERM, then SIGKILL to whatever is left after
    /// `TERM_GRACE`, and reap the worker (waiting at most `KILL_WAIT`; a process stuck in the
    /// kernel is left to the system rather than hang relattn).
    pub fn kill(&mut self) {
        if std::mem::replace(&mut self.ended, true) {
            return;
        }
        super::live::remove_group(self.group);
        self.stdin.take();
        let _ = kill_process_group(self.group, Signal::TERM);
        let term_deadline = Instant::now() + TERM_GRACE;
        let mut reaped = false;
        while Instant::now() < term_deadline {
            reaped = reaped || matches!(self.child.try_wait(), Ok(Some(_)));
            // The group is gone once the worker is reaped and nothing else is left in it.
            if reaped && test_kill_process_group(self.group).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = kill_process_group(self.group, Signal::KILL);
        let kill_deadline = Instant::now() + KILL_WAIT;
        while !reaped && Instant::now() < kill_deadline {
            reaped = matches!(self.child.try_wait(), Ok(Some(_)));
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One line without its newline, at most `MAX_LINE` bytes (a longer one is drained and
/// reported as too long), lossily decoded.
pub(super) fn read_bounded_line(reader: &mut impl BufRead) -> Line {
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
    fn a_marking_workers_request_quotes_its_own_stderr() {
        // An earlier line, the request's lines between its marks, then the answer.
        let script = r#"read l; echo before >&2; echo 'relattn-mark begin "t"' >&2; echo own >&2; echo 'relattn-mark end "t"' >&2; echo '{"ok":true,"id":"t"}'; read l"#;
        let t = Duration::from_secs(5);
        let id = serde_json::json!("t");
        let mut p = Process::spawn(&sh(script)).unwrap();
        p.use_marks();
        p.request(&serde_json::json!({"id": "t"}), t).unwrap();
        assert_eq!(p.stderr_of(&id, 12), "own");
        // Without marks in use: the process's last lines.
        let mut p2 = {
            let mut p = Process::spawn(&sh(script)).unwrap();
            p.request(&serde_json::json!({"id": "t"}), t).unwrap();
            p
        };
        let started = Instant::now();
        while p2.stderr_tail(12).lines().count() < 2 && started.elapsed() < t {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(p2.stderr_of(&id, 12), "before\nown");
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

    /// Whether `pid` is gone (or a zombie nobody reaped yet: it runs no more).
    fn gone(pid: u32) -> bool {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => true,
            Ok(stat) => stat
                .rsplit(')')
                .next()
                .is_some_and(|rest| rest.trim_start().starts_with('Z')),
        }
    }

    fn wait_gone(pid: u32) -> bool {
        let started = std::time::Instant::now();
        while started.elapsed() < Duration::from_secs(5) {
            if gone(pid) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// The pid a test worker printed on stderr.
    fn pid_on_stderr(p: &Process) -> u32 {
        let started = std::time::Instant::now();
        let mut tail = String::new();
        while tail.is_empty() && started.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(20));
            tail = p.stderr_tail(1);
        }
        tail.trim().parse().expect("the child's pid")
    }

    #[test]
    fn a_workers_kill_0_reaches_only_its_own_group() {
        // In relattn's group, this would end the test process itself.
        let mut p = Process::spawn(&sh("read l; kill 0; sleep 5")).unwrap();
        let r = p.request(&serde_json::json!({}), Duration::from_secs(5));
        match r {
            Err(Death::Closed(status)) => assert!(status.contains("15"), "{status}"),
            other => panic!("expected the worker to end itself: {other:?}"),
        }
    }

    #[test]
    fn closing_a_worker_ends_what_it_started() {
        let p = Process::spawn(&sh("sleep 1000 & echo $! >&2; read l")).unwrap();
        let pid = pid_on_stderr(&p);
        assert!(!gone(pid));
        p.close();
        assert!(wait_gone(pid), "the worker's child {pid} outlived it");
    }

    #[test]
    fn killing_a_worker_ends_children_that_ignore_sigterm() {
        let mut p =
            Process::spawn(&sh("(trap '' TERM; sleep 1000) & echo $! >&2; sleep 1000")).unwrap();
        let pid = pid_on_stderr(&p);
        let killing = std::time::Instant::now();
        p.kill();
        assert!(killing.elapsed() < TERM_GRACE + KILL_WAIT);
        assert!(wait_gone(pid), "the worker's child {pid} outlived it");
    }

    #[test]
    fn stale_answers_are_dropped_and_bounded() {
        let t = Duration::from_secs(5);
        // Answers every request twice: the second copy arrives while the next request waits.
        let mut p = Process::spawn(&sh(
            r#"while read l; do id=${l#*\"id\":}; id=${id%%,*}; id=${id%%\}*}; printf '{"ok":true,"id":%s}\n' "$id" "$id"; done"#,
        ))
        .unwrap();
        for id in 1..=4 {
            let a = p
                .request(&serde_json::json!({"op": "x", "id": id}), t)
                .unwrap();
            assert_eq!(a["id"], id);
        }
        let mut p = Process::spawn(&sh(
            r#"read l; echo '{"id":1}'; read l; for i in 1 2 3 4 5 6; do echo '{"id":1}'; done; read l"#,
        ))
        .unwrap();
        assert_eq!(
            p.request(&serde_json::json!({"id": 1}), t).unwrap()["id"],
            1
        );
        // Six copies of an earlier answer: four are dropped, the fifth is handed on (and the
        // caller refuses it).
        assert_eq!(
            p.request(&serde_json::json!({"id": 2}), t).unwrap()["id"],
            1
        );
    }
}
