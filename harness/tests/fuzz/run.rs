//! The budget of a fuzz run, its figures, and what every kind of input shares.

use crate::bounded::{children_peak_kib, have_prlimit, tree, Outcome, CASE_LIMIT};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Hard time limit of one input: a child still running then is a hang.
pub(crate) const INPUT_TIMEOUT: Duration = Duration::from_secs(10);
/// Every input must finish within this (a slow input fails the suite, as a hang does).
pub(crate) const INPUT_BOUND: Duration = Duration::from_secs(5);

pub(crate) struct Budget {
    cases: u32,
    seconds: f64,
    seed: u64,
}

pub(crate) fn budget() -> Budget {
    let var = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<f64>().ok());
    Budget {
        cases: var("RELATTN_FUZZ_CASES").map_or(1000, |v| v as u32),
        seconds: var("RELATTN_FUZZ_SECONDS").unwrap_or(12.0),
        seed: var("RELATTN_FUZZ_SEED").map_or(19, |v| v as u64),
    }
}

/// What one kind's inputs did.
pub(crate) struct Figures {
    kind: &'static str,
    started: Instant,
    corpus: u32,
    generated: u32,
    by_code: BTreeMap<String, u32>,
    slowest: Duration,
    slowest_args: String,
    sampled_peak_kib: u64,
    /// Refusals by the shape of their message (digits and quoted text blanked).
    reasons: BTreeMap<String, u32>,
}

/// The shape of an error message, so that refusals of one kind count together.
pub(crate) fn reason_of(stderr: &str) -> Option<String> {
    let line = stderr.lines().find(|l| l.starts_with("error"))?;
    let mut out = String::new();
    let mut quoted = false;
    for c in line.chars() {
        match c {
            '`' | '"' => {
                quoted = !quoted;
                out.push(c);
            }
            _ if quoted => {}
            '0'..='9' => {
                if !out.ends_with('#') {
                    out.push('#');
                }
            }
            _ => out.push(c),
        }
    }
    Some(out.chars().take(90).collect())
}

impl Figures {
    pub(crate) fn new(kind: &'static str) -> Figures {
        Figures {
            kind,
            started: Instant::now(),
            corpus: 0,
            generated: 0,
            by_code: BTreeMap::new(),
            slowest: Duration::ZERO,
            slowest_args: String::new(),
            sampled_peak_kib: 0,
            reasons: BTreeMap::new(),
        }
    }

    pub(crate) fn record(&mut self, out: &Outcome, from_corpus: bool) {
        if from_corpus {
            self.corpus += 1;
        } else {
            self.generated += 1;
        }
        let code = match (out.code, out.timed_out) {
            (_, true) => "hang".to_string(),
            (Some(c), _) => format!("exit {c}"),
            (None, _) => format!("signal {:?}", out.signal),
        };
        *self.by_code.entry(code).or_default() += 1;
        if out.elapsed > self.slowest {
            self.slowest = out.elapsed;
            self.slowest_args = out.args.join(" ");
        }
        self.sampled_peak_kib = self.sampled_peak_kib.max(out.sampled_peak_kib);
        if let Some(r) = reason_of(&out.stderr) {
            *self.reasons.entry(r).or_default() += 1;
        }
    }

    pub(crate) fn print(&self) {
        eprintln!("{}", self.line());
        if std::env::var_os("RELATTN_FUZZ_REASONS").is_some() {
            let mut reasons: Vec<(&String, &u32)> = self.reasons.iter().collect();
            reasons.sort_by(|a, b| b.1.cmp(a.1));
            for (r, n) in reasons.iter().take(25) {
                eprintln!("  {n:>5}  {r}");
            }
        }
    }

    /// The one-line figures of this kind.
    pub(crate) fn line(&self) -> String {
        let codes: Vec<String> = self
            .by_code
            .iter()
            .map(|(k, v)| format!("{k}: {v}"))
            .collect();
        let mut slowest = self.slowest_args.clone();
        slowest.truncate(120);
        format!(
            "fuzz {}: {} inputs ({} corpus + {} generated) in {:.1} s; {}; panics 0, hangs 0; \
             slowest {:.3} s ({slowest}); peak RSS sampled {} KiB, of any child so far {} KiB; \
             memory limit {}",
            self.kind,
            self.corpus + self.generated,
            self.corpus,
            self.generated,
            self.started.elapsed().as_secs_f64(),
            codes.join(", "),
            self.slowest.as_secs_f64(),
            self.sampled_peak_kib,
            children_peak_kib(),
            if have_prlimit() {
                format!(
                    "{} MiB of address space (prlimit)",
                    crate::bounded::MEMORY_LIMIT >> 20
                )
            } else {
                "none (prlimit missing)".to_string()
            },
        )
    }
}

/// Run `strategy`'s inputs through `check` until the budget is spent; `check` returns the
/// outcome's violation, if any.
pub(crate) fn fuzz<S: Strategy>(
    figures: &Mutex<Figures>,
    kind_seed: u64,
    strategy: S,
    check: impl Fn(&S::Value) -> (Outcome, Option<String>),
) where
    S::Value: std::fmt::Debug,
{
    fuzz_at_most(figures, kind_seed, u32::MAX, strategy, check)
}

/// [`fuzz`] with at most `cases` inputs: for a kind whose inputs are few and costly (files of
/// megabytes), so that it stays within seconds.
pub(crate) fn fuzz_at_most<S: Strategy>(
    figures: &Mutex<Figures>,
    kind_seed: u64,
    cases: u32,
    strategy: S,
    check: impl Fn(&S::Value) -> (Outcome, Option<String>),
) where
    S::Value: std::fmt::Debug,
{
    let mut b = budget();
    b.cases = b.cases.min(cases);
    let mut seed = [0u8; 32];
    seed[..8].copy_from_slice(&b.seed.to_le_bytes());
    seed[8..16].copy_from_slice(&kind_seed.to_le_bytes());
    let config = Config {
        cases: b.cases,
        failure_persistence: None,
        max_shrink_iters: 64,
        ..Config::default()
    };
    let mut runner =
        TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &seed));
    let deadline = Instant::now() + Duration::from_secs_f64(b.seconds);
    let result = runner.run(&strategy, |input| {
        if Instant::now() > deadline {
            return Ok(());
        }
        let (out, violation) = check(&input);
        figures.lock().unwrap().record(&out, false);
        let slow = (out.elapsed > INPUT_BOUND)
            .then(|| format!("relattn {}: took {:?}", out.args.join(" "), out.elapsed));
        match violation.or(slow) {
            Some(v) => Err(TestCaseError::fail(v)),
            None => Ok(()),
        }
    });
    let f = figures.lock().unwrap();
    f.print();
    if let Err(e) = result {
        panic!("fuzz {}: {e}", f.kind);
    }
}

pub(crate) fn os(args: &[String]) -> Vec<OsString> {
    args.iter().map(OsString::from).collect()
}

pub(crate) fn with_limit(args: &[&str]) -> Vec<String> {
    let mut out = vec!["--max-case-bytes".to_string(), CASE_LIMIT.to_string()];
    out.extend(args.iter().map(|a| a.to_string()));
    out
}

pub(crate) fn corpus(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/corpus")
        .join(rel)
}

/// Temporary files of `files::write_atomic` left behind anywhere under `root`.
pub(crate) fn leftovers(root: &Path) -> Vec<PathBuf> {
    tree(root)
        .into_keys()
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with('.') && n.ends_with(".tmp"))
        })
        .collect()
}

/// Numbers that sit on the limits (int32, int64, 2^64, the ranges of `limits::Dim`) and small
/// ones that make valid cases.
pub(crate) fn number() -> BoxedStrategy<u64> {
    prop_oneof![
        4 => 0u64..40,
        3 => prop::sample::select(vec![
            0u64, 1, 2, 3, 7, 8, 16, 64, 127, 128, 129, 255, 256, 257, 1023, 1024, 1025,
            4095, 4096, 4097, 65535, 65536, (1 << 31) - 2, (1 << 31) - 1, 1 << 31, 1 << 32,
            1 << 40, 1 << 62, (1 << 63) - 1, 1 << 63, u64::MAX - 1, u64::MAX,
        ]),
        1 => any::<u64>(),
    ]
    .boxed()
}

pub(crate) fn signed() -> BoxedStrategy<i64> {
    prop_oneof![
        3 => -3i64..40,
        2 => prop::sample::select(vec![
            -1i64, -2, i64::MIN, i64::MAX, i32::MAX as i64, i32::MIN as i64, (1i64 << 31),
            1 << 32, 511, 512,
        ]),
    ]
    .boxed()
}
