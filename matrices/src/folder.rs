//! Case folders: a tier made of case files nobody generated (captured inputs of an incident,
//! another team's files). Every `*.safetensors` file under the folder, at any depth, is a case
//! named after its file's stem, with an id that is a hash of its bytes (`file_case_id`), so a
//! renamed or moved file keeps its id. Each file is read once here with the hardened reader of
//! case files (a regular file, never through a symbolic link, within the case-byte limit) and
//! validated whole; its trials read it again and check that its bytes still have its id.

use crate::case::{file_case_id, Case, CaseSource, Facts, FileCase};
use crate::count::{MAX_CASES, MAX_FORCED_SPLITS, MAX_SPLIT_SETTINGS};
use crate::error::MatrixError;
use crate::rules::Rules;
use relattn_reference::casefile::{parse_case, read_case_bytes_nofollow};
use relattn_reference::limits::CaseSize;
use relattn_reference::Problem;
use relattn_routing::SplitSetting;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// What a case folder's cases have as `tier` (and a report as its matrix): this, then the folder.
pub const FOLDER_TIER_PREFIX: &str = "cases:";

/// The split settings of a case folder's cases when none are given: the route's own choice,
/// one split (the unsplit kernel, so a split-combine error shows against it) and 3 (an uneven
/// count, whose splits differ in length and, on short requests, are empty), on each path that
/// can take them.
pub const DEFAULT_FOLDER_SPLITS: [SplitSetting; 3] = [
    SplitSetting::Policy,
    SplitSetting::Forced(1),
    SplitSetting::Forced(3),
];

/// Folders deeper than this under the case folder are not read (a loop of bind mounts would
/// never end).
const MAX_DEPTH: usize = 32;

/// The cases of a folder, and the files that are none.
#[derive(Debug, Clone, PartialEq)]
pub struct Folder {
    /// The valid case files, in path order, each once.
    pub cases: Vec<Case>,
    /// Files that are not valid case files, in path order.
    pub bad: Vec<BadFile>,
    /// Files holding the bytes of an earlier file, run once as that one: (file, earlier file).
    pub duplicates: Vec<(String, String)>,
}

/// A file of a case folder that is not a valid case file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadFile {
    /// Its path under the folder.
    pub relative: String,
    /// The id of its bytes, when they could be read.
    pub id: Option<String>,
    /// Why it is not a case, in one line.
    pub reason: String,
}

impl BadFile {
    /// The name of its (skipped) trial: `case_file::` and its path under the folder, with the
    /// characters a case name keeps and `/`.
    pub fn trial_name(&self) -> String {
        let path: Vec<String> = self.relative.split('/').map(case_name).collect();
        format!("case_file::{}", path.join("/"))
    }
}

/// The split settings of `--splits`: comma-separated `policy` and counts (1 to
/// `MAX_FORCED_SPLITS`), at most `MAX_SPLIT_SETTINGS` of them, each kept once.
pub fn parse_splits(text: &str) -> Result<Vec<SplitSetting>, String> {
    let mut out = Vec::new();
    for item in text.split(',').map(str::trim) {
        let split: SplitSetting = item
            .parse()
            .map_err(|e| format!("--splits {text:?}: {e}"))?;
        if split.forced().is_some_and(|n| n > MAX_FORCED_SPLITS) {
            return Err(format!(
                "--splits {text:?}: a forced split count is at most {MAX_FORCED_SPLITS}"
            ));
        }
        if !out.contains(&split) {
            out.push(split);
        }
    }
    if out.len() > MAX_SPLIT_SETTINGS {
        return Err(format!(
            "--splits {text:?}: at most {MAX_SPLIT_SETTINGS} split settings"
        ));
    }
    Ok(out)
}

/// Read the case folder `dir`: every `*.safetensors` file under it is read and validated, its
/// case given `splits` and the exclusion rules of the native paths. With `select`, only the
/// files whose id starts with it count (a bad file whose bytes cannot be read has no id, so it
/// is left out too). A folder that cannot be read is an error; a file that is not a valid case
/// is listed in `Folder::bad`. `limit` is the case-byte limit.
pub fn load_folder(
    dir: &Path,
    splits: &[SplitSetting],
    select: Option<&str>,
    limit: u64,
) -> Result<Folder, MatrixError> {
    let folder_error = |message: String| MatrixError::Folder {
        dir: dir.display().to_string(),
        message,
    };
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(folder_error("not a directory".into())),
        Err(e) => return Err(folder_error(e.to_string())),
    }
    if splits.is_empty() {
        return Err(folder_error("no split settings".into()));
    }
    let mut files = Vec::new();
    let mut bad = Vec::new();
    walk(dir, dir, 0, &mut files, &mut bad).map_err(folder_error)?;
    let rules = Rules::builtin()?;
    let tier = format!("{FOLDER_TIER_PREFIX}{}", dir.display());
    let mut folder = Folder {
        cases: Vec::new(),
        bad: Vec::new(),
        duplicates: Vec::new(),
    };
    let mut first_of: HashMap<String, String> = HashMap::new();
    for (path, relative) in files {
        let bytes = match read_case_bytes_nofollow(&path, limit) {
            Ok(bytes) => bytes,
            Err(e) => {
                bad.push(bad_file(relative, None, &e.to_string(), &path));
                continue;
            }
        };
        let id = file_case_id(&bytes);
        if select.is_some_and(|prefix| !id.starts_with(prefix)) {
            continue;
        }
        if let Some(first) = first_of.get(&id) {
            folder.duplicates.push((relative, first.clone()));
            continue;
        }
        let file = match parse_case(&path, &bytes, limit) {
            Ok(file) => file,
            Err(e) => {
                bad.push(bad_file(relative, Some(id), &e.to_string(), &path));
                continue;
            }
        };
        drop(bytes);
        if folder.cases.len() as u64 >= MAX_CASES {
            return Err(folder_error(format!(
                "more than {MAX_CASES} case files; split the folder"
            )));
        }
        first_of.insert(id.clone(), relative.clone());
        let mut case = file_case(&tier, id, path, relative, &file.problem, file.meta.seed);
        case.splits = splits.to_vec();
        rules.apply(&mut case);
        folder.cases.push(case);
    }
    bad.retain(|b| {
        select.is_none_or(|prefix| b.id.as_ref().is_some_and(|id| id.starts_with(prefix)))
    });
    bad.sort_by(|a, b| a.relative.cmp(&b.relative));
    folder.bad = bad;
    Ok(folder)
}

/// A bad file's entry; the reader's message names the file by its full path, which the entry
/// names already.
fn bad_file(relative: String, id: Option<String>, message: &str, path: &Path) -> BadFile {
    let shown = path.display().to_string();
    let reason = message
        .strip_prefix(shown.as_str())
        .map_or(message, |rest| rest.trim_start_matches(':').trim_start())
        .replace('\n', " ");
    BadFile {
        relative,
        id,
        reason,
    }
}

/// The case of a valid file (no split settings yet).
fn file_case(
    tier: &str,
    id: String,
    path: PathBuf,
    relative: String,
    problem: &Problem,
    seed: Option<u64>,
) -> Case {
    let facts = Facts::of_problem(problem);
    let size = CaseSize {
        rows: problem.total_rows(),
        heads: problem.num_heads,
        kv_heads: problem.num_kv_heads,
        head_dim: problem.head_dim,
        extent: problem.rel_extent,
        page_size: problem.page_size,
        blocks: problem.num_blocks,
        batch: problem.batch(),
        max_pages: problem.max_pages(),
    };
    let name = path
        .file_stem()
        .map(|s| case_name(&s.to_string_lossy()))
        .unwrap_or_default();
    Case {
        id,
        name,
        tier: tier.to_string(),
        mix: String::new(),
        tolerance: crate::tolerance::defaults()[&facts.dtype],
        source: CaseSource::File(FileCase {
            path,
            relative,
            facts,
            seed,
            bytes: size.bytes(),
        }),
        splits: Vec::new(),
        sample_rows: None,
        excluded: BTreeMap::new(),
        excluded_splits: BTreeMap::new(),
        regression: None,
    }
}

/// A file stem as a case name: letters, digits, `_`, `-` and `.` kept, anything else (a `:`
/// that would split a trial name, a space, a control character) as `_`.
fn case_name(stem: &str) -> String {
    let name: String = stem
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "_-.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    if name.is_empty() {
        "_".into()
    } else {
        name
    }
}

/// The `*.safetensors` files under `dir` (full path, path under `root`), in name order at each
/// level, hidden ones (`.name`) left out. A link to a folder is not followed and counts as a bad file (its cases would be
/// missed); a link, FIFO or device named `*.safetensors` is left to the reader, which refuses it.
fn walk(
    root: &Path,
    dir: &Path,
    depth: usize,
    files: &mut Vec<(PathBuf, String)>,
    bad: &mut Vec<BadFile>,
) -> Result<(), String> {
    let relative = |p: &Path| {
        p.strip_prefix(root)
            .unwrap_or(p)
            .to_string_lossy()
            .into_owned()
    };
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut entries: Vec<_> = entries
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        // Hidden files and folders are skipped: a writer's temporary file (`.tmp-*.safetensors`)
        // is no case, and nor is what it holds while being written.
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let path = entry.path();
        let kind = entry
            .file_type()
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let is_case = path.extension().is_some_and(|x| x == "safetensors");
        if kind.is_dir() {
            if depth >= MAX_DEPTH {
                bad.push(BadFile {
                    relative: relative(&path),
                    id: None,
                    reason: format!("a folder more than {MAX_DEPTH} levels deep: not read"),
                });
                continue;
            }
            walk(root, &path, depth + 1, files, bad)?;
        } else if kind.is_symlink() && !is_case && path.is_dir() {
            bad.push(BadFile {
                relative: relative(&path),
                id: None,
                reason: "a symbolic link to a folder: links are not followed in a case folder \
                         (copy or move the files into it)"
                    .into(),
            });
        } else if is_case {
            files.push((path.clone(), relative(&path)));
        }
    }
    Ok(())
}

/// Read a case folder's case again for its trials: its problem, once the file's bytes still
/// have the case's id (a file changed since the folder was read is an error naming both ids).
pub fn read_file_case(id: &str, file: &FileCase, limit: u64) -> Result<Problem, String> {
    let bytes = read_case_bytes_nofollow(&file.path, limit).map_err(|e| e.to_string())?;
    let now = file_case_id(&bytes);
    if now != id {
        return Err(format!(
            "{}: the file changed since the case folder was read: its bytes are case {now} now, \
             not {id}; run the folder again",
            file.path.display()
        ));
    }
    parse_case(&file.path, &bytes, limit)
        .map(|f| f.problem)
        .map_err(|e| e.to_string())
}
