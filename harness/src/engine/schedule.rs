//! The threads of a run: the cases prepared ahead on CPU threads, native GPU trials on one
//! thread per device with their judging on threads of their own, each worker's trials on a
//! thread per process of its pool (a worker process serves one request at a time), grouped by
//! kernel configuration, and the CPU trials on the rest; rows come back to the caller's thread
//! in the order they finish.

use super::ahead::Ahead;
use super::cases::CaseStore;
use super::runners::Runners;
use super::trial::{run_trial, start_trial, Step};
use super::Engine;
use crate::runner::Target;
use crate::trial_list::{Trial, TrialKind};
use relattn_matrices::Case;
use relattn_reports::Row;
use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

/// Threads judging the GPU runs of each device thread.
const JUDGES_PER_DEVICE: usize = 2;

/// Run every trial of `engine.session` not in `done` (CPU ones on threads of their own, native
/// GPU ones on one thread per device, each worker's on one thread) and hand each row to `on_row`
/// (on this thread) as soon as it finishes.
pub(super) fn run_all(
    engine: &Engine<'_>,
    done: &HashSet<String>,
    stopping: &(dyn Fn() -> bool + Sync),
    mut on_row: impl FnMut(Row),
) {
    let (session, keep, processes) = (engine.session, engine.keep, engine.processes);
    let (tx, rx) = mpsc::channel::<Row>();
    let trials: Vec<Trial> = session
        .trials
        .iter()
        .filter(|t| !done.contains(&t.name))
        .cloned()
        .collect();
    let maps: Vec<bool> = session
        .workers
        .iter()
        .map(|w| w.hello.maps_case_files)
        .collect();
    let store = Arc::new(CaseStore::for_trials(&trials).with_memory_gate(
        engine.memory_gate.clone(),
        &trials,
        &maps,
    ));
    let (runs, cpu): (Vec<Trial>, Vec<Trial>) = trials
        .into_iter()
        .partition(|t| matches!(t.kind, TrialKind::Gpu { .. }) && t.ignore.is_none());
    // Native trials go to the device threads, each worker's to a thread of its own (a worker
    // process serves one request at a time).
    let mut per_worker: Vec<Vec<Trial>> = vec![Vec::new(); session.workers.len()];
    let mut gpu = Vec::new();
    for t in runs {
        match &t.kind {
            TrialKind::Gpu {
                target: Target::Worker { worker, .. },
                ..
            } if *worker < per_worker.len() => per_worker[*worker].push(t),
            _ => gpu.push(t),
        }
    }
    let set = session.set.clone();
    std::thread::scope(|scope| {
        // GPU trials grouped by case, so a case's reference and upload serve all its trials.
        let mut by_case: BTreeMap<String, Vec<Trial>> = BTreeMap::new();
        for t in gpu {
            let id = t.case().map(|c| c.id.clone()).unwrap_or_default();
            by_case.entry(id).or_default().push(t);
        }
        // The cheapest case first (`ahead::by_cost`): the costliest are prepared from the
        // queue's back while the device threads run the others.
        let mut groups: Vec<Vec<Trial>> = by_case.into_values().collect();
        let case = |g: &Vec<Trial>| g.first().and_then(Trial::case).cloned();
        groups.sort_by(|a, b| match (case(a), case(b)) {
            (Some(a), Some(b)) => super::ahead::by_cost(&a, &b),
            (a, b) => a.is_some().cmp(&b.is_some()),
        });
        // The queue's cases are generated and their references computed on CPU threads of
        // their own, ahead of the device threads, so the GPU rarely waits (bounded in memory).
        let cases: Vec<Arc<Case>> = groups.iter().filter_map(case).collect();
        let (ahead, ends) = Ahead::for_machine(cases, processes);
        let ahead = Arc::new(ahead);
        let queue = Arc::new(Mutex::new(
            groups.into_iter().enumerate().collect::<VecDeque<_>>(),
        ));
        if let Some(exec) = session.executor_ref() {
            for end in ends {
                let (ahead, store) = (ahead.clone(), store.clone());
                scope.spawn(move || ahead.work(&store, end, stopping));
            }
            // Device threads run the kernels and leave the judging to threads of their own
            // (a short queue: a run waiting for its judge holds its output).
            let (to_judge, judged) = mpsc::sync_channel::<(Trial, Step)>(2 * JUDGES_PER_DEVICE);
            let judged = Arc::new(Mutex::new(judged));
            // A judge triages a failing native trial on the device slot its run took.
            let judges = Runners {
                native: Some((exec, 0)),
                triage: session.triage,
                xfail: session.xfail.as_ref(),
                ..Runners::default()
            };
            for _ in 0..JUDGES_PER_DEVICE * session.device_count() {
                let (judged, tx, set) = (judged.clone(), tx.clone(), set.clone());
                scope.spawn(move || loop {
                    let next = judged.lock().unwrap_or_else(|e| e.into_inner()).recv();
                    let Ok((t, step)) = next else {
                        break;
                    };
                    let _ = tx.send(step.finish(&t, &judges, &set));
                });
            }
            let mut devices = Vec::new();
            for slot in 0..session.device_count() {
                let (queue, to_judge, store, ahead) = (
                    queue.clone(),
                    to_judge.clone(),
                    store.clone(),
                    ahead.clone(),
                );
                devices.push(scope.spawn(move || loop {
                    let next = queue.lock().unwrap_or_else(|e| e.into_inner()).pop_front();
                    let Some((index, group)) = next.filter(|_| !stopping()) else {
                        break;
                    };
                    ahead.taken(index);
                    let runners = Runners::native(Some((exec, slot)));
                    for t in group {
                        if stopping() {
                            break;
                        }
                        let step = start_trial(&t, &store, &runners);
                        let _ = to_judge.send((t, step));
                    }
                }));
            }
            drop(to_judge);
            let ahead = ahead.clone();
            scope.spawn(move || {
                for d in devices {
                    let _ = d.join();
                }
                ahead.finish();
            });
        }
        // Each worker's trials, a unit per case, handed to a thread per process of its pool
        // (`compile_key::UnitQueue`: a configuration compiles in one process, once).
        for (index, trials) in per_worker.into_iter().enumerate() {
            let queue = Arc::new(super::compile_key::UnitQueue::new(
                super::compile_key::units(trials),
            ));
            let worker = &session.workers[index];
            let threads = worker.pool_size().min(queue.len());
            for slot in 0..threads {
                // The process starts while its thread builds the first unit's case.
                scope.spawn(move || worker.warm(slot));
                let (queue, tx, store, set) =
                    (queue.clone(), tx.clone(), store.clone(), set.clone());
                let runners = Runners {
                    keep,
                    worker_slot: slot,
                    ..session.runners(0)
                };
                scope.spawn(move || {
                    let _release = super::compile_key::Releaser {
                        queue: &queue,
                        slot,
                    };
                    while let Some(unit) = queue.next(slot, stopping) {
                        for t in &unit.trials {
                            if stopping() {
                                break;
                            }
                            let _ = tx.send(run_trial(t, &store, &runners, &set));
                        }
                        queue.finished(unit.key());
                    }
                });
            }
        }
        // CPU trials on threads of their own, not as jobs of rayon's pool: a trial may wait
        // for a case another thread is building with the pool's parallel loops, and a pool
        // thread parked in that wait could leave those loops without threads (a deadlock).
        let cpu = Arc::new(Mutex::new(VecDeque::from(cpu)));
        for _ in 0..rayon::current_num_threads() {
            let (cpu, tx, store, set) = (cpu.clone(), tx.clone(), store.clone(), set.clone());
            scope.spawn(move || loop {
                let next = cpu.lock().unwrap_or_else(|e| e.into_inner()).pop_front();
                let Some(t) = next.filter(|_| !stopping()) else {
                    break;
                };
                let runners = Runners {
                    xfail: session.xfail.as_ref(),
                    ..Runners::default()
                };
                let _ = tx.send(run_trial(&t, &store, &runners, &set));
            });
        }
        drop(tx);
        for row in rx {
            on_row(row);
        }
    });
}
