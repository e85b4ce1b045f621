//! The lock of a report directory: one `relattn run` at a time writes into an `--out`.
//!
//! The lock is an advisory lock (`flock`) on the file `OUT/relattn.lock`, held for the run's
//! life: the operating system releases it when the process ends, however it ends, so a killed
//! run leaves no lock behind that anyone must judge stale. The file holds the holder's pid, for
//! the message of a run that finds the lock held; the pid is information, never the lock. The
//! file is removed (while still locked) when the run ends.

use relattn_common::files;
use std::fs::{self, File, TryLockError};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// File name of the lock inside the report directory.
pub const LOCK_FILE: &str = "relattn.lock";

/// A held lock; dropping it removes the lock file (and `OUT` itself when this run created it
/// and left it empty), then releases the lock.
#[derive(Debug)]
pub struct RunLock {
    path: PathBuf,
    file: File,
    created_dir: Option<PathBuf>,
}

/// How often a lock taken on a file another run removed at that moment is taken again.
const ATTEMPTS: usize = 8;

/// The lock file, opened without following a link and without waiting on a FIFO; it must be a
/// regular file.
fn open(path: &Path) -> Result<File, String> {
    files::open_or_create_regular_nofollow(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::InvalidInput {
            // A link, FIFO, device or directory where the lock belongs.
            format!(
                "{} cannot be this folder's lock: {e}; remove it",
                path.display()
            )
        } else {
            format!("cannot open the lock {}: {e}", path.display())
        }
    })
}

/// Whether `file` is still the file at `path` (not removed or replaced since it was opened).
fn still_at(file: &File, path: &Path) -> bool {
    match (file.metadata(), fs::symlink_metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// The pid a lock file names (at most a few bytes are read).
fn holder(file: &File) -> Option<u32> {
    let mut text = String::new();
    let mut f = file;
    f.rewind().ok()?;
    f.take(32).read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}

impl RunLock {
    /// Takes the lock of `out`, creating the directory if needed. Errors are messages for the
    /// user (a held lock names its pid when the holder has written it).
    pub fn acquire(out: &Path) -> Result<RunLock, String> {
        let created_dir = (!out.exists()).then(|| out.to_path_buf());
        fs::create_dir_all(out)
            .map_err(|e| format!("cannot create the report directory {}: {e}", out.display()))?;
        let path = out.join(LOCK_FILE);
        for _ in 0..ATTEMPTS {
            let file = open(&path)?;
            match file.try_lock() {
                Ok(()) => {}
                Err(TryLockError::WouldBlock) => {
                    let pid = holder(&file).map_or(String::new(), |p| format!("pid {p}, "));
                    return Err(format!(
                        "{} is in use by another relattn run ({pid}lock {}): wait for it to \
                         end, or give another --out",
                        out.display(),
                        path.display()
                    ));
                }
                Err(TryLockError::Error(e)) => {
                    return Err(format!(
                        "cannot lock {} ({e}): the file system of --out must support file locks",
                        path.display()
                    ))
                }
            }
            // The run that held it may have removed the file just before releasing it: then
            // this lock is on a file nobody else will open, and the lock is taken again.
            if !still_at(&file, &path) {
                continue;
            }
            let mut lock = RunLock {
                path: path.clone(),
                file,
                created_dir,
            };
            lock.write_pid()
                .map_err(|e| format!("cannot write the lock {}: {e}", path.display()))?;
            return Ok(lock);
        }
        Err(format!(
            "{} keeps changing hands between other relattn runs: give another --out",
            out.display()
        ))
    }

    fn write_pid(&mut self) -> std::io::Result<()> {
        self.file.set_len(0)?;
        self.file.rewind()?;
        writeln!(self.file, "{}", std::process::id())
    }
}

impl Drop for RunLock {
    fn drop(&mut self) {
        // Removed while still locked: a run that opened the file before this and locks it after
        // sees that it is gone (`still_at`) and takes the lock again.
        let _ = fs::remove_file(&self.path);
        if let Some(dir) = &self.created_dir {
            // Only succeeds when empty: a refused run leaves no directory behind.
            let _ = fs::remove_dir(dir);
        }
        let _ = self.file.unlock();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Barrier};

    #[test]
    fn a_held_lock_names_its_pid_and_a_left_file_is_no_lock() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let held = RunLock::acquire(&out).unwrap();
        let err = RunLock::acquire(&out).unwrap_err();
        assert!(
            err.contains(&format!("pid {}", std::process::id())),
            "{err}"
        );
        drop(held);
        assert!(
            !out.exists(),
            "an empty directory this run created is removed"
        );
        // A file left by a killed run (any content, or none) is no lock: nobody holds it.
        fs::create_dir_all(&out).unwrap();
        for left in ["4294967\n", ""] {
            fs::write(out.join(LOCK_FILE), left).unwrap();
            let taken = RunLock::acquire(&out).unwrap();
            let text = fs::read_to_string(out.join(LOCK_FILE)).unwrap();
            assert_eq!(text.trim(), std::process::id().to_string());
            drop(taken);
            assert!(!out.join(LOCK_FILE).exists());
        }
        assert!(out.exists(), "a directory that existed before stays");
    }

    /// The race of a pid-file lock: a second run that read the file between its creation and
    /// the pid's write took it over ("names no pid"). A lock held on an empty file is held.
    #[test]
    fn a_lock_held_before_its_pid_is_written_is_held() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(LOCK_FILE);
        let other = File::create(&path).unwrap();
        other.try_lock().unwrap();
        let err = RunLock::acquire(dir.path()).unwrap_err();
        assert!(
            err.contains("in use by another relattn run (lock "),
            "{err}"
        );
        assert_eq!(
            fs::read(&path).unwrap(),
            b"",
            "the holder's file is untouched"
        );
    }

    /// Two runs started together into one folder, 50 times: exactly one holds the lock while
    /// both live (each acquire opens the file anew, as two processes do).
    #[test]
    fn of_two_runs_started_together_one_gets_the_lock() {
        for round in 0..50 {
            let dir = tempfile::tempdir().unwrap();
            let out = Arc::new(dir.path().join("out"));
            let start = Arc::new(Barrier::new(2));
            let hold = Arc::new(Barrier::new(2));
            let threads: Vec<_> = (0..2)
                .map(|_| {
                    let (out, start, hold) = (out.clone(), start.clone(), hold.clone());
                    std::thread::spawn(move || {
                        start.wait();
                        let lock = RunLock::acquire(&out);
                        hold.wait(); // both have tried before either lets go
                        lock.is_ok()
                    })
                })
                .collect();
            let won: usize = threads
                .into_iter()
                .map(|t| t.join().unwrap() as usize)
                .sum();
            assert_eq!(won, 1, "round {round}");
        }
    }

    #[test]
    fn a_lock_path_that_is_no_regular_file_is_refused_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(LOCK_FILE);
        assert!(std::process::Command::new("mkfifo")
            .arg(&path)
            .status()
            .unwrap()
            .success());
        let started = std::time::Instant::now();
        let err = RunLock::acquire(dir.path()).unwrap_err();
        assert!(err.contains("not a regular file"), "{err}");
        assert!(started.elapsed().as_secs() < 5);
        fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink(dir.path().join("elsewhere"), &path).unwrap();
        let err = RunLock::acquire(dir.path()).unwrap_err();
        assert!(err.contains("symbolic link"), "{err}");
        assert!(!dir.path().join("elsewhere").exists());
    }
}
