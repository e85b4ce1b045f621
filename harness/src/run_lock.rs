//! The lock of a report directory: one `relattn run` at a time writes into an `--out`.
//!
//! The lock is the file `OUT/relattn.lock`, created exclusively and holding the holder's pid. A
//! second run finds it and stops at once, naming that pid. A lock whose pid no longer runs (a
//! run that was killed) is stale: the next run takes it over and says so. The lock is removed
//! when the run ends, however it ends short of being killed.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

/// File name of the lock inside the report directory.
pub const LOCK_FILE: &str = "relattn.lock";

/// A held lock; dropping it removes the lock file (and `OUT` itself when this run created it
/// and left it empty).
#[derive(Debug)]
pub struct RunLock {
    path: PathBuf,
    created_dir: Option<PathBuf>,
}

/// Whether a process with this pid runs on this machine. Without `/proc` nothing can be told,
/// and the lock is taken to be held.
fn pid_alive(pid: u32) -> bool {
    let proc = Path::new("/proc");
    !proc.is_dir() || proc.join(pid.to_string()).exists()
}

fn try_create(path: &Path) -> std::io::Result<()> {
    let mut f = OpenOptions::new().write(true).create_new(true).open(path)?;
    writeln!(f, "{}", std::process::id())?;
    f.sync_all()
}

impl RunLock {
    /// Takes the lock of `out`, creating the directory if needed. Errors are messages for the
    /// user (a held lock names its pid).
    pub fn acquire(out: &Path) -> Result<RunLock, String> {
        let created_dir = (!out.exists()).then(|| out.to_path_buf());
        fs::create_dir_all(out)
            .map_err(|e| format!("cannot create the report directory {}: {e}", out.display()))?;
        let path = out.join(LOCK_FILE);
        let lock = |created_dir| RunLock {
            path: path.clone(),
            created_dir,
        };
        match try_create(&path) {
            Ok(()) => return Ok(lock(created_dir)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(format!("cannot create the lock {}: {e}", path.display())),
        }
        let text = fs::read_to_string(&path).unwrap_or_default();
        let holder = text.trim().parse::<u32>().ok();
        match holder {
            Some(pid) if pid_alive(pid) => {
                return Err(format!(
                    "{} is in use by another relattn run (pid {pid}, lock {}): wait for it to \
                     end, or give another --out",
                    out.display(),
                    path.display()
                ))
            }
            Some(pid) => eprintln!(
                "relattn run: taking over the stale lock {} of pid {pid}, which no longer runs",
                path.display()
            ),
            None => eprintln!(
                "relattn run: taking over the lock {}, which names no pid",
                path.display()
            ),
        }
        fs::remove_file(&path)
            .map_err(|e| format!("cannot remove the stale lock {}: {e}", path.display()))?;
        match try_create(&path) {
            Ok(()) => Ok(lock(None)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Err(format!(
                "{} was locked by another relattn run while this one took over a stale lock; \
                 give another --out",
                out.display()
            )),
            Err(e) => Err(format!("cannot create the lock {}: {e}", path.display())),
        }
    }
}

impl Drop for RunLock {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
        if let Some(dir) = &self.created_dir {
            // Only succeeds when empty: a refused run leaves no directory behind.
            let _ = fs::remove_dir(dir);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_lock_names_its_pid_and_a_stale_one_is_taken_over() {
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
        // A pid that cannot run (above the kernel's pid_max of 2^22).
        fs::create_dir_all(&out).unwrap();
        fs::write(out.join(LOCK_FILE), "4294967\n").unwrap();
        let taken = RunLock::acquire(&out).unwrap();
        let text = fs::read_to_string(out.join(LOCK_FILE)).unwrap();
        assert_eq!(text.trim(), std::process::id().to_string());
        drop(taken);
        assert!(!out.join(LOCK_FILE).exists());
        assert!(out.exists(), "a directory that existed before stays");
    }
}
