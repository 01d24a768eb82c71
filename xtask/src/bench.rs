//! `cargo xtask bench`: the datapath's cost per packet (`tests/src/bin/shaper-bench.rs`):
//! `BPF_PROG_TEST_RUN` with many repeats for 10 and 10,000 rules, next to an empty tc
//! program measured in the same run. Runs on the host kernel (no `fq` needed).

use anyhow::{bail, Context as _};
use clap::Args;

use crate::{demo, setup, util};

/// Options of `cargo xtask bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {}

/// Runs the benchmarks and prints their figures.
pub fn run(_args: &BenchArgs) -> anyhow::Result<()> {
    setup::require_root("the benchmarks (BPF_PROG_TEST_RUN)")?;
    setup::ensure_all()?;
    demo::build_bins()?;
    let bench = util::target_dir().join("debug/shaper-bench");
    let status = std::process::Command::new(&bench).status().with_context(|| format!("running {}", bench.display()))?;
    if !status.success() {
        bail!("the benchmark failed ({status})");
    }
    Ok(())
}
