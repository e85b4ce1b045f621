//! `--sanitize TOOL`: GPU trials under NVIDIA's compute-sanitizer, each trial failing with its
//! tool's class when the sanitizer reports an error while it ran (`Tool::class`):
//!
//! - `memcheck`: out-of-bounds and misaligned accesses. Every allocation gets `PADDING` bytes
//!   of padding after it (`--padding`), so an over-read of a tile past one tensor lands in
//!   padding, which belongs to no allocation, instead of in the tensor allocated after it;
//! - `initcheck`: reads of device memory no kernel or copy wrote (an unwritten split partial
//!   combined, an output row never stored). relattn's native runs then leave the workspaces
//!   unpoisoned (a memset would count as written);
//! - `racecheck` and `synccheck`: shared-memory races and barrier misuse.
//!
//! - Workers are long-lived processes answering one trial at a time, so each worker process runs
//!   under a sanitizer of its own (`wrap`), with a log file of its own in relattn's folder for the
//!   worker, and PyTorch's caching allocator off (`PYTORCH_NO_CUDA_MEMORY_CACHING=1`: a read
//!   past a tensor inside a pooled block is no error to memcheck). After each answer relattn
//!   reads the log's new bytes (`LogWatch`) and gives them to that trial; a worker whose trial
//!   had errors is restarted, so its next trial starts with a fresh sanitizer.
//! - The native paths run in relattn's own process, on cudarc: a command asked to sanitize them
//!   runs itself again under the sanitizer (`reexec`), the child knowing its log file from
//!   `LOG_ENV`; its GPU executor checks the log after each trial, whose launches end in a
//!   stream synchronisation. One device, one trial at a time (one device thread), so every
//!   error in the log between two checks is that trial's.
//! - compute-sanitizer writes to stdout unless told otherwise, which would corrupt the worker
//!   protocol: every wrapper names a `--log-file`. Whether memcheck has written a report to the
//!   file by the time the target's synchronising call returns is not documented: relattn reads
//!   a trial's part of the log `FLUSH_WAIT` (100 ms) after the trial ended at the earliest, and
//!   only once the file has stopped growing (about 0.1 s per sanitized trial).
//! - `--destroy-on-device-error kernel`: a memory error ends the kernel, not the CUDA context,
//!   so the next trial runs; `--report-api-errors no`: CUDA API errors of libraries (torch probes
//!   some on purpose) are not memory errors; `--show-backtrace no`: one short report per error.
//!
//! Every trial of a sanitized run carries the parameter `sanitize` = the tool, and the report's
//! environment says the run was sanitized: its times are not comparable with unsanitized ones.

use crate::exit;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The environment variable naming the sanitizer's program (else `compute-sanitizer` on PATH).
pub const PROGRAM_ENV: &str = "RELATTN_SANITIZER";
/// Set by `reexec` for the child it starts under the sanitizer: the child's log file.
pub const LOG_ENV: &str = "RELATTN_SANITIZE_LOG";
/// The program looked for on PATH.
pub const PROGRAM: &str = "compute-sanitizer";
/// Reports memcheck prints per process; past it a process's errors are counted, not printed.
pub const PRINT_LIMIT: usize = 10_000;
/// How long to wait for a log to receive the reports of a trial that just ended.
pub const FLUSH_WAIT: Duration = Duration::from_millis(100);
/// Once reports arrive, how long the log must stay the same size to be taken as complete, and
/// the longest wait for that.
const SETTLE: Duration = Duration::from_millis(30);
const SETTLE_MAX: Duration = Duration::from_secs(3);
/// The line prefix of compute-sanitizer's output.
const PREFIX: &str = "=========";
/// Characters of the first report quoted in a trial's message.
const FIRST_REPORT_CHARS: usize = 1500;

/// Bytes of padding memcheck adds after every allocation (`--padding`): more than a 128-row
/// tile of q or out at 64 heads of 128 dims in bf16 (2 MiB) reaches past, so a tile's over-read
/// of one tensor lands in padding rather than in the next tensor.
pub const PADDING: usize = 4 << 20;

/// A compute-sanitizer tool `--sanitize` takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Tool {
    /// Out-of-bounds and misaligned accesses to global, local and shared memory (with padding
    /// after every allocation).
    Memcheck,
    /// Reads of global memory never written.
    Initcheck,
    /// Shared-memory data races.
    Racecheck,
    /// Barrier and warp-synchronisation misuse.
    Synccheck,
}

impl Tool {
    pub fn as_str(self) -> &'static str {
        match self {
            Tool::Memcheck => "memcheck",
            Tool::Initcheck => "initcheck",
            Tool::Racecheck => "racecheck",
            Tool::Synccheck => "synccheck",
        }
    }

    /// The tool named `name` as `--sanitize` takes it (clap's own parser).
    pub fn parse(name: &str) -> Option<Tool> {
        <Tool as clap::ValueEnum>::from_str(name, false).ok()
    }

    /// The class a report of this tool puts a trial in: its words, then the docs/operator.md
    /// section 5 class it stands for (the classes name the bugs; racecheck and synccheck find
    /// defects of relattn's own kernels that no class names).
    pub fn class(self) -> &'static str {
        match self {
            Tool::Memcheck => "out-of-bounds access (docs/operator.md section 5, class 5)",
            Tool::Initcheck => "read of memory never written (docs/operator.md section 5, class 7)",
            Tool::Racecheck => "shared-memory race",
            Tool::Synccheck => "barrier misuse",
        }
    }

    /// Options this tool takes beyond the common ones.
    fn options(self) -> Vec<String> {
        match self {
            Tool::Memcheck => vec!["--padding".into(), PADDING.to_string()],
            Tool::Initcheck | Tool::Racecheck | Tool::Synccheck => Vec::new(),
        }
    }
}

/// A sanitizer program and the tool it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sanitizer {
    pub program: PathBuf,
    pub tool: Tool,
}

impl Sanitizer {
    /// `RELATTN_SANITIZER`, else `compute-sanitizer` on PATH; exit 3 (a GPU tool is required and
    /// not usable) with one message when neither is there. Looks at no GPU.
    pub fn find(tool: Tool) -> anyhow::Result<Sanitizer> {
        Sanitizer::find_in(
            tool,
            std::env::var_os(PROGRAM_ENV).map(PathBuf::from),
            std::env::var_os("PATH"),
        )
    }

    fn find_in(
        tool: Tool,
        named: Option<PathBuf>,
        path: Option<std::ffi::OsString>,
    ) -> anyhow::Result<Sanitizer> {
        let need = format!(
            "--sanitize {} needs NVIDIA's compute-sanitizer (CUDA toolkit, e.g. \
             /usr/local/cuda/bin/compute-sanitizer)",
            tool.as_str()
        );
        if let Some(program) = named.filter(|p| !p.as_os_str().is_empty()) {
            if is_executable(&program) {
                return Ok(Sanitizer { program, tool });
            }
            return Err(exit::no_gpu(format!(
                "{need}: {PROGRAM_ENV}={} is not an executable file",
                program.display()
            )));
        }
        let found = path
            .iter()
            .flat_map(std::env::split_paths)
            .map(|dir| dir.join(PROGRAM))
            .find(|p| is_executable(p));
        found
            .map(|program| Sanitizer { program, tool })
            .ok_or_else(|| {
                exit::no_gpu(format!(
                    "{need}: there is no {PROGRAM} on PATH; add its folder to PATH or set \
                     {PROGRAM_ENV} to it"
                ))
            })
    }

    /// `command` run under the sanitizer, its reports written to `log` (never to stdout).
    pub fn wrap(&self, log: &Path, command: &[String]) -> Vec<String> {
        let mut out = vec![
            self.program.to_string_lossy().into_owned(),
            "--tool".into(),
            self.tool.as_str().into(),
            "--log-file".into(),
            log.to_string_lossy().into_owned(),
            "--print-limit".into(),
            PRINT_LIMIT.to_string(),
            "--destroy-on-device-error".into(),
            "kernel".into(),
            "--report-api-errors".into(),
            "no".into(),
            "--show-backtrace".into(),
            "no".into(),
            "--target-processes".into(),
            "application-only".into(),
        ];
        out.extend(self.tool.options());
        out.extend_from_slice(command);
        out
    }

    /// The environment a sanitized worker gets: PyTorch allocating each tensor on its own, so
    /// that a read past one is outside every allocation.
    pub fn worker_env(&self) -> Vec<(String, String)> {
        vec![("PYTORCH_NO_CUDA_MEMORY_CACHING".into(), "1".into())]
    }

    /// Run this very command again under the sanitizer, with `LOG_ENV` naming a fresh log file,
    /// wait for it and end with its exit code. Never returns on success.
    pub fn reexec(&self, what: &str) -> anyhow::Result<()> {
        let exe = std::env::current_exe()
            .map_err(|e| exit::usage(format!("locating relattn to run it sanitized: {e}")))?;
        let dir = tempfile::Builder::new()
            .prefix("relattn-sanitize-")
            .tempdir()
            .map_err(|e| exit::usage(format!("cannot make a folder for the sanitizer log: {e}")))?;
        let log = dir.path().join("native.log");
        let mut command = vec![exe.to_string_lossy().into_owned()];
        command.extend(std::env::args().skip(1));
        let argv = self.wrap(&log, &command);
        eprintln!(
            "relattn {what}: running the native paths under {} --tool {} (times are not \
             comparable with unsanitized runs)",
            self.program.display(),
            self.tool.as_str()
        );
        let status = std::process::Command::new(&argv[0])
            .args(&argv[1..])
            .env(LOG_ENV, &log)
            .env(TOOL_ENV, self.tool.as_str())
            .status()
            .map_err(|e| exit::no_gpu(format!("cannot start {}: {e}", self.program.display())))?;
        match status.code() {
            Some(code) => std::process::exit(code),
            None => Err(exit::failed(format!(
                "the sanitized run ended without an exit code ({status})"
            ))),
        }
    }
}

/// The start-up every sanitized command shares, in two steps. `find`: before any GPU detection,
/// the sanitizer `--sanitize` asked for (exit 3 when there is none). `run_natives_under`: when
/// the native paths are about to run in this process (`ready`: a usable GPU) and this is not
/// yet the sanitized child, the command again under the sanitizer (never returns then).
pub fn find(tool: Option<Tool>) -> anyhow::Result<Option<Sanitizer>> {
    tool.map(Sanitizer::find).transpose()
}

/// See `find`.
pub fn run_natives_under(
    sanitizer: Option<&Sanitizer>,
    what: &str,
    ready: bool,
) -> anyhow::Result<()> {
    match sanitizer {
        Some(s) if ready && child_log().is_none() => s.reexec(what),
        _ => Ok(()),
    }
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Set by `reexec` beside `LOG_ENV`: the tool's name.
pub const TOOL_ENV: &str = "RELATTN_SANITIZE_TOOL";

/// In a child `reexec` started: its log file and the tool.
pub fn child_log() -> Option<(PathBuf, Tool)> {
    let log = std::env::var_os(LOG_ENV).filter(|v| !v.is_empty())?;
    let tool = std::env::var(TOOL_ENV)
        .ok()
        .and_then(|t| Tool::parse(&t))
        .unwrap_or(Tool::Memcheck);
    Some((PathBuf::from(log), tool))
}

/// What the sanitizer said about one trial: the tool, and the failure message when it reported
/// errors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    pub tool: String,
    pub errors: Option<String>,
}

/// The reports found in a stretch of a log.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reports {
    pub count: usize,
    /// The first report, its lines joined with "; ".
    pub first: Option<String>,
}

/// Lines of compute-sanitizer's output that are not an error report.
const NOT_ERRORS: [&str; 10] = [
    "COMPUTE-SANITIZER",
    "ERROR SUMMARY",
    "LEAK SUMMARY",
    "RACECHECK SUMMARY",
    "SYNCCHECK SUMMARY",
    "Target application",
    "Error: process didn't terminate",
    "Program hit",
    "Warning",
    "Note",
];

/// The error reports in `text` (complete lines of a log): a report starts at a line of the
/// sanitizer's prefix followed by text (not indented, not one of `NOT_ERRORS`) and goes on over
/// the indented lines after it.
pub fn parse(text: &str) -> Reports {
    let mut out = Reports::default();
    let mut first: Vec<String> = Vec::new();
    let mut in_first = false;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(PREFIX) else {
            in_first = false;
            continue;
        };
        let body = rest.trim();
        let indented = rest.starts_with("  ");
        if !body.is_empty() && !indented {
            in_first = false;
            if NOT_ERRORS.iter().any(|n| body.starts_with(n)) {
                continue;
            }
            out.count += 1;
            if out.count == 1 {
                first.push(body.to_string());
                in_first = true;
            }
        } else if in_first && !body.is_empty() {
            first.push(body.to_string());
        } else {
            in_first = false;
        }
    }
    if !first.is_empty() {
        let mut s = first.join("; ");
        if s.chars().count() > FIRST_REPORT_CHARS {
            s = s.chars().take(FIRST_REPORT_CHARS).collect::<String>() + " ...";
        }
        out.first = Some(s);
    }
    out
}

/// The failure message of a trial with `reports`: the tool's class first, the count, the first
/// report.
pub fn failure_message(tool: Tool, reports: &Reports) -> String {
    format!(
        "{}: compute-sanitizer {} reported {} error(s) while this trial ran; the first: {}",
        tool.class(),
        tool.as_str(),
        reports.count,
        reports.first.as_deref().unwrap_or("(no report text)")
    )
}

/// A log file read from where the last trial's reading stopped.
#[derive(Debug)]
pub struct LogWatch {
    path: PathBuf,
    offset: u64,
    /// Reports seen so far in this log (the print limit is per process).
    pub seen: usize,
}

impl LogWatch {
    pub fn new(path: PathBuf) -> LogWatch {
        LogWatch {
            path,
            offset: 0,
            seen: 0,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The complete lines written since the last call, read once `FLUSH_WAIT` has passed and the
    /// file has stopped growing (for `SETTLE`, at most `SETTLE_MAX` in all): a report memcheck
    /// writes just after the call that ended the trial returned is still this trial's.
    pub fn take_new(&mut self) -> Result<Reports, String> {
        let started = Instant::now();
        let mut size = self.size();
        let mut stable_since = started;
        loop {
            let waited = started.elapsed();
            if waited >= SETTLE_MAX || (waited >= FLUSH_WAIT && stable_since.elapsed() >= SETTLE) {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
            let now = self.size();
            if now != size {
                size = now;
                stable_since = Instant::now();
            }
        }
        let text = self.read_lines().map_err(|e| {
            format!(
                "cannot read the sanitizer's log {}: {e}",
                self.path.display()
            )
        })?;
        let reports = parse(&text);
        self.seen += reports.count;
        Ok(reports)
    }

    fn size(&self) -> u64 {
        std::fs::metadata(&self.path).map_or(0, |m| m.len())
    }

    /// The bytes from the offset to the last newline; the offset moves past them.
    fn read_lines(&mut self) -> std::io::Result<String> {
        let mut f = match std::fs::File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(String::new()),
            Err(e) => return Err(e),
        };
        f.seek(SeekFrom::Start(self.offset))?;
        let mut bytes = Vec::new();
        f.take(64 << 20).read_to_end(&mut bytes)?;
        let end = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        self.offset += end as u64;
        Ok(String::from_utf8_lossy(&bytes[..end]).into_owned())
    }

    /// Whether the sanitizer may have stopped printing reports (the print limit is reached).
    pub fn limit_reached(&self) -> bool {
        self.seen >= PRINT_LIMIT
    }
}

/// A trial's verdict from its log: `Checked` with the failure message when it had errors; a
/// log that cannot be read, or a print limit used up, is an error of the trial (its memory
/// accesses were not checked).
pub fn check(watch: &mut LogWatch, tool: Tool) -> Result<Checked, String> {
    if watch.limit_reached() {
        return Err(format!(
            "compute-sanitizer's print limit of {PRINT_LIMIT} reports is used up in this \
             process: this trial's accesses are not checked; rerun its case alone with --sanitize"
        ));
    }
    let reports = watch.take_new()?;
    Ok(Checked {
        tool: tool.as_str().to_string(),
        errors: (reports.count > 0).then(|| failure_message(tool, &reports)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "\
========= COMPUTE-SANITIZER
========= Invalid __global__ read of size 2 bytes
=========     at score_mod_attention_bf16+0x1a30
=========     by thread (5,0,0) in block (0,3,1)
=========     Address 0x7f12c0000200 is out of bounds
=========     and is 1 bytes after the nearest allocation at 0x7f12c0000000 of size 511 bytes
=========
========= Invalid __global__ read of size 2 bytes
=========     at score_mod_attention_bf16+0x1a30
=========     by thread (6,0,0) in block (0,3,1)
=========
";

    #[test]
    fn reports_are_counted_and_the_first_is_quoted() {
        let r = parse(LOG);
        assert_eq!(r.count, 2);
        assert_eq!(
            r.first.as_deref(),
            Some(
                "Invalid __global__ read of size 2 bytes; at score_mod_attention_bf16+0x1a30; \
                 by thread (5,0,0) in block (0,3,1); Address 0x7f12c0000200 is out of bounds; \
                 and is 1 bytes after the nearest allocation at 0x7f12c0000000 of size 511 bytes"
            )
        );
        let m = failure_message(Tool::Memcheck, &r);
        assert!(
            m.starts_with(
                "out-of-bounds access (docs/operator.md section 5, class 5): compute-sanitizer \
                 memcheck reported 2 error(s)"
            ),
            "{m}"
        );
    }

    #[test]
    fn headers_summaries_and_other_output_are_no_errors() {
        let clean = "========= COMPUTE-SANITIZER\n=========\n========= ERROR SUMMARY: 0 errors\n\
                     some line of the target\n========= Warning: something\n";
        assert_eq!(parse(clean), Reports::default());
        let hw = "========= Warp Illegal Address\n=========     at k+0x10\n";
        assert_eq!(parse(hw).count, 1);
    }

    #[test]
    fn a_watch_reads_only_what_is_new_and_only_whole_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let mut w = LogWatch::new(path.clone());
        // No file yet: nothing, after the bounded wait.
        let t = Instant::now();
        assert_eq!(w.take_new().unwrap(), Reports::default());
        assert!(t.elapsed() >= FLUSH_WAIT);
        std::fs::write(&path, "========= COMPUTE-SANITIZER\n").unwrap();
        assert_eq!(w.take_new().unwrap().count, 0);
        // One report, its last line not finished yet: counted once the line is whole.
        let mut text = String::from("========= COMPUTE-SANITIZER\n");
        text.push_str("========= Invalid __global__ read of size 4 bytes\n=========     at k+0x");
        std::fs::write(&path, &text).unwrap();
        assert_eq!(w.take_new().unwrap().count, 1);
        text.push_str("10\n");
        std::fs::write(&path, &text).unwrap();
        let again = w.take_new().unwrap();
        assert_eq!(again.count, 0, "{again:?}");
        assert_eq!(w.seen, 1);
        let c = check(&mut w, Tool::Memcheck).unwrap();
        assert_eq!(c.errors, None);
    }

    #[test]
    fn the_sanitizer_is_found_or_the_command_exits_3() {
        let dir = tempfile::tempdir().unwrap();
        let e = Sanitizer::find_in(Tool::Memcheck, None, Some(dir.path().into())).unwrap_err();
        assert_eq!(exit::code_of(&e), exit::Code::NoGpu);
        assert!(
            e.to_string()
                .contains("there is no compute-sanitizer on PATH")
                && e.to_string().contains("RELATTN_SANITIZER"),
            "{e}"
        );
        let fake = dir.path().join(PROGRAM);
        std::fs::write(&fake, "#!/bin/sh\n").unwrap();
        let e = Sanitizer::find_in(Tool::Memcheck, Some(fake.clone()), None).unwrap_err();
        assert!(e.to_string().contains("is not an executable file"), "{e}");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
        let s = Sanitizer::find_in(Tool::Memcheck, None, Some(dir.path().into())).unwrap();
        assert_eq!(s.program, fake);
        let argv = s.wrap(Path::new("/tmp/x.log"), &["python3".into(), "w.py".into()]);
        let at = |flag: &str| argv[argv.iter().position(|a| a == flag).unwrap() + 1].clone();
        assert_eq!(at("--tool"), "memcheck");
        assert_eq!(at("--log-file"), "/tmp/x.log");
        assert_eq!(at("--destroy-on-device-error"), "kernel");
        assert_eq!(at("--target-processes"), "application-only");
        assert_eq!(&argv[argv.len() - 2..], ["python3", "w.py"]);
        assert_eq!(at("--padding"), PADDING.to_string());
        for tool in [Tool::Initcheck, Tool::Racecheck, Tool::Synccheck] {
            let s = Sanitizer {
                program: fake.clone(),
                tool,
            };
            let argv = s.wrap(Path::new("/tmp/x.log"), &["python3".into()]);
            let at = |flag: &str| argv[argv.iter().position(|a| a == flag).unwrap() + 1].clone();
            assert_eq!(at("--tool"), tool.as_str());
            assert!(!argv.contains(&"--padding".to_string()), "{argv:?}");
            assert_eq!(Tool::parse(tool.as_str()), Some(tool));
        }
    }

    #[test]
    fn each_tools_reports_count_and_its_summaries_do_not() {
        let race = "========= COMPUTE-SANITIZER\n\
                    ========= Error: Race reported between Write access at k+0x40\n\
                    =========     and Read access at k+0x80 [16 hazards]\n\
                    =========\n\
                    ========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)\n";
        let r = parse(race);
        assert_eq!(r.count, 1, "{r:?}");
        assert!(r
            .first
            .unwrap()
            .starts_with("Error: Race reported between Write"));
        let init = "========= Uninitialized __global__ memory read of size 4 bytes\n\
                    =========     at combine+0x90\n\
                    ========= ERROR SUMMARY: 1 error\n";
        assert_eq!(parse(init).count, 1);
        let sync = "========= Barrier error detected. Divergent thread(s) in block\n\
                    =========     at k+0x10\n\
                    ========= SYNCCHECK SUMMARY: 1 error\n";
        assert_eq!(parse(sync).count, 1);
        let m = failure_message(Tool::Initcheck, &parse(init));
        assert!(m.starts_with("read of memory never written (docs/operator.md section 5, class 7): compute-sanitizer initcheck reported 1 error(s)"), "{m}");
    }
}
