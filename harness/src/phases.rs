//! Where a run's time goes: busy seconds per phase (generating cases, the reference, compiling,
//! the GPU or worker runs, judging, the reference self-checks), summed over the threads that did
//! the work, so the next bottleneck of a run is visible in its report.

use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Generate,
    Reference,
    Compile,
    /// Native paths on the device.
    Gpu,
    /// Worker processes (whatever device they use).
    Workers,
    Judge,
    SelfChecks,
    /// Failing trials run again in variants (`engine/triage.rs`).
    Triage,
}

const PHASES: [Phase; 8] = [
    Phase::Generate,
    Phase::Reference,
    Phase::Compile,
    Phase::Gpu,
    Phase::Workers,
    Phase::Judge,
    Phase::SelfChecks,
    Phase::Triage,
];

static NANOS: [AtomicU64; 8] = [const { AtomicU64::new(0) }; 8];

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Generate => "generate",
            Phase::Reference => "reference",
            Phase::Compile => "compile",
            Phase::Gpu => "gpu",
            Phase::Workers => "workers",
            Phase::Judge => "judge",
            Phase::SelfChecks => "self_checks",
            Phase::Triage => "triage",
        }
    }

    fn slot(self) -> &'static AtomicU64 {
        &NANOS[PHASES.iter().position(|&p| p == self).unwrap_or(0)]
    }
}

/// Run `f`, counting its time to `phase`.
pub fn time<T>(phase: Phase, f: impl FnOnce() -> T) -> T {
    let started = Instant::now();
    let out = f();
    let nanos = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
    phase.slot().fetch_add(nanos, Ordering::Relaxed);
    crate::trace::record(phase.name(), started);
    out
}

/// Busy seconds per phase so far (this process).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Split {
    pub wall_s: f64,
    pub busy_s: Vec<(&'static str, f64)>,
    /// Kernels the workers JIT-compiled, and the seconds of the runs that compiled them.
    pub worker_compiles: (u64, f64),
}

/// The split since the process started counting, with the run's wall time.
pub fn split(wall_s: f64) -> Split {
    Split {
        wall_s,
        busy_s: PHASES
            .iter()
            .map(|p| (p.name(), p.slot().load(Ordering::Relaxed) as f64 * 1e-9))
            .collect(),
        worker_compiles: crate::worker::jit::totals(),
    }
}

impl Split {
    /// `wall 118.9 s; busy generate 12.0 s, reference 30.1 s, ...`
    pub fn line(&self) -> String {
        let busy: Vec<String> = self
            .busy_s
            .iter()
            .map(|(name, s)| format!("{name} {s:.1} s"))
            .collect();
        let (kernels, seconds) = self.worker_compiles;
        format!(
            "wall {:.1} s; busy (summed over threads) {}; workers compiled {kernels} kernels in \
             {seconds:.1} s",
            self.wall_s,
            busy.join(", ")
        )
    }

    pub fn json(&self) -> serde_json::Value {
        let mut m = serde_json::Map::new();
        m.insert("wall_s".into(), self.wall_s.into());
        m.insert(
            "worker_kernels_compiled".into(),
            self.worker_compiles.0.into(),
        );
        m.insert("worker_compile_s".into(), self.worker_compiles.1.into());
        for (name, s) in &self.busy_s {
            m.insert(format!("{name}_s"), (*s).into());
        }
        serde_json::Value::Object(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_counts_to_its_phase() {
        let before = split(0.0);
        let x = time(Phase::Judge, || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            7
        });
        assert_eq!(x, 7);
        let after = split(1.5);
        let judge = |s: &Split| s.busy_s.iter().find(|(n, _)| *n == "judge").unwrap().1;
        assert!(judge(&after) - judge(&before) >= 0.019);
        assert!(
            after.line().starts_with("wall 1.5 s; busy"),
            "{}",
            after.line()
        );
        assert_eq!(after.json()["wall_s"], 1.5);
        assert!(after.json()["self_checks_s"].is_number());
    }
}
