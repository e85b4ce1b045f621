//! Matrix files: groups of axes with values on and past the limits, wrong arities and types.

use crate::bounded::{relattn_in, tree, Outcome};
use crate::run::*;
use proptest::prelude::*;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

#[derive(Debug, Clone)]
struct MatrixInput {
    text: String,
    /// 0: matrix --show, 1: --show --skipped, 2: --show --shard, 3: run --case zz.
    command: u8,
    shard: (u64, u64),
}

fn toml_list(items: Vec<String>) -> String {
    format!("[{}]", items.join(", "))
}

fn list_of(item: BoxedStrategy<String>) -> BoxedStrategy<String> {
    prop_oneof![
        8 => prop::collection::vec(item.clone(), 1..3).prop_map(toml_list),
        1 => prop::collection::vec(item, 0..6).prop_map(toml_list),
        1 => prop::sample::select(vec!["5", "\"x\"", "[[]]", "{}", "true"]).prop_map(str::to_string),
    ]
    .boxed()
}

fn toml_int() -> BoxedStrategy<String> {
    prop_oneof![
        4 => number().prop_map(|n| n.min(i64::MAX as u64).to_string()),
        1 => signed().prop_map(|n| n.to_string()),
        1 => Just("18446744073709551615".to_string()),
        1 => Just("\"16\"".to_string()),
        1 => Just("1.5".to_string()),
    ]
    .boxed()
}

fn layer_name() -> BoxedStrategy<String> {
    prop_oneof![
        4 => prop::sample::select(vec![
            "global_e1024", "local_e512", "global_e128", "local_e128", "local_e512_w300",
            "global_e64", "local_e256_w64", "global_e1000",
        ])
        .prop_map(|s| format!("\"{s}\"")),
        2 => number().prop_map(|n| format!("\"global_e{n}\"")),
        2 => number().prop_map(|n| format!("\"local_e{n}\"")),
        2 => (number(), signed()).prop_map(|(e, w)| format!("\"local_e{e}_w{w}\"")),
        1 => "[a-z_0-9]{0,12}".prop_map(|s| format!("\"{s}\"")),
    ]
    .boxed()
}

fn head_pair() -> BoxedStrategy<String> {
    prop_oneof![
        6 => prop::sample::select(vec!["[8, 1]", "[16, 2]", "[4, 4]", "[64, 8]", "[8, 2]"])
            .prop_map(str::to_string),
        3 => prop::collection::vec(toml_int(), 0..4).prop_map(toml_list),
    ]
    .boxed()
}

fn quoted(names: Vec<&'static str>) -> BoxedStrategy<String> {
    prop_oneof![
        6 => prop::sample::select(names).prop_map(|s| format!("\"{s}\"")),
        1 => "[a-z_0-9]{0,10}".prop_map(|s| format!("\"{s}\"")),
    ]
    .boxed()
}

fn split_value() -> BoxedStrategy<String> {
    prop_oneof![
        3 => toml_int(),
        2 => prop::sample::select(vec!["\"policy\"", "\"s7\"", "\"s0\"", "\"often\"", "\"1\""])
            .prop_map(str::to_string),
    ]
    .boxed()
}

/// `good` most of the time in a group meant to load (`hostile` false), half the time otherwise.
fn pick(
    hostile: bool,
    good: BoxedStrategy<String>,
    bad: BoxedStrategy<String>,
) -> BoxedStrategy<String> {
    if hostile {
        prop_oneof![1 => good, 1 => bad].boxed()
    } else {
        prop_oneof![19 => good, 1 => bad].boxed()
    }
}

/// A required key: always there in a group meant to load, missing now and then otherwise.
fn required(hostile: bool, value: BoxedStrategy<String>) -> BoxedStrategy<Option<String>> {
    if hostile {
        prop::option::weighted(0.9, value).boxed()
    } else {
        value.prop_map(Some).boxed()
    }
}

fn good_list(items: Vec<&'static str>) -> BoxedStrategy<String> {
    prop::collection::vec(prop::sample::select(items), 1..3)
        .prop_map(|v| toml_list(v.into_iter().map(str::to_string).collect()))
        .boxed()
}

fn group_text(hostile: bool) -> BoxedStrategy<String> {
    let mixes: Vec<&'static str> = relattn_matrices::MIXES.iter().map(|m| m.name).collect();
    let quoted_mixes: Vec<&'static str> = mixes
        .iter()
        .map(|m| &*Box::leak(format!("\"{m}\"").into_boxed_str()))
        .collect();
    let classes: Vec<&'static str> = relattn_matrices::REGRESSION_CLASSES
        .iter()
        .map(|(c, _)| *c)
        .collect();
    let optional =
        move |key: &'static str, good: BoxedStrategy<String>, bad: BoxedStrategy<String>| {
            prop::option::weighted(
                0.3,
                pick(hostile, good, bad).prop_map(move |v| format!("{key} = {v}\n")),
            )
            .boxed()
        };
    let small_ints = |v: Vec<&'static str>| good_list(v);
    let splits_bad = prop_oneof![
        8 => list_of(split_value()),
        1 => (1usize..40).prop_map(|n| toml_list((1..=n).map(|i| i.to_string()).collect())),
    ]
    .boxed();
    let layers = pick(
        hostile,
        good_list(vec![
            "\"global_e1024\"",
            "\"local_e512\"",
            "\"global_e128\"",
            "\"local_e128\"",
            "\"local_e512_w300\"",
            "\"global_e64\"",
            "\"local_e256_w64\"",
            "\"global_e1000\"",
            "\"local_e512_w4294967296\"",
        ]),
        list_of(layer_name()),
    );
    let heads = pick(
        hostile,
        good_list(vec![
            "[8, 1]", "[16, 2]", "[4, 4]", "[64, 8]", "[8, 2]", "[32, 8]",
        ]),
        list_of(head_pair()),
    );
    let mix_list = pick(hostile, good_list(quoted_mixes), list_of(quoted(mixes)));
    (
        required(hostile, layers),
        required(hostile, heads),
        required(hostile, mix_list),
        (
            optional(
                "head_dims",
                small_ints(vec!["64", "128", "256"]),
                list_of(toml_int()),
            ),
            optional(
                "page_sizes",
                small_ints(vec!["16", "32", "64", "128", "256", "4096"]),
                list_of(toml_int()),
            ),
            optional(
                "layouts",
                good_list(vec!["\"nhd_packed\"", "\"hnd_packed\"", "\"contiguous\""]),
                list_of(quoted(vec!["nhd_packed", "hnd_packed", "contiguous"])),
            ),
            optional(
                "dtypes",
                good_list(vec!["\"bf16\"", "\"fp16\"", "\"fp32\""]),
                list_of(quoted(vec!["bf16", "fp16", "fp32"])),
            ),
            optional(
                "bias",
                good_list(vec!["\"normal\"", "\"distinct\"", "\"zero\""]),
                list_of(quoted(vec!["normal", "distinct", "zero"])),
            ),
        ),
        (
            optional(
                "splits",
                good_list(vec!["\"policy\"", "1", "2", "7", "16", "32", "128", "1024"]),
                splits_bad,
            ),
            optional(
                "seeds",
                small_ints(vec!["1", "2", "3", "9223372036854775807"]),
                list_of(toml_int()),
            ),
            optional(
                "spare_pages",
                prop::sample::select(vec!["0", "1", "3", "2147483000"])
                    .prop_map(str::to_string)
                    .boxed(),
                toml_int(),
            ),
            optional(
                "sample_rows",
                prop::sample::select(vec!["1", "16", "1000000"])
                    .prop_map(str::to_string)
                    .boxed(),
                toml_int(),
            ),
            optional(
                "poison",
                prop::sample::select(vec!["true", "false"])
                    .prop_map(str::to_string)
                    .boxed(),
                Just("1".to_string()).boxed(),
            ),
            optional(
                "scale",
                prop::sample::select(vec!["0.0078125", "0.5"])
                    .prop_map(str::to_string)
                    .boxed(),
                prop::sample::select(vec!["1e300", "nan", "inf", "-1.0", "0.0", "2"])
                    .prop_map(str::to_string)
                    .boxed(),
            ),
            optional(
                "regression",
                quoted(classes),
                "[a-z]{0,6}".prop_map(|s| format!("\"{s}\"")).boxed(),
            ),
            if hostile {
                optional(
                    "page_size",
                    Just("[16]".to_string()).boxed(),
                    Just("[16]".to_string()).boxed(),
                )
            } else {
                Just(None).boxed()
            },
        ),
    )
        .prop_map(|(layers, heads, mixes, a, b)| {
            let mut text = String::from("[[group]]\n");
            for (key, v) in [("layers", layers), ("heads", heads), ("mixes", mixes)] {
                if let Some(v) = v {
                    text.push_str(&format!("{key} = {v}\n"));
                }
            }
            for line in [
                a.0, a.1, a.2, a.3, a.4, b.0, b.1, b.2, b.3, b.4, b.5, b.6, b.7,
            ]
            .into_iter()
            .flatten()
            {
                text.push_str(&line);
            }
            text
        })
        .boxed()
}

fn matrix_input() -> impl Strategy<Value = MatrixInput> {
    let tolerance = prop::option::weighted(
        0.15,
        (
            quoted(vec!["bf16", "fp16", "fp32"]),
            prop::sample::select(vec!["rtol", "atol", "atol2", "rtol2", "eps"]),
            prop::sample::select(vec!["2.0", "0.0", "-1.0", "nan", "inf", "\"x\""]),
        )
            .prop_map(|(d, k, v)| format!("[tolerance.{}]\n{k} = {v}\n", d.trim_matches('"'))),
    );
    let groups = prop_oneof![
        3 => prop::collection::vec(group_text(false), 1..3),
        2 => prop::collection::vec(group_text(true), 0..3),
    ];
    (
        groups,
        tolerance,
        prop::option::weighted(0.05, 0u16..1000),
        prop::sample::select(vec![0u8, 0, 1, 2, 3]),
        (number(), number()),
    )
        .prop_map(|(groups, tolerance, cut, command, shard)| {
            let mut text = tolerance.unwrap_or_default();
            text.push_str(&groups.join("\n"));
            if let Some(per_mille) = cut {
                let mut at = text.len() * per_mille as usize / 1000;
                while !text.is_char_boundary(at) {
                    at -= 1;
                }
                text.truncate(at);
            }
            MatrixInput {
                text,
                command,
                shard,
            }
        })
}

fn run_matrix(input: &MatrixInput) -> (Outcome, Option<String>) {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("m.toml"), &input.text).unwrap();
    let shard = format!("{}/{}", input.shard.0 % 5, input.shard.1 % 5);
    let args = match input.command {
        0 => with_limit(&["matrix", "--show", "m.toml"]),
        1 => with_limit(&["matrix", "--show", "m.toml", "--skipped"]),
        2 => with_limit(&["matrix", "--show", "m.toml", "--shard", &shard]),
        // No case id starts with "zz": a matrix that loads ends in exit 2 before any trial.
        _ => with_limit(&[
            "run", "--matrix", "m.toml", "--out", "reports", "--case", "zz",
        ]),
    };
    let allowed: &[i32] = if input.command == 3 { &[2] } else { &[0, 2] };
    let before = tree(tmp.path());
    let out = relattn_in(tmp.path(), &os(&args), None, INPUT_TIMEOUT);
    let mut violation = out.violation(allowed);
    if violation.is_none() && tree(tmp.path()) != before {
        violation = Some(format!("files were written: {:?}", tree(tmp.path())));
    }
    if violation.is_some() {
        violation = violation.map(|v| format!("{v}\nmatrix file:\n{}", input.text));
    }
    (out, violation)
}

#[test]
fn fuzz_matrix_files() {
    let figures = Mutex::new(Figures::new("matrix files"));
    let dir = corpus("matrix");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let tmp = tempfile::tempdir().unwrap();
    for file in files {
        let f = file.display().to_string();
        for args in [
            with_limit(&["matrix", "--show", &f]),
            with_limit(&["run", "--matrix", &f, "--out", "r"]),
        ] {
            let out = relattn_in(tmp.path(), &os(&args), None, INPUT_TIMEOUT);
            out.check(&[2]);
            assert!(out.elapsed < Duration::from_secs(1), "{:?}", out.elapsed);
            figures.lock().unwrap().record(&out, true);
        }
    }
    assert!(tree(tmp.path()).is_empty());
    fuzz(&figures, 2, matrix_input(), run_matrix);
}
