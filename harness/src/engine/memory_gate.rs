//! The memory of cases, shared by every relattn run on a machine: before a run builds a case it
//! reserves the case's footprint (its tensors, their generation, and the copy each worker that
//! runs it loads) in a ledger all runs read, and waits while the runs together would pass the
//! machine's budget. Runs side by side (`--processes`, CI jobs on one host) then take turns with
//! their largest cases instead of being killed by the operating system together.
//!
//! The ledger is a folder (`$RELATTN_MEMORY_DIR`, else `/dev/shm/relattn-memory`, else `memory`
//! in relattn's cache folder; never under `TMPDIR`, which differs between runs and which a run
//! leaves as it found it): one entry file per run, which the run holds locked (`flock`) for its life and which
//! says how many bytes it holds, how many of them a running trial uses now, and since when one
//! of its threads waits; a file `ledger.lock` serialises the check-and-reserve. An entry whose
//! lock can be taken belongs to a run that ended, however it ended: it is removed, so a killed
//! run holds nothing. A folder that cannot be used costs only the gate: the run goes on as
//! without one.
//!
//! Rules: a reservation is granted when no other run holds anything, or when all runs' holdings
//! and it stay within the budget; otherwise it waits (saying so once on stderr). A run is never
//! held back by its own holdings alone (one run behaves as without the gate). A case stays
//! reserved until its last trial has run, also between its trials (a case that one worker has
//! run waits for another's): when every run that holds memory waits and none of them is running
//! a trial, nothing would ever be released, so the run that has waited longest goes on.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The environment variable naming the ledger's folder.
pub const ENV: &str = "RELATTN_MEMORY_DIR";
/// The environment variable setting the budget in bytes (default: [`BUDGET_DENOMINATOR`] of
/// the memory), for machines whose memory other programs share.
pub const BUDGET_ENV: &str = "RELATTN_MEMORY_BUDGET";
/// The cases of all runs together stay within this fraction of the machine's memory (the rest
/// is the workers' interpreters, CUDA contexts and everything else on the machine).
pub const BUDGET_DENOMINATOR: u64 = 2;
/// How often a waiting reservation looks again.
const POLL: Duration = Duration::from_millis(200);
/// How long the runs holding memory must all have waited, using none of it, before the one
/// that waited longest goes on over the budget (`MemoryGate::try_reserve`).
const STUCK_FOR: Duration = Duration::from_secs(5);
const LOCK: &str = "ledger.lock";
const SUFFIX: &str = ".entry";

/// One worker's share of a case: whether it maps the case file (`maps_case_files` of its
/// hello), and how many processes of its pool may hold the case at once (one per path of the
/// worker the case has trials on: the pool hands each path's trials of a case to one process).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerShare {
    pub maps: bool,
    pub processes: usize,
}

/// Bytes a case takes while it is in use, from its tensors' bytes as float32 (`Case::bytes`)
/// and as stored (in the case's dtype, as a case file holds them), with one entry in `workers`
/// per worker that runs it. relattn holds the floats (generating a case peaks there: 12.6 GB
/// for a case of 12.9 GB of floats) and, reading a case file, its stored bytes beside them.
/// Each worker's pool writes the case file once (stored bytes, in a folder which may be
/// memory); each of its processes that runs the case then holds its own tensors: the floats
/// for one that loads the file (the numpy workers), the stored bytes for one that maps it
/// (the torch workers share the file's pages but build their own tensors from them). Counting
/// a mapping worker's pool as the file alone (30 GiB for `offset_over_2_31` through vllm and
/// triton) let 8 runs side by side on a 128 GB H100 host drive the memory available down to
/// 1.3 GB, and the system killed five of them.
pub fn footprint(float_bytes: u64, stored_bytes: u64, workers: &[WorkerShare]) -> u64 {
    workers
        .iter()
        .fold(float_bytes.saturating_add(stored_bytes), |sum, w| {
            let each = if w.maps { stored_bytes } else { float_bytes };
            let pool = stored_bytes.saturating_add(each.saturating_mul(w.processes as u64));
            sum.saturating_add(pool)
        })
}

/// A case's stored bytes from its float32 bytes and its dtype's element size (the integer
/// tensors, stored as they are, are few).
pub fn stored_bytes(float_bytes: u64, element_bytes: usize) -> u64 {
    float_bytes / 4 * element_bytes as u64
}

/// What one run's entry says.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Entry {
    /// Bytes reserved.
    held: u64,
    /// Of those, the bytes of cases a running trial uses now.
    in_use: u64,
    /// Milliseconds since the epoch at which the longest-waiting of its threads began to wait;
    /// 0 when none waits.
    waiting_since: u64,
}

/// This run's side of the ledger.
struct Own {
    file: File,
    held: u64,
    in_use: u64,
    /// The start (ms since the epoch) of each waiting thread's wait, by ticket.
    waits: BTreeMap<u64, u64>,
    next_ticket: u64,
}

impl Own {
    fn entry(&self) -> Entry {
        Entry {
            held: self.held,
            in_use: self.in_use,
            waiting_since: self.waits.values().copied().min().unwrap_or(0),
        }
    }

    fn write(&mut self) {
        let e = self.entry();
        let _ = write_entry(&mut self.file, e);
    }
}

/// This run's place in the machine's ledger.
pub struct MemoryGate {
    dir: PathBuf,
    budget: u64,
    /// `STUCK_FOR` (shorter in tests).
    stuck_for: Duration,
    /// The memory the system could give now (`limits::memory_available`; a stand-in in tests).
    available: fn() -> Option<u64>,
    own: Mutex<Own>,
    own_path: PathBuf,
}

/// Bytes held in the ledger until dropped; [`Reservation::use_started`] and
/// [`Reservation::use_ended`] say when a trial runs on them.
pub struct Reservation {
    gate: Arc<MemoryGate>,
    bytes: u64,
    users: Mutex<usize>,
}

impl Reservation {
    /// The case is built (and, when prepared ahead, its references computed): until a trial
    /// uses it, it only waits.
    pub fn built(&self) {
        self.use_ended();
    }

    /// A trial begins to use the case.
    pub fn use_started(&self) {
        let mut users = self.users.lock().unwrap_or_else(|e| e.into_inner());
        *users += 1;
        if *users == 1 {
            self.gate
                .update(|o| o.in_use = o.in_use.saturating_add(self.bytes));
        }
    }

    /// A trial is done with the case.
    pub fn use_ended(&self) {
        let mut users = self.users.lock().unwrap_or_else(|e| e.into_inner());
        if *users == 0 {
            return;
        }
        *users -= 1;
        if *users == 0 {
            self.gate
                .update(|o| o.in_use = o.in_use.saturating_sub(self.bytes));
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let users = *self.users.lock().unwrap_or_else(|e| e.into_inner());
        let bytes = self.bytes;
        self.gate.update(|o| {
            o.held = o.held.saturating_sub(bytes);
            if users > 0 {
                o.in_use = o.in_use.saturating_sub(bytes);
            }
        });
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl MemoryGate {
    /// The gate of this machine: its ledger in `$RELATTN_MEMORY_DIR` or [`default_dir`],
    /// its budget `$RELATTN_MEMORY_BUDGET` bytes or [`BUDGET_DENOMINATOR`] of the memory. None
    /// when the ledger cannot be used.
    pub fn for_machine() -> Option<Arc<MemoryGate>> {
        let dir = std::env::var_os(ENV)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(default_dir)?;
        let budget = std::env::var(BUDGET_ENV)
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| relattn_reference::limits::memory_bytes().0 / BUDGET_DENOMINATOR);
        MemoryGate::open(&dir, budget).ok().map(Arc::new)
    }

    /// A gate over the ledger in `dir` with `budget` bytes for all runs together.
    pub fn open(dir: &Path, budget: u64) -> std::io::Result<MemoryGate> {
        if !dir.is_dir() {
            fs::create_dir_all(dir)?;
            // Shared by every user's runs on the machine, as /tmp is (each entry stays its
            // owner's; the sticky bit keeps others from removing it).
            use std::os::unix::fs::PermissionsExt;
            let _ = fs::set_permissions(dir, fs::Permissions::from_mode(0o1777));
        }
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let own_path = dir.join(format!("{}-{nanos}{SUFFIX}", std::process::id()));
        // Created and locked under the ledger's lock: another run never sees it unlocked (and
        // takes it for an ended run's).
        let lock = ledger_lock(dir);
        let mut file = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&own_path)?;
        file.lock()?;
        set_mode(&file, 0o644);
        write_entry(&mut file, Entry::default())?;
        drop(lock);
        Ok(MemoryGate {
            dir: dir.to_path_buf(),
            budget,
            stuck_for: STUCK_FOR,
            available: relattn_reference::limits::memory_available,
            own: Mutex::new(Own {
                file,
                held: 0,
                in_use: 0,
                waits: BTreeMap::new(),
                next_ticket: 0,
            }),
            own_path,
        })
    }

    fn own(&self) -> std::sync::MutexGuard<'_, Own> {
        self.own.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn update(&self, change: impl FnOnce(&mut Own)) {
        // Readers read entries under the ledger's lock: so are they written.
        let _lock = ledger_lock(&self.dir);
        let mut own = self.own();
        change(&mut own);
        own.write();
    }

    /// Reserve `bytes` for `what` (a case id, for the message), waiting while the runs on this
    /// machine hold too much.
    /// Once `stopping` says so (a signal), it waits no more: the run is ending, and at most the
    /// trials already started finish.
    pub fn reserve(
        self: &Arc<Self>,
        bytes: u64,
        what: &str,
        stopping: &dyn Fn() -> bool,
    ) -> Reservation {
        let mut ticket = None;
        let mut stuck_since = None;
        loop {
            match self.try_reserve(bytes, ticket, stopping(), &mut stuck_since) {
                Ok(()) => {
                    return Reservation {
                        gate: self.clone(),
                        bytes,
                        users: Mutex::new(1),
                    }
                }
                Err((others, short)) if ticket.is_none() => {
                    let mut own = self.own();
                    let t = own.next_ticket;
                    own.next_ticket += 1;
                    own.waits.insert(t, now_ms());
                    own.write();
                    ticket = Some(t);
                    drop(own);
                    let short = short
                        .map(|a| format!("; the machine has {} available", gib(a)))
                        .unwrap_or_default();
                    eprintln!(
                        "relattn: waiting for memory: case {what} takes about {} in use; other relattn runs on this machine hold {} of the {} their cases may take together{short} ({ENV}: {})",
                        gib(bytes),
                        gib(others),
                        gib(self.budget),
                        self.dir.display()
                    );
                }
                Err(_) => {}
            }
            std::thread::sleep(POLL);
        }
    }

    /// Reserves `bytes` when the rules allow, else gives the bytes other runs hold and, when
    /// they fit the budget but not the memory the machine has available, that memory. `ticket`:
    /// this thread's wait, once it waits; `stuck_since`: since when the runs have looked stuck
    /// to it, without a break.
    fn try_reserve(
        &self,
        bytes: u64,
        ticket: Option<u64>,
        stopping: bool,
        stuck_since: &mut Option<Instant>,
    ) -> Result<(), (u64, Option<u64>)> {
        let lock = ledger_lock(&self.dir);
        let mut own = self.own();
        let others = match &lock {
            Some(_) => self.others(),
            None => Vec::new(), // no ledger: no gate
        };
        let others_held = others
            .iter()
            .fold(0u64, |a, (e, _)| a.saturating_add(e.held));
        let fits = others_held.saturating_add(own.held).saturating_add(bytes) <= self.budget;
        // Beside other runs' cases, the case must also fit what the machine has available now,
        // less a sixteenth of its memory: a footprint the ledger counts too low, or memory
        // other programs take, makes it wait instead of the system killing runs.
        let available = if fits && others_held > 0 {
            (self.available)()
        } else {
            None
        };
        let short = available.filter(|&a| {
            let margin = relattn_reference::limits::memory_bytes().0 / 16;
            bytes.saturating_add(margin) > a
        });
        let fits = fits && short.is_none();
        // Nothing would be released: every other run holding memory waits and uses none of
        // it (no case being built or run), and neither does this one; the run that has waited
        // longest (then the lowest entry name) goes on, through its longest-waiting thread only.
        let mine = own.entry();
        let first_here = ticket.is_some() && ticket == own.waits.keys().next().copied();
        let me = (mine.waiting_since, self.own_path.clone());
        let looks_stuck = first_here
            && mine.in_use == 0
            && others.iter().filter(|(e, _)| e.held > 0).all(|(e, path)| {
                e.in_use == 0 && e.waiting_since != 0 && (e.waiting_since, path.clone()) > me
            });
        // Only for `STUCK_FOR` without a break: a run between two trials of a case it holds
        // looks stuck for a moment, and is not.
        *stuck_since = looks_stuck.then(|| stuck_since.unwrap_or_else(Instant::now));
        let stuck = stuck_since.is_some_and(|since| since.elapsed() >= self.stuck_for);
        if others_held == 0 || fits || stuck || stopping {
            if let Some(t) = ticket {
                own.waits.remove(&t);
            }
            // In use from now on: the case is built, then its trials run (`Reservation::built`).
            own.held = own.held.saturating_add(bytes);
            own.in_use = own.in_use.saturating_add(bytes);
            own.write();
            return Ok(());
        }
        Err((others_held, short))
    }

    /// The entries of the other live runs; entries of runs that ended are removed.
    fn others(&self) -> Vec<(Entry, PathBuf)> {
        let Ok(dir) = fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for entry in dir.filter_map(Result::ok) {
            let path = entry.path();
            if !path.to_string_lossy().ends_with(SUFFIX) || path == self.own_path {
                continue;
            }
            let Ok(mut file) = File::open(&path) else {
                continue;
            };
            if file.try_lock().is_ok() {
                // Its run ended: nobody holds the entry's lock.
                let _ = fs::remove_file(&path);
                continue;
            }
            let mut text = String::new();
            let _ = (&mut file).take(128).read_to_string(&mut text);
            out.push((parse_entry(&text), path));
        }
        out
    }

    /// The bytes this run holds now, and those of them in use.
    #[cfg(test)]
    pub(crate) fn held(&self) -> (u64, u64) {
        let own = self.own();
        (own.held, own.in_use)
    }
}

/// The ledger's folder when `$RELATTN_MEMORY_DIR` does not name one: `relattn-memory` in the
/// machine's shared memory (`/dev/shm`, the same for every user of the machine whatever their
/// `TMPDIR`), else `memory` in relattn's cache folder.
fn default_dir() -> Option<PathBuf> {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        return Some(shm.join("relattn-memory"));
    }
    relattn_kernels::gpu::cache_dir().map(|d| d.join("memory"))
}

impl Drop for MemoryGate {
    fn drop(&mut self) {
        // Removed while still locked: nobody takes it for a live run's entry.
        let _ = fs::remove_file(&self.own_path);
    }
}

/// The ledger's lock, held while the value lives; None when it cannot be had within a few
/// seconds (a folder this user cannot use, or a process stopped while holding it): the gate
/// then lets the reservation through rather than hang the run.
fn ledger_lock(dir: &Path) -> Option<File> {
    let path = dir.join(LOCK);
    // Read-only is enough for the lock (another user's run may have created the file).
    let file = File::open(&path)
        .or_else(|_| {
            let f = File::options()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)?;
            set_mode(&f, 0o666);
            Ok::<_, std::io::Error>(f)
        })
        .ok()?;
    let deadline = std::time::Instant::now() + LOCK_WAIT;
    loop {
        match file.try_lock() {
            Ok(()) => return Some(file),
            Err(std::fs::TryLockError::WouldBlock) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(_) => return None,
        }
    }
}

/// Longest wait for the ledger's lock (held for microseconds by a live run).
const LOCK_WAIT: Duration = Duration::from_secs(5);

/// Entries and the lock are shared by every user's runs, whatever the creator's umask.
fn set_mode(file: &File, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    let _ = file.set_permissions(fs::Permissions::from_mode(mode));
}

/// The entry's one line, of fixed width and written in one call at its start, so a reader sees
/// the old or the new figures, never a mix.
fn write_entry(file: &mut File, e: Entry) -> std::io::Result<()> {
    file.rewind()?;
    file.write_all(format!("{:020} {:020} {:020}\n", e.held, e.in_use, e.waiting_since).as_bytes())
}

/// An entry's figures; what cannot be read counts as nothing held.
fn parse_entry(text: &str) -> Entry {
    let mut n = text.split_whitespace().map(|w| w.parse().unwrap_or(0));
    Entry {
        held: n.next().unwrap_or(0),
        in_use: n.next().unwrap_or(0),
        waiting_since: n.next().unwrap_or(0),
    }
}

fn gib(bytes: u64) -> String {
    if bytes < 1 << 30 {
        return format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64);
    }
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

#[cfg(test)]
#[path = "memory_gate_tests.rs"]
mod tests;
