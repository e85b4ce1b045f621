//! Worker protocol v1 (`adapters/PROTOCOL.md`): the requests relattn sends and the strict
//! reading of the answers. An answer that is not a JSON object of this protocol is a
//! `ProtocolError`, which costs the worker its life (relattn restarts it), never a panic.

use serde::Deserialize;
use serde_json::{json, Value};

/// The protocol version this build speaks.
pub const PROTOCOL: u64 = 1;

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
    },
    Rejected(String),
    /// The worker has no routing.
    Unsupported(String),
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

pub fn route_request(cc: &str, s: &RouteShape) -> Value {
    json!({
        "op": "route",
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

fn message_of(v: &Value) -> String {
    v.get("message")
        .and_then(Value::as_str)
        .unwrap_or("(no message)")
        .to_string()
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
            "name or path {bad_name:?}: expected 1 to 64 letters, digits, `_`, `-` or `.`"
        )));
    }
    Ok(hello)
}

pub fn parse_run(v: &Value, id: &str) -> Result<RunAnswer, ProtocolError> {
    let got = v.get("id").and_then(Value::as_str);
    if got != Some(id) {
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
    let num_splits = v
        .get("num_splits")
        .and_then(Value::as_u64)
        .filter(|&n| n >= 1)
        .ok_or_else(|| bad("`num_splits` must be the split count used (an integer >= 1)"))?;
    let ms = match v.get("ms") {
        None | Some(Value::Null) => None,
        Some(Value::Array(a)) => Some(
            a.iter()
                .map(|x| x.as_f64().filter(|t| t.is_finite() && *t >= 0.0))
                .collect::<Option<Vec<f64>>>()
                .ok_or_else(|| bad("`ms` must be a list of non-negative numbers"))?,
        ),
        Some(Value::Number(n)) => Some(vec![n.as_f64().unwrap_or(f64::NAN)]),
        Some(_) => return Err(bad("`ms` must be null or a list of numbers")),
    };
    Ok(RunAnswer::Done {
        num_splits: num_splits as usize,
        ms,
    })
}

pub fn parse_route(v: &Value) -> Result<RouteAnswer, ProtocolError> {
    if !ok_of(v)? {
        return match failure(v)? {
            (true, m) => Ok(RouteAnswer::Unsupported(m)),
            (false, m) => Err(bad(format!("route failed: {m}"))),
        };
    }
    let rejected = v
        .get("rejected")
        .and_then(Value::as_bool)
        .ok_or_else(|| bad("route answer without boolean `rejected`"))?;
    if rejected {
        let reason = v
            .get("reason")
            .and_then(Value::as_str)
            .unwrap_or("(no reason)");
        return Ok(RouteAnswer::Rejected(reason.to_string()));
    }
    let path = v
        .get("path")
        .and_then(Value::as_str)
        .filter(|p| ["sheared_bias", "score_mod", "fallback"].contains(p))
        .ok_or_else(|| {
            bad("route answer: `path` must be sheared_bias, score_mod or fallback when not rejected")
        })?;
    let num_splits = match v.get("num_splits") {
        None | Some(Value::Null) => None,
        Some(n) => Some(
            n.as_u64()
                .filter(|&n| n >= 1)
                .ok_or_else(|| bad("`num_splits` must be null or an integer >= 1"))?
                as usize,
        ),
    };
    Ok(RouteAnswer::Routed {
        path: path.to_string(),
        num_splits,
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
        assert!(parse_hello(hello(json!({"split_paths": ["other"]}))).is_err());
        assert!(parse_hello(hello(json!({"paths": []}))).is_err());
        assert!(parse_hello(hello(json!({"name": "../x"}))).is_err());
        assert!(parse_hello(json!({"ok": true})).is_err());
        assert!(parse_hello(json!([1])).is_err());
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
        ] {
            assert!(parse_run(&bad, "a").is_err(), "{bad}");
        }
    }

    #[test]
    fn route_answers() {
        let r = json!({"ok": true, "path": "score_mod", "rejected": false, "reason": null, "num_splits": 1});
        assert_eq!(
            parse_route(&r).unwrap(),
            RouteAnswer::Routed {
                path: "score_mod".into(),
                num_splits: Some(1)
            }
        );
        let rej = json!({"ok": true, "path": null, "rejected": true, "reason": "SM12x", "num_splits": null});
        assert_eq!(
            parse_route(&rej).unwrap(),
            RouteAnswer::Rejected("SM12x".into())
        );
        let none = json!({"ok": false, "status": "unsupported", "message": "no routing"});
        assert!(matches!(
            parse_route(&none),
            Ok(RouteAnswer::Unsupported(_))
        ));
        for bad in [
            json!({"ok": true, "path": "fa2", "rejected": false}),
            json!({"ok": true, "path": "score_mod"}),
            json!({"ok": true, "path": "score_mod", "rejected": false, "num_splits": 0}),
        ] {
            assert!(parse_route(&bad).is_err(), "{bad}");
        }
    }
}
