//! `cargo xtask bench`: the datapath's cost per packet on a many-flow mix and on one packet
//! repeated, next to an empty tc program measured in the same run; the control loop's tick
//! at 10,000 classes next to 100 (`tests/src/bin/shaper-bench.rs`). Prints one table with
//! ratios and goals, and writes it to `target/bench/` as JSON and a PNG chart. Runs on the
//! host kernel (`BPF_PROG_TEST_RUN`; no `fq` needed).
//!
//! `--short` is the version the test stage `bench` runs: fewer packets, and a non-zero exit
//! if a ratio regresses past its bound (`shaper_tests::bench::Row::bound`).

use anyhow::{bail, Context as _};
use clap::Args;

use crate::{setup, util};

/// Options of `cargo xtask bench`.
#[derive(Args, Debug, Default)]
pub struct BenchArgs {
    /// Fewer packets and ticks, no model sweep; fail if a ratio regresses past its bound.
    #[arg(long)]
    pub short: bool,
}

/// Builds the bench (optimised: the control loop's tick is timed too) and runs it.
pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    setup::require_root("the benchmarks (BPF_PROG_TEST_RUN)")?;
    setup::ensure_all()?;
    util::run(&mut util::cargo_at_root(&["build", "--release", "-p", "shaper-tests", "--bin", "shaper-bench"]))?;
    let bench = util::target_dir().join("release/shaper-bench");
    let out = util::target_dir().join("bench");
    let mut cmd = std::process::Command::new(&bench);
    cmd.arg("--out").arg(&out);
    if args.short {
        cmd.args(["--short", "--check"]);
    }
    let status = cmd.status().with_context(|| format!("running {}", bench.display()))?;
    if !status.success() {
        bail!("the benchmark failed ({status})");
    }
    Ok(())
}
