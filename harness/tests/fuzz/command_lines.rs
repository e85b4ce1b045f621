//! Command lines: every subcommand with flags and values on and past their limits.

use crate::bounded::{relattn_in, tree, Outcome, CASE_LIMIT};
use crate::run::*;
use proptest::prelude::*;
use relattn_reference::casefile::{write_case, CaseMeta};
use relattn_reference::gen::{generate, GenSpec};
use std::sync::Mutex;
use std::time::Duration;

#[derive(Debug, Clone)]
struct CommandLine {
    args: Vec<String>,
    /// Commands that need a GPU may also exit 3.
    gpu: bool,
}

fn value() -> BoxedStrategy<String> {
    prop_oneof![
        4 => number().prop_map(|n| n.to_string()),
        2 => signed().prop_map(|n| n.to_string()),
        1 => prop::sample::select(vec![
            "", "x", "1/0", "1/128", "nan", "-", "1:4", "1:4,2:3", "5:3", "0:0", "1:2000000000",
            "8/1", "0/0", "9.0", "12.1", "all", "routed", "on", "both", "sm90",
        ])
        .prop_map(str::to_string),
        1 => "[ -~]{0,10}",
    ]
    .boxed()
}

fn flags(names: Vec<&'static str>, max: usize) -> BoxedStrategy<Vec<String>> {
    prop::collection::vec((prop::sample::select(names), value(), 0u8..4), 0..max)
        .prop_map(|flags| {
            let mut out = Vec::new();
            for (name, value, form) in flags {
                out.push(name.to_string());
                // Most flags take a value; some are switches, and a value may be missing.
                if form > 0 {
                    out.push(value);
                }
            }
            out
        })
        .boxed()
}

fn command_line() -> impl Strategy<Value = CommandLine> {
    let gen = (
        prop::option::weighted(
            0.6,
            prop::sample::select(vec![
                "tiny",
                "decode",
                "prefill",
                "chunked",
                "mixed",
                "local",
                "gqa16",
                "verify",
                "zero_table",
                "huge",
            ]),
        ),
        flags(
            vec![
                "--heads",
                "--kv-heads",
                "--head-dim",
                "--extent",
                "--window-left",
                "--local",
                "--scale",
                "--page-size",
                "--layout",
                "--dtype",
                "--requests",
                "--padding-rows",
                "--bias",
                "--all-zero-pages",
                "--no-poison",
                "--spare-pages",
                "--seed",
                "--case-id",
            ],
            5,
        ),
    )
        .prop_map(|(preset, flags)| {
            let mut a = vec![
                "gen".to_string(),
                "--output".to_string(),
                "g.safetensors".to_string(),
            ];
            if let Some(p) = preset {
                a.extend(["--preset".to_string(), p.to_string()]);
            }
            a.extend(flags);
            (a, false)
        });
    // Requests within the case-byte limit: the flags a person would give, most of them valid.
    let good_gen = (
        prop::sample::select(vec![(8usize, 1usize), (16, 2), (4, 4), (64, 8), (6, 4)]),
        prop::collection::vec((0usize..70, 0usize..3000), 1..4),
        prop::option::of(prop::sample::select(vec![
            "32", "64", "128", "256", "0", "257",
        ])),
        prop::option::of(prop::sample::select(vec!["16", "64", "256", "4096", "1"])),
        prop::option::of(prop::sample::select(vec!["bf16", "fp16", "fp32", "fp8"])),
        prop::option::of(prop::sample::select(vec![
            "--local",
            "--all-zero-pages",
            "--no-poison",
        ])),
        prop::option::of(prop::sample::select(vec![
            "nhd_packed",
            "hnd",
            "contiguous",
        ])),
        any::<u64>(),
    )
        .prop_map(
            |((h, hkv), requests, d, page, dtype, switch, layout, seed)| {
                let req: Vec<String> = requests.iter().map(|(q, k)| format!("{q}:{k}")).collect();
                let mut a: Vec<String> = [
                    "gen",
                    "-o",
                    "g.safetensors",
                    "--heads",
                    &h.to_string(),
                    "--kv-heads",
                    &hkv.to_string(),
                    "--requests",
                    &req.join(","),
                    "--seed",
                    &seed.to_string(),
                ]
                .iter()
                .map(|x| x.to_string())
                .collect();
                for (flag, v) in [
                    ("--head-dim", d),
                    ("--page-size", page),
                    ("--dtype", dtype),
                    ("--layout", layout),
                ] {
                    if let Some(v) = v {
                        a.extend([flag.to_string(), v.to_string()]);
                    }
                }
                a.extend(switch.map(str::to_string));
                (a, false)
            },
        );
    let good_route = (
        prop::sample::select(vec![
            "8.0", "8.6", "8.9", "9.0", "10.0", "10.3", "11.0", "12.0", "12.1", "7.5", "13.0",
        ]),
        any::<bool>(),
        1usize..300,
        1usize..5000,
        prop::sample::select(vec![(8usize, 1usize), (16, 2), (64, 8), (32, 4)]),
        prop::sample::select(vec![16usize, 64, 128, 256]),
        any::<bool>(),
    )
        .prop_map(|(cc, local, batch, len, (h, hkv), page, json)| {
            let (q, k) = (len.min(64), len);
            let mut a: Vec<String> = [
                "route",
                "--cc",
                cc,
                "--batch",
                &batch.to_string(),
                "--max-query-len",
                &q.to_string(),
                "--heads",
                &h.to_string(),
                "--kv-heads",
                &hkv.to_string(),
                "--max-kv-len",
                &k.to_string(),
                "--page-size",
                &page.to_string(),
            ]
            .iter()
            .map(|x| x.to_string())
            .collect();
            if local {
                a.extend([
                    "--local".to_string(),
                    "--window-left".to_string(),
                    "511".to_string(),
                ]);
            }
            if json {
                a.push("--json".to_string());
            }
            (a, false)
        });
    let route = flags(
        vec![
            "--cc",
            "--local",
            "--batch",
            "--max-query-len",
            "--heads",
            "--kv-heads",
            "--max-kv-len",
            "--page-size",
            "--window-left",
            "--json",
        ],
        10,
    )
    .prop_map(|f| {
        let mut a = vec!["route".to_string()];
        a.extend(f);
        (a, false)
    });
    let matrix = (
        prop::sample::select(vec!["--list", "--show"]),
        prop::sample::select(vec![
            "smoke",
            "ci",
            "nightly",
            "regressions",
            "weekly",
            "c.safetensors",
            "missing.toml",
            ".",
        ]),
        flags(vec!["--shard", "--skipped"], 2),
    )
        .prop_map(|(mode, tier, f)| {
            let mut a = vec!["matrix".to_string(), mode.to_string()];
            if mode == "--show" {
                a.push(tier.to_string());
            }
            a.extend(f);
            (a, false)
        });
    let inputs = prop::sample::select(vec![
        "c.safetensors",
        "missing.safetensors",
        ".",
        "o.safetensors",
        "./c.safetensors",
    ]);
    let reference = (
        inputs.clone(),
        inputs.clone(),
        flags(vec!["--sample-rows", "--seed"], 2),
    )
        .prop_map(|(i, o, f)| {
            let mut a = vec![
                "reference".to_string(),
                "-i".into(),
                i.into(),
                "-o".into(),
                o.into(),
            ];
            a.extend(f);
            (a, false)
        });
    let judge = (
        inputs.clone(),
        inputs.clone(),
        flags(vec!["--sample-rows", "--seed", "--json"], 2),
    )
        .prop_map(|(i, o, f)| {
            let mut a = vec![
                "judge".to_string(),
                "-i".into(),
                i.into(),
                "-o".into(),
                o.into(),
            ];
            a.extend(f);
            (a, false)
        });
    // A smoke case (the first of the tier), prefixes of it, ids without the letter, and junk.
    let gen_case = (
        prop::sample::select(vec!["c1b24787ba2", "c1b2", "c", "1b24787ba2", "zz", ""]),
        prop::option::of(prop::sample::select(vec![
            "smoke",
            "regressions",
            "missing.toml",
            "c.safetensors",
        ])),
        flags(vec!["--preset", "--heads", "--seed"], 1),
    )
        .prop_map(|(id, matrix, f)| {
            let mut a: Vec<String> = ["gen", "-o", "g.safetensors", "--case", id]
                .iter()
                .map(|x| x.to_string())
                .collect();
            if let Some(m) = matrix {
                a.extend(["--matrix".to_string(), m.to_string()]);
            }
            a.extend(f);
            (a, false)
        });
    let exec = (
        prop::sample::select(vec!["fallback", "score_mod", "sheared_bias", "flash"]),
        inputs.clone(),
        inputs,
        flags(vec!["--splits", "--device", "--bounds-check"], 3),
    )
        .prop_map(|(p, i, o, f)| {
            let mut a = vec![
                "exec".to_string(),
                "--path".into(),
                p.into(),
                "--input".into(),
                i.into(),
                "--output".into(),
                o.into(),
            ];
            a.extend(f);
            (a, true)
        });
    let report = (
        prop::sample::select(vec!["show", "diff", "merge", "print"]),
        prop::collection::vec(
            prop::sample::select(vec![".", "missing", "c.safetensors", "empty"]),
            0..3,
        ),
        flags(
            vec![
                "--out",
                "--error-factor",
                "--throughput-drop",
                "--ratio-floor",
                "--json",
                "--strict-coverage",
            ],
            3,
        ),
    )
        .prop_map(|(sub, dirs, f)| {
            let mut a = vec!["report".to_string(), sub.to_string()];
            a.extend(dirs.into_iter().map(str::to_string));
            a.extend(f);
            (a, false)
        });
    // `run` only as far as loading: no case id starts with "zz".
    let run = flags(
        vec![
            "--matrix",
            "--paths",
            "--shard",
            "--devices",
            "--bounds-check",
            "--out",
        ],
        3,
    )
    .prop_map(|f| {
        let mut a = vec![
            "run".to_string(),
            "--case".into(),
            "zz".into(),
            "--out".into(),
            "r".into(),
        ];
        a.extend(f);
        (a, false)
    });
    // GPU commands with an option they refuse, so that a machine with a GPU does not start them.
    let gpu = (
        prop::sample::select(vec!["bench", "mutants", "bench-reference"]),
        prop::sample::select(vec!["--reps", "--only", "--shapes", "--paths", "--matrix"]),
        prop::sample::select(vec!["0", "nothing", "-1", ""]),
    )
        .prop_map(|(c, flag, v)| {
            (
                vec![
                    c.to_string(),
                    flag.to_string(),
                    v.to_string(),
                    "--bogus".into(),
                ],
                true,
            )
        });
    let junk = prop::collection::vec(
        prop_oneof![
            prop::sample::select(vec![
                "--help",
                "--version",
                "-h",
                "help",
                "devices",
                "run",
                "gen",
                "frobnicate",
                "--",
                "--max-case-bytes",
                "-x",
            ])
            .prop_map(str::to_string),
            "[ -~]{0,8}",
            any::<String>(),
        ],
        0..4,
    )
    .prop_map(|a| {
        // `run` alone would run the CPU part of the smoke tier: keep it to loading.
        let mut a = a;
        if a.first().is_some_and(|x| x == "run") {
            a.extend([
                "--case".to_string(),
                "zz".to_string(),
                "--out".to_string(),
                "r".to_string(),
            ]);
        }
        (a, false)
    });
    let limit = prop_oneof![
        8 => Just(Some(CASE_LIMIT.to_string())),
        1 => prop::sample::select(vec!["0", "1", "1K", "1.5G", "-1", "99999999999999999999T", "16777216T"])
            .prop_map(|s| Some(s.to_string())),
        1 => Just(None),
    ];
    (
        prop_oneof![
            3 => good_gen, 2 => gen, 2 => good_route, 1 => route, 1 => matrix, 2 => reference,
            1 => judge, 1 => gen_case, 1 => exec, 2 => report, 1 => run, 1 => gpu, 1 => junk,
        ],
        limit,
    )
        .prop_map(|((args, gpu), limit)| {
            let mut full = Vec::new();
            if let Some(l) = limit {
                full.extend(["--max-case-bytes".to_string(), l]);
            }
            full.extend(args);
            CommandLine { args: full, gpu }
        })
}

/// A tiny case file for the command lines that read one.
fn tiny_case() -> Vec<u8> {
    static CASE: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    CASE.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.safetensors");
        let p = generate(&GenSpec::global(2, 1, vec![(2, 5), (1, 3)], 3)).unwrap();
        write_case(&path, &p, &CaseMeta::of(&p)).unwrap();
        std::fs::read(&path).unwrap()
    })
    .clone()
}

fn run_command_line(input: &CommandLine) -> (Outcome, Option<String>) {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("c.safetensors"), tiny_case()).unwrap();
    std::fs::create_dir(tmp.path().join("empty")).unwrap();
    let before = std::fs::read(tmp.path().join("c.safetensors")).unwrap();
    let out = relattn_in(tmp.path(), &os(&input.args), None, INPUT_TIMEOUT);
    let allowed: &[i32] = if input.gpu { &[0, 1, 2, 3] } else { &[0, 1, 2] };
    let mut violation = out.violation(allowed);
    if violation.is_none() && std::fs::read(tmp.path().join("c.safetensors")).ok() != Some(before) {
        violation = Some("the input case file was changed".into());
    }
    let left = leftovers(tmp.path());
    if violation.is_none() && !left.is_empty() {
        violation = Some(format!("temporary files left: {left:?}"));
    }
    (out, violation)
}

#[test]
fn fuzz_command_lines() {
    let figures = Mutex::new(Figures::new("command lines"));
    let text = std::fs::read_to_string(corpus("cli/gen.txt")).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    for line in text
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
    {
        let (line, _) = line.split_once(" | ").unwrap();
        let mut args = with_limit(&["gen", "--output", "g.safetensors"]);
        args.extend(line.split_whitespace().map(str::to_string));
        let out = relattn_in(tmp.path(), &os(&args), None, INPUT_TIMEOUT);
        out.check(&[2]);
        assert!(out.elapsed < Duration::from_secs(1), "{:?}", out.elapsed);
        figures.lock().unwrap().record(&out, true);
    }
    assert!(tree(tmp.path()).is_empty());
    fuzz(&figures, 4, command_line(), run_command_line);
}
