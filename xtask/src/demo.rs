//! `cargo xtask demo`: builds everything, then runs `shaper-demo` (the roommates of seed 000
//! on a gateway of network namespaces, see `tests/src/bin/shaper-demo.rs`) on a kernel with
//! `sch_fq`: the host's if it has one, otherwise the test VM's.
//!
//! `--seed 001`, `002`, ... replays another seed's experiment with its configuration from
//! `config/`: the VM tests that measure it (`tests/tests/vm/seeds.rs`, `download.rs`,
//! `ifb.rs`), which print each table next to the seed's own numbers.

use std::{path::PathBuf, process::Command, time::Duration};

use anyhow::{bail, Context as _};
use clap::Args;

use crate::{setup, util, vm};

/// Options of `cargo xtask demo`.
#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Configuration to demonstrate (default: config/roommates.toml).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// TCP flows instead of the seed's UDP.
    #[arg(long)]
    tcp: bool,
    /// The seed to replay: 000 (the roommates, the default), 001 (a download next to
    /// browsing, on the LAN side and on WAN ingress), 002 (`DiffServ` classes under UDP
    /// overload), 003 (a DSL uplink: ping under upload load), 004 (the lab's ceilings, port
    /// rules and firewall marks).
    #[arg(long, default_value = "000", value_parser = ["000", "001", "002", "003", "004"])]
    seed: String,
}

/// The VM tests that replay seed `seed` (other than 000) and print its tables.
fn seed_tests(seed: &str) -> &'static [&'static str] {
    match seed {
        "001" => &[
            "download::seed_001_a_download_leaves_browsing_fast_and_takes_the_whole_line_alone",
            "ifb::seed_001_on_wan_ingress_through_an_ifb",
        ],
        "002" => &["seeds::seed_002_classes_keep_their_throughput_under_udp_overload"],
        "003" => &["seeds::seed_003_pings_stay_fast_under_a_saturated_dsl_uplink"],
        _ => &["seeds::seed_004_ceilings_ports_and_marks_as_the_lab_measured"],
    }
}

/// Whether this kernel can run `fq` (probed in a scratch network namespace).
fn host_has_fq() -> bool {
    let ns = "shaper-xtask-fq-probe";
    let _ = Command::new("modprobe").arg("sch_fq").output();
    let _ = Command::new("ip").args(["netns", "add", ns]).output();
    let ok = Command::new("ip")
        .args(["netns", "exec", ns, "tc", "qdisc", "add", "dev", "lo", "root", "fq"])
        .output()
        .is_ok_and(|o| o.status.success());
    let _ = Command::new("ip").args(["netns", "del", ns]).output();
    ok
}

/// Builds the workspace binaries (shaperd, shaperctl, shaper-demo, shaper-bench).
pub fn build_bins() -> anyhow::Result<()> {
    let mut cmd = util::command(util::cargo(), &["build", "--workspace", "--bins"]);
    cmd.current_dir(util::workspace_root()).env("PATH", util::path_with_cargo_bin());
    util::run(&mut cmd)
}

/// `cargo build --workspace --bins --release`; returns the folder of the binaries.
pub fn build_release_bins() -> anyhow::Result<std::path::PathBuf> {
    let mut cmd = util::command(util::cargo(), &["build", "--workspace", "--bins", "--release"]);
    cmd.current_dir(util::workspace_root()).env("PATH", util::path_with_cargo_bin());
    util::run(&mut cmd)?;
    Ok(util::target_dir().join("release"))
}

/// Runs the demo.
pub fn run(args: &DemoArgs) -> anyhow::Result<()> {
    setup::require_root("the demo (network namespaces, BPF, qdiscs)")?;
    setup::ensure_all()?;
    if args.seed != "000" {
        if args.config.is_some() || args.tcp {
            bail!(
                "--config and --tcp are options of seed 000's demo; seed {} replays its own configuration",
                args.seed
            );
        }
        eprintln!("demo: replaying seed {} in the VM (Debian 6.1 kernel, QEMU)", args.seed);
        return crate::test::vm_tests(crate::vm::KernelLine::V6_1, seed_tests(&args.seed), Duration::from_secs(1800));
    }
    build_bins()?;
    let root = util::workspace_root();
    let demo = util::target_dir().join("debug/shaper-demo");
    let config = match &args.config {
        Some(c) => std::fs::canonicalize(c).with_context(|| format!("{}", c.display()))?,
        None => root.join("config/roommates.toml"),
    };
    let charts = util::target_dir().join("demo");
    std::fs::create_dir_all(&charts).with_context(|| format!("creating {}", charts.display()))?;
    let tcp = if args.tcp { " --tcp" } else { "" };
    if host_has_fq() {
        eprintln!("demo: this kernel has sch_fq; running on the host");
        let mut cmd = Command::new(&demo);
        cmd.arg("--config").arg(&config).arg("--out").arg(&charts);
        if args.tcp {
            cmd.arg("--tcp");
        }
        let status = cmd.status().with_context(|| format!("running {}", demo.display()))?;
        if !status.success() {
            bail!("the demo failed ({status})");
        }
        return Ok(());
    }
    eprintln!("demo: this kernel has no sch_fq; running in the VM (Debian kernel, QEMU)");
    // The guest sees the workspace read-only: the charts go to the run's writable folder.
    let rwdir = vm::vm_dir().join("demo-run");
    let script = format!(
        "set -e\nmodprobe sch_fq\nmodprobe veth\n{} --config {} --out {}{tcp}\n",
        util::shell_quote_path(&demo)?,
        util::shell_quote_path(&config)?,
        util::shell_quote_path(&rwdir)?,
    );
    let run = vm::run_in_vm_live(&script, &rwdir, Duration::from_secs(900))?;
    if run.exit_code != 0 {
        bail!("the demo failed in the VM (exit code {})", run.exit_code);
    }
    for entry in std::fs::read_dir(&rwdir).with_context(|| format!("reading {}", rwdir.display()))? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "png") {
            let to = charts.join(path.file_name().expect("a file"));
            std::fs::copy(&path, &to).with_context(|| format!("copying {}", path.display()))?;
            eprintln!("demo: chart {}", to.display());
        }
    }
    Ok(())
}
