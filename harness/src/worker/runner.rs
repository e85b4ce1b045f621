//! A worker as a `Runner`: case files in, output files out, over a pool of long-lived processes
//! (`Member`s, each with its own case folder and device), each restarted alone after its death
//! (exit, closed stdout, garbage, timeout) and given up after `MAX_DEATHS` deaths in a row. The
//! engine runs member `slot` from a thread of its own; the first member is started at once (its
//! `hello` describes the worker), the others beside it on a GPU machine, else as their thread
//! takes its first unit (`warm`) or first needs them.

use super::case_files::{CaseFiles, Source};
use super::process::{Death, Process};
use super::protocol::{self, Hello, Route, RouteShape, RunAnswer};
use super::WorkerSpec;
use crate::runner::{Kept, RunError, RunOutput, RunRequest, Runner, Target};
use crate::sanitize::{Checked, LogWatch};
use relattn_common::files::{open_regular_nofollow, read_limited, write_atomic};
use relattn_common::stats::median;
use relattn_reference::casefile::{read_worker_output, CaseMeta};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Deaths in a row after which a worker's remaining trials are errors.
pub const MAX_DEATHS: usize = 3;
/// Lines of the worker's stderr quoted in an erroring trial's message.
const TAIL_IN_MESSAGE: usize = 12;
/// A failing trial's case and output files are kept with the report up to this size each, and
/// while the report's `failures/` folder holds less than `KEEP_TOTAL_BYTES` (whatever kept it:
/// every worker of the run, and the runs a `--resume` continues).
pub const KEEP_FILE_BYTES: u64 = 256 << 20;
pub const KEEP_TOTAL_BYTES: u64 = 2 << 30;

struct State {
    process: Option<Process>,
    /// The sanitizer's log of the live process (`--sanitize`).
    watch: Option<LogWatch>,
    deaths: usize,
    last_death: String,
    /// Files written so far (names are unique within the folder).
    files: u64,
    /// The last run's files, kept until the next run so a failing trial's can be kept with its
    /// report.
    last: Option<Last>,
    /// Id of the last `route` request.
    route_id: u64,
}

/// A run's trial, case file and output file, and whether the case file is this process's alone
/// (removed with the output; a shared one goes with its case: `CaseFiles`).
#[derive(Clone)]
struct Last {
    trial: String,
    case: PathBuf,
    out: PathBuf,
    case_alone: bool,
}

impl State {
    /// End the live process without counting a death: the next trial starts a fresh one (and a
    /// fresh sanitizer).
    fn retire(&mut self) {
        if let Some(mut p) = self.process.take() {
            p.kill();
        }
        self.watch = None;
    }
}

/// One process of the pool: its own folder (output files, the sanitizer's logs), environment
/// (its device) and state.
struct Member {
    dir: tempfile::TempDir,
    env: Vec<(String, String)>,
    state: Mutex<State>,
}

impl Member {
    fn new(env: Vec<(String, String)>) -> Result<Member, String> {
        let dir = tempfile::Builder::new()
            .prefix("relattn-worker-")
            .tempdir()
            .map_err(|e| format!("cannot make a folder for worker output files: {e}"))?;
        super::live::add_folder(dir.path());
        Ok(Member {
            dir,
            env,
            state: Mutex::new(State {
                process: None,
                watch: None,
                deaths: 0,
                last_death: String::new(),
                files: 0,
                last: None,
                route_id: 0,
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// How many processes a worker runs, and the GPUs they run on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pool {
    /// Processes (at least 1).
    pub size: usize,
    /// NVML indices of the GPUs, handed out round robin (`CUDA_VISIBLE_DEVICES`) when there
    /// are several; with one or none, the processes inherit relattn's environment.
    pub devices: Vec<u32>,
}

impl Pool {
    /// One process on the inherited device.
    pub fn single() -> Pool {
        Pool {
            size: 1,
            devices: Vec::new(),
        }
    }

    /// What process `member` gets: its GPU, and its share of the run's cores for the thread
    /// pools of numpy and torch (each takes every core otherwise: eight processes of sixteen
    /// threads on sixteen cores slowed every trial of a pool threefold). A variable the user set
    /// is kept.
    fn env_of(&self, member: usize) -> Vec<(String, String)> {
        let mut env = Vec::new();
        if self.size > 1 {
            let threads = (rayon::current_num_threads() / self.size)
                .max(1)
                .to_string();
            for key in ["OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"] {
                if std::env::var_os(key).is_none() {
                    env.push((key.to_string(), threads.clone()));
                }
            }
        }
        if self.devices.len() > 1 {
            let device = self.devices[member % self.devices.len()];
            env.push(("CUDA_DEVICE_ORDER".into(), "PCI_BUS_ID".into()));
            env.push(("CUDA_VISIBLE_DEVICES".into(), device.to_string()));
        }
        env
    }
}

pub struct WorkerRunner {
    pub spec: WorkerSpec,
    pub hello: Hello,
    timeout: Duration,
    members: Vec<Arc<Member>>,
    /// The threads starting processes beside the first (`start_pool`), joined on drop.
    starters: Mutex<Vec<std::thread::JoinHandle<()>>>,
    /// The case files, shared by the pool's processes.
    files: std::sync::Arc<CaseFiles>,
}

/// Start the worker and read its `hello`. Every failure here is the user's to fix (a command
/// that is not found, a worker that does not speak protocol 1), so the message says what ran.
/// Under a sanitizer, the process runs wrapped in it with a new log file in `dir`, watched.
fn start(
    spec: &WorkerSpec,
    timeout: Duration,
    member: &Member,
) -> Result<(Process, Hello, Option<LogWatch>), String> {
    crate::trace::span("worker_start", || start_process(spec, timeout, member))
}

fn start_process(
    spec: &WorkerSpec,
    timeout: Duration,
    member: &Member,
) -> Result<(Process, Hello, Option<LogWatch>), String> {
    let dir = member.dir.path();
    let mut env = member.env.clone();
    let (mut p, watch) = match &spec.sanitizer {
        None => (Process::spawn_with(&spec.command, &env)?, None),
        Some(s) => {
            static LOGS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
            let n = LOGS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let log = dir.join(format!("sanitizer-{n}.log"));
            env.extend(s.worker_env());
            let p = Process::spawn_with(&s.wrap(&log, &spec.command), &env)?;
            (p, Some(LogWatch::new(log)))
        }
    };
    let answer = p
        .request(&protocol::hello_request(), timeout)
        .map_err(|d| format!("{d}; its stderr:\n{}", p.stderr_tail(TAIL_IN_MESSAGE)))?;
    let hello = protocol::parse_hello(answer).map_err(|e| e.to_string())?;
    if hello.protocol != protocol::PROTOCOL {
        p.kill();
        return Err(format!(
            "it speaks worker protocol {}, this relattn speaks {}",
            hello.protocol,
            protocol::PROTOCOL
        ));
    }
    if hello.stderr_marks {
        p.use_marks();
    }
    Ok((p, hello, watch))
}

impl WorkerRunner {
    /// Start the worker (one process) and greet it.
    pub fn start(spec: WorkerSpec, timeout: Duration) -> Result<WorkerRunner, String> {
        WorkerRunner::start_pool(spec, timeout, &Pool::single())
    }

    /// Start the pool's first process and greet it. On a GPU machine the others start beside
    /// it, on threads of their own that the run does not wait for (their imports and device
    /// setup overlap the first's and the rest of the setup instead of following them); else
    /// each starts when its thread first needs it. Only the first one's failure fails the
    /// start: another's start is tried again on its first use (and counted as a death there).
    pub fn start_pool(
        spec: WorkerSpec,
        timeout: Duration,
        pool: &Pool,
    ) -> Result<WorkerRunner, String> {
        let files = CaseFiles::new()?;
        // What the worker's processes are given (numpy, vLLM, JIT caches): decided once.
        let env = spec.env();
        let members = (0..pool.size.max(1))
            .map(|i| Member::new([env.clone(), pool.env_of(i)].concat()).map(Arc::new))
            .collect::<Result<Vec<_>, _>>()?;
        let beside = if pool.devices.is_empty() {
            &[][..]
        } else {
            &members[1..]
        };
        let starters = beside
            .iter()
            .map(|m| {
                let (spec, m) = (spec.clone(), m.clone());
                std::thread::spawn(move || {
                    let mut st = m.lock();
                    if st.process.is_none() {
                        match start(&spec, timeout, &m) {
                            Ok((p, _, watch)) => {
                                st.process = Some(p);
                                st.watch = watch;
                            }
                            Err(e) => st.last_death = format!("start failed: {e}"),
                        }
                    }
                })
            })
            .collect();
        let (process, hello, watch) = start(&spec, timeout, &members[0])
            .map_err(|e| format!("worker {}: {e}", spec.label))?;
        {
            let mut st = members[0].lock();
            st.process = Some(process);
            st.watch = watch;
        }
        Ok(WorkerRunner {
            spec,
            hello,
            timeout,
            members,
            starters: Mutex::new(starters),
            files,
        })
    }

    /// Start process `slot` of the pool (modulo its size) if it is not running, so its start
    /// overlaps whatever its first trial does before the run (generating the case, writing
    /// its file); that trial's run then waits for the start. A failed start counts as a death,
    /// as on first use.
    pub fn warm(&self, slot: usize) {
        let member = &self.members[slot % self.members.len()];
        let mut st = member.lock();
        let _ = self.process(member, &mut st);
    }

    /// Processes in the pool.
    pub fn pool_size(&self) -> usize {
        self.members.len()
    }

    pub fn name(&self) -> &str {
        &self.hello.name
    }

    /// The worker's routing decision for `shape` on capability `cc`.
    pub fn route(&self, cc: &str, shape: &RouteShape) -> Result<Route, String> {
        let member = &self.members[0];
        let mut st = member.lock();
        st.route_id += 1;
        let id = st.route_id;
        let p = self.process(member, &mut st)?;
        let answer = match p.request(&protocol::route_request(id, cc, shape), self.timeout) {
            Ok(v) => protocol::parse_route(&v, id).map_err(|e| e.to_string()),
            Err(d) => Err(d.to_string()),
        };
        match answer {
            Ok(a) => {
                st.deaths = 0;
                Ok(a)
            }
            Err(e) => {
                let tail = self.bury(&mut st, e.clone());
                Err(format!("{e}; worker stderr:\n{tail}"))
            }
        }
    }

    /// The live process, restarting a dead one (a failed restart is one more death).
    fn process<'s>(&self, member: &Member, st: &'s mut State) -> Result<&'s mut Process, String> {
        if st.deaths >= MAX_DEATHS {
            return Err(format!(
                "worker keeps dying: {} deaths in a row, the last: {}",
                st.deaths, st.last_death
            ));
        }
        if st.process.is_none() {
            match start(&self.spec, self.timeout, member) {
                Ok((p, _, watch)) => {
                    st.process = Some(p);
                    st.watch = watch;
                }
                Err(e) => {
                    st.deaths += 1;
                    st.last_death = format!("restart failed: {e}");
                    return Err(st.last_death.clone());
                }
            }
        }
        st.process
            .as_mut()
            .ok_or_else(|| "no worker process".to_string())
    }

    /// Under `--sanitize`, what the sanitizer's log says about the request just answered.
    fn sanitizer_check(&self, st: &mut State) -> Result<Option<Checked>, String> {
        match (&self.spec.sanitizer, st.watch.as_mut()) {
            (Some(s), Some(watch)) => crate::sanitize::check(watch, s.tool).map(Some),
            _ => Ok(None),
        }
    }

    /// Kill the process after a death, count it, and return its stderr tail.
    fn bury(&self, st: &mut State, why: String) -> String {
        let tail = st
            .process
            .take()
            .map(|mut p| {
                p.kill();
                p.stderr_tail(TAIL_IN_MESSAGE)
            })
            .unwrap_or_default();
        st.deaths += 1;
        st.last_death = why;
        tail
    }

    /// The case file of `req`, always one in the worker's case folders and read-only, so a
    /// worker never writes to a file of the user's: the case's file shared by the pool's
    /// processes while the case lives, else one of its own (a copy of the user's file for
    /// `exec`), and whether it is the latter.
    fn case_file(&self, req: &RunRequest<'_>) -> Result<(PathBuf, bool), String> {
        let meta = CaseMeta {
            case_id: Some(req.case_id.to_string()),
            seed: None,
            cache_layout: req.problem.layout,
        };
        let source = match req.case_file {
            Some(from) => Source::File(from),
            None => Source::Problem(req.problem, &meta),
        };
        match req.case_life {
            Some(life) => Ok((self.files.shared(req.case_id, life, source)?, false)),
            None => Ok((self.files.one_off(source)?, true)),
        }
    }
}

/// Copy `from`, a file a worker could have replaced, to `to` in a report: only a regular file
/// is read (never through a symbolic link, never a FIFO or a device), at most `limit` bytes.
fn copy_worker_file(from: &Path, to: &Path, limit: u64) -> std::io::Result<u64> {
    let (file, len) = open_regular_nofollow(from)?;
    if len > limit {
        return Err(std::io::Error::new(
            std::io::ErrorKind::FileTooLarge,
            format!("{} MiB", len >> 20),
        ));
    }
    let bytes = read_limited(file, limit)?;
    write_atomic(to, |w| w.write_all(&bytes))?;
    Ok(bytes.len() as u64)
}

impl Runner for WorkerRunner {
    /// Run `req` on the pool's process `slot` (modulo the pool's size).
    fn run(&self, slot: usize, req: &RunRequest<'_>) -> Result<RunOutput, RunError> {
        let Target::Worker { path, .. } = req.target else {
            return Err(RunError::Other(format!(
                "worker {} was handed a native target",
                self.name()
            )));
        };
        let member = &self.members[slot % self.members.len()];
        let mut st = member.lock();
        if let Some(last) = st.last.take() {
            if last.case_alone {
                let _ = std::fs::remove_file(last.case);
            }
            let _ = std::fs::remove_file(last.out);
        }
        let (case, alone) = self.case_file(req).map_err(RunError::Other)?;
        st.files += 1;
        let out = member
            .dir
            .path()
            .join(format!("out-{}.safetensors", st.files));
        st.last = Some(Last {
            trial: req.trial.to_string(),
            case: case.clone(),
            out: out.clone(),
            case_alone: alone,
        });
        let message = protocol::run_request(
            req.trial,
            &case.to_string_lossy(),
            path,
            req.split.forced(),
            &out.to_string_lossy(),
            req.timing.map(|t| (t.warmup, t.reps)),
        );
        let p = self.process(member, &mut st).map_err(RunError::Other)?;
        let answer = p
            .request(&message, self.timeout)
            .map_err(|d: Death| d.to_string())
            .and_then(|v| {
                super::jit::record(&v);
                protocol::parse_run(&v, req.trial).map_err(|e| e.to_string())
            });
        // A shared file changed by this process would be what the pool's later trials of the
        // case read (mode 0444 does not stop a worker run as root).
        if !alone && !self.files.intact(&case) {
            // Not a death (it answered): a fresh process for the next trial all the same.
            st.retire();
            return Err(RunError::Other(format!(
                "the worker wrote to its case file {} (read-only, and read by every process of \
                 its pool); restarting it for the next trial",
                case.display()
            )));
        }
        let answer = match answer {
            Ok(a) => a,
            Err(why) => {
                let errors = self.sanitizer_check(&mut st).ok().flatten();
                let tail = self.bury(&mut st, why.clone());
                let message =
                    format!("{why}; restarting it for the next trial; worker stderr:\n{tail}");
                return Err(match errors.and_then(|c| c.errors) {
                    Some(e) => RunError::Fault(format!("{e}; the run: {message}")),
                    None => RunError::Other(message),
                });
            }
        };
        st.deaths = 0;
        let checked = self.sanitizer_check(&mut st).map_err(RunError::Other)?;
        let errors = checked.as_ref().and_then(|c| c.errors.clone());
        // What this request wrote to stderr, for a message (read before a retire ends the
        // process).
        let quoted = match answer {
            RunAnswer::Error(_) => true,
            RunAnswer::Unsupported(_) => errors.is_some(),
            RunAnswer::Done { .. } => false,
        };
        let tail = match &mut st.process {
            Some(p) if quoted => p.stderr_of(&serde_json::Value::from(req.trial), TAIL_IN_MESSAGE),
            _ => String::new(),
        };
        if errors.is_some() {
            // A fresh process (and sanitizer) for the next trial: its reports and its CUDA
            // context start clean. Not a death: the worker answered.
            st.retire();
        }
        let (num_splits, ms) = match (answer, errors) {
            (RunAnswer::Unsupported(m), None) => return Err(RunError::Unsupported(m)),
            (RunAnswer::Error(m), None) => {
                return Err(RunError::Other(format!(
                    "the worker failed: {m}; worker stderr:\n{tail}"
                )))
            }
            (RunAnswer::Unsupported(m) | RunAnswer::Error(m), Some(e)) => {
                return Err(RunError::Fault(format!(
                    "{e}; the worker then answered: {m}; worker stderr:\n{tail}"
                )))
            }
            (RunAnswer::Done { num_splits, ms }, _) => (num_splits, ms.unwrap_or_default()),
        };
        let p = req.problem;
        let shape = [p.total_rows(), p.num_heads, p.head_dim];
        let out = read_worker_output(&out, shape)
            .map_err(|e| RunError::Other(format!("the worker's output: {e}")))?;
        Ok(RunOutput {
            padding_intact: relattn_reference::judge::padding_is_nan(p, &out),
            out,
            counters_left: 0,
            ms: median(&ms),
            ms_all: ms,
            num_splits,
            kernels: vec![format!("{}/{path}", self.name())],
            sanitizer: checked,
        })
    }

    /// The case file of `req`, written ahead when it lives with a case (its run finds it).
    fn stage(&self, req: &RunRequest<'_>) {
        if req.case_life.is_some() && req.case_file.is_none() {
            let _ = self.case_file(req);
        }
    }

    fn takes_forced_splits(&self, target: &Target) -> bool {
        matches!(target, Target::Worker { path, .. } if self.hello.split_paths.contains(path))
    }

    fn keep(&self, trial: &str, dir: &Path) -> Option<Kept> {
        // The process that ran `trial` is idle (its thread asks); one busy with another trial
        // is not waited for.
        let Last { case, out, .. } = self.members.iter().find_map(|m| {
            m.state
                .try_lock()
                .ok()?
                .last
                .clone()
                .filter(|last| last.trial == trial)
        })?;
        relattn_common::files::create_dir_nofollow(dir).ok()?;
        let stem = trial.replace("::", "-");
        let mut kept = Kept::default();
        let mut held = folder_bytes(dir);
        for (from, name, slot) in [
            (case, format!("{stem}.case.safetensors"), &mut kept.case),
            (out, format!("{stem}.out.safetensors"), &mut kept.output),
        ] {
            // Absent: the worker wrote no output (it died, or failed before writing).
            let Ok(meta) = std::fs::symlink_metadata(&from) else {
                continue;
            };
            let room = KEEP_TOTAL_BYTES.saturating_sub(held).min(KEEP_FILE_BYTES);
            if meta.is_file() && meta.len() > room {
                kept.left_out.push(format!(
                    "{name} ({} MiB: over the {} MiB per file or the {} MiB a report keeps)",
                    meta.len() >> 20,
                    KEEP_FILE_BYTES >> 20,
                    KEEP_TOTAL_BYTES >> 20
                ));
                continue;
            }
            let to = dir.join(&name);
            match copy_worker_file(&from, &to, room) {
                Ok(n) => {
                    held += n;
                    *slot = Some(to);
                }
                Err(e) => kept.left_out.push(format!("{name} ({e})")),
            }
        }
        Some(kept)
    }

    fn describe(&self, env: &mut relattn_reports::Environment) {
        let entry = serde_json::json!({
            "name": self.hello.name,
            "version": self.hello.version,
            "command": self.spec.command.join(" "),
            "device": self.hello.device,
            "capability": self.hello.capability,
            "paths": self.hello.paths,
            "processes": self.members.len(),
        });
        match env.extra.get_mut("workers") {
            Some(serde_json::Value::Array(a)) => a.push(entry),
            _ => {
                env.extra
                    .insert("workers".into(), serde_json::Value::Array(vec![entry]));
            }
        }
    }
}

/// Bytes of the files directly in `dir` (0 when it cannot be listed).
fn folder_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

impl Drop for WorkerRunner {
    /// Close the pool's processes side by side: each may take a second or more to exit (a
    /// Python process with CUDA), and a run ends when the last one has.
    fn drop(&mut self) {
        let starters = std::mem::take(self.starters.get_mut().unwrap_or_else(|e| e.into_inner()));
        for t in starters {
            let _ = t.join();
        }
        let members = std::mem::take(&mut self.members);
        std::thread::scope(|s| {
            for m in members {
                s.spawn(move || drop(m));
            }
        });
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = st.process.take() {
            p.close();
        }
        super::live::remove_folder(self.dir.path());
    }
}

#[cfg(test)]
mod tests;
