//! The `relattn` commands run as a user runs them, bad inputs, the CI configuration and a run's
//! verdicts with a stand-in GPU (one test binary keeps link time low).

#[path = "../binary/mod.rs"]
mod binary;
#[path = "../bounded/mod.rs"]
mod bounded;
#[path = "../common/mod.rs"]
mod common;
#[path = "../python/mod.rs"]
mod python;

mod bad_inputs;
mod ci_config;
mod citations;
mod cli_bench;
mod cli_capture;
mod cli_cases;
mod cli_exec;
mod cli_judge;
mod cli_limits;
mod cli_loop;
mod cli_matrix;
mod cli_pool;
mod cli_reference;
mod cli_report;
mod cli_report_files;
mod cli_report_smoke;
mod cli_resume;
mod cli_route;
mod cli_run;
mod cli_sanitize;
mod cli_worker;
mod cli_xfail;
mod gpu_verdicts;
mod readme_examples;
mod vllm_releases;
