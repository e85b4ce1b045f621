//! Helpers shared by the command-line tests.
#![allow(dead_code)] // each test binary uses a subset

use std::process::{Command, Output};

/// Run the `relattn` binary. RUST_BACKTRACE=1, so a panic would show its backtrace: the error
/// tests must never see one.
pub fn relattn(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_relattn"))
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("the relattn binary runs")
}

/// `relattn` with extra environment variables.
pub fn relattn_env(args: &[&str], vars: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_relattn"))
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .envs(vars.iter().copied())
        .output()
        .expect("the relattn binary runs")
}

/// Output bytes as text.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}
