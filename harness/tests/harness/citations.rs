//! Words that a newcomer can follow: every "docs/operator.md section N" names a section that
//! page has, and every path of this repository named in a source file, a matrix or a page
//! exists (placeholders in capitals, such as `adapters/NAME_worker.py`, aside).

use regex::Regex;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The project's text files: sources, matrices, scripts and pages (no build output, no
/// hidden folder such as a fetched vLLM tree).
fn text_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with('.') && name != ".ci" || name == "target" || name == "__pycache__" {
            continue;
        }
        if path.is_dir() {
            text_files(&path, out);
        } else if ["rs", "py", "md", "toml", "sh", "cu", "cuh", "yml"]
            .iter()
            .any(|e| path.extension().is_some_and(|x| x == *e))
        {
            out.push(path);
        }
    }
}

#[test]
fn section_citations_and_repository_paths_resolve() {
    let root = root();
    let operator = std::fs::read_to_string(root.join("docs/operator.md")).unwrap();
    let heading = Regex::new(r"(?m)^#{2,3} (\d+(?:\.\d+)?)[. ]").unwrap();
    let sections: Vec<String> = heading
        .captures_iter(&operator)
        .map(|c| c[1].to_string())
        .collect();
    assert!(sections.len() >= 10, "{sections:?}");
    let cite = Regex::new(r"docs/operator\.md sections? (\d+(?:\.\d+)?)").unwrap();
    let path = Regex::new(
        r"(?:^|[^\w/.-])((?:harness|kernels|reference|routing|matrices|reports|adapters|docs|ci|common)/[\w./-]*\w)",
    )
    .unwrap();
    let mut files = Vec::new();
    text_files(&root, &mut files);
    let mut bad = Vec::new();
    for file in &files {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        let at = file
            .strip_prefix(&root)
            .unwrap_or(file)
            .display()
            .to_string();
        if at.ends_with("citations.rs") {
            continue; // its patterns are not citations
        }
        for c in cite.captures_iter(&text) {
            if !sections.iter().any(|s| *s == c[1]) {
                bad.push(format!("{at}: docs/operator.md has no section {}", &c[1]));
            }
        }
        for c in path.captures_iter(&text) {
            let named = c[1].trim_end_matches('.');
            let placeholder = named.chars().any(|ch| ch.is_ascii_uppercase());
            if !placeholder && !root.join(named).exists() {
                bad.push(format!("{at}: {named} does not exist"));
            }
        }
    }
    assert!(files.len() > 100, "{}", files.len());
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}
