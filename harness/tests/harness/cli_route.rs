//! `relattn route` and `relattn devices` as a user runs them.

use crate::common;
use common::relattn;

fn route_json(extra: &[&str]) -> (i32, serde_json::Value) {
    let mut args = vec!["route", "--json"];
    args.extend_from_slice(extra);
    let out = relattn(&args);
    let code = out.status.code().expect("exit code");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let value = serde_json::from_str(stdout.trim()).unwrap_or(serde_json::Value::Null);
    (code, value)
}

const DECODE_TP8: [&str; 10] = [
    "--batch",
    "1",
    "--max-query-len",
    "1",
    "--heads",
    "8",
    "--kv-heads",
    "1",
    "--max-kv-len",
    "1048576",
];

fn with_cc<'a>(cc: &'a str, rest: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec!["--cc", cc];
    v.extend_from_slice(rest);
    v
}

fn keys(v: &serde_json::Value) -> Vec<String> {
    let mut k: Vec<_> = v
        .as_object()
        .expect("a JSON object")
        .keys()
        .cloned()
        .collect();
    k.sort();
    k
}

const EIGHT_KEYS: [&str; 8] = [
    "cc",
    "decode_splits",
    "max_seqlen_q_bucket",
    "num_splits",
    "path",
    "reason",
    "rejected",
    "split_kv_decode",
];

#[test]
fn json_has_exactly_the_eight_keys_routed_or_rejected() {
    for cc in ["10.0", "9.0", "8.0", "12.1", "13.0"] {
        let (code, v) = route_json(&with_cc(cc, &DECODE_TP8));
        assert_eq!(code, 0, "{cc}");
        assert_eq!(keys(&v), EIGHT_KEYS, "{cc}");
        assert_eq!(v["cc"], cc);
    }
}

#[test]
fn routed_values() {
    // SM100, TP8 decode, batch 1, 1M context: num_splits 128 (docs/operator.md section 4.1 by hand:
    // target 256, base 1, max_split 128, ceil(1048576/128) = 8192).
    let (_, v) = route_json(&with_cc("10.0", &DECODE_TP8));
    assert_eq!(v["path"], "sheared_bias");
    assert_eq!(v["rejected"], false);
    assert!(v["reason"].is_null());
    assert_eq!(v["num_splits"], 128);
    assert_eq!(v["split_kv_decode"], false);
    assert_eq!(v["decode_splits"], 1);
    assert_eq!(v["max_seqlen_q_bucket"], 1);
    // SM80: two-stage decode, min(32, ceil(1048576/2048)) = 32 splits.
    let (_, v) = route_json(&with_cc("8.0", &DECODE_TP8));
    assert_eq!(v["path"], "fallback");
    assert_eq!(
        (v["num_splits"].as_u64(), v["split_kv_decode"].as_bool()),
        (Some(1), Some(true))
    );
    assert_eq!(v["decode_splits"], 32);
}

#[test]
fn sm121_is_rejected_with_exit_zero() {
    let (code, v) = route_json(&with_cc("12.1", &DECODE_TP8));
    assert_eq!(code, 0);
    assert_eq!(v["rejected"], true);
    assert!(v["path"].is_null() && v["num_splits"].is_null() && v["decode_splits"].is_null());
    assert_eq!(v["split_kv_decode"], false);
    assert!(
        v["reason"]
            .as_str()
            .unwrap()
            .contains("no paged-KV forward"),
        "{v}"
    );
    // Text form too.
    let out = relattn(&[&["route"], &with_cc("12.1", &DECODE_TP8)[..]].concat());
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("SM 12.1") && text.contains("rejected"),
        "{text}"
    );
}

#[test]
fn local_layer_window_defaults_to_511() {
    // SM80 local decode, Lk 131072 >= 8192 -> decode kernel; window 511: min(4, ceil(512/128)) = 4;
    // window 255: ceil(256/128) = 2.
    let local = [
        "--local",
        "--batch",
        "8",
        "--max-query-len",
        "1",
        "--heads",
        "8",
    ];
    let rest = ["--kv-heads", "2", "--max-kv-len", "131072"];
    let (code, v) = route_json(&[&with_cc("8.0", &local)[..], &rest].concat());
    assert_eq!(code, 0);
    assert_eq!(
        (v["split_kv_decode"].as_bool(), v["decode_splits"].as_u64()),
        (Some(true), Some(4))
    );
    let (_, v) = route_json(
        &[
            &with_cc("8.0", &local)[..],
            &rest,
            &["--window-left", "255"],
        ]
        .concat(),
    );
    assert_eq!(v["decode_splits"], 2);
}

#[test]
fn window_left_without_local_is_a_usage_error() {
    let out = relattn(
        &[
            &["route"],
            &with_cc("9.0", &DECODE_TP8)[..],
            &["--window-left", "511"],
        ]
        .concat(),
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--local"));
}

#[test]
fn invalid_arguments_exit_two() {
    let base = |heads: &'static str, kv: &'static str, batch: &'static str| {
        vec![
            "route",
            "--cc",
            "9.0",
            "--batch",
            batch,
            "--max-query-len",
            "1",
            "--heads",
            heads,
            "--kv-heads",
            kv,
            "--max-kv-len",
            "512",
        ]
    };
    for args in [
        base("8", "3", "1"),
        base("8", "0", "1"),
        base("0", "1", "1"),
        base("8", "1", "0"),
    ] {
        assert_eq!(relattn(&args).status.code(), Some(2), "{args:?}");
    }
    let mut bad_cc = base("8", "1", "1");
    bad_cc[2] = "nine";
    assert_eq!(relattn(&bad_cc).status.code(), Some(2));
    let mut missing = base("8", "1", "1");
    missing.truncate(missing.len() - 2);
    assert_eq!(
        relattn(&missing).status.code(),
        Some(2),
        "--max-kv-len is required"
    );
}

/// `relattn ARGS` as this machine is (`crate::binary::relattn_seeing_gpus`).
fn unhidden(args: &[&str]) -> std::process::Output {
    crate::binary::relattn_seeing_gpus()
        .args(args)
        .output()
        .expect("the relattn binary runs")
}

#[test]
fn devices_answers_without_failing() {
    let relattn = unhidden;
    let out = relattn(&["devices", "--json"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    if v["driver"] == false {
        assert!(v["message"].as_str().unwrap().contains("no NVIDIA driver"));
        assert_eq!(v["devices"].as_array().map(Vec::len), Some(0));
        let text = relattn(&["devices"]);
        assert_eq!(text.status.code(), Some(0));
        assert!(String::from_utf8_lossy(&text.stdout).contains("no NVIDIA driver"));
    } else {
        // A machine with a driver: every device carries a capability and a route or a reason.
        for d in v["devices"].as_array().unwrap() {
            assert!(d["cc"].as_str().is_some_and(|cc| cc.contains('.')), "{d}");
            assert_ne!(d["path"].is_null(), d["reason"].is_null(), "{d}");
        }
    }
}

/// An empty `CUDA_VISIBLE_DEVICES` (what the command-line tests run relattn with) hides every
/// GPU, on a GPU machine too: `devices` lists none and says why, a GPU command exits 3 naming the
/// variable, and `run` runs the CPU part into `cpu/`.
#[test]
fn an_empty_cuda_visible_devices_hides_every_gpu() {
    for args in [&["devices", "--json"][..], &["devices"][..]] {
        let out = relattn(args);
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(said.contains("CUDA_VISIBLE_DEVICES is ``"), "{said}");
        if args.len() == 2 {
            let v: serde_json::Value = serde_json::from_str(&said).expect("JSON");
            assert_eq!(v["driver"], false);
            assert_eq!(v["devices"].as_array().map(Vec::len), Some(0));
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let case = relattn_matrices::load_tier("smoke")
        .unwrap()
        .expand()
        .unwrap()
        .cases[0]
        .id
        .clone();
    let out = |name: &str| dir.path().join(name).to_string_lossy().into_owned();
    let (required, plain) = (out("required"), out("plain"));
    let run = ["run", "--matrix", "smoke", "--case", &case, "--out"];
    let refused = relattn(&[&run[..], &[&required, "--require-gpu"]].concat());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(3), "{err}");
    assert!(err.contains("CUDA_VISIBLE_DEVICES"), "{err}");
    let ran = relattn(&[&run[..], &[&plain]].concat());
    let err = String::from_utf8_lossy(&ran.stderr);
    assert_eq!(ran.status.code(), Some(0), "{err}");
    assert!(err.contains("CUDA_VISIBLE_DEVICES"), "{err}");
    assert!(dir.path().join("plain/cpu/results.jsonl").is_file());
}
