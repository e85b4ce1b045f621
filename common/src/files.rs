//! Reading and writing files safely: every file relattn writes goes through [`write_atomic`]
//! (no reader ever sees half of one, and nothing but a regular file or a new name is replaced),
//! every input it reads through [`read_regular`] (regular files only, read up to a limit, so a
//! FIFO cannot hang a command nor a device fill its memory), and [`same_file`] tells whether two
//! paths name one file.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Read, Write};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// What a file type is, in words, for messages.
fn kind_of(t: fs::FileType) -> &'static str {
    if t.is_file() {
        "a regular file"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_symlink() {
        "a symbolic link"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}

fn not_regular(t: fs::FileType, what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{} is {}, not a regular file", what, kind_of(t)),
    )
}

/// Open `path` for reading if it is a regular file (symbolic links resolved), with its length.
/// A FIFO, device, socket or directory is refused without blocking: the open does not wait for
/// a FIFO's writer, and the type is checked on the open file, not on the name.
pub fn open_regular(path: &Path) -> io::Result<(File, u64)> {
    open_checked(OpenOptions::new().read(true), path, libc::O_NONBLOCK)
}

/// Like [`open_regular`], but a symbolic link is refused too (files another process made, such
/// as a worker's output, are never followed elsewhere).
pub fn open_regular_nofollow(path: &Path) -> io::Result<(File, u64)> {
    open_checked(
        OpenOptions::new().read(true),
        path,
        libc::O_NONBLOCK | libc::O_NOFOLLOW,
    )
}

/// Open `path` for reading and writing, creating it when absent (never truncating), with the
/// checks of [`open_regular_nofollow`]: a link, FIFO, device or directory is refused (a lock
/// file).
pub fn open_or_create_regular_nofollow(path: &Path) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.read(true).write(true).create(true).truncate(false);
    let flags = libc::O_NONBLOCK | libc::O_NOFOLLOW;
    open_checked(&mut options, path, flags).map(|(file, _)| file)
}

/// Open with `options` and `flags`, then refuse what is not a regular file.
fn open_checked(options: &mut OpenOptions, path: &Path, flags: i32) -> io::Result<(File, u64)> {
    let file = options.custom_flags(flags).open(path).map_err(|e| {
        // With O_NOFOLLOW, ELOOP means the path itself is a link.
        if flags & libc::O_NOFOLLOW != 0 && e.raw_os_error() == Some(libc::ELOOP) {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "it is a symbolic link, not a regular file (links are not followed here)",
            )
        } else {
            e
        }
    })?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(not_regular(meta.file_type(), "it"));
    }
    Ok((file, meta.len()))
}

/// Everything `file` holds, refusing (with `ErrorKind::FileTooLarge`) a file that turns out
/// longer than `limit` bytes while it is read: the length checked before reading can change.
pub fn read_limited(file: File, limit: u64) -> io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    file.take(limit.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(io::Error::new(
            io::ErrorKind::FileTooLarge,
            format!("it grew past the limit of {limit} bytes while it was read"),
        ));
    }
    Ok(bytes)
}

/// A regular file whole, when it holds at most `limit` bytes (`ErrorKind::FileTooLarge`
/// otherwise, before reading).
pub fn read_regular(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    let (file, len) = open_regular(path)?;
    if len > limit {
        return Err(io::Error::new(
            io::ErrorKind::FileTooLarge,
            format!("it holds {len} bytes, over the limit of {limit} bytes"),
        ));
    }
    read_limited(file, limit)
}

/// [`read_regular`] as UTF-8 text.
pub fn read_regular_text(path: &Path, limit: u64) -> io::Result<String> {
    String::from_utf8(read_regular(path, limit)?)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.utf8_error()))
}

/// Refuse to replace `path` unless it is absent or a regular file: an output never replaces a
/// symbolic link (nor writes through one), a device, a FIFO or a directory.
pub fn check_output_path(path: &Path) -> io::Result<()> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_file() => Ok(()),
        Ok(m) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} is {}: relattn writes only new files or regular files it replaces",
                path.display(),
                kind_of(m.file_type())
            ),
        )),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Create the directory `dir` (and its parents) where it is missing; a `dir` that exists must be
/// a real directory, not a symbolic link to one (a link inside a report folder would send the
/// report elsewhere).
pub fn create_dir_nofollow(dir: &Path) -> io::Result<()> {
    match fs::symlink_metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(m) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} is {}, not a directory relattn may write into (links are not followed)",
                dir.display(),
                kind_of(m.file_type())
            ),
        )),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            fs::create_dir_all(dir)?;
            // Created by a racing process as something else: check again.
            match fs::symlink_metadata(dir) {
                Ok(m) if m.is_dir() => Ok(()),
                Ok(m) => Err(not_regular(m.file_type(), &dir.display().to_string())),
                Err(e) => Err(e),
            }
        }
        Err(e) => Err(e),
    }
}

/// Write `path` through a temporary file in the same directory, renamed over `path` once
/// `write` has written all of it. A failure (of `write` or of the rename) leaves `path` as it
/// was and removes the temporary file. The file gets the permissions a newly created file
/// gets (0666 less the umask), not the temporary file's 0600. A `path` that exists and is not a
/// regular file (a symbolic link, a device, a FIFO, a directory) is refused before anything is
/// written ([`check_output_path`]).
pub fn write_atomic(
    path: &Path,
    write: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> io::Result<()> {
    check_output_path(path)?;
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
    fn outputs_never_replace_links_devices_or_fifos() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        fs::write(&target, b"keep").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let dangling = dir.path().join("dangling");
        std::os::unix::fs::symlink(dir.path().join("nowhere"), &dangling).unwrap();
        for path in [&link, &dangling] {
            let e = write_atomic(path, |w| w.write_all(b"x")).unwrap_err();
            assert!(e.to_string().contains("symbolic link"), "{e}");
            assert!(fs::symlink_metadata(path).unwrap().is_symlink());
        }
        assert_eq!(fs::read(&target).unwrap(), b"keep");
        assert!(
            !dir.path().join("nowhere").exists(),
            "no file at the link's target"
        );
        let e = write_atomic(Path::new("/dev/null"), |w| w.write_all(b"x")).unwrap_err();
        assert!(e.to_string().contains("character device"), "{e}");
        assert!(fs::metadata("/dev/null")
            .unwrap()
            .file_type()
            .is_char_device());
    }

    #[test]
    fn inputs_must_be_regular_files_and_are_read_up_to_a_limit() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        fs::write(&file, b"12345").unwrap();
        assert_eq!(read_regular(&file, 5).unwrap(), b"12345");
        let e = read_regular(&file, 4).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::FileTooLarge);
        // A device reports length 0 and never ends: refused, not read.
        for dev in ["/dev/zero", "/dev/urandom"] {
            let e = read_regular(Path::new(dev), 1 << 20).unwrap_err();
            assert!(e.to_string().contains("character device"), "{e}");
        }
        let e = read_regular(dir.path(), 10).unwrap_err();
        assert!(e.to_string().contains("directory"), "{e}");
        // A FIFO with no writer: refused at once, not waited on.
        let fifo = dir.path().join("fifo");
        assert!(std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success());
        let started = std::time::Instant::now();
        let e = read_regular(&fifo, 10).unwrap_err();
        assert!(e.to_string().contains("FIFO"), "{e}");
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
        // A link to a regular file is followed by read_regular, refused by the nofollow open.
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert_eq!(read_regular(&link, 10).unwrap(), b"12345");
        let e = open_regular_nofollow(&link).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert!(open_regular_nofollow(&file).is_ok());
    }

    #[test]
    fn report_folders_are_never_links() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("a/b");
        create_dir_nofollow(&real).unwrap();
        create_dir_nofollow(&real).unwrap();
        assert!(real.is_dir());
        let link = dir.path().join("l");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let e = create_dir_nofollow(&link).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
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
