//! The `fmt` and `clippy` stages of `cargo xtask test`: formatting and lints of the workspace
//! and of the tc program (`shaper-ebpf`), which is not a workspace member and has its own
//! toolchain.
//!
//! Each stage runs all its checks and fails if any of them failed, so that one run reports
//! every problem.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context as _};

use crate::util;

/// The target, toolchain and flags `shaper-daemon/build.rs` builds the tc program with (its
/// Debian route, which `cargo xtask setup` installs and the build script prefers).
mod bpf_build {
    include!("../../shaper-daemon/bpf_build.rs");
}

use bpf_build::{is_outer_build_setting, BPF_RUSTFLAGS, BPF_TARGET, DEBIAN_CARGO, DEBIAN_RUSTC};

/// The tc program's crate, relative to the workspace root.
const EBPF_CRATE: &str = "shaper-ebpf";
/// Debian's clippy for that rustc (apt package `rust-web-clippy`): rustup's clippy belongs to
/// another compiler, which has no `core` for the BPF target here.
const BPF_CARGO_CLIPPY: &str = "/usr/bin/cargo-clippy";

/// `cargo fmt --check` on the workspace and on the tc program's crate.
pub fn fmt() -> anyhow::Result<()> {
    let ebpf_manifest = ebpf_dir().join("Cargo.toml");
    let ebpf_manifest = ebpf_manifest.to_string_lossy();
    util::all_ok(vec![
        ("workspace", util::run(&mut util::cargo_at_root(&["fmt", "--all", "--check"]))),
        (EBPF_CRATE, util::run(&mut util::cargo_at_root(&["fmt", "--check", "--manifest-path", &ebpf_manifest]))),
    ])
}

/// Clippy with warnings denied: the workspace for the host, and the tc program for the BPF
/// target.
pub fn clippy() -> anyhow::Result<()> {
    util::all_ok(vec![
        (
            "workspace",
            // All features: the VM tests are behind `shaper-tests/vm`.
            util::run(&mut util::cargo_at_root(&[
                "clippy",
                "--workspace",
                "--all-targets",
                "--all-features",
                "--",
                "-D",
                "warnings",
            ])),
        ),
        (EBPF_CRATE, clippy_bpf()),
    ])
}

/// Clippy on the tc program, run the way `shaper-daemon/build.rs` builds it.
fn clippy_bpf() -> anyhow::Result<()> {
    if !Path::new(BPF_CARGO_CLIPPY).is_file() {
        bail!("{BPF_CARGO_CLIPPY} is missing (apt package rust-web-clippy; `cargo xtask setup` installs it)");
    }
    let root = util::workspace_root();
    let mut cmd = Command::new(BPF_CARGO_CLIPPY);
    cmd.args(["clippy", "--release", "--target", BPF_TARGET])
        // The build script's own target folder: the dependencies it has built serve here too,
        // and cargo keeps clippy's results apart from the build's.
        .arg("--target-dir")
        .arg(root.join("target").join("bpf"))
        .args(["--", "-D", "warnings"]);
    // `cargo xtask` runs under the host toolchain's `cargo run`, whose settings are for the host.
    for (key, _) in std::env::vars_os() {
        if is_outer_build_setting(&key.to_string_lossy()) {
            cmd.env_remove(&key);
        }
    }
    cmd.current_dir(ebpf_dir())
        .env("CARGO", DEBIAN_CARGO)
        .env("RUSTC", DEBIAN_RUSTC)
        // aya-ebpf uses unstable features (see shaper-daemon/build.rs).
        .env("RUSTC_BOOTSTRAP", "1")
        .env("CARGO_ENCODED_RUSTFLAGS", BPF_RUSTFLAGS)
        .env("PATH", util::path_with_cargo_bin());
    // The build script's cargo inherits `HOST` from the outer build, and aya-ebpf's build
    // scripts rerun when it changes (aya-build's `emit_bpf_target_arch_cfg`); the same value
    // here keeps clippy and the build from rebuilding aya-ebpf for each other.
    cmd.env("HOST", host_triple()?);
    util::run(&mut cmd)
}

/// The host's target triple, as the BPF compiler reports it (`host:` in `rustc -vV`).
fn host_triple() -> anyhow::Result<String> {
    let out =
        Command::new(DEBIAN_RUSTC).arg("-vV").output().with_context(|| format!("cannot run {DEBIAN_RUSTC} -vV"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|line| line.strip_prefix("host: "))
        .map(str::to_owned)
        .with_context(|| format!("`{DEBIAN_RUSTC} -vV` printed no `host:` line: {text}"))
}

fn ebpf_dir() -> PathBuf {
    util::workspace_root().join(EBPF_CRATE)
}

#[cfg(test)]
mod tests {
    use super::is_outer_build_setting;

    #[test]
    fn outer_settings() {
        assert!(is_outer_build_setting("CARGO_MANIFEST_DIR"));
        assert!(is_outer_build_setting("CARGO_TARGET_DIR"));
        assert!(is_outer_build_setting("RUSTFLAGS"));
        assert!(!is_outer_build_setting("CARGO_HOME"));
        assert!(!is_outer_build_setting("PATH"));
    }
}
