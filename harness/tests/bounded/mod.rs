//! Running the `relattn` binary as a child process with bounded time and memory, as the bad-input
//! regressions and the fuzz suite do: under `prlimit --as` (an address-space limit, so an
//! absurd allocation fails inside the child instead of taking the machine), killed past a
//! time limit, with its exit status, output and peak resident memory.
#![allow(dead_code)] // each test binary uses a part

use std::ffi::OsString;
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Address space of every child: far below the 6 GiB to 17 TB allocations bad inputs used to
/// attempt, far above what any bounded run needs (tens of MiB).
pub const MEMORY_LIMIT: u64 = 1 << 30;

/// glibc's malloc arenas the children may make, and their threads. Each arena reserves 64 MiB of
/// address space (not memory), and glibc gives a new thread its own at its first allocation, up
/// to eight per core; each thread's stack takes 2 MiB more: on a 16-core machine a run's threads
/// alone filled `MEMORY_LIMIT`. Two arenas and four threads keep the limit a bound on what relattn
/// allocates, on any machine.
pub const MALLOC_ARENAS: &str = "2";
pub const THREADS: &str = "4";

/// Case-byte limit given to the children (`--max-case-bytes`), so that no valid input they
/// generate or read comes near the memory limit.
pub const CASE_LIMIT: &str = "64M";

/// What a finished (or killed) child did.
#[derive(Debug)]
pub struct Outcome {
    pub args: Vec<String>,
    /// Exit code; None when a signal ended it.
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub stdout: Vec<u8>,
    pub stderr: String,
    pub elapsed: Duration,
    pub timed_out: bool,
    /// The largest VmHWM seen while it ran (sampled; a lower bound of its peak).
    pub sampled_peak_kib: u64,
}

/// Text a panic or an aborted allocation leaves on stderr, or the refusal of a child that could
/// not start its threads under the limit (which would make every input an exit 2 that tests
/// nothing).
const PANIC_TEXT: [&str; 6] = [
    "panicked at",
    "stack backtrace",
    "RUST_BACKTRACE",
    "memory allocation of",
    "fatal runtime error",
    "could not start its",
];

impl Outcome {
    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// Why the outcome breaks the rules (exit code in `allowed`, finished in time, no panic
    /// text), or None.
    pub fn violation(&self, allowed: &[i32]) -> Option<String> {
        let what = format!("relattn {}", self.args.join(" "));
        if self.timed_out {
            return Some(format!("{what}: still running after {:?}", self.elapsed));
        }
        if let Some(text) = PANIC_TEXT.iter().find(|t| self.stderr.contains(*t)) {
            return Some(format!("{what}: {text:?} on stderr:\n{}", self.stderr));
        }
        match self.code {
            Some(c) if allowed.contains(&c) => None,
            Some(c) => Some(format!(
                "{what}: exit {c}, expected one of {allowed:?}; stderr:\n{}",
                self.stderr
            )),
            None => Some(format!(
                "{what}: killed by signal {:?}; stderr:\n{}",
                self.signal, self.stderr
            )),
        }
    }

    /// Panic unless the outcome keeps the rules.
    pub fn check(&self, allowed: &[i32]) -> &Outcome {
        if let Some(v) = self.violation(allowed) {
            panic!("{v}");
        }
        self
    }
}

/// Whether `prlimit` (util-linux) can be run; without it children run without a memory limit
/// and the figures say so.
pub fn have_prlimit() -> bool {
    static HAVE: OnceLock<bool> = OnceLock::new();
    *HAVE.get_or_init(|| {
        Command::new("prlimit")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// Peak resident memory of the largest child this process has waited for, in KiB
/// (`getrusage(RUSAGE_CHILDREN)`).
pub fn children_peak_kib() -> u64 {
    nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN)
        .map(|u| u.max_rss().max(0) as u64)
        .unwrap_or(0)
}

fn vm_hwm_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Run `relattn ARGS` in `cwd`, with `stdin` as its input, killed after `timeout`.
pub fn relattn_in(
    cwd: &Path,
    args: &[OsString],
    stdin: Option<&[u8]>,
    timeout: Duration,
) -> Outcome {
    relattn_with_env(cwd, args, stdin, &[], timeout)
}

/// [`relattn_in`] with variables added to its environment.
pub fn relattn_with_env(
    cwd: &Path,
    args: &[OsString],
    stdin: Option<&[u8]>,
    env: &[(String, String)],
    timeout: Duration,
) -> Outcome {
    let bin = env!("CARGO_BIN_EXE_relattn");
    let mut cmd = if have_prlimit() {
        let mut c = Command::new("prlimit");
        c.arg(format!("--as={MEMORY_LIMIT}")).arg("--").arg(bin);
        c
    } else {
        Command::new(bin)
    };
    cmd.args(args)
        .current_dir(cwd)
        .envs(crate::binary::ENV)
        .env("MALLOC_ARENA_MAX", MALLOC_ARENAS)
        .env("RAYON_NUM_THREADS", THREADS)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let start = Instant::now();
    let mut child = cmd.spawn().expect("relattn starts");
    let pid = child.id();
    if let (Some(bytes), Some(mut pipe)) = (stdin, child.stdin.take()) {
        let bytes = bytes.to_vec();
        std::thread::spawn(move || {
            let _ = pipe.write_all(&bytes);
        });
    }
    let mut out_pipe = child.stdout.take().expect("piped stdout");
    let mut err_pipe = child.stderr.take().expect("piped stderr");
    let out_reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = out_pipe.read_to_end(&mut buf);
        buf
    });
    let err_reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = err_pipe.read_to_end(&mut buf);
        buf
    });
    let mut peak = 0;
    let mut timed_out = false;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for relattn") {
            break status;
        }
        if let Some(kib) = vm_hwm_kib(pid) {
            peak = peak.max(kib);
        }
        if start.elapsed() > timeout {
            timed_out = true;
            let _ = child.kill();
            break child.wait().expect("wait for the killed relattn");
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let elapsed = start.elapsed();
    use std::os::unix::process::ExitStatusExt;
    Outcome {
        args: args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
        code: status.code(),
        signal: status.signal(),
        stdout: out_reader.join().unwrap_or_default(),
        stderr: String::from_utf8_lossy(&err_reader.join().unwrap_or_default()).into_owned(),
        elapsed,
        timed_out,
        sampled_peak_kib: peak,
    }
}

/// `relattn_in` with string arguments and no input.
pub fn relattn(cwd: &Path, args: &[&str], timeout: Duration) -> Outcome {
    let args: Vec<OsString> = args.iter().map(OsString::from).collect();
    relattn_in(cwd, &args, None, timeout)
}

/// Every path under `root` (relative to it) with its size, to tell what a command wrote.
pub fn tree(root: &Path) -> std::collections::BTreeMap<std::path::PathBuf, u64> {
    let mut out = std::collections::BTreeMap::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(dir) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let meta = std::fs::symlink_metadata(&path);
            let len = meta.as_ref().map_or(0, |m| m.len());
            if meta.is_ok_and(|m| m.is_dir()) {
                todo.push(path.clone());
            }
            if let Ok(rel) = path.strip_prefix(root) {
                out.insert(rel.to_path_buf(), len);
            }
        }
    }
    out
}
