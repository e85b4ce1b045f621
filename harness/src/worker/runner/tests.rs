use super::*;
use crate::worker::protocol::RouteAnswer;

#[test]
fn folder_bytes_counts_what_the_folder_already_holds() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(folder_bytes(dir.path()), 0);
    assert_eq!(folder_bytes(&dir.path().join("absent")), 0);
    // Sparse files: their length counts, their blocks are never written.
    for (name, len) in [("a.case.safetensors", KEEP_TOTAL_BYTES - 10), ("b", 7)] {
        std::fs::File::create(dir.path().join(name))
            .unwrap()
            .set_len(len)
            .unwrap();
    }
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    assert_eq!(folder_bytes(dir.path()), KEEP_TOTAL_BYTES - 3);
}

/// A worker whose route answers are `num_splits` = the shape's batch, each written `copies`
/// times, echoing the request's id when `echo` is set.
fn route_worker(copies: usize, echo: bool) -> WorkerRunner {
    let script = format!(
        r#"
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    if r["op"] == "hello":
        print(json.dumps({{"ok": True, "protocol": 1, "name": "twice", "version": "1",
                          "device": None, "capability": None, "paths": ["p"]}}), flush=True)
    elif r["op"] == "route":
        a = {{"ok": True, "path": "score_mod", "rejected": False, "reason": None,
             "num_splits": r["shape"]["batch"]}}
        if {echo}:
            a["id"] = r.get("id")
        for _ in range({copies}):
            print(json.dumps(a), flush=True)
    else:
        break
"#,
        echo = if echo { "True" } else { "False" }
    );
    let spec = WorkerSpec {
        command: vec!["python3".into(), "-c".into(), script],
        label: "--worker twice".into(),
        sanitizer: None,
        shipped: None,
    };
    WorkerRunner::start(spec, Duration::from_secs(10)).unwrap()
}

fn shape(batch: usize) -> RouteShape {
    RouteShape {
        is_local: false,
        batch,
        max_query_len: 1,
        heads: 8,
        kv_heads: 1,
        max_kv_len: 1024,
        page_size: 16,
        window_left: -1,
    }
}

#[test]
fn a_route_answer_given_twice_is_not_taken_for_the_next() {
    let w = route_worker(2, true);
    for batch in 1..=20 {
        assert_eq!(
            w.route("9.0", &shape(batch)).unwrap().answer,
            RouteAnswer::Routed {
                path: "score_mod".into(),
                num_splits: Some(batch),
                decode_splits: None,
            }
        );
    }
}

#[test]
fn route_answers_must_echo_the_id() {
    let w = route_worker(1, false);
    let e = w.route("9.0", &shape(1)).unwrap_err();
    assert!(
        e.contains("route answer for id none, expected 1")
            && e.contains("echoes its request's `id`"),
        "{e}"
    );
    // More stale answers than a worker may leave: a protocol violation, not a wrong answer.
    let w = route_worker(7, true);
    w.route("9.0", &shape(1)).unwrap();
    let e = w.route("9.0", &shape(2)).unwrap_err();
    assert!(e.contains("route answer for id 1, expected 2"), "{e}");
}
