//! `cargo xtask demo`: builds everything, then runs `shaper-demo` (the roommates of seed 000
//! on a gateway of network namespaces, see `tests/src/bin/shaper-demo.rs`) on a kernel with
//! `sch_fq`: the host's if it has one, otherwise the test VM's.

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
