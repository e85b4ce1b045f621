//! Files that are not regular files, in every place a command reads or writes one: FIFOs (a
//! read would wait for a writer for ever), devices (`/dev/zero` reports length 0 and never
//! ends), directories, and symbolic links to each. Every input is refused with exit 2 in
//! bounded time and memory; no output replaces one or writes through a link.

use crate::bounded::relattn;
use crate::run::*;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

/// The special files of one folder, by name.
fn specials(dir: &Path) -> Vec<(&'static str, PathBuf)> {
    let fifo = dir.join("fifo");
    assert!(std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let folder = dir.join("folder");
    std::fs::create_dir(&folder).unwrap();
    let link_fifo = dir.join("link_to_fifo");
    std::os::unix::fs::symlink(&fifo, &link_fifo).unwrap();
    let link_zero = dir.join("link_to_zero");
    std::os::unix::fs::symlink("/dev/zero", &link_zero).unwrap();
    vec![
        ("FIFO", fifo),
        ("/dev/zero", PathBuf::from("/dev/zero")),
        ("/dev/urandom", PathBuf::from("/dev/urandom")),
        ("directory", folder),
        ("link to a FIFO", link_fifo),
        ("link to /dev/zero", link_zero),
    ]
}

fn s(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

#[test]
fn files_that_are_not_regular_are_refused_in_bounded_time_and_memory() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let case = root.join("tiny.safetensors");
    let made = relattn(
        root,
        &["gen", "--preset", "tiny", "--output", &s(&case)],
        INPUT_TIMEOUT,
    );
    made.check(&[0]);
    let reference = root.join("ref.safetensors");
    relattn(
        root,
        &[
            "reference",
            "--input",
            &s(&case),
            "--output",
            &s(&reference),
        ],
        INPUT_TIMEOUT,
    )
    .check(&[0]);
    let mut figures = Figures::new("files");
    // Each command with `{}` where the special file goes.
    let readers: Vec<Vec<String>> = [
        "judge --input {} --output REF",
        "judge --input CASE --output {}",
        "reference --input {} --output NEW",
        "run --matrix {} --out NEW",
        "matrix --show {}",
        "bench --from-json {}",
        "gen --case c97f5ebf67d --matrix {} --output NEW",
    ]
    .iter()
    .map(|c| c.split(' ').map(str::to_string).collect())
    .collect();
    for (what, special) in specials(root) {
        for command in &readers {
            let new = root.join("new");
            let args: Vec<String> = command
                .iter()
                .map(|a| match a.as_str() {
                    "{}" => s(&special),
                    "REF" => s(&reference),
                    "CASE" => s(&case),
                    "NEW" => s(&new),
                    _ => a.clone(),
                })
                .collect();
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let full = with_limit(&args);
            let full: Vec<&str> = full.iter().map(String::as_str).collect();
            let out = relattn(root, &full, INPUT_TIMEOUT);
            figures.record(&out, false);
            out.check(&[2]);
            assert!(
                out.stderr.contains("not a regular file"),
                "relattn {args:?} with {what}: {}",
                out.stderr
            );
            assert!(!new.exists(), "relattn {args:?} with {what} wrote {new:?}");
        }
    }
    figures.print();
}

/// Outputs replace only regular files: never a link (nor its target), a FIFO or a directory.
#[test]
fn outputs_never_replace_or_write_through_what_is_not_a_regular_file() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let target = root.join("target.txt");
    std::fs::write(&target, b"keep").unwrap();
    let link = root.join("link.safetensors");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let dangling = root.join("dangling.safetensors");
    std::os::unix::fs::symlink(root.join("nowhere"), &dangling).unwrap();
    let fifo = root.join("fifo");
    assert!(std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let folder = root.join("folder");
    std::fs::create_dir(&folder).unwrap();
    let mut figures = Figures::new("outputs");
    for output in [&link, &dangling, &fifo, &folder] {
        let args = ["gen", "--preset", "tiny", "--output", &s(output)];
        let out = relattn(root, &args, INPUT_TIMEOUT);
        figures.record(&out, false);
        out.check(&[2]);
        assert!(
            out.stderr
                .contains("relattn writes only new files or regular files"),
            "{args:?}: {}",
            out.stderr
        );
    }
    assert_eq!(std::fs::read(&target).unwrap(), b"keep");
    assert!(!root.join("nowhere").exists());
    assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
    assert!(std::fs::symlink_metadata(&fifo)
        .unwrap()
        .file_type()
        .is_fifo());
    assert!(leftovers(root).is_empty(), "{:?}", leftovers(root));
    figures.print();
}
