//! Tests of the memory ledger (`memory_gate.rs`).
use super::*;
use std::sync::mpsc;

/// How long runs must look stuck here (`STUCK_FOR` in a run).
const STUCK: Duration = Duration::from_millis(1500);

fn gate(dir: &Path, budget: u64) -> Arc<MemoryGate> {
    let mut gate = MemoryGate::open(dir, budget).unwrap();
    gate.stuck_for = STUCK;
    Arc::new(gate)
}

/// Reserve on a thread of its own; the receiver hears when it is granted.
fn reserve_later(
    g: &Arc<MemoryGate>,
    bytes: u64,
) -> (mpsc::Receiver<()>, std::thread::JoinHandle<Reservation>) {
    let (tx, rx) = mpsc::channel();
    let g = g.clone();
    let t = std::thread::spawn(move || {
        let r = g.reserve(bytes, "later", &|| false);
        tx.send(()).unwrap();
        r
    });
    (rx, t)
}

const SHORT: Duration = Duration::from_millis(700);
const LONG: Duration = Duration::from_secs(20);

#[test]
fn a_run_alone_is_never_held_back_by_its_own_cases() {
    let dir = tempfile::tempdir().unwrap();
    let a = gate(dir.path(), 100);
    let first = a.reserve(80, "one", &|| false);
    let second = a.reserve(80, "two", &|| false);
    assert_eq!(a.held().0, 160);
    drop((first, second));
    assert_eq!(a.held().0, 0);
}

#[test]
fn a_second_run_waits_until_the_first_releases() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (gate(dir.path(), 100), gate(dir.path(), 100));
    let held = a.reserve(60, "big", &|| false);
    held.use_started();
    let small = b.reserve(40, "fits beside it", &|| false);
    // 60 + 40 + 30 > 100: the third waits while the first is held.
    let (rx, t) = reserve_later(&b, 30);
    assert!(rx.recv_timeout(SHORT).is_err());
    assert_eq!(b.held().0, 40);
    drop(held);
    rx.recv_timeout(LONG)
        .expect("granted once the other run released its case");
    let granted = t.join().unwrap();
    assert_eq!(b.held().0, 70);
    drop((small, granted));
}

#[test]
fn an_ended_runs_entry_is_removed_and_not_counted() {
    let dir = tempfile::tempdir().unwrap();
    // An entry nobody holds locked: its run ended (was killed) holding 90 in use.
    let dead_path = dir.path().join(format!("1-1{SUFFIX}"));
    let mut dead = File::create(&dead_path).unwrap();
    let held = Entry {
        held: 90,
        in_use: 90,
        waiting_since: 0,
    };
    write_entry(&mut dead, held).unwrap();
    drop(dead);
    let a = gate(dir.path(), 100);
    let (rx, t) = reserve_later(&a, 50);
    rx.recv_timeout(LONG).expect("not held back by a dead run");
    drop(t.join().unwrap());
    assert!(!dead_path.exists());
}

/// Two runs, each holding a case kept for later trials and waiting for another: the one
/// that waited first goes on; a run that runs a trial on its case is waited for instead.
#[test]
fn runs_waiting_on_each_other_let_the_first_waiter_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (gate(dir.path(), 100), gate(dir.path(), 100));
    let parked_a = a.reserve(60, "a's case", &|| false);
    let parked_b = b.reserve(30, "b's case", &|| false);
    parked_b.built();
    parked_a.built();
    parked_a.use_started();
    let (rx_a, t_a) = reserve_later(&a, 40);
    std::thread::sleep(Duration::from_millis(50));
    let (rx_b, t_b) = reserve_later(&b, 40);
    // a runs a trial on its case: both wait for it.
    assert!(rx_a.recv_timeout(SHORT).is_err());
    assert!(rx_b.try_recv().is_err());
    // A pause between two of its trials is no deadlock: a gap shorter than the stuck period
    // lets nobody over the budget.
    parked_a.use_ended();
    assert!(rx_a.recv_timeout(STUCK / 3).is_err());
    parked_a.use_started();
    assert!(rx_a.recv_timeout(STUCK).is_err());
    // Its trial ends, the case stays (parked): nothing would be released any more, and
    // after the stuck period a, the first to wait, goes on; b still waits.
    parked_a.use_ended();
    let ended = std::time::Instant::now();
    rx_a.recv_timeout(LONG).expect("the first waiter goes on");
    assert!(ended.elapsed() >= STUCK);
    assert!(rx_b.recv_timeout(SHORT).is_err());
    let granted_a = t_a.join().unwrap();
    drop((parked_a, granted_a));
    rx_b.recv_timeout(LONG).expect("b goes on once a released");
    drop((t_b.join().unwrap(), parked_b));
}

/// A case being built counts as in use: a run building one is not taken for a stuck one.
#[test]
fn a_case_being_built_holds_the_others_back() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (gate(dir.path(), 100), gate(dir.path(), 100));
    let building = b.reserve(30, "b builds it", &|| false);
    let parked = a.reserve(60, "a's case", &|| false);
    parked.built();
    let (rx, t) = reserve_later(&a, 40);
    assert!(
        rx.recv_timeout(SHORT).is_err(),
        "a went on while b was building its case"
    );
    building.built();
    // Now b holds a case it does not use and does not wait: a still waits for it.
    assert!(rx.recv_timeout(SHORT).is_err());
    drop(building);
    rx.recv_timeout(LONG).expect("granted once b released");
    drop((t.join().unwrap(), parked));
}

#[test]
fn a_stop_ends_the_wait() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (gate(dir.path(), 100), gate(dir.path(), 100));
    let _held = a.reserve(90, "held", &|| false);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (tx, rx) = mpsc::channel();
    let t = {
        let (b, stop) = (b.clone(), stop.clone());
        std::thread::spawn(move || {
            let r = b.reserve(50, "stopped", &|| {
                stop.load(std::sync::atomic::Ordering::SeqCst)
            });
            tx.send(()).unwrap();
            r
        })
    };
    assert!(rx.recv_timeout(SHORT).is_err());
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    rx.recv_timeout(LONG).expect("a stop ends the wait");
    drop(t.join().unwrap());
}

#[test]
fn a_gate_removes_its_entry_when_its_run_ends() {
    let dir = tempfile::tempdir().unwrap();
    let a = gate(dir.path(), 100);
    let r = a.reserve(10, "x", &|| false);
    let entries = || {
        fs::read_dir(dir.path())
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .path()
                    .to_string_lossy()
                    .ends_with(SUFFIX)
            })
            .count()
    };
    assert_eq!(entries(), 1);
    drop(r);
    drop(a);
    assert_eq!(entries(), 0);
}

#[test]
fn an_entry_reads_back_and_garbage_holds_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("e");
    let mut f = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    let e = Entry {
        held: 7,
        in_use: 3,
        waiting_since: 12,
    };
    write_entry(&mut f, e).unwrap();
    assert_eq!(parse_entry(&fs::read_to_string(&path).unwrap()), e);
    assert_eq!(parse_entry("torn"), Entry::default());
}

#[test]
fn the_footprint_counts_the_pools_file_and_a_copy_per_process() {
    let share = |maps, processes| WorkerShare { maps, processes };
    assert_eq!(footprint(12, 6, &[]), 18);
    // Loading: the file and the floats, per process.
    assert_eq!(footprint(12, 6, &[share(false, 1), share(false, 1)]), 54);
    assert_eq!(footprint(12, 6, &[share(false, 2)]), 48);
    // Mapping: the file and the stored bytes, per process.
    assert_eq!(footprint(12, 6, &[share(true, 1), share(true, 1)]), 42);
    assert_eq!(footprint(12, 6, &[share(true, 2), share(true, 1)]), 48);
    assert_eq!(footprint(12, 6, &[share(true, 1), share(false, 1)]), 48);
    assert_eq!(footprint(u64::MAX, 3, &[share(false, 3)]), u64::MAX);
    assert_eq!(footprint(3, u64::MAX, &[share(true, 1)]), u64::MAX);
    assert_eq!(footprint(3, 2, &[share(true, usize::MAX)]), u64::MAX);
    assert_eq!(stored_bytes(12, 2), 6);
    assert_eq!(stored_bytes(12, 4), 12);
}

/// What the stand-in says the machine has available (`available_stand_in`).
static AVAILABLE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn available_stand_in() -> Option<u64> {
    Some(AVAILABLE.load(std::sync::atomic::Ordering::SeqCst))
}

/// A case that fits the budget beside other runs' cases still waits while the machine has
/// less available than it takes (with a margin); a run alone is never held back by it.
#[test]
fn a_case_beside_others_also_waits_for_the_memory_the_machine_has() {
    use std::sync::atomic::Ordering::SeqCst;
    let dir = tempfile::tempdir().unwrap();
    let mut b = MemoryGate::open(dir.path(), 100).unwrap();
    b.available = available_stand_in;
    let b = Arc::new(b);
    AVAILABLE.store(0, SeqCst);
    let alone = b.reserve(20, "alone", &|| false);
    drop(alone);
    let a = gate(dir.path(), 100);
    let held = a.reserve(30, "a's case", &|| false);
    // 30 + 20 fits the budget of 100, not the machine's 0 bytes available.
    let (rx, t) = reserve_later(&b, 20);
    assert!(rx.recv_timeout(SHORT).is_err());
    AVAILABLE.store(u64::MAX, SeqCst);
    rx.recv_timeout(LONG)
        .expect("granted once the machine has the memory");
    drop((t.join().unwrap(), held));
}
