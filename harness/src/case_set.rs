//! Where a run's cases come from: a matrix (a tier or a matrix file, `--matrix`) or a case
//! folder (`--cases`), and how each is named in a report and on a command line.

use relattn_matrices::{SplitSetting, DEFAULT_FOLDER_SPLITS, FOLDER_TIER_PREFIX};
use std::path::PathBuf;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CaseSet {
    /// A tier name or the path of a matrix file.
    Matrix(String),
    /// Every case file under a folder, each run with these split settings. `keep_going`: the
    /// folder's invalid files are skipped trials instead of a refusal to run.
    Folder {
        dir: PathBuf,
        splits: Vec<SplitSetting>,
        keep_going: bool,
    },
}

impl CaseSet {
    /// A case folder with the default split settings.
    pub fn folder(dir: PathBuf) -> CaseSet {
        CaseSet::Folder {
            dir,
            splits: DEFAULT_FOLDER_SPLITS.to_vec(),
            keep_going: false,
        }
    }

    /// Its name in reports (summary.json's `matrix`, the cases' `tier`): the tier or file as
    /// given, or `cases:DIR`.
    pub fn name(&self) -> String {
        match self {
            CaseSet::Matrix(m) => m.clone(),
            CaseSet::Folder { dir, .. } => format!("{FOLDER_TIER_PREFIX}{}", dir.display()),
        }
    }

    /// What a report's `matrix` names (`--rerun-failed` without `--matrix` or `--cases`): a
    /// case folder, with the default split settings, when it is `cases:DIR`.
    pub fn from_name(name: &str) -> CaseSet {
        match name.strip_prefix(FOLDER_TIER_PREFIX) {
            Some(dir) => CaseSet::folder(PathBuf::from(dir)),
            None => CaseSet::Matrix(name.to_string()),
        }
    }

    /// The arguments of `relattn run` that select one case of it again, for one split setting
    /// (a reproduce line): `--matrix M --case ID` (every split setting of the case, as the
    /// matrix states them), or `--cases DIR --case ID --splits S`. Paths are quoted for a shell.
    pub fn case_args(&self, case_id: &str, split: Option<SplitSetting>) -> String {
        match self {
            CaseSet::Matrix(m) => format!("--matrix {} --case {case_id}", quote(m)),
            CaseSet::Folder { dir, .. } => {
                let mut args = format!(
                    "--cases {} --case {case_id}",
                    quote(&dir.display().to_string())
                );
                if let Some(split) = split {
                    let split = split.forced().map_or("policy".into(), |n| n.to_string());
                    args.push_str(&format!(" --splits {split}"));
                }
                args
            }
        }
    }
}

/// `text` as one shell word (unchanged when it needs no quotes).
fn quote(text: &str) -> String {
    shlex::try_quote(text).map_or_else(|_| format!("'{text}'"), |q| q.into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_arguments_round_trip() {
        let m = CaseSet::Matrix("smoke".into());
        assert_eq!(m.name(), "smoke");
        assert_eq!(CaseSet::from_name("smoke"), m);
        assert_eq!(
            m.case_args("c1", Some(SplitSetting::Forced(3))),
            "--matrix smoke --case c1"
        );
        let f = CaseSet::folder("my cases/x".into());
        assert_eq!(f.name(), "cases:my cases/x");
        assert_eq!(CaseSet::from_name(&f.name()), f);
        assert_eq!(
            f.case_args("c1", Some(SplitSetting::Forced(3))),
            "--cases 'my cases/x' --case c1 --splits 3"
        );
        assert_eq!(
            f.case_args("c1", Some(SplitSetting::Policy)),
            "--cases 'my cases/x' --case c1 --splits policy"
        );
        assert_eq!(f.case_args("c1", None), "--cases 'my cases/x' --case c1");
    }
}
