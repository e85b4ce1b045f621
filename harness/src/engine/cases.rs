//! The cases of a run: each generated (or read from the disk cache), or read from its case file,
//! and its references computed once, shared by every trial that uses it, and dropped when its last trial has run.

use super::case_cache::CaseCache;
use super::memory_gate::{footprint, stored_bytes, MemoryGate, Reservation, WorkerShare};
use crate::phases::{self, Phase};
use crate::trial_list::Trial;
use relattn_matrices::{read_file_case, Case, CaseSource};
use relattn_reference::{emulate, fast, gen, Problem, RefOutput};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};

/// A generated case with its references, computed on first use.
pub struct CaseData {
    pub problem: Problem,
    /// Sampled rows (None: every row).
    pub rows: Option<Vec<usize>>,
    ref64: OnceLock<RefOutput>,
    ref_lp: OnceLock<RefOutput>,
    /// The case's memory in the machine's ledger, held while the case is (`memory_gate`).
    memory: Option<Reservation>,
    /// What runners keep for the case (a worker's case file) goes with it.
    pub life: crate::runner::CaseLife,
}

impl CaseData {
    pub fn new(case: &Case) -> Result<CaseData, String> {
        CaseData::cached(case, None)
    }

    /// The case from `cache` when it holds it, else generated (and kept there).
    pub fn cached(case: &Case, cache: Option<&CaseCache>) -> Result<CaseData, String> {
        let problem = match (&case.source, cache.and_then(|c| c.load(case))) {
            (_, Some(p)) => p,
            (CaseSource::Spec(spec), None) => {
                let p = phases::time(Phase::Generate, || gen::generate(spec))
                    .map_err(|e| format!("generating case {}: {e}", case.id))?;
                if let Some(c) = cache {
                    c.store(case, &p);
                }
                p
            }
            (CaseSource::File(file), None) => phases::time(Phase::Generate, || {
                read_file_case(&case.id, file, relattn_reference::limits::max_case_bytes())
            })?,
        };
        let rows = case
            .sample_rows
            .map(|n| relattn_reference::sample::sample_rows(&problem, n, case.seed()));
        Ok(CaseData {
            problem,
            rows,
            ref64: OnceLock::new(),
            ref_lp: OnceLock::new(),
            memory: None,
            life: Default::default(),
        })
    }

    pub fn ref64(&self) -> &RefOutput {
        self.ref64.get_or_init(|| {
            phases::time(Phase::Reference, || match &self.rows {
                Some(rows) => fast::attention_rows(&self.problem, rows),
                None => fast::attention(&self.problem),
            })
        })
    }

    pub fn ref_lp(&self) -> &RefOutput {
        self.ref_lp.get_or_init(|| {
            phases::time(Phase::Reference, || match &self.rows {
                Some(rows) => emulate::attention_rows(&self.problem, rows),
                None => emulate::attention(&self.problem),
            })
        })
    }
}

/// A case's data, built by the first trial that needs it.
type CaseCell = Arc<OnceLock<Result<Arc<CaseData>, String>>>;

/// Per case: its cell and how many trials still need it.
type CaseMap = Mutex<HashMap<String, (CaseCell, usize)>>;

/// One trial's use of a case, from `CaseStore::get`. While it lives the case's memory counts as
/// in use; dropping it ends the use, and the last trial's drops the case (unless the store keeps
/// every case).
pub struct CaseUse {
    data: Result<Arc<CaseData>, String>,
    map: Arc<CaseMap>,
    keep: bool,
    id: String,
}

impl CaseUse {
    /// The case, or why it could not be built.
    pub fn data(&self) -> Result<&Arc<CaseData>, &str> {
        self.data.as_ref().map_err(String::as_str)
    }
}

impl Drop for CaseUse {
    fn drop(&mut self) {
        if let Some(memory) = self.data.as_ref().ok().and_then(|d| d.memory.as_ref()) {
            memory.use_ended();
        }
        if self.keep {
            return;
        }
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = map.get_mut(&self.id) {
            entry.1 = entry.1.saturating_sub(1);
            if entry.1 == 0 {
                map.remove(&self.id);
            }
        }
    }
}

/// Cases by id, each built once and dropped when its last trial has run.
#[derive(Default)]
pub struct CaseStore {
    inner: Arc<CaseMap>,
    /// Never drop a case (for runs that revisit cases, like `relattn mutants`).
    keep: bool,
    /// Cases kept on disk between processes (the `cargo test` harness under nextest).
    disk: Option<CaseCache>,
    /// The machine's memory ledger, shared with other runs, and per case its workers.
    gate: Option<(Arc<MemoryGate>, CaseWorkers)>,
}

/// Per case, the workers that run it: whether each maps the case file, and how many of its
/// processes may hold the case (`footprint`).
type CaseWorkers = HashMap<String, Vec<WorkerShare>>;

impl CaseStore {
    /// A store expecting these trials (used to know when a case can be dropped).
    pub fn for_trials(trials: &[Trial]) -> CaseStore {
        let mut map = HashMap::new();
        for t in trials.iter().filter(|t| t.ignore.is_none()) {
            if let Some(case) = t.case() {
                map.entry(case.id.clone())
                    .or_insert_with(|| (Arc::new(OnceLock::new()), 0))
                    .1 += 1;
            }
        }
        CaseStore {
            inner: Arc::new(Mutex::new(map)),
            keep: false,
            disk: None,
            gate: None,
        }
    }

    /// The same store, reading and keeping generated cases in `cache`.
    pub fn with_disk_cache(mut self, cache: Option<CaseCache>) -> CaseStore {
        self.disk = cache;
        self
    }

    /// The same store, each case reserving its memory in `gate` (with the share of every
    /// worker of `trials` that runs it: a process per path; `maps[w]`: whether worker `w` maps
    /// the case file) before it is built, and holding it until it is dropped.
    pub fn with_memory_gate(
        mut self,
        gate: Option<Arc<MemoryGate>>,
        trials: &[Trial],
        maps: &[bool],
    ) -> CaseStore {
        self.gate = gate.map(|g| {
            let mut paths: HashMap<String, HashMap<usize, HashSet<String>>> = HashMap::new();
            for t in trials.iter().filter(|t| t.ignore.is_none()) {
                if let (Some(case), Some(w)) = (t.case(), t.worker_index()) {
                    let of_case = paths.entry(case.id.clone()).or_default();
                    of_case.entry(w).or_default().insert(t.path());
                }
            }
            let shares = |workers: HashMap<usize, HashSet<String>>| {
                workers
                    .into_iter()
                    .map(|(w, paths)| WorkerShare {
                        maps: maps.get(w).copied().unwrap_or(false),
                        processes: paths.len(),
                    })
                    .collect()
            };
            (
                g,
                paths.into_iter().map(|(id, w)| (id, shares(w))).collect(),
            )
        });
        self
    }

    /// A store that keeps every case it builds.
    pub fn keep_all() -> CaseStore {
        CaseStore {
            inner: Arc::default(),
            keep: true,
            disk: None,
            gate: None,
        }
    }

    /// The case's data (built on first use), held until the returned use is dropped.
    pub fn get(&self, case: &Case) -> CaseUse {
        let cell = {
            let mut map = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            map.entry(case.id.clone())
                .or_insert_with(|| (Arc::new(OnceLock::new()), 1))
                .0
                .clone()
        };
        let data = self.build(&cell, case).clone();
        if let Ok(Some(memory)) = data.as_ref().map(|d| d.memory.as_ref()) {
            memory.use_started();
        }
        CaseUse {
            data,
            map: self.inner.clone(),
            keep: self.keep,
            id: case.id.clone(),
        }
    }

    /// The cell's case, built from the disk cache or generated on first use.
    fn build<'c>(&self, cell: &'c CaseCell, case: &Case) -> &'c Result<Arc<CaseData>, String> {
        cell.get_or_init(|| {
            let memory = self.gate.as_ref().map(|(gate, workers)| {
                let copies = workers.get(&case.id).map(Vec::as_slice).unwrap_or(&[]);
                let stored = stored_bytes(case.bytes(), case.facts().dtype.size_bytes());
                let bytes = footprint(case.bytes(), stored, copies);
                crate::trace::span("memory", || gate.reserve(bytes, &case.id, &super::stopping))
            });
            CaseData::cached(case, self.disk.as_ref()).map(|data| {
                if let Some(m) = &memory {
                    m.built();
                }
                Arc::new(CaseData { memory, ..data })
            })
        })
    }

    /// Build the case and both references ahead of its trials (a device thread prepares the
    /// next case while the GPU runs this one). Its trials' uses still drop it.
    /// A case whose trials have all finished (another device thread ran them) is left alone.
    pub fn prepare(&self, case: &Case) {
        let cell = {
            let map = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            match map.get(&case.id) {
                Some((cell, _)) => cell.clone(),
                None => return,
            }
        };
        if let Ok(data) = self.build(&cell, case) {
            // Computing the references uses the case's memory as a trial would.
            let memory = data.memory.as_ref();
            memory.inspect(|m| m.use_started());
            let _ = (data.ref64(), data.ref_lp());
            memory.inspect(|m| m.use_ended());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use relattn_matrices::load_tier;

    /// A store over one smoke case that two trials use, its memory reserved in a private ledger.
    fn store_of_two_trials(gate: &Arc<MemoryGate>) -> (CaseStore, Case) {
        let tier = load_tier("smoke").expect("smoke tier");
        let case = tier.expand().expect("smoke expands").cases.remove(0);
        let mut map = HashMap::new();
        map.insert(case.id.clone(), (Arc::new(OnceLock::new()), 2));
        let store = CaseStore {
            inner: Arc::new(Mutex::new(map)),
            keep: false,
            disk: None,
            gate: Some((gate.clone(), HashMap::new())),
        };
        (store, case)
    }

    #[test]
    fn a_case_is_in_use_while_a_use_lives_and_dropped_with_its_last_trials_use() {
        let dir = tempfile::tempdir().unwrap();
        let gate = Arc::new(MemoryGate::open(dir.path(), u64::MAX).unwrap());
        let (store, case) = store_of_two_trials(&gate);
        let first = store.get(&case);
        assert!(first.data().is_ok());
        let (held, in_use) = gate.held();
        assert!(held > 0 && in_use == held, "held {held}, in use {in_use}");
        // A use handed to another thread (a judge) ends there.
        let second = store.get(&case);
        drop(first);
        assert_eq!(gate.held(), (held, held), "one use left: still in use");
        std::thread::spawn(move || drop(second)).join().unwrap();
        assert_eq!(gate.held(), (0, 0), "the last trial's use drops the case");
        assert!(store.inner.lock().unwrap().is_empty());
    }

    /// A case reserves, besides relattn's own copy, the pool's case file for every worker that
    /// runs it and, for each of the worker's paths (a process each), the floats where the
    /// worker loads the file and the stored bytes where it maps it (the torch workers).
    #[test]
    fn each_process_of_a_pool_reserves_its_own_tensors() {
        let case = Arc::new(
            load_tier("smoke")
                .unwrap()
                .expand()
                .unwrap()
                .cases
                .remove(0),
        );
        let hello = |name: &str, maps, paths: &[&str]| crate::worker::protocol::Hello {
            ok: true,
            protocol: 1,
            name: name.into(),
            version: "1".into(),
            device: None,
            capability: None,
            paths: paths.iter().map(|p| p.to_string()).collect(),
            split_paths: Vec::new(),
            unavailable: None,
            maps_case_files: maps,
            stderr_marks: false,
        };
        let loads = hello("loads", false, &["p"]);
        let maps = hello("maps", true, &["p"]);
        let maps_two = hello("maps2", true, &["p", "q"]);
        let (floats, stored) = (
            case.bytes(),
            stored_bytes(case.bytes(), case.facts().dtype.size_bytes()),
        );
        let own = floats + stored;
        for (workers, expected) in [
            (vec![&loads], own + stored + floats),
            (vec![&maps], own + 2 * stored),
            (vec![&maps_two], own + 3 * stored),
            (vec![&maps, &loads], own + 3 * stored + floats),
        ] {
            let info: Vec<_> = workers
                .iter()
                .enumerate()
                .map(|(i, h)| (i, *h, h.name.as_str()))
                .collect();
            let trials = crate::trial_list::worker_trials(std::slice::from_ref(&case), &info);
            let flags: Vec<bool> = workers.iter().map(|h| h.maps_case_files).collect();
            let dir = tempfile::tempdir().unwrap();
            let gate = Arc::new(MemoryGate::open(dir.path(), u64::MAX).unwrap());
            let store = CaseStore::for_trials(&trials).with_memory_gate(
                Some(gate.clone()),
                &trials,
                &flags,
            );
            let used = store.get(&case);
            assert!(used.data().is_ok());
            let names: Vec<&str> = workers.iter().map(|h| h.name.as_str()).collect();
            assert_eq!(gate.held().0, expected, "{names:?}");
        }
    }
}
