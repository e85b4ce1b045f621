//! Launches exclusive across processes: several `relattn` processes may share one GPU (the
//! nightly tier run as shards side by side on one machine), and a kernel timed while another
//! process's kernels run beside it measures the neighbour too. Every timed launch sequence holds
//! an advisory lock on a file named after the device's UUID, so launches of different processes
//! on one GPU take turns while everything else (generation, references, uploads, judging)
//! overlaps. Copies and memsets of other processes are not covered: they use the copy engines
//! and a sliver of memory bandwidth.

#![deny(unsafe_code)]

use std::fs::{File, OpenOptions, TryLockError};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// How long a launch waits for another process's launches before going ahead unlocked (a
/// neighbour's launch sequence takes milliseconds; a stuck neighbour must not hang this run).
const WAIT: Duration = Duration::from_secs(60);

/// The lock file of one GPU, opened once per `Gpu`.
#[derive(Debug)]
pub(crate) struct LaunchLock {
    file: Option<File>,
}

/// Held while launches run; dropping it releases the lock.
pub(crate) struct Held<'a>(Option<&'a File>);

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if let Some(f) = self.0 {
            let _ = f.unlock();
        }
    }
}

/// The lock file of the device with this UUID (hex): `RELATTN_LOCK_DIR`, else the temp dir.
pub(crate) fn lock_path(uuid_hex: &str) -> PathBuf {
    let dir = std::env::var_os("RELATTN_LOCK_DIR")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    dir.join(format!("relattn-gpu-{uuid_hex}.lock"))
}

impl LaunchLock {
    /// The lock at `path`; without a usable file (read-only temp dir) launches go unlocked.
    pub(crate) fn open(path: PathBuf) -> LaunchLock {
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .ok();
        LaunchLock { file }
    }

    /// A lock that never waits (no file).
    pub(crate) fn none() -> LaunchLock {
        LaunchLock { file: None }
    }

    /// Wait for the other processes' launches on this GPU, up to `WAIT`.
    pub(crate) fn hold(&self) -> Held<'_> {
        let Some(f) = &self.file else {
            return Held(None);
        };
        let deadline = Instant::now() + WAIT;
        let mut pause = Duration::from_micros(50);
        loop {
            match f.try_lock() {
                Ok(()) => return Held(Some(f)),
                Err(TryLockError::WouldBlock) if Instant::now() < deadline => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(2));
                }
                // Timed out, or locks unsupported on this file system: go ahead unlocked.
                Err(_) => return Held(None),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_waits_until_the_first_lets_go() {
        let dir = std::env::temp_dir().join(format!("relattn-lock-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("gpu.lock");
        // Two opens of one file stand for two processes: flock locks belong to the open file.
        let (a, b) = (LaunchLock::open(path.clone()), LaunchLock::open(path));
        let held = a.hold();
        assert!(held.0.is_some(), "the first holder gets the lock");
        let f = b.file.as_ref().expect("lock file opens");
        assert!(matches!(f.try_lock(), Err(TryLockError::WouldBlock)));
        let released = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            let waiter = s.spawn(|| {
                let h = b.hold();
                assert!(released.load(std::sync::atomic::Ordering::SeqCst));
                h.0.is_some()
            });
            std::thread::sleep(Duration::from_millis(100));
            released.store(true, std::sync::atomic::Ordering::SeqCst);
            drop(held);
            assert!(
                waiter.join().unwrap(),
                "the second holder gets it after the first"
            );
        });
        assert!(LaunchLock::none().hold().0.is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
