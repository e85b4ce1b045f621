//! The case files of a worker's pool: one read-only file per case in one folder, shared by every
//! process of the pool, written by the first process that needs it while the others that need
//! it wait, and removed as soon as the run is done with the case (the next request after the
//! engine dropped it). A large case (6 GB for `offset_over_2_31`) is then on the disk once per
//! worker while its trials run, not once per process, and not after them: eight runs of the
//! regressions tier side by side filled a 64 GB disk when each process kept its own copy. Each
//! worker has a folder of its own: one that writes to its input (mode 0444 does not stop a
//! worker run as root) spoils only its own trials, and the file is written again.
//!
//! A file no case owns (a triage variant, a user's case file for `exec`) lives until the same
//! process's next request: a failing trial's files are kept with the report in between.
//!
//! The files go to memory (`/dev/shm`) when it has room for them, else to the temporary folder:
//! gigabytes written to a disk wait for its write-back, and stall every process writing to that
//! disk meanwhile (the runs' logs included). `$RELATTN_CASE_FILES_DIR` names the folder instead.
//! Memory taken this way is within what the machine's ledger reserves for the case
//! (`engine::memory_gate::footprint`).

use crate::runner::CaseAlive;
use relattn_common::files::{open_regular, read_limited};
use relattn_reference::casefile::{write_case, CaseMeta};
use relattn_reference::Problem;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// A written file and what it was then (length, last change): a worker that writes to it is
/// found out after its run.
type Written = Arc<OnceLock<Result<(PathBuf, Stamp), String>>>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp(u64, Option<std::time::SystemTime>);

fn stamp(path: &Path) -> Option<Stamp> {
    let m = std::fs::symlink_metadata(path).ok()?;
    Some(Stamp(m.len(), m.modified().ok()))
}

struct Entry {
    case_id: String,
    alive: CaseAlive,
    file: Written,
}

/// The environment variable naming the folder of the workers' case files.
pub const ENV: &str = "RELATTN_CASE_FILES_DIR";
/// Memory left free in `/dev/shm` beside a case file written there, and the share of what it
/// has free that one file may take.
const SHM_SPARE_BYTES: u64 = 1 << 30;
const SHM_SHARE: u64 = 2;

/// The pool's case folders (in memory when it has room, else the temporary folder) and the
/// files in them by case id.
pub struct CaseFiles {
    dir: tempfile::TempDir,
    memory: Option<tempfile::TempDir>,
    entries: Mutex<Vec<Entry>>,
    next: AtomicU64,
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
    pub fn new() -> Result<CaseFiles, String> {
        let chosen = std::env::var_os(ENV).filter(|v| !v.is_empty());
        let folder = |within: &Path| {
            let dir = tempfile::Builder::new()
                .prefix("relattn-cases-")
                .tempdir_in(within)
                .map_err(|e| {
                    format!(
                        "cannot make a folder for worker case files in {}: {e}",
                        within.display()
                    )
                })?;
            super::live::add_folder(dir.path());
            Ok::<_, String>(dir)
        };
        let dir = folder(
            &chosen
                .clone()
                .map_or_else(std::env::temp_dir, PathBuf::from),
        )?;
        let shm = Path::new("/dev/shm");
        let memory = (chosen.is_none() && shm.is_dir())
            .then(|| folder(shm).ok())
            .flatten();
        Ok(CaseFiles {
            dir,
            memory,
            entries: Mutex::new(Vec::new()),
            next: AtomicU64::new(0),
        })
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

    fn new_path(&self, bytes: u64) -> PathBuf {
        let n = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        self.folder_for(bytes).join(format!("case-{n}.safetensors"))
    }

    /// Remove the files of the cases the run no longer holds.
    pub fn sweep(&self) {
        let gone: Vec<Entry> = {
            let mut entries = self.entries();
            let (gone, kept) = std::mem::take(&mut *entries)
                .into_iter()
                .partition(|e| e.alive.strong_count() == 0);
            *entries = kept;
            gone
        };
        for e in gone {
            if let Some(Ok((path, _))) = e.file.get() {
                let _ = std::fs::remove_file(path);
            }
        }
    }

    /// Whether the shared file `path` is as it was written (a file this table does not hold,
    /// one of a single request, counts as intact). One that changed is dropped: the next
    /// request for its case writes it again.
    pub fn intact(&self, path: &Path) -> bool {
        let mut entries = self.entries();
        let Some(at) = entries
            .iter()
            .position(|e| matches!(e.file.get(), Some(Ok((p, _))) if p == path))
        else {
            return true;
        };
        let Some(Ok((_, written))) = entries[at].file.get() else {
            return true;
        };
        if stamp(path) == Some(*written) {
            return true;
        }
        entries.remove(at);
        let _ = std::fs::remove_file(path);
        false
    }

    /// The file of case `case_id`, which lives while `alive` does: the one already written, or
    /// written now from `source` (a second caller for the same case waits for the first).
    pub fn shared(
        &self,
        case_id: &str,
        alive: &CaseAlive,
        source: Source<'_>,
    ) -> Result<PathBuf, String> {
        self.sweep();
        let written = {
            let mut entries = self.entries();
            match entries
                .iter()
                .find(|e| e.case_id == case_id && e.alive.ptr_eq(alive))
            {
                Some(e) => e.file.clone(),
                None => {
                    let file = Written::default();
                    entries.push(Entry {
                        case_id: case_id.to_string(),
                        alive: alive.clone(),
                        file: file.clone(),
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

    /// A file of its own for a case no run holds; the caller removes it.
    pub fn one_off(&self, source: Source<'_>) -> Result<PathBuf, String> {
        self.sweep();
        self.write(source)
    }

    fn write(&self, source: Source<'_>) -> Result<PathBuf, String> {
        let file = self.new_path(source.bytes());
        let written = match source {
            Source::Problem(problem, meta) => {
                write_case(&file, problem, meta).map_err(|e| e.to_string())
            }
            Source::File(from) => copy_read_only(from, &file)
                .map_err(|e| format!("cannot copy case file {}: {e}", from.display())),
        };
        match written {
            Ok(()) => {
                let _ = std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o444));
                Ok(file)
            }
            Err(e) => {
                let _ = std::fs::remove_file(&file);
                Err(e)
            }
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

impl Drop for CaseFiles {
    fn drop(&mut self) {
        super::live::remove_folder(self.dir.path());
        if let Some(m) = &self.memory {
            super::live::remove_folder(m.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::any::Any;

    /// Files in both of `files`' folders.
    fn count(files: &CaseFiles) -> usize {
        let folders = [Some(files.dir()), files.memory.as_ref().map(|m| m.path())];
        folders
            .into_iter()
            .flatten()
            .map(|d| std::fs::read_dir(d).unwrap().count())
            .sum()
    }

    fn user_file(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn one_file_per_case_while_the_case_lives() {
        let files = CaseFiles::new().unwrap();
        let user = tempfile::tempdir().unwrap();
        let a = user_file(user.path(), "a", "case a");
        let case: Arc<dyn Any + Send + Sync> = Arc::new(1u8);
        let alive = Arc::downgrade(&case);
        let first = files.shared("a", &alive, Source::File(&a)).unwrap();
        // The second request (another process, another worker) gets the same file.
        let b = user_file(user.path(), "b", "another text");
        let again = files.shared("a", &alive, Source::File(&b)).unwrap();
        assert_eq!(first, again);
        assert_eq!(std::fs::read_to_string(&first).unwrap(), "case a");
        assert_eq!(count(&files), 1);
        // Another case with the same id from another run's engine is another file.
        let other: Arc<dyn Any + Send + Sync> = Arc::new(2u8);
        let second = files
            .shared("a", &Arc::downgrade(&other), Source::File(&b))
            .unwrap();
        assert_ne!(first, second);
        // The run is done with the first case: its file goes at the next request.
        drop(case);
        assert!(first.exists());
        files.sweep();
        assert!(!first.exists() && second.exists());
        drop(other);
        let third = files.one_off(Source::File(&a)).unwrap();
        assert_eq!(count(&files), 1);
        assert!(third.exists());
    }

    #[test]
    fn concurrent_requests_for_a_case_write_it_once() {
        let files = CaseFiles::new().unwrap();
        let user = tempfile::tempdir().unwrap();
        let a = user_file(user.path(), "a", &"x".repeat(1 << 20));
        let case: Arc<dyn Any + Send + Sync> = Arc::new(());
        let alive = Arc::downgrade(&case);
        let paths: Vec<PathBuf> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| s.spawn(|| files.shared("a", &alive, Source::File(&a)).unwrap()))
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
        let case: Arc<dyn Any + Send + Sync> = Arc::new(());
        let alive = Arc::downgrade(&case);
        let e = files
            .shared("a", &alive, Source::File(&missing))
            .unwrap_err();
        assert!(e.contains("cannot copy case file"), "{e}");
        assert_eq!(count(&files), 0);
        let a = user_file(user.path(), "a", "now here");
        let path = files.shared("a", &alive, Source::File(&a)).unwrap();
        assert_eq!(std::fs::read_to_string(path).unwrap(), "now here");
    }

    #[test]
    fn a_file_a_worker_changed_is_written_again() {
        let files = CaseFiles::new().unwrap();
        let user = tempfile::tempdir().unwrap();
        let a = user_file(user.path(), "a", "case a");
        let case: Arc<dyn Any + Send + Sync> = Arc::new(());
        let alive = Arc::downgrade(&case);
        let first = files.shared("a", &alive, Source::File(&a)).unwrap();
        assert!(files.intact(&first));
        std::fs::set_permissions(&first, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::write(&first, "overwritten by a worker").unwrap();
        assert!(!files.intact(&first));
        assert!(!first.exists());
        let again = files.shared("a", &alive, Source::File(&a)).unwrap();
        assert_ne!(first, again);
        assert_eq!(std::fs::read_to_string(&again).unwrap(), "case a");
        // A file of one request is not the table's to judge.
        assert!(files.intact(&user.path().join("a")));
    }

    #[test]
    fn the_folders_go_with_the_files() {
        let files = CaseFiles::new().unwrap();
        let dirs = [Some(files.dir()), files.memory.as_ref().map(|m| m.path())]
            .into_iter()
            .flatten()
            .map(Path::to_path_buf)
            .collect::<Vec<_>>();
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
}
