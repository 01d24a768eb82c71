//! `cargo xtask setup`: installs, idempotently, everything the project needs on Debian/Ubuntu.
//!
//! Four layers, each checked before anything is installed (so a second run only checks):
//! 1. apt packages: Debian's Rust 1.96 with a prebuilt `core` for `bpfel-unknown-none` and its
//!    clippy, LLVM 22 (for bpf-linker), QEMU and the tools the tests run (iperf3, ping, tc);
//! 2. `bpf-linker`, built against Debian's LLVM 22 (which matches rustc-web's LLVM);
//! 3. the cargo subcommands of the dependency checks: cargo-machete and cargo-deny;
//! 4. the VM: Debian 12's kernels 6.1 (clsact) and 6.12 (TCX), both with `sch_fq`, and
//!    virtme-ng (see [`crate::vm`]).
//!
//! The recipe and why each piece is needed: `../shared/KERNEL-AND-TOOLCHAIN.md`.

use std::process::Command;

use anyhow::{bail, Context as _};

use crate::util;

/// Debian packages the project needs (build, BPF toolchain, VM, test tools).
pub const APT_PACKAGES: &[&str] = &[
    "rustc-web",
    "cargo-web",
    "libstd-rust-web-dev-bpf",
    // Clippy for that rustc: the clippy stage lints the tc program for the BPF target with it.
    "rust-web-clippy",
    "llvm-22-dev",
    "libpolly-22-dev",
    "clang-22",
    "lld-22",
    "qemu-system-x86",
    "busybox-static",
    "kmod",
    "iperf3",
    "iputils-ping",
    "iproute2",
    // The NAT tests masquerade on the gateway (tests/tests/vm/nat.rs).
    "nftables",
    "python3-venv",
    // The demo's charts are labelled with DejaVu Sans.
    "fonts-dejavu-core",
    // The metrics tests scrape shaperd with a real Prometheus server and check the
    // exposition with promtool.
    "prometheus",
    // systemd-analyze and systemd-sysusers check contrib/ (tests/tests/contrib.rs); containers
    // and minimal installs lack them.
    "systemd",
];

/// Where Debian's LLVM 22 lives (for bpf-linker's llvm-sys).
const LLVM_PREFIX: &str = "/usr/lib/llvm-22";
/// The bpf-linker release known to build against Debian's LLVM 22 (the LLVM of Debian's rustc
/// 1.96); pinned so that a later release wanting another LLVM cannot break a fresh setup.
const BPF_LINKER: &str = "bpf-linker@0.13.0";

/// A cargo subcommand installed from crates.io with `cargo install --locked`.
pub struct CargoTool {
    /// The crate, which is also the name of the program.
    pub name: &'static str,
    /// Pinned, so that a fresh setup gets the release these checks were written against (a
    /// later one may want a newer Rust, or read `deny.toml` differently).
    pub version: &'static str,
}

/// Finds unused dependencies (the `dependencies` stage of `cargo xtask test`).
pub const CARGO_MACHETE: CargoTool = CargoTool { name: "cargo-machete", version: "0.9.2" };
/// Checks the dependency trees' licences, bans, sources and advisories against `deny.toml`.
pub const CARGO_DENY: CargoTool = CargoTool { name: "cargo-deny", version: "0.20.2" };

/// Installs everything: apt packages, bpf-linker, cargo-machete, cargo-deny, the VM kernels and
/// virtme-ng.
pub fn ensure_all() -> anyhow::Result<()> {
    ensure_apt_packages(APT_PACKAGES)?;
    ensure_bpf_linker()?;
    for tool in [CARGO_MACHETE, CARGO_DENY] {
        ensure_cargo_tool(&tool)?;
    }
    let mut kernels = Vec::new();
    let mut vng = None;
    for line in crate::vm::KernelLine::ALL {
        let vm = crate::vm::ensure_vm(line)?;
        kernels.push(format!("{} ({}, package {})", vm.kernel.release, line.attach_mode(), vm.kernel.package));
        vng = Some(vm.vng);
    }
    eprintln!(
        "setup: everything is in place; VM kernels {}; {}",
        kernels.join(", "),
        vng.as_deref().map(std::path::Path::display).expect("KernelLine::ALL is not empty")
    );
    Ok(())
}

/// `true` if the Debian package `name` is installed.
pub fn apt_package_installed(name: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", name])
        .output()
        .is_ok_and(|out| out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "install ok installed")
}

/// Installs the missing ones among `packages` (running `apt-get update` first only if some are).
pub fn ensure_apt_packages(packages: &[&str]) -> anyhow::Result<()> {
    let missing: Vec<&str> = packages.iter().copied().filter(|p| !apt_package_installed(p)).collect();
    if missing.is_empty() {
        eprintln!("setup: apt packages already there ({} checked)", packages.len());
        return Ok(());
    }
    require_root(&format!("install apt packages {}", missing.join(" ")))?;
    eprintln!("setup: installing apt packages: {}", missing.join(" "));
    apt_get_update()?;
    let mut install = apt_get(&["install", "-y"]);
    install.args(&missing);
    util::run(&mut install)?;
    let still_missing: Vec<&str> = missing.iter().copied().filter(|p| !apt_package_installed(p)).collect();
    if !still_missing.is_empty() {
        bail!("apt-get install ran but these are still not installed: {}", still_missing.join(" "));
    }
    eprintln!("setup: installed apt packages: {}", missing.join(" "));
    Ok(())
}

/// `apt-get update` (quietly, non-interactively).
pub fn apt_get_update() -> anyhow::Result<()> {
    util::run(&mut apt_get(&["update", "-q"]))
}

/// An `apt-get` command that never asks questions.
pub fn apt_get(args: &[&str]) -> Command {
    let mut cmd = util::command("apt-get", args);
    cmd.env("DEBIAN_FRONTEND", "noninteractive");
    cmd
}

/// Installs `bpf-linker` (with `cargo install`, into `~/.cargo/bin`) unless it is on `PATH` there.
pub fn ensure_bpf_linker() -> anyhow::Result<()> {
    if let Some(path) = util::find_program("bpf-linker") {
        eprintln!("setup: bpf-linker already there ({})", path.display());
        return Ok(());
    }
    if !std::path::Path::new(LLVM_PREFIX).join("bin/llvm-config").exists() {
        bail!("bpf-linker needs LLVM 22 at {LLVM_PREFIX} (apt package llvm-22-dev), which is missing");
    }
    eprintln!("setup: building bpf-linker against LLVM 22 (takes a few minutes)");
    let mut cmd =
        util::command(util::cargo(), &["install", BPF_LINKER, "--no-default-features", "--features", "llvm-22"]);
    // llvm-sys reads LLVM_SYS_221_PREFIX, but bpf-linker's own build script finds the LLVM
    // library directory through LLVM_PREFIX or else the first `llvm-config` on PATH; Debian's
    // `llvm` package puts an older one (LLVM 14) in /usr/bin, and linking then fails with
    // "unable to find library -lLLVM". So name LLVM 22 in both ways.
    let mut path = vec![std::path::Path::new(LLVM_PREFIX).join("bin")];
    path.extend(std::env::split_paths(&util::path_with_cargo_bin()));
    cmd.env("LLVM_SYS_221_PREFIX", LLVM_PREFIX)
        .env("LLVM_PREFIX", LLVM_PREFIX)
        .env("PATH", std::env::join_paths(path).context("PATH has a directory with ':' in its name")?);
    util::run(&mut cmd)?;
    let path = util::find_program("bpf-linker")
        .context("`cargo install bpf-linker` succeeded but bpf-linker is not on PATH or in ~/.cargo/bin")?;
    eprintln!("setup: installed bpf-linker ({})", path.display());
    Ok(())
}

/// Installs `tool` with `cargo install --locked` unless its pinned version is already there.
pub fn ensure_cargo_tool(tool: &CargoTool) -> anyhow::Result<()> {
    let CargoTool { name, version } = tool;
    let installed = util::find_program(name).map(|path| (installed_version(&path), path));
    match &installed {
        Some((Some(found), path)) if found == version => {
            eprintln!("setup: {name} {version} already there ({})", path.display());
            return Ok(());
        }
        Some((found, path)) => eprintln!(
            "setup: {} is {}, not {version}: installing {version}",
            path.display(),
            found.as_deref().unwrap_or("of an unknown version")
        ),
        None => eprintln!("setup: building {name} {version}"),
    }
    let spec = format!("{name}@{version}");
    let mut cmd = util::command(util::cargo(), &["install", "--locked", &spec]);
    cmd.env("PATH", util::path_with_cargo_bin());
    util::run(&mut cmd)?;
    let path = util::find_program(name)
        .with_context(|| format!("`cargo install {spec}` succeeded but {name} is not on PATH or in ~/.cargo/bin"))?;
    eprintln!("setup: installed {name} {version} ({})", path.display());
    Ok(())
}

/// The version a program prints for `--version`: the last word of its first line
/// (`cargo-deny 0.20.2`, or `0.9.2` alone for cargo-machete).
fn installed_version(program: &std::path::Path) -> Option<String> {
    let out = Command::new(program).arg("--version").output().ok().filter(|out| out.status.success())?;
    version_word(&String::from_utf8_lossy(&out.stdout))
}

fn version_word(version_output: &str) -> Option<String> {
    version_output.lines().next()?.split_whitespace().last().map(str::to_owned)
}

/// Fails with a clear message unless we are root; `what` says what needed it.
pub fn require_root(what: &str) -> anyhow::Result<()> {
    if util::is_root() {
        Ok(())
    } else {
        bail!("need root to {what}: run `cargo xtask setup` as root (e.g. with sudo -E)")
    }
}

#[cfg(test)]
mod tests {
    use super::version_word;

    #[test]
    fn version_output() {
        assert_eq!(version_word("cargo-deny 0.20.2\n").as_deref(), Some("0.20.2"));
        assert_eq!(version_word("0.9.2\n").as_deref(), Some("0.9.2"));
        assert_eq!(version_word(""), None);
    }
}
