//! The cases of a run: each generated (or read from the disk cache), or read from its case file,
//! and its references computed once, shared by every trial that uses it, and dropped when its last trial has run.

use super::case_cache::CaseCache;
use super::memory_gate::{footprint, MemoryGate, Reservation};
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

/// Cases by id, each built once and dropped when its last trial has run.
#[derive(Default)]
pub struct CaseStore {
    /// Per case: its cell and how many trials still need it.
    inner: Mutex<HashMap<String, (CaseCell, usize)>>,
    /// Never drop a case (for runs that revisit cases, like `relattn mutants`).
    keep: bool,
    /// Cases kept on disk between processes (the `cargo test` harness under nextest).
    disk: Option<CaseCache>,
    /// The machine's memory ledger, shared with other runs, and per case how many workers load
    /// their own copy of it.
    gate: Option<(Arc<MemoryGate>, HashMap<String, usize>)>,
}

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
            inner: Mutex::new(map),
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

    /// The same store, each case reserving its memory in `gate` (with a copy for every worker
    /// of `trials` that runs it) before it is built, and holding it until it is dropped.
    pub fn with_memory_gate(
        mut self,
        gate: Option<Arc<MemoryGate>>,
        trials: &[Trial],
    ) -> CaseStore {
        self.gate = gate.map(|g| {
            let mut workers: HashMap<String, HashSet<usize>> = HashMap::new();
            for t in trials.iter().filter(|t| t.ignore.is_none()) {
                if let (Some(case), Some(w)) = (t.case(), t.worker_index()) {
                    workers.entry(case.id.clone()).or_default().insert(w);
                }
            }
            (
                g,
                workers.into_iter().map(|(id, w)| (id, w.len())).collect(),
            )
        });
        self
    }

    /// A store that keeps every case it builds.
    pub fn keep_all() -> CaseStore {
        CaseStore {
            inner: Mutex::new(HashMap::new()),
            keep: true,
            disk: None,
            gate: None,
        }
    }

    /// The case's data; the caller must call `release` once done with it.
    pub fn get(&self, case: &Case) -> Result<Arc<CaseData>, String> {
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
        data
    }

    /// The cell's case, built from the disk cache or generated on first use.
    fn build<'c>(&self, cell: &'c CaseCell, case: &Case) -> &'c Result<Arc<CaseData>, String> {
        cell.get_or_init(|| {
            let memory = self.gate.as_ref().map(|(gate, workers)| {
                let copies = workers.get(&case.id).copied().unwrap_or(0);
                gate.reserve(footprint(case.bytes(), copies), &case.id, &super::stopping)
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
    /// next case while the GPU runs this one). Its trials' `release` calls still drop it.
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

    /// One trial of `case` finished; the last one drops the case's data.
    pub fn release(&self, case: &Case) {
        if self.keep {
            return;
        }
        let mut map = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = map.get_mut(&case.id) {
            if let Some(Ok(data)) = entry.0.get() {
                if let Some(memory) = &data.memory {
                    memory.use_ended();
                }
            }
            entry.1 = entry.1.saturating_sub(1);
            if entry.1 == 0 {
                map.remove(&case.id);
            }
        }
    }
}
