//! The workers alive in this process, so that a process ending at once (a second interrupt)
//! still ends their process groups and removes their case folders: exiting skips the drops
//! that normally do both.

use rustix::process::{kill_process_group, Pid, Signal};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

static GROUPS: Mutex<Vec<Pid>> = Mutex::new(Vec::new());
static FOLDERS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

fn with<T>(list: &Mutex<Vec<T>>, f: impl FnOnce(&mut Vec<T>)) {
    f(&mut list.lock().unwrap_or_else(|e| e.into_inner()));
}

pub(crate) fn add_group(group: Pid) {
    with(&GROUPS, |g| g.push(group));
}

pub(crate) fn remove_group(group: Pid) {
    with(&GROUPS, |g| g.retain(|&x| x != group));
}

pub(crate) fn add_folder(folder: &Path) {
    with(&FOLDERS, |f| f.push(folder.to_path_buf()));
}

pub(crate) fn remove_folder(folder: &Path) {
    with(&FOLDERS, |f| f.retain(|x| x != folder));
}

/// Kill every live worker's process group and remove every worker case folder, at once (for a
/// process about to exit without its drops).
pub fn end_all() {
    with(&GROUPS, |groups| {
        for group in groups.drain(..) {
            let _ = kill_process_group(group, Signal::KILL);
        }
    });
    with(&FOLDERS, |folders| {
        for folder in folders.drain(..) {
            let _ = std::fs::remove_dir_all(folder);
        }
    });
}
