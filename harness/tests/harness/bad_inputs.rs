//! Issue 19: every defect found by trying relattn with malformed and absurd inputs, as a
//! regression. Each runs the binary under a memory limit (`bounded::MEMORY_LIMIT`) and must end
//! within a second in exit 2 with one message naming the file, key or tensor, the value and
//! the limit (or, for a broken pipe, quietly), writing nothing where it does not belong.

use crate::bounded;

use bounded::{relattn, tree, Outcome};
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

const SECOND: Duration = Duration::from_secs(1);

fn corpus(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/corpus")
        .join(rel)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Exit 2 within a second, one `error:` line mentioning every part of `mentions`.
fn refused(out: &Outcome, mentions: &[&str]) {
    out.check(&[2]);
    assert!(out.elapsed < SECOND, "{:?}: {:?}", out.args, out.elapsed);
    let err = out.stderr.trim_end();
    assert!(
        err.starts_with("error: ") && err.lines().count() == 1,
        "{:?}: {err}",
        out.args
    );
    for m in mentions {
        assert!(
            err.contains(m),
            "{:?}: {err:?} does not mention {m:?}",
            out.args
        );
    }
}

/// Copy a corpus directory into `to`.
fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for entry in fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let dest = to.join(path.file_name().unwrap());
        if path.is_dir() {
            copy_dir(&path, &dest);
        } else {
            fs::copy(&path, &dest).unwrap();
        }
    }
}

/// Item 1: empty tensors whose shapes claim 2^40 cache blocks made `reference` and `exec` loop
/// over the blocks before any validation.
#[test]
fn item1_a_case_claiming_2_40_blocks_is_refused_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out.safetensors");
    for (file, mentions) in [
        (
            "case/empty_caches_2_40_blocks.safetensors",
            [
                "`key_cache` dim 0 (num_blocks) = 1099511627776",
                "0..=2147483647",
            ],
        ),
        (
            "case/zero_head_dim_in_range_blocks.safetensors",
            ["`key_cache` dim 3 (D) = 0", "1..=256"],
        ),
    ] {
        let case = corpus(file);
        let name = case.file_name().unwrap().to_str().unwrap().to_string();
        let r = relattn(
            tmp.path(),
            &["reference", "-i", s(&case), "-o", s(&out)],
            SECOND,
        );
        refused(&r, &[&name, mentions[0], mentions[1]]);
        for path in ["fallback", "score_mod", "sheared_bias"] {
            let e = relattn(
                tmp.path(),
                &[
                    "exec",
                    "--path",
                    path,
                    "--input",
                    s(&case),
                    "--output",
                    s(&out),
                ],
                SECOND,
            );
            refused(&e, &[&name, mentions[0]]);
        }
        assert!(!out.exists());
    }
}

/// Item 2: matrix files the parser accepted crashed `matrix --show` and `run`.
#[test]
fn item2_matrix_files_that_crashed_show_and_run_are_refused_at_load() {
    let tmp = tempfile::tempdir().unwrap();
    let splits: Vec<String> = (1..=100_000).map(|i| i.to_string()).collect();
    let splits_file = tmp.path().join("splits_100000.toml");
    fs::write(
        &splits_file,
        format!(
            "[[group]]\nlayers = [\"global_e1024\"]\nheads = [[8, 1]]\nmixes = [\"decode\"]\n\
             splits = [{}]\n",
            splits.join(", ")
        ),
    )
    .unwrap();
    let cases: [(PathBuf, &[&str]); 10] = [
        (
            corpus("matrix/product_1e18.toml"),
            &["1000000000000000000 cases", "limit of 100000"],
        ),
        (
            corpus("matrix/product_1e8.toml"),
            &["100000000 cases", "limit of 100000"],
        ),
        (
            corpus("matrix/extent_2_32.toml"),
            &["layers", "global_e4294967296", "1..=2147483647"],
        ),
        (
            corpus("matrix/page_size_2_40.toml"),
            &["page_sizes = 1099511627776", "1..=4096"],
        ),
        (
            corpus("matrix/spare_pages_2_63.toml"),
            &["spare_pages = 9223372036854775807", "0..=2147483647"],
        ),
        (
            corpus("matrix/spare_pages_2_32.toml"),
            &["spare_pages = 4294967296", "0..=2147483647"],
        ),
        (
            corpus("matrix/local_extent_2_64_minus_1.toml"),
            &["local_e18446744073709551615", "1..=2147483647"],
        ),
        (
            corpus("matrix/heads_arity_3.toml"),
            &["heads = [8, 2, 1]", "two numbers"],
        ),
        (
            corpus("matrix/window_lk_past_int32.toml"),
            &[
                "local_e2147483647",
                "window_edges",
                "Lk of request",
                "0..=2147483647",
            ],
        ),
        (
            splits_file,
            &["splits = a list of 100000 settings", "at most 32"],
        ),
    ];
    let out_dir = tmp.path().join("reports");
    for (file, mentions) in cases {
        let name = file.file_name().unwrap().to_str().unwrap().to_string();
        let mut all = vec![name.as_str()];
        all.extend_from_slice(mentions);
        let show = relattn(tmp.path(), &["matrix", "--show", s(&file)], SECOND);
        refused(&show, &all);
        let run = relattn(
            tmp.path(),
            &["run", "--matrix", s(&file), "--out", s(&out_dir)],
            SECOND,
        );
        refused(&run, &all);
        assert!(!out_dir.exists(), "{name}: run wrote a report");
    }
}

/// Item 2, the case-byte limit: a matrix case in range but too large for the limit is never
/// generated. With a usable GPU `run` refuses it (exit 2, naming the case and the limit); without
/// one (as here, where relattn sees no GPU on any machine), its trials are skipped with that
/// reason and the rest of the run goes on (a CPU machine cannot run that case, which is no reason
/// to refuse the others), in bounded time.
#[test]
fn item2_run_never_generates_a_case_over_the_byte_limit() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("big.toml");
    fs::write(
        &file,
        "[[group]]\nlayers = [\"global_e2147483647\"]\nheads = [[8, 1]]\nmixes = [\"decode\"]\n",
    )
    .unwrap();
    let run = relattn(
        tmp.path(),
        &[
            "--max-case-bytes",
            "64M",
            "run",
            "--matrix",
            s(&file),
            "--out",
            "r",
        ],
        SECOND,
    );
    run.check(&[0]);
    let rows = fs::read_to_string(tmp.path().join("r/cpu/results.jsonl")).unwrap();
    let skipped: Vec<&str> = rows
        .lines()
        .filter(|l| l.contains("needs a host with more memory"))
        .collect();
    assert!(!skipped.is_empty(), "{rows}");
    for needle in ["global_e2147483647", "in memory takes", "--max-case-bytes"] {
        assert!(skipped[0].contains(needle), "{needle}: {}", skipped[0]);
    }
}

/// Item 3: `relattn gen` had no memory bound, and two arguments overflowed into panics.
#[test]
fn item3_gen_requests_past_the_limits_are_refused_writing_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let text = fs::read_to_string(corpus("cli/gen.txt")).unwrap();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .collect();
    assert!(lines.len() >= 10);
    for line in lines {
        let (line, mention) = line.split_once(" | ").expect("ARGS | MENTION");
        let mut args = vec!["gen", "--output", "case.safetensors"];
        args.extend(line.split_whitespace());
        let out = relattn(tmp.path(), &args, SECOND);
        refused(&out, &[mention]);
        assert!(
            out.stderr.contains("out of range") || out.stderr.contains("over the limit"),
            "{line}: {}",
            out.stderr
        );
        assert!(
            tree(tmp.path()).is_empty(),
            "{line}: wrote {:?}",
            tree(tmp.path())
        );
    }
}

/// Item 4: `reference --input F --output F` destroyed F.
#[test]
fn item4_an_output_that_is_the_input_is_refused_and_the_input_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let made = relattn(
        tmp.path(),
        &["gen", "--preset", "tiny", "-o", "c.safetensors"],
        SECOND,
    );
    made.check(&[0]);
    let case = tmp.path().join("c.safetensors");
    let before = fs::read(&case).unwrap();
    fs::create_dir(tmp.path().join("d")).unwrap();
    for spelling in ["c.safetensors", "./c.safetensors", "d/../c.safetensors"] {
        let r = relattn(
            tmp.path(),
            &["reference", "-i", "c.safetensors", "-o", spelling],
            SECOND,
        );
        refused(&r, &[spelling, "is the input file"]);
        let e = relattn(
            tmp.path(),
            &[
                "exec",
                "--path",
                "fallback",
                "--input",
                "c.safetensors",
                "--output",
                spelling,
            ],
            SECOND,
        );
        refused(&e, &[spelling, "is the input file"]);
    }
    std::os::unix::fs::symlink(&case, tmp.path().join("link.safetensors")).unwrap();
    let r = relattn(
        tmp.path(),
        &["reference", "-i", "c.safetensors", "-o", "link.safetensors"],
        SECOND,
    );
    refused(&r, &["is the input file"]);
    assert_eq!(fs::read(&case).unwrap(), before);
    // Writes go to a temporary file beside the target, renamed into place: a good run leaves
    // exactly its output.
    let r = relattn(
        tmp.path(),
        &["reference", "-i", "c.safetensors", "-o", "r.safetensors"],
        SECOND,
    );
    r.check(&[0]);
    let names: Vec<String> = tree(tmp.path())
        .into_keys()
        .map(|p| p.display().to_string())
        .collect();
    assert_eq!(
        names,
        ["c.safetensors", "d", "link.safetensors", "r.safetensors"]
    );
}

/// Item 5: `report merge` used an input's `arch` as a path and wrote outside `--out`.
#[test]
fn item5_merge_never_writes_outside_out() {
    for dir in ["report/arch_relative", "report/arch_absolute"] {
        let tmp = tempfile::tempdir().unwrap();
        let input = tmp.path().join("a/b/in");
        copy_dir(&corpus(dir), &input);
        let before = tree(tmp.path());
        let out = tmp.path().join("a/b/out");
        let m = relattn(
            tmp.path(),
            &["report", "merge", s(&input), "--out", s(&out)],
            SECOND,
        );
        refused(&m, &["summary.json", "sm<digits>"]);
        assert_eq!(tree(tmp.path()), before, "{dir}: merge wrote something");
        assert!(!Path::new("/tmp/relattn-escaped").exists());
    }
}

/// Item 6: a duplicated trial made `show` say FAIL while `diff` used the first copy; a report
/// read from results.csv lost its empty parameters and conflicted with its own JSONL.
#[test]
fn item6_reports_agree_with_themselves() {
    let tmp = tempfile::tempdir().unwrap();
    let dup = corpus("report/duplicate_trial");
    let good = corpus("report/empty_params_jsonl");
    let cases: [&[&str]; 4] = [
        &["report", "show", s(&dup)],
        &["report", "diff", s(&good), s(&dup)],
        &["report", "diff", s(&dup), s(&good)],
        &["report", "merge", s(&dup), "--out", "merged"],
    ];
    for args in cases {
        let out = relattn(tmp.path(), args, SECOND);
        refused(
            &out,
            &["gpu::fallback::a::1", "appears twice", "lines 1 and 3"],
        );
    }
    assert!(!tmp.path().join("merged").exists());
    let csv = corpus("report/empty_params_csv");
    let m = relattn(
        tmp.path(),
        &["report", "merge", s(&good), s(&csv), "--out", "merged"],
        SECOND,
    );
    m.check(&[0]);
    assert!(
        m.stdout_text().contains("sm90: 1 trials (1 pass"),
        "{}",
        m.stdout_text()
    );
    let d = relattn(tmp.path(), &["report", "diff", s(&csv), s(&good)], SECOND);
    d.check(&[0]);
}

/// Item 7: `relattn matrix --show nightly | head` panicked on the broken pipe.
#[test]
fn item7_a_broken_pipe_ends_quietly() {
    use std::io::Read;
    use std::process::Stdio;
    for args in [
        &["matrix", "--show", "nightly"][..],
        &["matrix", "--show", "nightly", "--skipped"][..],
        &["report", "show", s(&corpus("report/empty_params_jsonl"))][..],
        &[
            "route",
            "--cc",
            "9.0",
            "--batch",
            "1",
            "--max-query-len",
            "1",
            "--heads",
            "8",
            "--kv-heads",
            "1",
            "--max-kv-len",
            "4096",
            "--json",
        ][..],
        &["devices"][..],
    ] {
        let mut child = crate::binary::relattn_command()
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Read a line's worth, as `head -c 10` would, and close the pipe.
        let mut stdout = child.stdout.take().unwrap();
        let mut first = [0u8; 10];
        let _ = stdout.read(&mut first);
        drop(stdout);
        let start = std::time::Instant::now();
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            matches!(out.status.code(), Some(0) | Some(141)),
            "{args:?}: {:?} {stderr}",
            out.status
        );
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert!(start.elapsed() < SECOND);
    }
}
