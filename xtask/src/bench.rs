//! `cargo xtask bench`: the benchmarks (not written yet).

use clap::Args;

/// Options of `cargo xtask bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {}

/// Runs the benchmarks.
pub fn run(_args: &BenchArgs) -> anyhow::Result<()> {
    anyhow::bail!("not implemented yet")
}
