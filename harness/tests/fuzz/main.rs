//! The fuzz suite: structure-aware generators (proptest) of case files, matrix files, report
//! directories and command lines, each input run through the `relattn` binary as a child under
//! a memory limit and a time limit (`bounded`). Every input must end in exit 0, 1 or 2 (3 for
//! GPU commands on a machine without a GPU), within the time limit, with no panic text on
//! stderr, and write nothing but its named outputs (no temporary files left, nothing outside
//! `--out`). Each kind starts from the regression corpus (tests/corpus/).
//!
//! Bounded for CPU CI: per kind at most `RELATTN_FUZZ_CASES` generated inputs (default 1000)
//! and `RELATTN_FUZZ_SECONDS` seconds (default 12); `RELATTN_FUZZ_SEED` picks another
//! deterministic stream (default 19). The figures of each kind are printed on stderr (see them
//! with `-- --nocapture`); `RELATTN_FUZZ_REASONS=1` adds the commonest refusals.

#[path = "../binary/mod.rs"]
mod binary;
#[path = "../bounded/mod.rs"]
mod bounded;
mod cases;
mod command_lines;
mod files;
mod matrices;
mod processes;
#[path = "../python/mod.rs"]
mod python;
mod report_files;
mod reports;
mod run;
mod workers;
