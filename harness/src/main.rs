//! `relattn`: validation harness for Inkling's relative-bias attention.

use clap::{Parser, Subcommand};
use relattn_harness::cmd;
use relattn_harness::exit;
use relattn_harness::output;
use relattn_kernels::gpu;
use std::process::ExitCode;

#[derive(Debug, Parser)]
#[command(
    name = "relattn",
    version,
    about = "Validate Inkling's relative-bias attention on every GPU generation"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Largest case to read or generate: the bytes of its tensors in memory (and of a case
    /// file on disk); e.g. 64M or 2G [default: 1/8 of the machine's memory].
    #[arg(long, global = true, value_name = "BYTES", value_parser = relattn_harness::args::parse_bytes)]
    max_case_bytes: Option<u64>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a matrix: routing checks, reference self-checks and (with a GPU) GPU trials; write reports.
    Run(cmd::run::Args),
    /// Write a case file: a matrix case by id, a named preset, or explicit parameters.
    Gen(cmd::gen::Args),
    /// Compute the CPU reference of a case file.
    Reference(cmd::reference::Args),
    /// Judge an output file made by anything against a case file (docs/operator.md section 6).
    Judge(cmd::judge::Args),
    /// Throughput of the fast f64 reference next to the machine's f64 GEMM.
    BenchReference(cmd::bench_reference::Args),
    /// Route a shape on a compute capability (works without a GPU).
    Route(cmd::route::Args),
    /// List visible GPUs with their capability and route.
    Devices(cmd::devices::Args),
    /// Show the matrix tiers and their case counts.
    Matrix(cmd::matrix::Args),
    /// Show, plot, merge and diff reports.
    Report(cmd::report::Args),
    /// Run one GPU path on one case file.
    Exec(cmd::exec::Args),
    /// Check that planted kernel defects are caught.
    Mutants(cmd::mutants::Args),
    /// Time every GPU path on the benchmark shapes.
    Bench(cmd::bench::Args),
    /// Compile every program for every supported architecture with NVRTC (no GPU needed).
    CompileCheck(cmd::compile_check::Args),
}

fn main() -> ExitCode {
    output::exit_quietly_on_broken_pipe();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() {
                exit::Code::Usage as u8
            } else {
                0
            };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    if let Some(bytes) = cli.max_case_bytes {
        relattn_reference::limits::set_max_case_bytes(bytes);
    }
    // A malformed build-target override is a usage error for every command that compiles.
    let compiles = matches!(
        cli.command,
        Command::Run(_)
            | Command::Exec(_)
            | Command::Mutants(_)
            | Command::Bench(_)
            | Command::CompileCheck(_)
    );
    if let (true, Ok(arch)) = (compiles, std::env::var(gpu::ARCH_ENV)) {
        if let Err(e) = gpu::check_arch(&arch) {
            eprintln!("error: {}={arch}: {e}", gpu::ARCH_ENV);
            return ExitCode::from(exit::Code::Usage as u8);
        }
    }
    // Every command's threads, before it runs (a run's share of the cores with --processes).
    let processes = match &cli.command {
        Command::Run(a) => a.processes,
        _ => 1,
    };
    if let Err(e) = relattn_harness::threads::start(relattn_harness::threads::share(processes)) {
        eprintln!("error: {}", exit::message_of(&e));
        return ExitCode::from(exit::code_of(&e) as u8);
    }
    let result = match cli.command {
        Command::Run(a) => cmd::run::run(a),
        Command::Gen(a) => cmd::gen::run(a),
        Command::Reference(a) => cmd::reference::run(a),
        Command::Judge(a) => cmd::judge::run(a),
        Command::BenchReference(a) => cmd::bench_reference::run(a),
        Command::Route(a) => cmd::route::run(a),
        Command::Devices(a) => cmd::devices::run(a),
        Command::Matrix(a) => cmd::matrix::run(a),
        Command::Report(a) => cmd::report::run(a),
        Command::Exec(a) => cmd::exec::run(a),
        Command::Mutants(a) => cmd::mutants::run(a),
        Command::Bench(a) => cmd::bench::run(a),
        Command::CompileCheck(a) => cmd::compile_check::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {}", exit::message_of(&err));
            ExitCode::from(exit::code_of(&err) as u8)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Cli;
    use clap::CommandFactory;

    /// Every argument (flag or positional) of every subcommand, at every depth, has help text,
    /// and so does every subcommand: `--help` explains each.
    #[test]
    fn every_argument_and_subcommand_has_help() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>, seen: &mut usize) {
            for arg in cmd.get_arguments().filter(|a| !a.is_hide_set()) {
                *seen += 1;
                let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
                if help.trim().is_empty() {
                    missing.push(format!("{path} {}", arg.get_id()));
                }
            }
            for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
                let path = format!("{path} {}", sub.get_name());
                if sub.get_about().is_none() && sub.get_name() != "help" {
                    missing.push(format!("{path} (the subcommand)"));
                }
                walk(sub, &path, missing, seen);
            }
        }
        let mut cmd = Cli::command();
        cmd.build();
        let (mut missing, mut seen) = (Vec::new(), 0);
        walk(&cmd, "relattn", &mut missing, &mut seen);
        assert!(
            seen > 100,
            "only {seen} arguments seen: is the tree walked?"
        );
        assert!(
            missing.is_empty(),
            "without help text:\n{}",
            missing.join("\n")
        );
    }
}
