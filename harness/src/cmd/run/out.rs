//! Where a run writes its report. `--out DIR` is exact: the report goes to `DIR/<arch>`, a
//! second run there refuses (or continues with `--resume`), as CI jobs and shard merges need.
//! Without `--out`, each run gets a folder of its own, `reports-out/<run id>/<arch>`, and
//! `reports-out/latest` points to the newest, so the same command (a printed reproduce line, a
//! rerun) works every time, and `report show`/`diff`/`plot` read the latest run by default.

use std::path::{Path, PathBuf};

/// The folder of the runs that name no `--out`.
pub const RUNS_ROOT: &str = "reports-out";
/// The link in `RUNS_ROOT` to the newest run's folder.
pub const LATEST: &str = "latest";

/// A run's report folder, and the run id to point `latest` at when the folder is a new one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportOut {
    pub dir: PathBuf,
    pub new_run: Option<String>,
}

/// The folder of this run: `out` when given; else a new `reports-out/<run id>`, or with
/// `resume` the one `reports-out/latest` points to.
pub fn resolve(out: Option<&Path>, resume: bool) -> Result<ReportOut, String> {
    if let Some(dir) = out {
        return Ok(ReportOut {
            dir: dir.to_path_buf(),
            new_run: None,
        });
    }
    let root = Path::new(RUNS_ROOT);
    if resume {
        let target = std::fs::read_link(root.join(LATEST)).map_err(|_| {
            format!(
                "--resume without --out continues {RUNS_ROOT}/{LATEST}, which does not exist: \
                 give the --out of the run to continue"
            )
        })?;
        return Ok(ReportOut {
            dir: root.join(target),
            new_run: None,
        });
    }
    let id = run_id(chrono::Local::now(), std::process::id());
    Ok(ReportOut {
        dir: root.join(&id),
        new_run: Some(id),
    })
}

/// `YYYYMMDD-HHMMSS-<pid>`: sorts by time, unique on a machine.
fn run_id(now: chrono::DateTime<chrono::Local>, pid: u32) -> String {
    format!("{}-{pid}", now.format("%Y%m%d-%H%M%S"))
}

/// Point `root/latest` at `root/<id>` (a relative link, replaced atomically). A `latest` that is
/// not a link (someone's own folder) is left alone, and the reason returned.
pub fn point_latest(root: &Path, id: &str) -> Result<(), String> {
    let latest = root.join(LATEST);
    if let Ok(meta) = std::fs::symlink_metadata(&latest) {
        if !meta.file_type().is_symlink() {
            return Err(format!(
                "{} is not a link, so it was left as it is",
                latest.display()
            ));
        }
    }
    let tmp = root.join(format!(".{LATEST}.{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(id, &tmp)
        .and_then(|()| std::fs::rename(&tmp, &latest))
        .map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            format!("cannot point {} at {id}: {e}", latest.display())
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_explicit_out_is_exact_and_a_run_without_one_gets_its_own_folder() {
        let given = resolve(Some(Path::new("x/y")), false).unwrap();
        assert_eq!((given.dir, given.new_run), (PathBuf::from("x/y"), None));
        let own = resolve(None, false).unwrap();
        let id = own.new_run.unwrap();
        assert_eq!(own.dir, Path::new(RUNS_ROOT).join(&id));
        let time = chrono::Local::now();
        assert!(run_id(time, 42).ends_with("-42"));
        assert_eq!(run_id(time, 42).len(), "20261203-065037-42".len());
    }

    #[test]
    fn latest_points_at_the_newest_run_and_never_replaces_a_folder() {
        let dir = tempfile::tempdir().unwrap();
        for id in ["20261203-065037-1", "20261203-065040-2"] {
            std::fs::create_dir(dir.path().join(id)).unwrap();
            point_latest(dir.path(), id).unwrap();
            assert_eq!(
                std::fs::read_link(dir.path().join(LATEST)).unwrap(),
                PathBuf::from(id)
            );
        }
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 3, "no temporary link left");
        let other = tempfile::tempdir().unwrap();
        std::fs::create_dir(other.path().join(LATEST)).unwrap();
        let e = point_latest(other.path(), "x").unwrap_err();
        assert!(e.contains("not a link"), "{e}");
    }
}
