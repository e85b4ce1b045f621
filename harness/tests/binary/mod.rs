//! The `relattn` binary as the command-line tests start it.
#![allow(dead_code)] // each test binary uses a subset

use std::process::Command;

/// What the command-line tests add to every `relattn` they start: no GPU visible (an empty
/// `CUDA_VISIBLE_DEVICES`, which relattn honours), so a run gives the same report, under `cpu/`,
/// on a GPU machine as on a machine without one (the GPU trials are `trials.rs`'s and
/// `kernels/tests/`'s); and `RUST_BACKTRACE=1`, so a panic would show its backtrace.
pub const ENV: [(&str, &str); 2] = [("CUDA_VISIBLE_DEVICES", ""), ("RUST_BACKTRACE", "1")];

/// `relattn` with [`ENV`].
pub fn relattn_command() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_relattn"));
    c.envs(ENV);
    c
}

/// `relattn` seeing this machine's GPUs (no `CUDA_VISIBLE_DEVICES`), for the tests of what it
/// does with them: `devices`, and `exec` where a GPU is usable.
pub fn relattn_seeing_gpus() -> Command {
    let mut c = relattn_command();
    c.env_remove("CUDA_VISIBLE_DEVICES");
    c
}
