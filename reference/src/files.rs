//! Writing files so that no reader ever sees half of one, and telling whether two paths name
//! the same file. Every file relattn writes goes through [`write_atomic`].

use std::fs;
use std::io::{self, BufWriter, Write};
use std::path::Path;

/// Write `path` through a temporary file in the same directory, renamed over `path` once
/// `write` has written all of it. A failure (of `write` or of the rename) leaves `path` as it
/// was and removes the temporary file. The file gets the permissions a newly created file
/// gets (0666 less the umask), not the temporary file's 0600.
pub fn write_atomic(
    path: &Path,
    write: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> io::Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let prefix = format!(".{name}.");
    let mut builder = tempfile::Builder::new();
    builder.prefix(&prefix).suffix(".tmp");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        builder.permissions(fs::Permissions::from_mode(0o666));
    }
    let mut tmp = builder.tempfile_in(dir)?;
    {
        let mut w = BufWriter::new(tmp.as_file_mut());
        write(&mut w)?;
        w.flush()?;
    }
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// Whether `a` and `b` name one existing file (compared as canonical paths, so `./x`, `d/../x`
/// and symbolic links to `x` are all `x`). A path that does not exist names no file.
pub fn same_file(a: &Path, b: &Path) -> bool {
    match (fs::canonicalize(a), fs::canonicalize(b)) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_whole_files_and_leaves_nothing_beside_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.txt");
        write_atomic(&path, |w| w.write_all(b"first")).unwrap();
        write_atomic(&path, |w| w.write_all(b"second")).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"second");
        let names: Vec<_> = fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "{names:?}");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
            assert_ne!(mode, 0o600, "the temporary file's mode leaked");
        }
    }

    #[test]
    fn a_failed_write_keeps_the_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keep.txt");
        fs::write(&path, b"old").unwrap();
        let err = write_atomic(&path, |w| {
            w.write_all(b"half")?;
            Err(io::Error::other("stopped"))
        })
        .unwrap_err();
        assert_eq!(err.to_string(), "stopped");
        assert_eq!(fs::read(&path).unwrap(), b"old");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
        // A directory in the way: the rename fails, nothing is left behind.
        let sub = dir.path().join("sub");
        fs::create_dir(&sub).unwrap();
        assert!(write_atomic(&sub, |w| w.write_all(b"x")).is_err());
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 2);
    }

    #[test]
    fn same_file_sees_through_spellings() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        fs::write(&a, b"x").unwrap();
        let other = dir.path().join("sub/../a");
        fs::create_dir(dir.path().join("sub")).unwrap();
        assert!(same_file(&a, &other));
        assert!(!same_file(&a, &dir.path().join("b")));
        #[cfg(unix)]
        {
            let link = dir.path().join("link");
            std::os::unix::fs::symlink(&a, &link).unwrap();
            assert!(same_file(&link, &a));
        }
    }
}
