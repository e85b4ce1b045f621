//! Case folders: ids from the bytes, names from the stems, bad files one by one, selection by
//! id, the exclusion rules, and a file changed under a run.

use relattn_matrices::{
    file_case_id, load_folder, parse_splits, read_file_case, SplitSetting, DEFAULT_FOLDER_SPLITS,
};
use relattn_reference::casefile::{write_case, CaseMeta};
use relattn_reference::gen::generate;
use relattn_reference::{DType, GenSpec};
use relattn_routing::PathId;
use std::path::Path;

const LIMIT: u64 = 1 << 30;

fn write(path: &Path, spec: &GenSpec) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let p = generate(spec).unwrap();
    write_case(path, &p, &CaseMeta::of(&p)).unwrap();
}

fn decode(seed: u64) -> GenSpec {
    GenSpec::global(4, 2, vec![(1, 40), (1, 7)], seed)
}

#[test]
fn every_case_file_is_a_case_named_by_its_stem_with_the_hash_of_its_bytes_as_id() {
    let dir = tempfile::tempdir().unwrap();
    write(&dir.path().join("b.safetensors"), &decode(1));
    write(&dir.path().join("sub/deeper/a x:y.safetensors"), &decode(2));
    std::fs::write(dir.path().join("README.md"), "not a case").unwrap();
    std::fs::write(dir.path().join(".tmp-half.safetensors"), "being written").unwrap();
    let folder = load_folder(dir.path(), &DEFAULT_FOLDER_SPLITS, None, LIMIT).unwrap();
    assert!(folder.bad.is_empty(), "{:?}", folder.bad);
    let names: Vec<&str> = folder.cases.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["b", "a_x_y"]);
    for case in &folder.cases {
        let file = case.file().unwrap();
        let bytes = std::fs::read(&file.path).unwrap();
        assert_eq!(case.id, file_case_id(&bytes));
        assert!(
            case.id.starts_with('c') && case.id.len() == 11,
            "{}",
            case.id
        );
        assert_eq!(case.splits, DEFAULT_FOLDER_SPLITS);
        assert!(case.tier.starts_with("cases:"), "{}", case.tier);
        let params: std::collections::BTreeMap<_, _> = case.params().into_iter().collect();
        assert_eq!(params["file"], file.relative);
        assert_eq!(params["batch"], "2");
        assert_eq!(params["max_kv_len"], "40");
        assert_eq!(params["bias"], "");
    }
    assert_eq!(
        folder.cases[1].file().unwrap().relative,
        "sub/deeper/a x:y.safetensors"
    );
    // A rename and a move keep the id; the name follows the file.
    let before = folder.cases[0].id.clone();
    std::fs::rename(
        dir.path().join("b.safetensors"),
        dir.path().join("sub/renamed.safetensors"),
    )
    .unwrap();
    let again = load_folder(dir.path(), &DEFAULT_FOLDER_SPLITS, None, LIMIT).unwrap();
    let moved = again.cases.iter().find(|c| c.name == "renamed").unwrap();
    assert_eq!(moved.id, before);
}

#[test]
fn bad_files_are_listed_one_by_one_and_the_rest_are_cases() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write(&d.join("good.safetensors"), &decode(1));
    std::fs::write(d.join("torn.safetensors"), b"\x08\0\0\0\0\0\0\0{}      ").unwrap();
    let good = std::fs::read(d.join("good.safetensors")).unwrap();
    std::fs::write(d.join("cut.safetensors"), &good[..good.len() / 2]).unwrap();
    std::os::unix::fs::symlink(d.join("good.safetensors"), d.join("link.safetensors")).unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(elsewhere.path(), d.join("linked_folder")).unwrap();
    assert!(std::process::Command::new("mkfifo")
        .arg(d.join("fifo.safetensors"))
        .status()
        .unwrap()
        .success());
    let folder = load_folder(d, &[SplitSetting::Policy], None, LIMIT).unwrap();
    assert_eq!(folder.cases.len(), 1);
    let bad: Vec<(&str, &str)> = folder
        .bad
        .iter()
        .map(|b| (b.relative.as_str(), b.reason.as_str()))
        .collect();
    let names: Vec<&str> = bad.iter().map(|b| b.0).collect();
    assert_eq!(
        names,
        [
            "cut.safetensors",
            "fifo.safetensors",
            "link.safetensors",
            "linked_folder",
            "torn.safetensors"
        ]
    );
    for (name, reason) in &bad {
        assert!(
            !reason.is_empty() && !reason.contains('\n'),
            "{name}: {reason}"
        );
        assert!(!reason.contains(d.to_str().unwrap()), "{name}: {reason}");
    }
    assert!(bad[1].1.contains("FIFO"), "{}", bad[1].1);
    assert!(bad[2].1.contains("symbolic link"), "{}", bad[2].1);
    assert!(
        bad[3].1.contains("symbolic link to a folder"),
        "{}",
        bad[3].1
    );
    assert!(bad[4].1.contains("is missing"), "{}", bad[4].1);
    // Readable bad files have the id of their bytes; unreadable ones none.
    assert_eq!(
        folder.bad[0].id.as_deref(),
        Some(file_case_id(&good[..good.len() / 2]).as_str())
    );
    assert!(folder.bad[1].id.is_none() && folder.bad[2].id.is_none());
    // A file over the case-byte limit is a bad file naming the limit.
    let small = load_folder(d, &[SplitSetting::Policy], None, 1000).unwrap();
    assert!(small.cases.is_empty());
    let over = small
        .bad
        .iter()
        .find(|b| b.relative == "good.safetensors")
        .unwrap();
    assert!(over.reason.contains("limit"), "{}", over.reason);
}

#[test]
fn a_selection_by_id_leaves_out_other_files_good_or_bad() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write(&d.join("a.safetensors"), &decode(1));
    write(&d.join("b.safetensors"), &decode(2));
    std::fs::write(d.join("torn.safetensors"), b"garbage").unwrap();
    std::os::unix::fs::symlink(d.join("a.safetensors"), d.join("link.safetensors")).unwrap();
    let all = load_folder(d, &[SplitSetting::Policy], None, LIMIT).unwrap();
    let id = all.cases[1].id.clone();
    let one = load_folder(d, &[SplitSetting::Policy], Some(&id[..6]), LIMIT).unwrap();
    assert_eq!(one.cases.len(), 1);
    assert_eq!(one.cases[0].id, id);
    assert!(one.bad.is_empty(), "{:?}", one.bad);
    let torn = file_case_id(b"garbage");
    let bad = load_folder(d, &[SplitSetting::Policy], Some(&torn), LIMIT).unwrap();
    assert!(bad.cases.is_empty());
    assert_eq!(bad.bad.len(), 1);
}

#[test]
fn a_copy_of_a_file_is_one_case() {
    let dir = tempfile::tempdir().unwrap();
    write(&dir.path().join("a.safetensors"), &decode(1));
    std::fs::copy(
        dir.path().join("a.safetensors"),
        dir.path().join("b.safetensors"),
    )
    .unwrap();
    let folder = load_folder(dir.path(), &[SplitSetting::Policy], None, LIMIT).unwrap();
    assert_eq!(folder.cases.len(), 1);
    assert_eq!(
        folder.duplicates,
        [("b.safetensors".to_string(), "a.safetensors".to_string())]
    );
}

#[test]
fn the_native_paths_exclusion_rules_apply() {
    let dir = tempfile::tempdir().unwrap();
    let mut fp32 = decode(1);
    fp32.dtype = DType::F32;
    write(&dir.path().join("fp32.safetensors"), &fp32);
    let mut odd = decode(2);
    odd.rel_extent = 1000;
    odd.requests = vec![(3, 50)];
    write(&dir.path().join("odd_extent_prefill.safetensors"), &odd);
    let splits = [SplitSetting::Policy, SplitSetting::Forced(3)];
    let folder = load_folder(dir.path(), &splits, None, LIMIT).unwrap();
    let f = folder.cases.iter().find(|c| c.name == "fp32").unwrap();
    for path in PathId::ALL {
        assert!(f.exclusion(path, SplitSetting::Policy).is_some(), "{path}");
    }
    let o = folder
        .cases
        .iter()
        .find(|c| c.name == "odd_extent_prefill")
        .unwrap();
    assert!(o
        .exclusion(PathId::ShearedBias, SplitSetting::Policy)
        .is_some());
    assert!(o
        .exclusion(PathId::Fallback, SplitSetting::Policy)
        .is_none());
    // Forced splits on the fallback path only for decode-only cases.
    assert!(o
        .exclusion(PathId::Fallback, SplitSetting::Forced(3))
        .is_some());
}

#[test]
fn a_file_changed_after_the_folder_was_read_is_an_error_naming_both_ids() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.safetensors");
    write(&path, &decode(1));
    let folder = load_folder(dir.path(), &[SplitSetting::Policy], None, LIMIT).unwrap();
    let case = &folder.cases[0];
    let problem = read_file_case(&case.id, case.file().unwrap(), LIMIT).unwrap();
    assert_eq!(problem.max_kv_len(), 40);
    write(&path, &decode(2));
    let e = read_file_case(&case.id, case.file().unwrap(), LIMIT).unwrap_err();
    assert!(e.contains("changed since") && e.contains(&case.id), "{e}");
}

#[test]
fn a_folder_that_is_not_one_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("x");
    std::fs::write(&file, "x").unwrap();
    for d in [file, dir.path().join("missing")] {
        let e = load_folder(&d, &[SplitSetting::Policy], None, LIMIT).unwrap_err();
        assert!(e.to_string().starts_with("case folder "), "{e}");
    }
}

#[test]
fn split_settings_parse_with_the_matrix_limits() {
    assert_eq!(
        parse_splits("policy, 1,3,3").unwrap(),
        [
            SplitSetting::Policy,
            SplitSetting::Forced(1),
            SplitSetting::Forced(3)
        ]
    );
    for bad in ["", "0", "policy,x", "2000", "-1"] {
        let e = parse_splits(bad).unwrap_err();
        assert!(e.starts_with("--splits"), "{bad}: {e}");
    }
    let many: Vec<String> = (1..=40).map(|n| n.to_string()).collect();
    assert!(parse_splits(&many.join(",")).is_err());
}
