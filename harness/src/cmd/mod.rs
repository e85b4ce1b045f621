//! One module per subcommand. Each defines its clap `Args` and `run(args) -> anyhow::Result<()>`;
//! errors carry their exit code (`crate::exit`).

pub mod bench;
pub mod bench_reference;
pub mod compile_check;
pub mod devices;
pub mod exec;
pub mod gen;
pub mod judge;
pub mod matrix;
pub mod mutants;
pub mod reference;
pub mod report;
pub mod route;
pub mod route_check;
pub mod run;
