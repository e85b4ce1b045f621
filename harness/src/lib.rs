//! relattn-harness: the `relattn` command's library part, shared with the `trials` test target.

pub mod args;
pub mod bench;
pub mod case_by_id;
pub mod case_set;
pub mod cmd;
pub mod coverage;
pub mod engine;
pub mod exit;
pub mod filter;
pub mod gpu_exec;
pub mod gpu_status;
pub mod output;
pub mod phases;
pub mod progress;
pub mod provenance;
pub mod run_lock;
pub mod runner;
pub mod sanitize;
pub mod selfcheck;
pub mod session;
pub mod table;
pub mod threads;
pub mod trace;
pub mod trial_list;
pub mod worker;
pub mod xfail;
