//! Report directories: summaries, JSONL and CSV rows, architectures and duplicates.

use crate::bounded::{relattn_in, tree, Outcome};
use crate::run::*;
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

#[derive(Debug, Clone)]
struct ArchDir {
    name: &'static str,
    /// None: no summary.json; Some(text).
    summary: Option<String>,
    jsonl: Option<String>,
    csv: Option<String>,
}

#[derive(Debug, Clone)]
struct ReportInput {
    /// Per input directory: its architecture directories (`flat`: the directory is one).
    inputs: Vec<(bool, Vec<ArchDir>)>,
    /// 0: show, 1: diff, 2: diff --json, 3: merge.
    command: u8,
}

fn row_json() -> BoxedStrategy<String> {
    let trial = prop::sample::select(vec![
        "gpu::fallback::global_e1024::a::policy::1",
        "gpu::score_mod::global_e1024::a::policy::1",
        "gpu::sheared_bias::local_e512::b::s7::2",
        "reference::oracle::smoke::b::2",
        "routing::sm_90",
    ]);
    let good_status = prop::sample::select(vec![
        "\"pass\"",
        "\"pass\"",
        "\"fail\"",
        "\"skip\"",
        "\"error\"",
    ]);
    let bad_status = prop::sample::select(vec!["\"PASS\"", "3", "null"]);
    let good_figure = prop::sample::select(vec![
        "null", "0.001", "0.02", "0.5", "\"NaN\"", "\"inf\"", "-0.0", "1e308", "5",
    ]);
    let bad_figure = prop::sample::select(vec!["\"x\"", "[]", "true"]);
    let good_param =
        prop::sample::select(vec!["\"\"", "\"global_e1024\"", "\"\\\\N\"", "\"bf16\""]);
    let status = prop_oneof![99 => good_status, 1 => bad_status];
    let figure = prop_oneof![99 => good_figure, 1 => bad_figure];
    let param = prop_oneof![99 => good_param, 1 => Just("7")];
    let seed = prop_oneof![99 => prop::sample::select(vec!["null", "1", "18446744073709551615"]), 1 => Just("-1")];
    (
        trial,
        status,
        figure.clone(),
        figure.clone(),
        figure,
        prop::collection::btree_map(
            prop::sample::select(vec!["layer", "dtype", "regression", "sample_rows"]),
            param,
            0..4,
        ),
        seed,
    )
        .prop_map(|(trial, status, max_abs, bound, tflops, params, seed)| {
            let params: Vec<String> = params
                .iter()
                .map(|(k, v)| format!("\"{k}\": {v}"))
                .collect();
            format!(
                "{{\"case_id\": \"c\", \"trial\": \"{trial}\", \"path\": \"fallback\", \
                 \"status\": {status}, \"max_abs\": {max_abs}, \"bound\": {bound}, \
                 \"tflops\": {tflops}, \"seed\": {seed}, \"params\": {{{}}}}}",
                params.join(", ")
            )
        })
        .boxed()
}

fn arch_dir() -> BoxedStrategy<ArchDir> {
    let arch = prop_oneof![
        6 => prop::sample::select(vec!["\"sm90\"", "\"sm100\"", "\"cpu\"", "\"\"", "null"]),
        1 => prop::sample::select(vec![
            "\"../../escaped\"", "\"/tmp/relattn-fuzz-escaped\"", "\"sm90/../../x\"", "\"SM90\"",
            "\"sm\"", "5",
        ]),
    ];
    let summary = prop::option::weighted(
        0.8,
        prop_oneof![
            12 => (arch, any::<bool>()).prop_map(|(a, complete)| format!(
                "{{\"schema_version\": 1, \"arch\": {a}, \"complete\": {complete}, \
                 \"environment\": {{\"shard\": \"1/2\", \"seeds\": [1]}}}}"
            )),
            1 => prop::sample::select(vec!["{", "[]", "{\"environment\": 5}", ""]).prop_map(str::to_string),
        ],
    );
    let lines = prop::collection::vec(
        prop_oneof![60 => row_json(), 1 => Just("{not json".to_string()), 1 => Just(String::new())],
        0..5,
    );
    let jsonl = prop::option::weighted(
        0.8,
        (lines, prop::bool::weighted(0.1)).prop_map(|(lines, torn)| {
            let mut text = lines.join("\n");
            if !torn && !text.is_empty() {
                text.push('\n');
            }
            text
        }),
    );
    let header = relattn_reports::FIXED_COLUMNS.join(",");
    let csv = prop::option::weighted(
        0.4,
        prop_oneof![
            3 => prop::collection::vec(
                prop::sample::select(vec![
                    "c,gpu::fallback::a::1,fallback,pass,0.001,,,0.02,,1.5,10,100,1,,\\N,",
                    "c,gpu::fallback::a::1,fallback,fail,NaN,,,0.02,1:2:3,,,,,oops,global_e1024,",
                    "c,gpu::score_mod::b::2,score_mod,skip,,,,,,,,,,why,,\\\\x",
                    "c,too,few",
                    "c,x,fallback,maybe,,,,,,,,,,,,",
                ]),
                0..4,
            )
            .prop_map(move |rows| format!("{header},layer,note\n{}\n", rows.join("\n"))),
            1 => Just("case_id,trial\nx,y\n".to_string()),
        ],
    );
    (
        prop::sample::select(vec!["sm90", "sm90", "sm100", "cpu", "cpu", "shard-1"]),
        summary,
        jsonl,
        csv,
    )
        .prop_map(|(name, summary, jsonl, csv)| ArchDir {
            name,
            summary,
            jsonl,
            csv,
        })
        .boxed()
}

fn report_input() -> impl Strategy<Value = ReportInput> {
    (
        prop::collection::vec(
            (
                prop::bool::weighted(0.3),
                prop::collection::vec(arch_dir(), 1..3),
            ),
            1..3,
        ),
        prop::sample::select(vec![0u8, 1, 2, 3, 3]),
    )
        .prop_map(|(inputs, command)| ReportInput { inputs, command })
}

fn write_report(root: &Path, input: &ReportInput) -> Vec<String> {
    let mut dirs = Vec::new();
    for (i, (flat, archs)) in input.inputs.iter().enumerate() {
        let base = root.join(format!("in{i}"));
        let archs = if *flat { &archs[..1] } else { &archs[..] };
        for a in archs {
            let dir = base.join(a.name);
            std::fs::create_dir_all(&dir).unwrap();
            for (file, text) in [
                ("summary.json", &a.summary),
                ("results.jsonl", &a.jsonl),
                ("results.csv", &a.csv),
            ] {
                if let Some(text) = text {
                    std::fs::write(dir.join(file), text).unwrap();
                }
            }
        }
        std::fs::create_dir_all(&base).unwrap();
        // A flat input is given as its one architecture directory.
        dirs.push(if *flat {
            format!("in{i}/{}", archs[0].name)
        } else {
            format!("in{i}")
        });
    }
    dirs
}

fn run_report(input: &ReportInput) -> (Outcome, Option<String>) {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("work");
    std::fs::create_dir(&root).unwrap();
    let dirs = write_report(&root, input);
    let second = dirs.get(1).unwrap_or(&dirs[0]).clone();
    let (args, allowed): (Vec<String>, &[i32]) = match input.command {
        0 => (with_limit(&["report", "show", &dirs[0]]), &[0, 2]),
        1 => (
            with_limit(&["report", "diff", &dirs[0], &second]),
            &[0, 1, 2],
        ),
        2 => (
            with_limit(&["report", "diff", &dirs[0], &second, "--json"]),
            &[0, 1, 2],
        ),
        _ => {
            let mut a = vec!["report".to_string(), "merge".to_string()];
            a.extend(dirs.iter().cloned());
            a.extend(["--out".to_string(), "out/merged".to_string()]);
            (
                with_limit(&a.iter().map(String::as_str).collect::<Vec<_>>()),
                &[0, 2],
            )
        }
    };
    let before = tree(tmp.path());
    let out = relattn_in(&root, &os(&args), None, INPUT_TIMEOUT);
    let mut violation = out.violation(allowed);
    // Nothing may change but what merge writes under --out.
    let after: BTreeMap<PathBuf, u64> = tree(tmp.path())
        .into_iter()
        .filter(|(p, _)| !p.starts_with("work/out"))
        .collect();
    if violation.is_none() && after != before {
        violation = Some(format!(
            "written outside --out: {after:?} (before {before:?})"
        ));
    }
    if violation.is_none() && Path::new("/tmp/relattn-fuzz-escaped").exists() {
        violation = Some("a report escaped to /tmp/relattn-fuzz-escaped".into());
    }
    let left = leftovers(tmp.path());
    if violation.is_none() && !left.is_empty() {
        violation = Some(format!("temporary files left: {left:?}"));
    }
    (out, violation)
}

#[test]
fn fuzz_report_directories() {
    let figures = Mutex::new(Figures::new("report directories"));
    let tmp = tempfile::tempdir().unwrap();
    for dir in [
        "report/arch_relative",
        "report/arch_absolute",
        "report/duplicate_trial",
    ] {
        let d = corpus(dir).display().to_string();
        for args in [
            with_limit(&["report", "show", &d]),
            with_limit(&["report", "merge", &d, "--out", "o"]),
        ] {
            let out = relattn_in(tmp.path(), &os(&args), None, INPUT_TIMEOUT);
            out.check(&[2]);
            assert!(out.elapsed < Duration::from_secs(1), "{:?}", out.elapsed);
            figures.lock().unwrap().record(&out, true);
        }
    }
    assert!(tree(tmp.path()).is_empty());
    fuzz(&figures, 3, report_input(), run_report);
}
