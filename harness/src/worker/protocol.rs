//! Worker protocol v1 (`adapters/PROTOCOL.md`): the requests relattn sends and the strict
//! reading of the answers. An answer that is not a JSON object of this protocol is a
//! `ProtocolError`, which costs the worker its life (relattn restarts it), never a panic.

use relattn_kernels::routing::PathId;
use serde::Deserialize;
use serde_json::{json, Value};

/// The protocol version this build speaks.
pub const PROTOCOL: u64 = 1;
/// Most paths a `hello` may list (the shipped workers list up to 3; every path is one more
/// trial per case).
pub const MAX_PATHS: usize = 256;
/// Largest `ms` a worker may report: one hour (a time past it is not a measurement).
pub const MAX_MS: f64 = 3_600_000.0;
/// Largest split count a worker may report (an int32, as the kernels' own counts are).
pub const MAX_SPLITS: u64 = i32::MAX as u64;

/// `hello`'s answer.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Hello {
    pub ok: bool,
    pub protocol: u64,
    pub name: String,
    pub version: String,
    pub device: Option<String>,
    pub capability: Option<String>,
    pub paths: Vec<String>,
    /// Paths that take forced split counts (optional; default none).
    #[serde(default)]
    pub split_paths: Vec<String>,
    /// Why no run can work in this process (optional): every trial of the worker is a skip
    /// with this reason, decided without a case file or a `run`.
    #[serde(default)]
    pub unavailable: Option<String>,
    /// Whether the worker builds its tensors on a mapping of the case file (pages shared with
    /// the file and the pool's other processes) without a float32 copy (optional; default
    /// false: it loads the floats). The memory ledger counts, for each of such a worker's
    /// processes that runs a case, the stored bytes instead of the floats (`footprint`).
    #[serde(default)]
    pub maps_case_files: bool,
    /// Whether the worker writes a `relattn-mark begin ID` line to stderr when it takes a
    /// request with an id and `relattn-mark end ID` before it answers (optional; default
    /// false): a failed trial's message then quotes that request's stderr only.
    #[serde(default)]
    pub stderr_marks: bool,
}

/// How a `run` ended, as the worker says.
#[derive(Debug, Clone, PartialEq)]
pub enum RunAnswer {
    Done {
        num_splits: usize,
        ms: Option<Vec<f64>>,
    },
    Unsupported(String),
    Error(String),
}

/// `route`'s answer, on relattn's path ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteAnswer {
    Routed {
        path: String,
        num_splits: Option<usize>,
        /// The fallback path's split-KV decode (docs/operator.md section 4.3): its split count, 1
        /// when the decode kernel does not run; None when the worker does not say (optional field).
        decode_splits: Option<usize>,
    },
    Rejected(String),
    /// The worker has no routing (for this capability).
    Unsupported(String),
}

/// A `route` answer and whether it is a proposed route: one from an unreleased change (an open
/// pull request, say), not from a release. `proposed` is the worker's text saying which.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub answer: RouteAnswer,
    pub proposed: Option<String>,
}

/// An answer outside the protocol.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("answer outside worker protocol v1: {0}")]
pub struct ProtocolError(pub String);

pub fn hello_request() -> Value {
    json!({"op": "hello", "protocol": PROTOCOL})
}

pub fn bye_request() -> Value {
    json!({"op": "bye"})
}

#[allow(clippy::too_many_arguments)]
pub fn run_request(
    id: &str,
    case: &str,
    path: &str,
    num_splits: Option<usize>,
    out: &str,
    timing: Option<(usize, usize)>,
) -> Value {
    json!({
        "op": "run",
        "id": id,
        "case": case,
        "path": path,
        "num_splits": num_splits,
        "out": out,
        "timing": timing.map(|(w, r)| json!({"warmup": w, "reps": r})),
    })
}

/// The shape fields of a `route` request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteShape {
    pub is_local: bool,
    pub batch: usize,
    pub max_query_len: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub max_kv_len: usize,
    pub page_size: usize,
    pub window_left: i64,
}

/// A `route` request; `id` (a number, new for each request) comes back in the answer, so an
/// answer to an earlier request is never taken for this one's.
pub fn route_request(id: u64, cc: &str, s: &RouteShape) -> Value {
    json!({
        "op": "route",
        "id": id,
        "cc": cc,
        "shape": {
            "is_local": s.is_local,
            "batch": s.batch,
            "max_query_len": s.max_query_len,
            "heads": s.heads,
            "kv_heads": s.kv_heads,
            "max_kv_len": s.max_kv_len,
            "page_size": s.page_size,
            "window_left": s.window_left,
        },
    })
}

fn bad(what: impl Into<String>) -> ProtocolError {
    ProtocolError(what.into())
}

/// The `ok` field, which every answer carries.
fn ok_of(v: &Value) -> Result<bool, ProtocolError> {
    v.get("ok")
        .and_then(Value::as_bool)
        .ok_or_else(|| bad("no boolean `ok`"))
}

/// The answer's `message`, with control characters escaped (it goes into reports).
fn message_of(v: &Value) -> String {
    let m = v
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or("(no message)");
    super::text::lines(m, super::text::MAX_MESSAGE_CHARS)
}

/// A split count the worker says it used: 1 to `MAX_SPLITS`.
fn splits_of(v: &Value) -> Option<usize> {
    v.as_u64()
        .filter(|n| (1..=MAX_SPLITS).contains(n))
        .map(|n| n as usize)
}

/// One time in milliseconds: finite, >= 0 and at most `MAX_MS`.
fn ms_of(v: &Value) -> Option<f64> {
    v.as_f64()
        .filter(|t| t.is_finite() && (0.0..=MAX_MS).contains(t))
}

/// `{"ok":false,"status":...}`: the status, which must be `unsupported` or `error`.
fn failure(v: &Value) -> Result<(bool, String), ProtocolError> {
    match v.get("status").and_then(Value::as_str) {
        Some("unsupported") => Ok((true, message_of(v))),
        Some("error") => Ok((false, message_of(v))),
        other => Err(bad(format!(
            "`ok` false with status {other:?}: expected \"unsupported\" or \"error\""
        ))),
    }
}

pub fn parse_hello(v: Value) -> Result<Hello, ProtocolError> {
    if !ok_of(&v)? {
        return Err(bad(format!("hello refused: {}", message_of(&v))));
    }
    let hello: Hello = serde_json::from_value(v).map_err(|e| bad(format!("hello answer: {e}")))?;
    if hello.paths.is_empty() {
        return Err(bad("hello answer lists no paths"));
    }
    if let Some(p) = hello.split_paths.iter().find(|p| !hello.paths.contains(p)) {
        return Err(bad(format!("split path `{p}` is not one of `paths`")));
    }
    if hello.paths.len() > MAX_PATHS {
        return Err(bad(format!(
            "hello lists {} paths: a worker may list at most {MAX_PATHS}",
            hello.paths.len()
        )));
    }
    let plain = |s: &str| {
        !s.is_empty()
            && s.len() <= 64
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
    };
    if let Some(bad_name) = std::iter::once(&hello.name)
        .chain(&hello.paths)
        .find(|s| !plain(s))
    {
        return Err(bad(format!(
            "name or path {:?}: expected 1 to 64 letters, digits, `_`, `-` or `.`",
            super::text::one_line(bad_name, 80)
        )));
    }
    let mut seen = std::collections::HashSet::new();
    if let Some(twice) = hello.paths.iter().find(|p| !seen.insert(p.as_str())) {
        return Err(bad(format!(
            "hello lists path `{twice}` twice: each path must be listed once"
        )));
    }
    // Free text that reports and terminals show.
    let clean = |s: &str| super::text::one_line(s, 200);
    Ok(Hello {
        version: clean(&hello.version),
        device: hello.device.as_deref().map(clean),
        capability: hello.capability.as_deref().map(clean),
        unavailable: hello
            .unavailable
            .as_deref()
            .filter(|s| !s.is_empty())
            .map(|s| super::text::one_line(s, 2000)),
        ..hello
    })
}

pub fn parse_run(v: &Value, id: &str) -> Result<RunAnswer, ProtocolError> {
    let got = v.get("id").and_then(Value::as_str);
    if got != Some(id) {
        let got = got.map(|g| super::text::one_line(g, 200));
        return Err(bad(format!("answer for id {got:?}, expected {id:?}")));
    }
    if !ok_of(v)? {
        let (unsupported, message) = failure(v)?;
        return Ok(if unsupported {
            RunAnswer::Unsupported(message)
        } else {
            RunAnswer::Error(message)
        });
    }
    let num_splits = v.get("num_splits").and_then(splits_of).ok_or_else(|| {
        bad(format!(
            "`num_splits` must be the split count used (an integer from 1 to {MAX_SPLITS})"
        ))
    })?;
    let times = || {
        bad(format!("`ms` must be null, a time or a list of times in milliseconds (each finite, from 0 to {MAX_MS})"))
    };
    let ms = match v.get("ms") {
        None | Some(Value::Null) => None,
        Some(Value::Array(a)) => Some(
            a.iter()
                .map(ms_of)
                .collect::<Option<Vec<f64>>>()
                .ok_or_else(times)?,
        ),
        Some(n @ Value::Number(_)) => Some(vec![ms_of(n).ok_or_else(times)?]),
        Some(_) => return Err(times()),
    };
    Ok(RunAnswer::Done { num_splits, ms })
}

/// A `route` answer, which must echo the request's `id`.
pub fn parse_route(v: &Value, id: u64) -> Result<Route, ProtocolError> {
    let got = v.get("id");
    if got.and_then(Value::as_u64) != Some(id) {
        return Err(bad(format!(
            "route answer for id {}, expected {id} (a route answer echoes its request's `id`)",
            got.map_or("none".to_string(), |g| super::text::one_line(
                &g.to_string(),
                40
            ))
        )));
    }
    if !ok_of(v)? {
        return match failure(v)? {
            (true, m) => Ok(Route {
                answer: RouteAnswer::Unsupported(m),
                proposed: None,
            }),
            (false, m) => Err(bad(format!("route failed: {m}"))),
        };
    }
    let proposed = match v.get("proposed") {
        None | Some(Value::Null) => None,
        Some(Value::String(t)) if !t.trim().is_empty() => {
            Some(super::text::one_line(t, super::text::MAX_MESSAGE_CHARS))
        }
        Some(_) => {
            return Err(bad(
                "`proposed` must be null or a text saying which unreleased change the route is",
            ))
        }
    };
    let answer = route_answer(v)?;
    Ok(Route { answer, proposed })
}

fn route_answer(v: &Value) -> Result<RouteAnswer, ProtocolError> {
    let rejected = v
        .get("rejected")
        .and_then(Value::as_bool)
        .ok_or_else(|| bad("route answer without boolean `rejected`"))?;
    if rejected {
        let reason = v
            .get("reason")
            .and_then(Value::as_str)
            .unwrap_or("(no reason)");
        return Ok(RouteAnswer::Rejected(super::text::lines(
            reason,
            super::text::MAX_MESSAGE_CHARS,
        )));
    }
    let path = v
        .get("path")
        .and_then(Value::as_str)
        .filter(|p| PathId::ALL.iter().any(|id| id.as_str() == *p))
        .ok_or_else(|| {
            let names = PathId::ALL.map(|id| id.as_str());
            let (last, rest) = names.split_last().expect("there are paths");
            bad(format!(
                "route answer: `path` must be {} or {last} when not rejected",
                rest.join(", ")
            ))
        })?;
    let count = |key: &str| match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(n) => splits_of(n).map(Some).ok_or_else(|| {
            bad(format!(
                "`{key}` must be null or an integer from 1 to {MAX_SPLITS}"
            ))
        }),
    };
    Ok(RouteAnswer::Routed {
        path: path.to_string(),
        num_splits: count("num_splits")?,
        decode_splits: count("decode_splits")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello(extra: Value) -> Value {
        let mut v = json!({"ok": true, "protocol": 1, "name": "numpy", "version": "1",
            "device": null, "capability": null, "paths": ["numpy"]});
        if let (Some(m), Value::Object(e)) = (v.as_object_mut(), extra) {
            m.extend(e);
        }
        v
    }

    #[test]
    fn hello_answers() {
        let h = parse_hello(hello(json!({}))).unwrap();
        assert_eq!(h.paths, ["numpy"]);
        assert!(h.split_paths.is_empty());
        assert!(
            !h.maps_case_files,
            "a worker loads the floats unless it says otherwise"
        );
        let h = parse_hello(hello(json!({"maps_case_files": true}))).unwrap();
        assert!(h.maps_case_files);
        assert!(parse_hello(hello(json!({"maps_case_files": "yes"}))).is_err());
        assert!(parse_hello(hello(json!({"split_paths": ["other"]}))).is_err());
        assert!(parse_hello(hello(json!({"paths": []}))).is_err());
        assert!(parse_hello(hello(json!({"name": "../x"}))).is_err());
        assert!(parse_hello(json!({"ok": true})).is_err());
        assert!(parse_hello(json!([1])).is_err());
        let many: Vec<String> = (0..=MAX_PATHS).map(|i| format!("p{i}")).collect();
        let e = parse_hello(hello(json!({ "paths": many }))).unwrap_err();
        assert!(
            e.0.contains("257 paths") && e.0.contains("at most 256"),
            "{e}"
        );
        let e = parse_hello(hello(json!({"paths": ["a", "b", "a"]}))).unwrap_err();
        assert!(e.0.contains("path `a` twice"), "{e}");
        let e = parse_hello(hello(json!({"name": "n\x1b[2J"}))).unwrap_err();
        assert!(e.0.contains("\\x1b[2J") && !e.0.contains('\x1b'), "{e}");
        let h = parse_hello(hello(
            json!({"version": "1\x1b[31m\r\n", "device": "G\x07"}),
        ))
        .unwrap();
        assert_eq!(h.version, "1\\x1b[31m\\x0d\\x0a");
        assert_eq!(h.device.as_deref(), Some("G\\x07"));
        // The version is checked by the caller (a usage error, not a death).
        assert_eq!(
            parse_hello(hello(json!({"protocol": 2}))).unwrap().protocol,
            2
        );
    }

    #[test]
    fn run_answers() {
        let ok = json!({"ok": true, "id": "a", "num_splits": 4, "ms": [1.0, 2.0]});
        assert_eq!(
            parse_run(&ok, "a").unwrap(),
            RunAnswer::Done {
                num_splits: 4,
                ms: Some(vec![1.0, 2.0])
            }
        );
        assert!(parse_run(&ok, "b").is_err(), "answer for another id");
        let skip = json!({"ok": false, "id": "a", "status": "unsupported", "message": "E"});
        assert_eq!(
            parse_run(&skip, "a").unwrap(),
            RunAnswer::Unsupported("E".into())
        );
        let err = json!({"ok": false, "id": "a", "status": "error", "message": "boom"});
        assert_eq!(
            parse_run(&err, "a").unwrap(),
            RunAnswer::Error("boom".into())
        );
        for bad in [
            json!({"ok": false, "id": "a", "status": "maybe"}),
            json!({"ok": true, "id": "a", "num_splits": 0}),
            json!({"ok": true, "id": "a"}),
            json!({"ok": true, "id": "a", "num_splits": 1, "ms": "fast"}),
            json!({"ok": true, "id": "a", "num_splits": 1, "ms": [-1]}),
            json!({"id": "a", "num_splits": 1}),
            // A bare time is checked as a list's are.
            json!({"ok": true, "id": "a", "num_splits": 1, "ms": -5}),
            json!({"ok": true, "id": "a", "num_splits": 1, "ms": 1e300}),
            // Finite, but their median overflows, and no kernel runs for an hour.
            json!({"ok": true, "id": "a", "num_splits": 1, "ms": [1.7e308, 1.7e308]}),
            json!({"ok": true, "id": "a", "num_splits": 1, "ms": [MAX_MS + 1.0]}),
            json!({"ok": true, "id": "a", "num_splits": u64::MAX}),
            json!({"ok": true, "id": "a", "num_splits": MAX_SPLITS + 1}),
        ] {
            assert!(parse_run(&bad, "a").is_err(), "{bad}");
        }
        let e = parse_run(
            &json!({"ok": true, "id": "a", "num_splits": 1, "ms": -5}),
            "a",
        );
        assert!(e.unwrap_err().0.contains("`ms` must be"));
        let edge = json!({"ok": true, "id": "a", "num_splits": MAX_SPLITS, "ms": 0.5});
        assert_eq!(
            parse_run(&edge, "a").unwrap(),
            RunAnswer::Done {
                num_splits: MAX_SPLITS as usize,
                ms: Some(vec![0.5])
            }
        );
    }

    #[test]
    fn worker_messages_are_kept_without_control_characters() {
        let err = json!({"ok": false, "id": "a", "status": "error",
            "message": "boom\x1b[2K\rfaked line\nsecond line"});
        assert_eq!(
            parse_run(&err, "a").unwrap(),
            RunAnswer::Error("boom\\x1b[2K\\x0dfaked line\nsecond line".into())
        );
        let long =
            json!({"ok": false, "id": "a", "status": "error", "message": "x".repeat(1 << 20)});
        let RunAnswer::Error(m) = parse_run(&long, "a").unwrap() else {
            panic!("an error answer")
        };
        assert!(
            m.len() < 5000 && m.ends_with("more characters)"),
            "{}",
            m.len()
        );
        let rej = json!({"ok": true, "id": 1, "rejected": true, "reason": "no\x1b]0;title\x07"});
        assert_eq!(
            parse_route(&rej, 1).unwrap().answer,
            RouteAnswer::Rejected("no\\x1b]0;title\\x07".into())
        );
    }

    #[test]
    fn route_answers() {
        let r = json!({"ok": true, "id": 7, "path": "score_mod", "rejected": false, "reason": null, "num_splits": 1});
        assert_eq!(
            parse_route(&r, 7).unwrap(),
            Route {
                answer: RouteAnswer::Routed {
                    path: "score_mod".into(),
                    num_splits: Some(1),
                    decode_splits: None,
                },
                proposed: None
            }
        );
        let rej = json!({"ok": true, "id": 7, "path": null, "rejected": true, "reason": "SM12x", "num_splits": null});
        assert_eq!(
            parse_route(&rej, 7).unwrap().answer,
            RouteAnswer::Rejected("SM12x".into())
        );
        let none = json!({"ok": false, "id": 7, "status": "unsupported", "message": "no routing"});
        assert!(matches!(
            parse_route(&none, 7).map(|r| r.answer),
            Ok(RouteAnswer::Unsupported(_))
        ));
        // A proposed route with the decode kernel's split count.
        let p = json!({"ok": true, "id": 7, "path": "fallback", "rejected": false, "num_splits": 1,
                       "decode_splits": 4, "proposed": "PR #1 (open)\x1b[2K"});
        assert_eq!(
            parse_route(&p, 7).unwrap(),
            Route {
                answer: RouteAnswer::Routed {
                    path: "fallback".into(),
                    num_splits: Some(1),
                    decode_splits: Some(4),
                },
                proposed: Some("PR #1 (open)\\x1b[2K".into())
            }
        );
        for bad in [
            json!({"ok": true, "id": 7, "path": "fa2", "rejected": false}),
            json!({"ok": true, "id": 7, "path": "score_mod"}),
            json!({"ok": true, "id": 7, "path": "score_mod", "rejected": false, "num_splits": 0}),
            json!({"ok": true, "id": 7, "path": "score_mod", "rejected": false, "num_splits": u64::MAX}),
            json!({"ok": true, "id": 7, "path": "fallback", "rejected": false, "decode_splits": 0}),
            json!({"ok": true, "id": 7, "path": "fallback", "rejected": false, "proposed": 55078}),
            json!({"ok": true, "id": 7, "path": "fallback", "rejected": false, "proposed": " "}),
            // The id must be echoed: missing, another request's, or not a number.
            json!({"ok": true, "path": "score_mod", "rejected": false, "num_splits": 1}),
            json!({"ok": true, "id": 6, "path": "score_mod", "rejected": false, "num_splits": 1}),
            json!({"ok": true, "id": "7", "path": "score_mod", "rejected": false, "num_splits": 1}),
        ] {
            assert!(parse_route(&bad, 7).is_err(), "{bad}");
        }
        let e = parse_route(&json!({"ok": true, "rejected": true}), 7).unwrap_err();
        assert!(e.0.contains("for id none, expected 7"), "{e}");
    }
}
