//! `cargo xtask bench`: the datapath's cost per packet on a many-flow mix and on one packet
//! repeated, next to an empty tc program measured in the same run; the control loop's tick
//! at 10,000 classes next to 100 (`tests/src/bin/shaper-bench.rs`). Prints one table with
//! ratios and goals, and writes it to `target/bench/` as JSON and a PNG chart. Runs on the
//! host kernel (`BPF_PROG_TEST_RUN`; no `fq` needed).
//!
//! `--forwarding` runs the VM benchmarks: small UDP datagrams forwarded through the gateway
//! namespace with nothing, shaper and HTB on the WAN interface (`tests/tests/vm/forwarding.rs`),
//! and shaperd's memory and idle CPU with many classes and rules (`tests/tests/vm/footprint.rs`).
//!
//! `--short` is the version the test stage `bench` runs: fewer packets, and a non-zero exit
//! if a ratio regresses past its bound (`shaper_tests::bench::Row::bound`) in the run and in
//! a second one that follows it.

use anyhow::{bail, Context as _};
use clap::Args;

use crate::{setup, util};

/// Options of `cargo xtask bench`.
#[derive(Args, Debug, Default)]
pub struct BenchArgs {
    /// Fewer packets and ticks, no model sweep; fail if a ratio regresses past its bound.
    #[arg(long)]
    pub short: bool,
    /// Instead, in the VM (its kernel has `sch_fq`): small UDP datagrams forwarded through
    /// the gateway namespace with nothing, shaper and HTB on the WAN interface; shaperd's
    /// memory and idle CPU with many classes and rules.
    #[arg(long, conflicts_with = "short")]
    pub forwarding: bool,
}

/// The VM benchmarks `--forwarding` runs, and the JSON file each writes.
const VM_BENCHES: [(&str, &str); 2] = [
    ("forwarding::small_udp_through_the_gateway_none_shaper_htb", "forwarding.json"),
    ("footprint::shaperd_memory_and_idle_cpu_with_many_classes_and_rules", "footprint.json"),
];

/// Builds the bench (optimised: the control loop's tick is timed too) and runs it.
pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    setup::require_root("the benchmarks (BPF_PROG_TEST_RUN)")?;
    setup::ensure_all()?;
    if args.forwarding {
        let names = VM_BENCHES.map(|(name, _)| name);
        crate::test::vm_tests(crate::vm::KernelLine::V6_1, &names, std::time::Duration::from_secs(1800))?;
        let out = util::target_dir().join("bench");
        std::fs::create_dir_all(&out).with_context(|| out.display().to_string())?;
        for (_, file) in VM_BENCHES {
            let written = crate::vm::vm_dir().join("test-run").join(file);
            std::fs::copy(&written, out.join(file)).with_context(|| written.display().to_string())?;
            println!("written: {}", out.join(file).display());
        }
        return Ok(());
    }
    util::run(&mut util::cargo_at_root(&["build", "--release", "-p", "shaper-tests", "--bin", "shaper-bench"]))?;
    let bench = util::target_dir().join("release/shaper-bench");
    let out = util::target_dir().join("bench");
    let run = || {
        let mut cmd = std::process::Command::new(&bench);
        cmd.arg("--out").arg(&out);
        if args.short {
            cmd.args(["--short", "--check"]);
        }
        cmd.status().with_context(|| format!("running {}", bench.display()))
    };
    let mut status = run()?;
    // A ratio past its bound (exit status 1) is measured again once: on this machine the
    // ratios of one build move by half from one minute to the next (mixed rules with
    // isolation: 5.66x to 8.27x within half an hour), while a regression stays.
    if args.short && status.code() == Some(1) {
        println!("a ratio is past its bound: measuring again; the stage fails if one is past it again");
        status = run()?;
    }
    if !status.success() {
        bail!("the benchmark failed ({status})");
    }
    Ok(())
}
