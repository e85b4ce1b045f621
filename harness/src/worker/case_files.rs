//! The case files of a worker's pool: one read-only file per case, shared by every process of the
//! pool, written by the first process that needs it while the others that need it wait, and
//! removed when the engine drops the case (its `CaseLife` ends), as its memory leaves the
//! machine's ledger. A large case (6 GB for `offset_over_2_31`) is then on the disk once per
//! worker while its trials run, not once per process, and not after them: eight runs of the
//! regressions tier side by side filled a 64 GB disk when each process kept its own copy. Each
//! worker has folders of its own: one that writes to its input (mode 0444 does not stop a worker
//! run as root) spoils only trials of its own pool, and the file is written again.
//!
//! A triage variant has a life of its own, from when triage makes it (its file may be written
//! ahead, while the trial runs again) to the end of that trial's triage. A file no case owns (a user's case file
//! copied for `exec`) lives until the same process's next request: a failing trial's files are
//! kept with the report in between.
//!
//! The files go to memory (`/dev/shm`) when it has room for them, else to the temporary folder
//! (also when a write to memory fails): gigabytes written to a disk wait for its write-back, and
//! stall every process writing to that disk meanwhile (the runs' logs included).
//! `$RELATTN_CASE_FILES_DIR` names the folder instead. Memory taken this way is within what the
//! machine's ledger reserves for the case (`engine::memory_gate::footprint`). Each folder holds a
//! lock for its run's life: a folder whose lock can be taken belongs to a run that was killed,
//! and the next run to start removes it.

use crate::runner::CaseLife;
use relattn_common::files::{open_regular, read_limited};
use relattn_reference::casefile::{write_case, CaseMeta};
use relattn_reference::Problem;
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

/// The environment variable naming the folder of the workers' case files.
pub const ENV: &str = "RELATTN_CASE_FILES_DIR";
/// Memory left free in `/dev/shm` beside a case file written there, and the share of what it
/// has free that one file may take.
const SHM_SPARE_BYTES: u64 = 1 << 30;
const SHM_SHARE: u64 = 2;
const PREFIX: &str = "relattn-cases-";
const LOCK: &str = ".lock";
/// A folder younger than this is never taken for a killed run's (one being made has no lock
/// yet).
const STALE_AFTER: Duration = Duration::from_secs(60);

/// A written file and what it was then (length, last change): a worker that writes to it is
/// found out after its run.
type Written = Arc<OnceLock<Result<(PathBuf, Stamp), String>>>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp(u64, Option<std::time::SystemTime>);

fn stamp(path: &Path) -> Option<Stamp> {
    let m = std::fs::symlink_metadata(path).ok()?;
    Some(Stamp(m.len(), m.modified().ok()))
}

/// A case: its id and the address of its life (unique while the life lasts, and the entry goes
/// when it ends).
type Key = (String, usize);

struct Entry {
    key: Key,
    file: Written,
}

/// A folder of case files, locked while this run lives.
struct Folder {
    dir: tempfile::TempDir,
    _lock: File,
}

impl Folder {
    fn new(within: &Path) -> Result<Folder, String> {
        remove_stale(within);
        let made = || -> std::io::Result<Folder> {
            let dir = tempfile::Builder::new().prefix(PREFIX).tempdir_in(within)?;
            let lock = File::create(dir.path().join(LOCK))?;
            lock.lock()?;
            super::live::add_folder(dir.path());
            Ok(Folder { dir, _lock: lock })
        };
        made().map_err(|e| {
            format!(
                "cannot make a folder for worker case files in {}: {e}",
                within.display()
            )
        })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Folder {
    fn drop(&mut self) {
        super::live::remove_folder(self.dir.path());
    }
}

/// Remove the case folders in `within` of runs that ended without removing them: their lock can
/// be taken.
fn remove_stale(within: &Path) {
    let Ok(entries) = std::fs::read_dir(within) else {
        return;
    };
    for e in entries.flatten() {
        if !e.file_name().to_string_lossy().starts_with(PREFIX) {
            continue;
        }
        let old = e
            .metadata()
            .ok()
            .and_then(|m| m.modified().ok())
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > STALE_AFTER);
        let path = e.path();
        let Ok(lock) = File::open(path.join(LOCK)) else {
            continue;
        };
        if old && lock.try_lock().is_ok() {
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}

/// The pool's case folders (in memory when it has room, else the temporary folder) and the
/// files in them by case.
pub struct CaseFiles {
    dir: Folder,
    memory: Option<Folder>,
    entries: Mutex<Vec<Entry>>,
    next: AtomicU64,
    me: Weak<CaseFiles>,
}

/// Where a case comes from: written from the problem, or copied from the user's file.
pub enum Source<'a> {
    Problem(&'a Problem, &'a CaseMeta),
    File(&'a Path),
}

impl Source<'_> {
    /// About the bytes of the file (the header aside).
    fn bytes(&self) -> u64 {
        match self {
            Source::File(f) => std::fs::metadata(f).map_or(0, |m| m.len()),
            Source::Problem(p, _) => {
                let cache = 2 * p.num_blocks * p.page_size * p.num_kv_heads * p.head_dim;
                let floats = p.q.len() + p.rel_logits.len() + cache;
                let ints = p.block_table.len() + p.seqused_k.len() + p.cu_seqlens_q.len();
                (floats * p.dtype.size_bytes() + ints * 4) as u64
            }
        }
    }
}

impl CaseFiles {
    pub fn new() -> Result<Arc<CaseFiles>, String> {
        let chosen = std::env::var_os(ENV).filter(|v| !v.is_empty());
        let within = chosen
            .clone()
            .map_or_else(std::env::temp_dir, PathBuf::from);
        let dir = Folder::new(&within)?;
        let shm = Path::new("/dev/shm");
        let memory = (chosen.is_none() && shm.is_dir())
            .then(|| Folder::new(shm).ok())
            .flatten();
        Ok(Arc::new_cyclic(|me| CaseFiles {
            dir,
            memory,
            entries: Mutex::new(Vec::new()),
            next: AtomicU64::new(0),
            me: me.clone(),
        }))
    }

    /// The folder of the files that are not in memory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The folder for a file of `bytes`: memory when it has room for it, else `dir`.
    fn folder_for(&self, bytes: u64) -> &Path {
        let fits = |dir: &Path| {
            rustix::fs::statvfs(dir).is_ok_and(|s| {
                let free = s.f_bavail.saturating_mul(s.f_frsize);
                bytes.saturating_add(SHM_SPARE_BYTES) <= free / SHM_SHARE
            })
        };
        match &self.memory {
            Some(m) if fits(m.path()) => m.path(),
            _ => self.dir.path(),
        }
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, Vec<Entry>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The entry of `key` goes, and its file.
    fn forget(&self, key: &Key) {
        let gone: Vec<Entry> = {
            let mut entries = self.entries();
            let (gone, kept) = std::mem::take(&mut *entries)
                .into_iter()
                .partition(|e| &e.key == key);
            *entries = kept;
            gone
        };
        for e in gone {
            if let Some(Ok((path, _))) = e.file.get() {
                let _ = std::fs::remove_file(path);
            }
        }
    }

    /// The file of case `case_id`, which lives while `life` does: the one already written, or
    /// written now from `source` (a second caller for the same case waits for the first).
    pub fn shared(
        &self,
        case_id: &str,
        life: &CaseLife,
        source: Source<'_>,
    ) -> Result<PathBuf, String> {
        let key: Key = (case_id.to_string(), life as *const CaseLife as usize);
        let written = {
            let mut entries = self.entries();
            match entries.iter().find(|e| e.key == key) {
                Some(e) => e.file.clone(),
                None => {
                    let file = Written::default();
                    entries.push(Entry {
                        key: key.clone(),
                        file: file.clone(),
                    });
                    let (me, key) = (self.me.clone(), key.clone());
                    life.on_end(move || {
                        if let Some(files) = me.upgrade() {
                            files.forget(&key);
                        }
                    });
                    file
                }
            }
        };
        let result = written
            .get_or_init(|| {
                let path = self.write(source)?;
                let at = stamp(&path).ok_or("the case file just written is gone")?;
                Ok((path, at))
            })
            .clone();
        if result.is_err() {
            // Not kept: the next request tries again (the disk may have room by then).
            self.entries().retain(|e| !Arc::ptr_eq(&e.file, &written));
        }
        result.map(|(path, _)| path)
    }

    /// Whether the shared file `path` is as it was written (a file this table does not hold,
    /// one of a single request, counts as intact). One that changed is dropped: the next
    /// request for its case writes it again.
    pub fn intact(&self, path: &Path) -> bool {
        let mut entries = self.entries();
        let found = entries
            .iter()
            .enumerate()
            .find_map(|(at, e)| match e.file.get() {
                Some(Ok((p, written))) if p == path => Some((at, *written)),
                _ => None,
            });
        let Some((at, written)) = found else {
            return true;
        };
        if stamp(path) == Some(written) {
            return true;
        }
        entries.remove(at);
        let _ = std::fs::remove_file(path);
        false
    }

    /// A file of its own for a case no run holds; the caller removes it.
    pub fn one_off(&self, source: Source<'_>) -> Result<PathBuf, String> {
        self.write(source)
    }

    fn write(&self, source: Source<'_>) -> Result<PathBuf, String> {
        let n = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let name = format!("case-{n}.safetensors");
        let first = self.folder_for(source.bytes()).join(&name);
        match write_in(&first, &source) {
            // Memory may have filled meanwhile (other pools, other runs): the disk then.
            Err(_) if !first.starts_with(self.dir()) => write_in(&self.dir().join(&name), &source),
            written => written,
        }
    }
}

/// Write the case file `file` from `source`, read-only; nothing is left of a failed write.
fn write_in(file: &Path, source: &Source<'_>) -> Result<PathBuf, String> {
    let written = crate::trace::span("case_file", || match source {
        Source::Problem(problem, meta) => {
            write_case(file, problem, meta).map_err(|e| e.to_string())
        }
        Source::File(from) => copy_read_only(from, file)
            .map_err(|e| format!("cannot copy case file {}: {e}", from.display())),
    });
    match written {
        Ok(()) => {
            let _ = std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o444));
            Ok(file.to_path_buf())
        }
        Err(e) => {
            let _ = std::fs::remove_file(file);
            Err(e)
        }
    }
}

/// Copy the regular file `from` (the user's case file, already read and checked) to the new
/// file `to`, created read-only.
fn copy_read_only(from: &Path, to: &Path) -> std::io::Result<()> {
    let (file, _) = open_regular(from)?;
    let bytes = read_limited(file, relattn_reference::limits::max_case_bytes())?;
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o444)
        .open(to)?;
    out.write_all(&bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Case files in both of `files`' folders (their locks aside).
    fn count(files: &CaseFiles) -> usize {
        folders(files)
            .iter()
            .map(|d| {
                std::fs::read_dir(d)
                    .unwrap()
                    .flatten()
                    .filter(|e| e.file_name() != LOCK)
                    .count()
            })
            .sum()
    }

    fn folders(files: &CaseFiles) -> Vec<PathBuf> {
        [Some(files.dir()), files.memory.as_ref().map(Folder::path)]
            .into_iter()
            .flatten()
            .map(Path::to_path_buf)
            .collect()
    }

    fn user_file(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn one_file_per_case_gone_when_the_case_ends() {
        let files = CaseFiles::new().unwrap();
        let user = tempfile::tempdir().unwrap();
        let a = user_file(user.path(), "a", "case a");
        let life = CaseLife::default();
        let first = files.shared("a", &life, Source::File(&a)).unwrap();
        // The second request (another process) gets the same file.
        let b = user_file(user.path(), "b", "another text");
        let again = files.shared("a", &life, Source::File(&b)).unwrap();
        assert_eq!(first, again);
        assert_eq!(std::fs::read_to_string(&first).unwrap(), "case a");
        assert_eq!(count(&files), 1);
        // Another case with the same id (another run's engine, a triage variant) is another file.
        let other = CaseLife::default();
        let second = files.shared("a", &other, Source::File(&b)).unwrap();
        assert_ne!(first, second);
        // The run is done with the first case: its file goes at once.
        drop(life);
        assert!(!first.exists() && second.exists());
        drop(other);
        assert_eq!(count(&files), 0);
        let third = files.one_off(Source::File(&a)).unwrap();
        assert_eq!(count(&files), 1);
        assert!(third.exists());
    }

    #[test]
    fn concurrent_requests_for_a_case_write_it_once() {
        let files = CaseFiles::new().unwrap();
        let user = tempfile::tempdir().unwrap();
        let a = user_file(user.path(), "a", &"x".repeat(1 << 20));
        let life = CaseLife::default();
        let paths: Vec<PathBuf> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| s.spawn(|| files.shared("a", &life, Source::File(&a)).unwrap()))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(paths.iter().all(|p| *p == paths[0]));
        assert_eq!(count(&files), 1);
    }

    #[test]
    fn a_failed_write_is_tried_again_and_leaves_nothing() {
        let files = CaseFiles::new().unwrap();
        let user = tempfile::tempdir().unwrap();
        let missing = user.path().join("missing");
        let life = CaseLife::default();
        let e = files
            .shared("a", &life, Source::File(&missing))
            .unwrap_err();
        assert!(e.contains("cannot copy case file"), "{e}");
        assert_eq!(count(&files), 0);
        let a = user_file(user.path(), "a", "now here");
        let path = files.shared("a", &life, Source::File(&a)).unwrap();
        assert_eq!(std::fs::read_to_string(path).unwrap(), "now here");
    }

    #[test]
    fn a_file_a_worker_changed_is_written_again() {
        let files = CaseFiles::new().unwrap();
        let user = tempfile::tempdir().unwrap();
        let a = user_file(user.path(), "a", "case a");
        let life = CaseLife::default();
        let first = files.shared("a", &life, Source::File(&a)).unwrap();
        assert!(files.intact(&first));
        std::fs::set_permissions(&first, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::write(&first, "overwritten by a worker").unwrap();
        assert!(!files.intact(&first));
        assert!(!first.exists());
        let again = files.shared("a", &life, Source::File(&a)).unwrap();
        assert_ne!(first, again);
        assert_eq!(std::fs::read_to_string(&again).unwrap(), "case a");
        // A file of one request is not the table's to judge.
        assert!(files.intact(&user.path().join("a")));
    }

    #[test]
    fn the_folders_go_with_the_files() {
        let files = CaseFiles::new().unwrap();
        let dirs = folders(&files);
        let user = tempfile::tempdir().unwrap();
        files
            .one_off(Source::File(&user_file(user.path(), "a", "a")))
            .unwrap();
        drop(files);
        assert!(dirs.iter().all(|d| !d.exists()), "{dirs:?}");
    }

    #[test]
    fn a_file_goes_to_memory_only_when_it_has_room() {
        let files = CaseFiles::new().unwrap();
        assert_eq!(files.folder_for(u64::MAX / 2), files.dir());
        if let Some(m) = &files.memory {
            assert_eq!(files.folder_for(1 << 20), m.path());
        }
    }

    #[test]
    fn a_killed_runs_folder_goes_a_live_ones_stays() {
        let within = tempfile::tempdir().unwrap();
        let age = |dir: &Path| {
            let old = std::time::SystemTime::now() - 2 * STALE_AFTER;
            File::open(dir).unwrap().set_modified(old).unwrap();
        };
        // A killed run's: its lock is free. A live one's: held. One being made: no lock yet.
        let killed = within.path().join(format!("{PREFIX}killed"));
        std::fs::create_dir(&killed).unwrap();
        File::create(killed.join(LOCK)).unwrap();
        let live = Folder::new(within.path()).unwrap();
        let making = within.path().join(format!("{PREFIX}making"));
        std::fs::create_dir(&making).unwrap();
        let young = within.path().join(format!("{PREFIX}young"));
        std::fs::create_dir(&young).unwrap();
        File::create(young.join(LOCK)).unwrap();
        for d in [&killed, live.path(), &making] {
            age(d);
        }
        remove_stale(within.path());
        assert!(!killed.exists());
        assert!(live.path().exists() && making.exists() && young.exists());
    }
}
