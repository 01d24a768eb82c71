//! `cargo xtask demo`: the shaping demo (not written yet).

use clap::Args;

/// Options of `cargo xtask demo`.
#[derive(Args, Debug)]
pub struct DemoArgs {}

/// Runs the demo.
pub fn run(_args: &DemoArgs) -> anyhow::Result<()> {
    anyhow::bail!("not implemented yet")
}
