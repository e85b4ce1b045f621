//! Which worker trials share a kernel configuration, so a pool of worker processes compiles each
//! configuration once per run: a JIT-compiled kernel (CuTe DSL, Triton) is specialised on the
//! dtype, head counts and dim, page size, window, extent and the bucketed query length
//! (docs/operator.md section 4.4), and on the split settings the case's trials force; each path
//! of a worker is a kernel of its own. A case's trials on one path are one unit (one process);
//! the queue hands units to a pool's processes, so a large case's paths run side by side, reading
//! the one case file the pool keeps for it (`worker::case_files`).

use crate::trial_list::Trial;
use relattn_matrices::Case;
use std::collections::BTreeMap;
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

/// One case's trials on one path of a worker: the unit a process takes.
pub struct Unit {
    key: String,
    /// The case's bytes in memory: larger cases take longer, so they start first.
    bytes: u64,
    pub trials: Vec<Trial>,
}

/// `trials` as units, one per case and path.
pub fn units(trials: Vec<Trial>) -> Vec<Unit> {
    let mut index: BTreeMap<(String, String), usize> = BTreeMap::new();
    let mut out: Vec<Unit> = Vec::new();
    for t in trials {
        let case_id = t.case().map(|c| c.id.clone()).unwrap_or_default();
        // The report's path column (`worker/path`): one kernel of the worker.
        let path = t.path();
        let at = *index.entry((case_id, path.clone())).or_insert_with(|| {
            let (key, bytes) = t.case().map_or((String::new(), 0), |c| {
                (format!("{}:{path}", of_case(c)), c.bytes())
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
    fn a_cases_trials_on_a_path_are_one_unit_and_every_trial_is_in_one() {
        let cases = ci_cases();
        let all = trials(&cases);
        let n = all.len();
        let units = units(all);
        // Two paths per case.
        assert_eq!(units.len(), 2 * cases.len());
        assert_eq!(units.iter().map(|u| u.trials.len()).sum::<usize>(), n);
        let mut seen = HashSet::new();
        for u in &units {
            let ids: HashSet<(&str, String)> = u
                .trials
                .iter()
                .map(|t| (t.case().unwrap().id.as_str(), t.path()))
                .collect();
            assert_eq!(ids.len(), 1);
            let (_, path) = ids.iter().next().unwrap();
            assert!(path == "w/a" || path == "w/b", "{path}");
            assert!(u.key.ends_with(&format!(":{path}")), "{}", u.key);
            for t in &u.trials {
                assert!(seen.insert(t.name.clone()), "{} twice", t.name);
            }
        }
        // Cases share configurations: fewer keys than units.
        let keys: HashSet<&str> = units.iter().map(Unit::key).collect();
        assert!(
            keys.len() > 10 && keys.len() < units.len(),
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

    #[test]
    fn larger_cases_come_first() {
        let queue = UnitQueue::new(units(trials(&ci_cases())));
        let st = queue.lock();
        assert!(st.units.windows(2).all(|w| w[0].bytes >= w[1].bytes));
    }
}
