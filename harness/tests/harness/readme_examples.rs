//! Every example line of the README runs as typed on a fresh clone without a GPU, or says in its
//! comment what it needs (`needs ...`). The lines without a need run here, in order, in one
//! empty folder, with the built binary as `relattn`; each exits 0, or the code its comment
//! names (`exit N:`). Nothing is set for them: the shipped workers get numpy and vLLM's pinned
//! release the way a user's run does.

use crate::common::text;
use std::path::Path;
use std::process::Command;

/// The README's examples: the code block after "## Install the binary".
fn examples() -> Vec<(String, String)> {
    let readme = std::fs::read_to_string(crate::python::repo().join("README.md")).unwrap();
    let section = readme
        .split("## Install the binary")
        .nth(1)
        .expect("README.md has an `Install the binary` section");
    let block = section
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("that section has a ```sh block");
    block
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| match l.split_once("  # ") {
            Some((command, comment)) => (command.trim().to_string(), comment.trim().to_string()),
            None => (l.trim().to_string(), String::new()),
        })
        .collect()
}

/// The exit code a comment names (`exit 1: ...`), else 0.
fn expected_code(comment: &str) -> i32 {
    comment
        .split("exit ")
        .skip(1)
        .find_map(|rest| {
            rest.split_once(':')
                .and_then(|(n, _)| n.trim().parse().ok())
        })
        .unwrap_or(0)
}

#[test]
fn every_readme_example_without_a_need_runs_as_typed() {
    if relattn_harness::gpu_exec::libraries_present() {
        eprintln!("a CUDA driver is present: the examples are checked on machines without one");
        return;
    }
    let lines = examples();
    assert!(lines.len() >= 10, "{lines:?}");
    let dir = tempfile::tempdir().unwrap();
    let mut ran = 0;
    for (command, comment) in &lines {
        assert!(
            command.starts_with("relattn ") || comment.contains("needs "),
            "an example that is not a relattn command must say what it needs: {command}"
        );
        if comment.contains("needs ") {
            eprintln!("README example not run here ({comment}): {command}");
            continue;
        }
        if command.contains("--impl vllm") || command.contains("--impl triton") {
            // vLLM's pinned release, fetched into relattn's cache folder as the binary would.
            if crate::cli_worker::vllm_root().is_none() {
                eprintln!("README example not run: no network for vLLM's wheel: {command}");
                continue;
            }
        }
        let words = shlex::split(command).expect("a shell command line");
        let out = Command::new(env!("CARGO_BIN_EXE_relattn"))
            .args(&words[1..])
            .current_dir(dir.path())
            .output()
            .expect("relattn runs");
        let err = text(&out.stderr);
        assert!(!err.contains("panicked"), "{command}: {err}");
        assert_eq!(
            out.status.code(),
            Some(expected_code(comment)),
            "README example `{command}` ({comment}): {err}"
        );
        ran += 1;
    }
    assert!(ran >= 7, "only {ran} README examples ran");
    assert!(Path::new(&dir.path().join("baseline/cpu/summary.md")).is_file());
}

#[test]
fn an_exit_code_is_read_from_its_comment() {
    assert_eq!(expected_code("exit 1: its decode differs"), 1);
    assert_eq!(expected_code("exit 1 on a regression"), 0);
    assert_eq!(expected_code("select trials"), 0);
}
