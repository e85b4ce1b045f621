//! The memory of cases, shared by every relattn run on a machine: before a run builds a case it
//! reserves the case's footprint (its tensors, their generation, and the copy each worker that
//! runs it loads) in a ledger all runs read, and waits while the runs together would pass the
//! machine's budget. Runs side by side (`--processes`, CI jobs on one host) then take turns with
//! their largest cases instead of being killed by the operating system together.
//!
//! The ledger is a folder (`$RELATTN_MEMORY_DIR`, else `relattn-memory` in the temporary
//! folder): one entry file per run, which the run holds locked (`flock`) for its life and which
//! says how many bytes it holds; a file `ledger.lock` serialises the check-and-reserve. An entry
//! whose lock can be taken belongs to a run that ended, however it ended: it is removed, so a
//! killed run holds nothing. A folder that cannot be used costs only the gate: the run goes on
//! as without one.
//!
//! Rules: a reservation is granted when no other run holds anything, or when all runs' holdings
//! and it stay within the budget; otherwise it waits (saying so once on stderr). A run is never
//! held back by its own holdings alone (one run behaves as without the gate), and a wait during
//! which no run's holdings changed for [`STALL`] is granted (runs that each wait on the others,
//! each holding a case kept for trials that come later, would otherwise wait for ever).

use std::fs::{self, File};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The environment variable naming the ledger's folder.
pub const ENV: &str = "RELATTN_MEMORY_DIR";
/// The environment variable setting the budget in bytes (default: [`BUDGET_DENOMINATOR`] of
/// the memory), for machines whose memory other programs share.
pub const BUDGET_ENV: &str = "RELATTN_MEMORY_BUDGET";
/// The cases of all runs together stay within this fraction of the machine's memory (the rest
/// is the workers' interpreters, CUDA contexts and everything else on the machine).
pub const BUDGET_DENOMINATOR: u64 = 2;
/// A wait during which no run's holdings changed for this long is granted.
pub const STALL: Duration = Duration::from_secs(300);
/// How often a waiting reservation looks again.
const POLL: Duration = Duration::from_millis(200);
const LOCK: &str = "ledger.lock";
const SUFFIX: &str = ".entry";

/// Bytes a case takes while it is in use: generating or reading it holds about twice its
/// tensors' bytes at the peak (`limits::MEMORY_FRACTION`), and each worker that runs it writes
/// it as a case file and loads its own float32 copy (about twice again).
pub fn footprint(case_bytes: u64, workers: usize) -> u64 {
    case_bytes.saturating_mul(2 + 2 * workers as u64)
}

/// This run's place in the machine's ledger.
pub struct MemoryGate {
    dir: PathBuf,
    budget: u64,
    stall: Duration,
    /// This run's entry, locked for the run's life, and the bytes it holds.
    own: Mutex<(File, u64)>,
    own_path: PathBuf,
}

/// Bytes held in the ledger until dropped.
pub struct Reservation {
    gate: Arc<MemoryGate>,
    bytes: u64,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.gate.release(self.bytes);
    }
}

impl MemoryGate {
    /// The gate of this machine: its ledger in `$RELATTN_MEMORY_DIR` or the temporary folder,
    /// its budget `$RELATTN_MEMORY_BUDGET` bytes or [`BUDGET_DENOMINATOR`] of the memory. None
    /// when the ledger cannot be used.
    pub fn for_machine() -> Option<Arc<MemoryGate>> {
        let dir = std::env::var_os(ENV)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| std::env::temp_dir().join("relattn-memory"));
        let budget = std::env::var(BUDGET_ENV)
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| relattn_reference::limits::memory_bytes().0 / BUDGET_DENOMINATOR);
        MemoryGate::open(&dir, budget, STALL).ok().map(Arc::new)
    }

    /// A gate over the ledger in `dir` with `budget` bytes for all runs together.
    pub fn open(dir: &Path, budget: u64, stall: Duration) -> std::io::Result<MemoryGate> {
        fs::create_dir_all(dir)?;
        let name = format!(
            "{}-{}{SUFFIX}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        );
        let own_path = dir.join(name);
        let mut file = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&own_path)?;
        file.lock()?;
        write_entry(&mut file, 0)?;
        Ok(MemoryGate {
            dir: dir.to_path_buf(),
            budget,
            stall,
            own: Mutex::new((file, 0)),
            own_path,
        })
    }

    /// Reserve `bytes` for `what` (a case id, for the message), waiting while the runs on this
    /// machine hold too much.
    pub fn reserve(self: &Arc<Self>, bytes: u64, what: &str) -> Reservation {
        let mut said = false;
        let mut last_change = Instant::now();
        let mut last_others = None;
        loop {
            let Some(others) = self.try_reserve(bytes, last_change.elapsed() >= self.stall) else {
                return Reservation {
                    gate: self.clone(),
                    bytes,
                };
            };
            if last_others != Some(others) {
                last_others = Some(others);
                last_change = Instant::now();
            }
            if !said {
                said = true;
                eprintln!(
                    "relattn: waiting for memory: case {what} takes about {} in use; other relattn runs on this machine hold {} of the {} their cases may take together ({ENV}: {})",
                    gib(bytes),
                    gib(others),
                    gib(self.budget),
                    self.dir.display()
                );
            }
            std::thread::sleep(POLL);
        }
    }

    /// Reserves `bytes` when the rules allow (None), else gives the bytes other runs hold.
    fn try_reserve(&self, bytes: u64, stalled: bool) -> Option<u64> {
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(self.dir.join(LOCK))
            .and_then(|f| f.lock().map(|()| f));
        let mut own = self.own.lock().unwrap_or_else(|e| e.into_inner());
        let others = match &lock {
            Ok(_) => self.others_holding(),
            Err(_) => 0, // no ledger: no gate
        };
        let fits = others.saturating_add(own.1).saturating_add(bytes) <= self.budget;
        if others == 0 || fits || stalled {
            let (file, held) = &mut *own;
            *held = held.saturating_add(bytes);
            let _ = write_entry(file, *held);
            return None;
        }
        Some(others)
    }

    fn release(&self, bytes: u64) {
        let mut own = self.own.lock().unwrap_or_else(|e| e.into_inner());
        let (file, held) = &mut *own;
        *held = held.saturating_sub(bytes);
        let _ = write_entry(file, *held);
    }

    /// The bytes the other live runs hold; entries of runs that ended are removed.
    fn others_holding(&self) -> u64 {
        let Ok(dir) = fs::read_dir(&self.dir) else {
            return 0;
        };
        let mut total = 0u64;
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
            let _ = (&mut file).take(64).read_to_string(&mut text);
            total = total.saturating_add(text.trim().parse().unwrap_or(0));
        }
        total
    }

    /// The bytes this run holds now.
    pub fn held(&self) -> u64 {
        self.own.lock().unwrap_or_else(|e| e.into_inner()).1
    }
}

/// The entry's one line, of fixed width and written in one call at its start, so a reader sees
/// the old or the new figure, never a mix.
fn write_entry(file: &mut File, held: u64) -> std::io::Result<()> {
    file.rewind()?;
    file.write_all(format!("{held:020}\n").as_bytes())
}

fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

impl Drop for MemoryGate {
    fn drop(&mut self) {
        // Removed while still locked: nobody takes it for a live run's entry.
        let _ = fs::remove_file(&self.own_path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    const LONG: Duration = Duration::from_secs(3600);

    fn gate(dir: &Path, budget: u64, stall: Duration) -> Arc<MemoryGate> {
        Arc::new(MemoryGate::open(dir, budget, stall).unwrap())
    }

    #[test]
    fn a_run_alone_is_never_held_back_by_its_own_cases() {
        let dir = tempfile::tempdir().unwrap();
        let a = gate(dir.path(), 100, LONG);
        let first = a.reserve(80, "one");
        let second = a.reserve(80, "two");
        assert_eq!(a.held(), 160);
        drop((first, second));
        assert_eq!(a.held(), 0);
    }

    #[test]
    fn a_second_run_waits_until_the_first_releases() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (gate(dir.path(), 100, LONG), gate(dir.path(), 100, LONG));
        let held = a.reserve(60, "big");
        let small = b.reserve(40, "fits beside it");
        let (tx, rx) = mpsc::channel();
        let waiter = {
            let b = b.clone();
            std::thread::spawn(move || {
                let r = b.reserve(30, "waits");
                tx.send(()).unwrap();
                r
            })
        };
        // 60 + 40 + 30 > 100: the third waits while the first is held.
        assert!(rx.recv_timeout(Duration::from_millis(600)).is_err());
        assert_eq!(b.held(), 40);
        drop(held);
        rx.recv_timeout(Duration::from_secs(10))
            .expect("granted once the other run released its case");
        let granted = waiter.join().unwrap();
        assert_eq!(b.held(), 70);
        drop((small, granted));
    }

    #[test]
    fn an_ended_runs_entry_is_removed_and_not_counted() {
        let dir = tempfile::tempdir().unwrap();
        // An entry nobody holds locked: its run ended (was killed) holding 90.
        let mut dead = File::create(dir.path().join(format!("1-1{SUFFIX}"))).unwrap();
        write_entry(&mut dead, 90).unwrap();
        drop(dead);
        let a = gate(dir.path(), 100, LONG);
        let (tx, rx) = mpsc::channel();
        let t = {
            let a = a.clone();
            std::thread::spawn(move || {
                let r = a.reserve(50, "after a killed run");
                tx.send(()).unwrap();
                r
            })
        };
        rx.recv_timeout(Duration::from_secs(10))
            .expect("not held back by a dead run");
        drop(t.join().unwrap());
        assert!(!dir.path().join(format!("1-1{SUFFIX}")).exists());
    }

    #[test]
    fn a_wait_with_no_change_anywhere_is_granted_after_the_stall() {
        let dir = tempfile::tempdir().unwrap();
        let a = gate(dir.path(), 100, LONG);
        let b = gate(dir.path(), 100, Duration::from_millis(300));
        let _held = a.reserve(90, "parked");
        let started = Instant::now();
        let r = b.reserve(50, "stalled");
        assert!(started.elapsed() >= Duration::from_millis(300));
        assert_eq!(b.held(), 50);
        drop(r);
    }

    #[test]
    fn a_gate_removes_its_entry_when_its_run_ends() {
        let dir = tempfile::tempdir().unwrap();
        let a = gate(dir.path(), 100, LONG);
        let _r = a.reserve(10, "x");
        let entries = || {
            fs::read_dir(dir.path())
                .unwrap()
                .filter(|e| {
                    e.as_ref()
                        .unwrap()
                        .path()
                        .to_string_lossy()
                        .ends_with(SUFFIX)
                })
                .count()
        };
        assert_eq!(entries(), 1);
        drop(_r);
        drop(a);
        assert_eq!(entries(), 0);
    }

    #[test]
    fn the_footprint_counts_a_copy_per_worker() {
        assert_eq!(footprint(10, 0), 20);
        assert_eq!(footprint(10, 2), 60);
        assert_eq!(footprint(u64::MAX, 3), u64::MAX);
    }
}
