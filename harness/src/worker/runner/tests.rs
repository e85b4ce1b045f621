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

/// A worker that takes a second to start, then greets, unless its `CUDA_VISIBLE_DEVICES` is
/// "97" (then it exits at once).
fn device_worker() -> WorkerSpec {
    let script = r#"
import json, os, sys, time
if os.environ.get("CUDA_VISIBLE_DEVICES") == "97":
    sys.exit(3)
time.sleep(1)
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

/// With GPUs, a pool's processes start beside the first, which alone the start waits for;
/// without, only the first starts. A process other than the first that fails to start fails no
/// run: its start is tried again on first use, where it counts as a death.
#[test]
fn a_pool_with_gpus_starts_every_process_beside_the_first() {
    let running = |w: &WorkerRunner| -> Vec<bool> {
        w.members
            .iter()
            .map(|m| m.lock().process.is_some())
            .collect()
    };
    let pool = |devices: Vec<u32>| Pool { size: 4, devices };
    let timeout = Duration::from_secs(10);
    let started = std::time::Instant::now();
    let w = WorkerRunner::start_pool(device_worker(), timeout, &pool(vec![0])).unwrap();
    let first = started.elapsed().as_secs_f64();
    // Each warm waits for the thread starting that process.
    for slot in 1..4 {
        w.warm(slot);
    }
    let all = started.elapsed().as_secs_f64();
    assert_eq!(running(&w), [true; 4]);
    // Each start takes a second: one after another they would take four.
    assert!(
        first >= 1.0 && all < 2.6,
        "first {first:.2} s, all {all:.2} s"
    );

    let w = WorkerRunner::start_pool(device_worker(), timeout, &pool(Vec::new())).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(running(&w), [true, false, false, false]);

    // Two GPUs: processes 1 and 3 see device 97, and their worker exits.
    let w = WorkerRunner::start_pool(device_worker(), timeout, &pool(vec![0, 97])).unwrap();
    for t in w.starters.lock().unwrap().drain(..) {
        t.join().unwrap();
    }
    assert_eq!(running(&w), [true, false, true, false]);
    let deaths = |w: &WorkerRunner| {
        let st = w.members[1].lock();
        (
            st.deaths,
            st.last_death.split(':').next().unwrap_or("").to_string(),
        )
    };
    assert_eq!(deaths(&w), (0, "start failed".to_string()));
    w.warm(1);
    assert_eq!(deaths(&w), (1, "restart failed".to_string()));
}

/// `stage` writes a case's shared file ahead; the run of the same case and life finds it (the
/// same file, written once), and it goes when the life ends.
#[test]
fn a_staged_case_file_is_the_one_its_run_takes() {
    let w = route_worker(1, true);
    let case = relattn_matrices::load_tier("smoke")
        .unwrap()
        .expand()
        .unwrap()
        .cases
        .remove(0);
    let problem = crate::engine::CaseData::new(&case).unwrap().problem;
    let target = Target::Worker {
        worker: 0,
        name: "twice".into(),
        path: "p".into(),
        label: "--worker twice".into(),
    };
    let life = crate::runner::CaseLife::default();
    let req = RunRequest {
        trial: "t",
        case_id: "c+finite_unread",
        problem: &problem,
        case_file: None,
        case_life: Some(&life),
        target: &target,
        split: relattn_matrices::SplitSetting::Policy,
        timing: None,
    };
    w.stage(&req);
    let case_files = |dir: &Path| {
        std::fs::read_dir(dir).map_or(0, |d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("case-"))
                .count()
        })
    };
    let staged = w
        .files
        .shared("c+finite_unread", &life, Source::File(Path::new("/absent")));
    let staged = staged.expect("the staged file, not written again");
    let written = std::fs::metadata(&staged).unwrap().modified().unwrap();
    let (file, alone) = w.case_file(&req).unwrap();
    assert_eq!((file.as_path(), alone), (staged.as_path(), false));
    assert_eq!(
        std::fs::metadata(&file).unwrap().modified().unwrap(),
        written
    );
    let folder = file.parent().unwrap().to_path_buf();
    assert_eq!(case_files(&folder), 1);
    drop(life);
    assert!(!file.exists());
}
