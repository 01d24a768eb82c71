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
    if host_has_fq() {
        eprintln!("demo: this kernel has sch_fq; running on the host");
        let status =
            Command::new(&demo).arg(&config).status().with_context(|| format!("running {}", demo.display()))?;
        if !status.success() {
            bail!("the demo failed ({status})");
        }
        return Ok(());
    }
    eprintln!("demo: this kernel has no sch_fq; running in the VM (Debian kernel, QEMU)");
    let script = format!(
        "set -e\nmodprobe sch_fq\nmodprobe veth\n{} {}\n",
        util::shell_quote_path(&demo)?,
        util::shell_quote_path(&config)?
    );
    let run = vm::run_in_vm_live(&script, &vm::vm_dir().join("demo-run"), Duration::from_secs(900))?;
    if run.exit_code != 0 {
        bail!("the demo failed in the VM (exit code {})", run.exit_code);
    }
    Ok(())
}
