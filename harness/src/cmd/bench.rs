//! `relattn bench` (not built yet).

#[derive(Debug, clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    Err(crate::exit::usage(
        "`relattn bench` is not available in this build",
    ))
}
