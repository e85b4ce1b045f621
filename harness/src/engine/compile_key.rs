//! Which worker trials share a kernel configuration, so a pool of worker processes compiles each
//! configuration once per run: a JIT-compiled kernel (CuTe DSL, Triton) is specialised on the
//! dtype, head counts and dim, page size, window, extent and the bucketed query length
//! (docs/operator.md section 4.4), and on the split settings the case's trials force. A case's
//! trials are one unit (one process, one case file), a large case's one unit each; the queue
//! hands units to a pool's processes.

use crate::trial_list::Trial;
use relattn_matrices::Case;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Condvar, Mutex};

/// A case's kernel configuration, as the workers' JIT caches key it.
pub fn of_case(case: &Case) -> String {
    let f = case.facts();
    let splits: Vec<String> = case.splits.iter().map(|s| s.to_string()).collect();
    format!(
        "{}:h{}:kv{}:d{}:p{}:w{}:e{}:q{}:{}",
        f.dtype.name(),
        f.num_heads,
        f.num_kv_heads,
        f.head_dim,
        f.page_size,
        f.window_left,
        f.rel_extent,
        relattn_routing::bucket_max_seqlen_q(case.shape().max_query_len()),
        splits.join(",")
    )
}

/// Cases of at least this many bytes (their tensors as float32) have a unit per trial: each of
/// their trials is long (a case file of gigabytes written, read and uploaded), and one process
/// running them one after another would set a run's wall time (the regressions tier's 12 GiB
/// `offset_over_2_31` and `paged_cache_past_2_31` cases), so the pool's processes run them side
/// by side, each with its own copy (counted in the run's memory reservation: [`loads`]).
pub const SPLIT_BYTES: u64 = 1 << 30;

/// One case's trials for one worker: the unit a process takes (one case file, written once);
/// for a case of [`SPLIT_BYTES`] or more, one trial.
pub struct Unit {
    key: String,
    /// The case's bytes in memory: larger cases take longer, so they start first.
    bytes: u64,
    pub trials: Vec<Trial>,
}

/// The unit a trial belongs to: its case's id, and for a large case its path too.
fn unit_of(t: &Trial) -> (String, Option<String>) {
    let Some(case) = t.case() else {
        return (String::new(), None);
    };
    let path = (case.bytes() >= SPLIT_BYTES).then(|| t.path());
    (case.id.clone(), path)
}

/// `trials` (one worker's) as units, one per case, or per trial of a large case.
pub fn units(trials: Vec<Trial>) -> Vec<Unit> {
    let mut index: BTreeMap<(String, Option<String>), usize> = BTreeMap::new();
    let mut out: Vec<Unit> = Vec::new();
    for t in trials {
        let at = *index.entry(unit_of(&t)).or_insert_with_key(|(_, path)| {
            let (key, bytes) = t.case().map_or((String::new(), 0), |c| {
                let key = match path {
                    // A path of its own compiles its own kernel.
                    Some(p) => format!("{}:{p}", of_case(c)),
                    None => of_case(c),
                };
                (key, c.bytes())
            });
            out.push(Unit {
                key,
                bytes,
                trials: Vec::new(),
            });
            out.len() - 1
        });
        out[at].trials.push(t);
    }
    out
}

/// Per case, how many worker processes load a copy of it at most: its units over every worker
/// (trials marked ignored load nothing).
pub fn loads(trials: &[Trial]) -> HashMap<String, usize> {
    let mut units: HashSet<(usize, String, Option<String>)> = HashSet::new();
    for t in trials.iter().filter(|t| t.ignore.is_none()) {
        if let Some(worker) = t.worker_index() {
            let (case, path) = unit_of(t);
            units.insert((worker, case, path));
        }
    }
    let mut out = HashMap::new();
    for (_, case, _) in units {
        *out.entry(case).or_insert(0) += 1;
    }
    out
}

/// The units of one worker, handed to the processes of its pool: a process takes the units of
/// the configurations it compiled first; then a configuration nobody has taken (it compiles
/// it); then, rather than idle, a unit of a configuration another process has already compiled
/// once (it loads the kernel from the persistent JIT cache instead of compiling it again). Within
/// each choice the largest case comes first, so the long trials do not come last.
pub struct UnitQueue {
    state: Mutex<QueueState>,
    moved: Condvar,
}

struct QueueState {
    units: Vec<Unit>,
    /// Configuration -> (the process that took it, whether one of its units has finished).
    owners: BTreeMap<String, (usize, bool)>,
}

impl UnitQueue {
    pub fn new(mut units: Vec<Unit>) -> UnitQueue {
        units.sort_by_key(|u| std::cmp::Reverse(u.bytes));
        UnitQueue {
            state: Mutex::new(QueueState {
                units,
                owners: BTreeMap::new(),
            }),
            moved: Condvar::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.lock().units.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The next unit for process `slot`, waiting while every unit left belongs to a
    /// configuration another process is still compiling; None when none is left or `stop`.
    pub fn next(&self, slot: usize, stop: &dyn Fn() -> bool) -> Option<Unit> {
        let mut st = self.lock();
        loop {
            if stop() || st.units.is_empty() {
                return None;
            }
            let owner = |u: &Unit| st.owners.get(&u.key).copied();
            let pick = st
                .units
                .iter()
                .position(|u| owner(u).is_some_and(|(o, _)| o == slot))
                .or_else(|| st.units.iter().position(|u| owner(u).is_none()))
                .or_else(|| {
                    st.units
                        .iter()
                        .position(|u| owner(u).is_some_and(|(_, done)| done))
                });
            if let Some(at) = pick {
                let unit = st.units.remove(at);
                st.owners.entry(unit.key.clone()).or_insert((slot, false));
                return Some(unit);
            }
            // Wake now and then to see a stop request even when nothing finishes.
            st = self
                .moved
                .wait_timeout(st, std::time::Duration::from_millis(200))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// The thread of process `slot` ends (its queue is empty, a stop, or a panic): every
    /// configuration it took is open to the others, so none waits for it.
    pub fn release(&self, slot: usize) {
        for owner in self.lock().owners.values_mut() {
            if owner.0 == slot {
                owner.1 = true;
            }
        }
        self.moved.notify_all();
    }

    /// Process `slot` finished a unit of configuration `key`: others may now load it.
    pub fn finished(&self, key: &str) {
        if let Some(owner) = self.lock().owners.get_mut(key) {
            owner.1 = true;
        }
        self.moved.notify_all();
    }
}

impl Unit {
    pub fn key(&self) -> &str {
        &self.key
    }
}

/// Releases a process's configurations when its thread ends, also by a panic
/// ([`UnitQueue::release`]).
pub struct Releaser<'q> {
    pub queue: &'q UnitQueue,
    pub slot: usize,
}

impl Drop for Releaser<'_> {
    fn drop(&mut self) {
        self.queue.release(self.slot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::sync::Arc;

    fn trials(cases: &[Arc<Case>]) -> Vec<Trial> {
        cases
            .iter()
            .flat_map(|c| {
                ["a", "b"].map(|p| Trial {
                    name: format!("impl::w::{p}::{}", c.id),
                    kind: crate::trial_list::TrialKind::Gpu {
                        case: c.clone(),
                        target: crate::runner::Target::Worker {
                            worker: 0,
                            name: "w".into(),
                            path: p.into(),
                            label: "--impl w".into(),
                        },
                        split: relattn_matrices::SplitSetting::Policy,
                    },
                    ignore: None,
                })
            })
            .collect()
    }

    fn ci_cases() -> Vec<Arc<Case>> {
        relattn_matrices::load_tier("ci")
            .unwrap()
            .expand()
            .unwrap()
            .cases
            .into_iter()
            .map(Arc::new)
            .collect()
    }

    #[test]
    fn a_cases_trials_are_one_unit_and_every_trial_is_in_one() {
        let cases = ci_cases();
        let all = trials(&cases);
        let n = all.len();
        let units = units(all);
        // Each trial of a large case is a unit of its own.
        let large = cases.iter().filter(|c| c.bytes() >= SPLIT_BYTES).count();
        assert!(large > 0 && large < cases.len() / 4, "{large}");
        assert_eq!(units.len(), cases.len() + large);
        assert_eq!(units.iter().map(|u| u.trials.len()).sum::<usize>(), n);
        let mut seen = HashSet::new();
        for u in &units {
            let ids: HashSet<&str> = u
                .trials
                .iter()
                .map(|t| t.case().unwrap().id.as_str())
                .collect();
            assert_eq!(ids.len(), 1);
            for t in &u.trials {
                assert!(seen.insert(t.name.clone()), "{} twice", t.name);
            }
        }
        let keys: HashSet<&str> = units.iter().map(Unit::key).collect();
        assert!(
            keys.len() > 10 && keys.len() < cases.len(),
            "{}",
            keys.len()
        );
    }

    #[test]
    fn a_process_keeps_its_configurations_and_takes_others_only_once_compiled() {
        let cases = ci_cases();
        let queue = UnitQueue::new(units(trials(&cases)));
        let total = queue.len();
        let never = || false;
        let first = queue.next(0, &never).unwrap();
        // Process 0 goes on with its own configuration while it has units of it.
        let same_left = {
            let st = queue.lock();
            st.units.iter().filter(|u| u.key == first.key).count()
        };
        if same_left > 0 {
            assert_eq!(queue.next(0, &never).unwrap().key, first.key);
        }
        // Process 1 takes another configuration while process 0 compiles the first.
        let other = queue.next(1, &never).unwrap();
        assert_ne!(other.key, first.key);
        // Once every other configuration is taken, process 1 steals only finished ones.
        let mut taken = 2 + usize::from(same_left > 0);
        queue.finished(&first.key);
        queue.finished(&other.key);
        while let Some(u) = queue.next(1, &|| false) {
            let owner = queue.lock().owners[&u.key];
            assert!(owner.0 == 1 || owner.1, "stole {} while it compiled", u.key);
            queue.finished(&u.key);
            taken += 1;
        }
        assert_eq!(taken, total);
        assert!(queue.is_empty());
    }

    #[test]
    fn a_process_that_ends_leaves_its_configurations_to_the_others() {
        let cases = ci_cases();
        let queue = UnitQueue::new(units(trials(&cases)));
        let never = || false;
        // Process 0 takes every configuration once and never finishes one (it panicked).
        let mut keys = HashSet::new();
        while let Some(u) = {
            let st = queue.lock();
            let fresh = st.units.iter().any(|u| !st.owners.contains_key(&u.key));
            drop(st);
            fresh.then(|| queue.next(0, &never)).flatten()
        } {
            keys.insert(u.key);
        }
        let left = queue.len();
        // Process 1 would wait for them; released, it takes every unit left.
        {
            let _gone = Releaser {
                queue: &queue,
                slot: 0,
            };
        }
        let mut taken = 0;
        while queue.next(1, &never).is_some() {
            taken += 1;
        }
        assert_eq!(taken, left);
        assert!(!keys.is_empty());
    }

    /// A large case's trials are units of their own, of different configurations, so two
    /// processes take them at once; each is a copy of the case the memory reservation counts.
    #[test]
    fn a_large_cases_trials_run_in_processes_side_by_side() {
        let cases = ci_cases();
        let (large, small): (Vec<_>, Vec<_>) =
            cases.into_iter().partition(|c| c.bytes() >= SPLIT_BYTES);
        let (large, small) = (large[0].clone(), small[0].clone());
        let mut all = trials(&[large.clone(), small.clone()]);
        let queue = UnitQueue::new(units(all.clone()));
        assert_eq!(queue.len(), 3);
        let never = || false;
        let (a, b) = (
            queue.next(0, &never).unwrap(),
            queue.next(1, &never).unwrap(),
        );
        for u in [&a, &b] {
            assert_eq!(u.trials.len(), 1);
            assert_eq!(
                u.trials[0].case().unwrap().id,
                large.id,
                "the largest first"
            );
        }
        assert_ne!(a.key, b.key);
        // Two processes may load the large case, one the small case; an ignored trial none.
        all[0].ignore = Some("no GPU".into());
        let copies = loads(&all);
        assert_eq!(copies[&large.id], 1);
        assert_eq!(copies[&small.id], 1);
        all[0].ignore = None;
        assert_eq!(loads(&all)[&large.id], 2);
    }

    #[test]
    fn larger_cases_come_first() {
        let queue = UnitQueue::new(units(trials(&ci_cases())));
        let st = queue.lock();
        assert!(st.units.windows(2).all(|w| w[0].bytes >= w[1].bytes));
    }
}
