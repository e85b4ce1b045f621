//! Preparing the device queue's cases ahead of the GPU: a few CPU threads generate the cases and
//! compute their references while the device threads run the earlier ones, so the GPU rarely
//! waits for the CPU. The queue runs from the cheapest case to the costliest (`by_cost`); most
//! preparing threads work from its front, just ahead of the device threads, and the others
//! from its back, so the few cases whose references take seconds are started at once and are
//! ready when the device threads reach them instead of stalling them. Bounded: at most
//! `max_ahead` cases past the device threads from the front, half of `max_bytes` from the back,
//! and `max_bytes` of case tensors prepared but not yet taken from both ends (the next case
//! always may be prepared, whatever its size, as a device thread would build it anyway).

use super::CaseStore;
use relattn_matrices::Case;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// Which end of the queue a preparing thread works from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The cases the device threads take next.
    Front,
    /// The costliest cases, the device threads' last.
    Back,
}

/// The order of a device queue: the cheaper case first, by the work of its reference (its
/// FLOPs, from the facts: nothing is generated), then its bytes, then its id.
pub fn by_cost(a: &Case, b: &Case) -> std::cmp::Ordering {
    a.flops()
        .total_cmp(&b.flops())
        .then(a.bytes().cmp(&b.bytes()))
        .then(a.id.cmp(&b.id))
}

/// The queue's cases, in the order device threads take them, and how far preparation may run.
pub struct Ahead {
    cases: Vec<(Arc<Case>, u64)>,
    state: Mutex<State>,
    moved: Condvar,
    max_ahead: usize,
    max_bytes: u64,
}

struct State {
    /// Cases taken by device threads: every index below this one.
    taken: usize,
    /// The next case the front claims.
    front: usize,
    /// The back has claimed every case from this index on.
    back: usize,
    /// Bytes of the cases the back claimed (at most half of `max_bytes`, so the front keeps
    /// its room while they wait for the device threads).
    back_bytes: u64,
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
            state: Mutex::new(State {
                taken: 0,
                front: 0,
                back: n,
                back_bytes: 0,
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
    /// prepare (a quarter of them, at least one when there are two, from the back), up to two
    /// cases each from the front, within an eighth of the memory's share of this run. Returns
    /// the ends of the preparing threads.
    pub fn for_machine(cases: Vec<Arc<Case>>, processes: usize) -> (Ahead, Vec<End>) {
        let threads = (rayon::current_num_threads() / 2).max(1);
        let (memory, _) = relattn_reference::limits::memory_bytes();
        let budget = memory / 8 / processes.max(1) as u64;
        let back = (threads / 4).max(usize::from(threads > 1));
        let ends = (0..threads)
            .map(|i| if i < back { End::Back } else { End::Front })
            .collect();
        (Ahead::new(cases, 2 * threads, budget), ends)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Prepare cases from `end` of the queue until none is left or `stop` says so (run on each
    /// preparing thread). A back thread whose next case does not fit the back's half of the
    /// byte budget works from the front from then on.
    pub fn work(&self, store: &CaseStore, mut end: End, stop: impl Fn() -> bool) {
        loop {
            let i = {
                let mut s = self.lock();
                let i = loop {
                    if s.done || stop() || s.front >= s.back {
                        return;
                    }
                    if end == End::Back {
                        let i = s.back - 1;
                        if i < s.taken {
                            return;
                        }
                        if s.back_bytes.saturating_add(self.cases[i].1) <= self.max_bytes / 2 {
                            s.back = i;
                            s.back_bytes = s.back_bytes.saturating_add(self.cases[i].1);
                            break i;
                        }
                        end = End::Front;
                        continue;
                    }
                    let i = s.front.max(s.taken);
                    if i >= s.back {
                        return;
                    }
                    let within = i < s.taken + self.max_ahead
                        && (i == s.taken
                            || s.bytes.saturating_add(self.cases[i].1) <= self.max_bytes);
                    if within {
                        s.front = i + 1;
                        break i;
                    }
                    s = self
                        .moved
                        .wait_timeout(s, Duration::from_millis(100))
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                };
                // Counted as it is claimed: no other thread claims against the old sum.
                s.counted[i] = true;
                s.bytes = s.bytes.saturating_add(self.cases[i].1);
                i
            };
            store.prepare(&self.cases[i].0);
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
    use std::sync::atomic::{AtomicBool, Ordering};

    fn smoke_cases(n: usize) -> Vec<Arc<Case>> {
        let tier = load_tier("smoke").expect("smoke tier");
        let cases = tier.expand().expect("smoke expands").cases;
        cases.into_iter().take(n).map(Arc::new).collect()
    }

    /// Waits (at most a minute) until `n` cases are prepared, then a little longer for any
    /// preparation beyond them.
    fn settled(ahead: &Ahead, n: usize) {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while ahead.pending().0 < n && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(200));
    }

    #[test]
    fn preparation_stays_within_max_ahead_and_catches_up_as_cases_are_taken() {
        let cases = smoke_cases(6);
        assert!(cases.len() >= 4);
        let n = cases.len();
        let store = CaseStore::keep_all();
        let ahead = Ahead::new(cases.clone(), 2, u64::MAX);
        std::thread::scope(|s| {
            s.spawn(|| ahead.work(&store, End::Front, || false));
            // Only two cases may be prepared before any is taken.
            settled(&ahead, 2);
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
            s.spawn(|| ahead.work(&store, End::Front, || false));
            settled(&ahead, 1);
            // Over budget after the first: only the next case is prepared.
            assert_eq!(ahead.pending().0, 1);
            ahead.finish();
        });
    }

    #[test]
    fn a_stop_ends_the_preparing_threads() {
        let store = CaseStore::keep_all();
        let ahead = Ahead::new(smoke_cases(4), 1, u64::MAX);
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            let h = s.spawn(|| ahead.work(&store, End::Front, || stop.load(Ordering::SeqCst)));
            std::thread::sleep(Duration::from_millis(50));
            stop.store(true, Ordering::SeqCst);
            h.join().unwrap();
        });
    }

    #[test]
    fn the_back_prepares_the_costliest_first_within_the_byte_budget_then_joins_the_front() {
        let mut cases = smoke_cases(6);
        cases.sort_by(|a, b| by_cost(a, b));
        let n = cases.len();
        assert!(n >= 4);
        // The back's half of the budget holds the last two cases: it prepares them before any
        // case is taken, then the front's next case (always allowed), and waits for the device
        // threads.
        let budget = 2 * (cases[n - 1].bytes() + cases[n - 2].bytes());
        let store = CaseStore::keep_all();
        let ahead = Ahead::new(cases, 1, budget);
        std::thread::scope(|s| {
            s.spawn(|| ahead.work(&store, End::Back, || false));
            settled(&ahead, 3);
            assert_eq!(ahead.pending().0, 3);
            let ready = ahead.lock().counted.clone();
            let mut expected = vec![false; n];
            (expected[0], expected[n - 2], expected[n - 1]) = (true, true, true);
            assert_eq!(ready, expected);
            for i in 0..n {
                ahead.taken(i);
            }
            ahead.finish();
        });
        assert_eq!(ahead.pending(), (0, 0));
    }

    #[test]
    fn the_device_queue_runs_from_the_cheapest_case_to_the_costliest() {
        let tier = load_tier("ci").expect("ci tier");
        let mut cases = tier.expand().expect("ci expands").cases;
        cases.sort_by(by_cost);
        assert!(cases.windows(2).all(|w| w[0].flops() <= w[1].flops()));
        let first = cases.first().unwrap().flops();
        let last = cases.last().unwrap().flops();
        assert!(last > 1000.0 * first.max(1.0), "{first} {last}");
    }

    #[test]
    fn threads_at_both_ends_together_keep_within_the_byte_budget() {
        let mut cases = smoke_cases(12);
        cases.sort_by(|a, b| by_cost(a, b));
        let largest = cases.iter().map(|c| c.bytes()).max().unwrap();
        // Room for about three of the larger cases: each claim is counted under the lock it is
        // made under, so six threads never take more together (the case at the device threads'
        // position may always be prepared, whatever its size).
        let budget = 3 * largest;
        let store = CaseStore::keep_all();
        let ahead = Ahead::new(cases, 64, budget);
        std::thread::scope(|s| {
            for end in [
                End::Back,
                End::Back,
                End::Front,
                End::Front,
                End::Front,
                End::Front,
            ] {
                let (ahead, store) = (&ahead, &store);
                s.spawn(move || ahead.work(store, end, || false));
            }
            let until = std::time::Instant::now() + Duration::from_millis(500);
            while std::time::Instant::now() < until {
                assert!(
                    ahead.pending().1 <= budget + largest,
                    "{:?}",
                    ahead.pending()
                );
                std::thread::sleep(Duration::from_millis(1));
            }
            ahead.finish();
        });
    }
}
