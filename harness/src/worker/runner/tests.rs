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

/// `warm` starts a member's process once, ahead of its first request: a second call leaves the
/// running process alone, and the member's first request is answered by it.
#[test]
fn warm_starts_a_members_process_ahead_and_once() {
    let script = r#"
import json, os, sys
for line in sys.stdin:
    r = json.loads(line)
    if r["op"] == "hello":
        print(json.dumps({"ok": True, "protocol": 1, "name": "pid", "version": "1",
                          "device": None, "capability": None, "paths": ["p"]}), flush=True)
    elif r["op"] == "route":
        print(json.dumps({"ok": True, "id": r.get("id"), "path": "score_mod", "rejected": False,
                          "reason": None, "num_splits": os.getpid()}), flush=True)
    else:
        break
"#;
    let spec = WorkerSpec {
        command: vec!["python3".into(), "-c".into(), script.into()],
        label: "--worker pid".into(),
        sanitizer: None,
        shipped: None,
    };
    let pool = Pool {
        size: 3,
        devices: Vec::new(),
    };
    let w = WorkerRunner::start_pool(spec, Duration::from_secs(10), &pool).unwrap();
    let running = |slot: usize| w.members[slot].lock().process.is_some();
    assert!(running(0) && !running(1) && !running(2));
    std::thread::scope(|s| {
        s.spawn(|| w.warm(1));
        s.spawn(|| w.warm(2));
    });
    assert!(running(1) && running(2));
    // The same process after a second warm: its pid, asked through the member's state.
    let pid = |slot: usize| {
        let member = &w.members[slot];
        let mut st = member.lock();
        let p = w.process(member, &mut st).unwrap();
        p.request(
            &protocol::route_request(1, "9.0", &shape(1)),
            Duration::from_secs(10),
        )
        .unwrap()["num_splits"]
            .as_u64()
            .unwrap()
    };
    let before = pid(1);
    w.warm(1);
    assert_eq!(pid(1), before);
    assert_ne!(pid(1), pid(2));
}

/// A worker that greets unless its `CUDA_VISIBLE_DEVICES` is "1" (then it exits at once).
fn device_worker() -> WorkerSpec {
    let script = r#"
import json, os, sys
if os.environ.get("CUDA_VISIBLE_DEVICES") == "1":
    sys.exit(3)
for line in sys.stdin:
    r = json.loads(line)
    if r["op"] == "hello":
        print(json.dumps({"ok": True, "protocol": 1, "name": "dev", "version": "1",
                          "device": None, "capability": None, "paths": ["p"]}), flush=True)
    else:
        break
"#;
    WorkerSpec {
        command: vec!["python3".into(), "-c".into(), script.into()],
        label: "--worker dev".into(),
        sanitizer: None,
        shipped: None,
    }
}

/// With GPUs, a pool's processes all start with the first (their starts overlap); without,
/// only the first does. A process other than the first that fails to start fails no run: it
/// is a death of its own, its start retried on first use.
#[test]
fn a_pool_with_gpus_starts_every_process_at_once() {
    let running = |w: &WorkerRunner| -> Vec<bool> {
        w.members
            .iter()
            .map(|m| m.lock().process.is_some())
            .collect()
    };
    let pool = |devices: Vec<u32>| Pool { size: 4, devices };
    let timeout = Duration::from_secs(10);
    let w = WorkerRunner::start_pool(device_worker(), timeout, &pool(Vec::new())).unwrap();
    assert_eq!(running(&w), [true, false, false, false]);
    let w = WorkerRunner::start_pool(device_worker(), timeout, &pool(vec![0])).unwrap();
    assert_eq!(running(&w), [true; 4]);
    // Two GPUs: processes 1 and 3 see device 1, and their worker exits.
    let w = WorkerRunner::start_pool(device_worker(), timeout, &pool(vec![0, 1])).unwrap();
    assert_eq!(running(&w), [true, false, true, false]);
    let st = w.members[1].lock();
    assert_eq!(st.deaths, 1);
    assert!(
        st.last_death.starts_with("start failed"),
        "{}",
        st.last_death
    );
}
