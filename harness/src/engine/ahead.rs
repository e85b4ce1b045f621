//! Preparing the device queue's cases ahead of the GPU: a few CPU threads generate the cases and
//! compute their references in queue order while the device threads run the earlier ones, so the
//! GPU rarely waits for the CPU. Bounded: at most `max_ahead` cases and `max_bytes` of case
//! tensors prepared but not yet taken by a device thread (the next case always may be prepared,
//! whatever its size, as a device thread would build it anyway).

use super::CaseStore;
use relattn_matrices::Case;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// The queue's cases, in the order device threads take them, and how far preparation may run.
pub struct Ahead {
    cases: Vec<(Arc<Case>, u64)>,
    next: AtomicUsize,
    state: Mutex<State>,
    moved: Condvar,
    max_ahead: usize,
    max_bytes: u64,
}

struct State {
    /// Cases taken by device threads: every index below this one.
    taken: usize,
    /// Bytes of the prepared cases not yet taken.
    bytes: u64,
    /// Which of those count in `bytes`.
    counted: Vec<bool>,
    done: bool,
}

impl Ahead {
    /// `cases` in queue order (one per group of trials).
    pub fn new(cases: Vec<Arc<Case>>, max_ahead: usize, max_bytes: u64) -> Ahead {
        let n = cases.len();
        let cases = cases
            .into_iter()
            .map(|c| {
                let bytes = c.bytes();
                (c, bytes)
            })
            .collect();
        Ahead {
            cases,
            next: AtomicUsize::new(0),
            state: Mutex::new(State {
                taken: 0,
                bytes: 0,
                counted: vec![false; n],
                done: false,
            }),
            moved: Condvar::new(),
            max_ahead: max_ahead.max(1),
            max_bytes,
        }
    }

    /// The defaults for this machine shared by `processes` runs: half the pool's threads
    /// prepare, up to two cases each, within an eighth of the memory's share of this run.
    pub fn for_machine(cases: Vec<Arc<Case>>, processes: usize) -> (Ahead, usize) {
        let threads = (rayon::current_num_threads() / 2).max(1);
        let (memory, _) = relattn_reference::limits::memory_bytes();
        let budget = memory / 8 / processes.max(1) as u64;
        (Ahead::new(cases, 2 * threads, budget), threads)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Prepare cases in queue order until none is left or `stop` says so (run on each preparing
    /// thread).
    pub fn work(&self, store: &CaseStore, stop: impl Fn() -> bool) {
        loop {
            let i = self.next.fetch_add(1, Ordering::SeqCst);
            let Some((case, bytes)) = self.cases.get(i) else {
                return;
            };
            {
                let mut s = self.lock();
                loop {
                    if s.done || stop() || i < s.taken {
                        break;
                    }
                    let within = i < s.taken + self.max_ahead
                        && (i == s.taken || s.bytes.saturating_add(*bytes) <= self.max_bytes);
                    if within {
                        break;
                    }
                    s = self
                        .moved
                        .wait_timeout(s, Duration::from_millis(100))
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
                if s.done || stop() {
                    return;
                }
                if i < s.taken {
                    continue; // a device thread took it first and builds it itself
                }
                s.counted[i] = true;
                s.bytes = s.bytes.saturating_add(*bytes);
            }
            store.prepare(case);
        }
    }

    /// A device thread took the case at `index` (and every one before it is taken).
    pub fn taken(&self, index: usize) {
        let mut s = self.lock();
        while s.taken <= index && s.taken < self.cases.len() {
            let t = s.taken;
            if s.counted[t] {
                s.counted[t] = false;
                s.bytes = s.bytes.saturating_sub(self.cases[t].1);
            }
            s.taken += 1;
        }
        self.moved.notify_all();
    }

    /// The device threads are done: preparing threads stop.
    pub fn finish(&self) {
        self.lock().done = true;
        self.moved.notify_all();
    }

    /// How many cases are prepared and not yet taken, and their bytes (for tests).
    #[cfg(test)]
    pub fn pending(&self) -> (usize, u64) {
        let s = self.lock();
        (s.counted.iter().filter(|&&c| c).count(), s.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use relattn_matrices::load_tier;

    fn smoke_cases(n: usize) -> Vec<Arc<Case>> {
        let tier = load_tier("smoke").expect("smoke tier");
        let cases = tier.expand().expect("smoke expands").cases;
        cases.into_iter().take(n).map(Arc::new).collect()
    }

    #[test]
    fn preparation_stays_within_max_ahead_and_catches_up_as_cases_are_taken() {
        let cases = smoke_cases(6);
        assert!(cases.len() >= 4);
        let n = cases.len();
        let store = CaseStore::keep_all();
        let ahead = Ahead::new(cases.clone(), 2, u64::MAX);
        std::thread::scope(|s| {
            s.spawn(|| ahead.work(&store, || false));
            // Only two cases may be prepared before any is taken.
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            while ahead.pending().0 < 2 && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            std::thread::sleep(Duration::from_millis(200));
            assert_eq!(ahead.pending().0, 2);
            for i in 0..n {
                ahead.taken(i);
            }
            assert_eq!(ahead.pending(), (0, 0));
            ahead.finish();
        });
    }

    #[test]
    fn a_byte_budget_still_lets_the_next_case_be_prepared() {
        let cases = smoke_cases(3);
        let store = CaseStore::keep_all();
        let ahead = Ahead::new(cases, 8, 1);
        std::thread::scope(|s| {
            s.spawn(|| ahead.work(&store, || false));
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            while ahead.pending().0 < 1 && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            std::thread::sleep(Duration::from_millis(200));
            // Over budget after the first: only the next case is prepared.
            assert_eq!(ahead.pending().0, 1);
            ahead.finish();
        });
    }

    #[test]
    fn a_stop_ends_the_preparing_threads() {
        let store = CaseStore::keep_all();
        let ahead = Ahead::new(smoke_cases(4), 1, u64::MAX);
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            let h = s.spawn(|| ahead.work(&store, || stop.load(Ordering::SeqCst)));
            std::thread::sleep(Duration::from_millis(50));
            stop.store(true, Ordering::SeqCst);
            h.join().unwrap();
        });
    }
}
