//! Builds the tc program (`shaper-ebpf`) for `bpfel-unknown-none` and leaves the object in
//! `OUT_DIR/shaper.bpf.o`, where `bpf.rs` embeds it.
//!
//! Two toolchains can build it, tried in this order (or forced with
//! `SHAPER_BPF_TOOLCHAIN=debian|nightly`):
//! - **debian**: Debian's `rustc-web` (`/usr/bin/rustc`) with its prebuilt `core` for the BPF
//!   targets (package `libstd-rust-web-dev-bpf`); needs `RUSTC_BOOTSTRAP=1` for aya-ebpf's
//!   unstable features.
//! - **nightly**: rustup's nightly with the `rust-src` component (`-Z build-std=core`), the
//!   usual aya route on developer machines.
//!
//! Both link with `bpf-linker`. When neither is usable the build fails and says what is
//! missing; `cargo xtask setup` installs the Debian route.

use std::{
    env,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _, Result};

include!("bpf_build.rs");

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Toolchain {
    Debian,
    Nightly,
}

fn main() -> Result<()> {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?);
    let root = manifest.parent().context("shaper-daemon has no parent directory")?;
    let ebpf = root.join("shaper-ebpf");
    for path in [
        "shaper-ebpf/src",
        "shaper-ebpf/Cargo.toml",
        "shaper-ebpf/Cargo.lock",
        "shaper-common/src",
        "shaper-daemon/bpf_build.rs",
    ] {
        println!("cargo:rerun-if-changed={}", root.join(path).display());
    }
    println!("cargo:rerun-if-env-changed=SHAPER_BPF_TOOLCHAIN");

    let out = PathBuf::from(env::var("OUT_DIR")?);
    let linker = find_bpf_linker();
    let toolchain = choose(linker.as_deref())?;
    println!("cargo:warning=building the tc program with the {toolchain:?} BPF toolchain");

    let target_dir = root.join("target").join("bpf");
    let mut cmd = match toolchain {
        Toolchain::Debian => {
            let mut c = Command::new(DEBIAN_CARGO);
            c.env("RUSTC", DEBIAN_RUSTC).env("RUSTC_BOOTSTRAP", "1");
            c.args(["build", "--release", "--target", BPF_TARGET]);
            c
        }
        Toolchain::Nightly => {
            let mut c = Command::new("rustup");
            c.args(["run", "nightly", "cargo", "build", "--release", "--target", BPF_TARGET]);
            c.args(["-Z", "build-std=core"]);
            c
        }
    };
    // The outer build's settings are for the host target; none of them apply here.
    for (key, _) in env::vars_os() {
        let key = key.to_string_lossy().into_owned();
        if is_outer_build_setting(&key) || (key == "RUSTC" && toolchain == Toolchain::Nightly) {
            cmd.env_remove(&key);
        }
    }
    cmd.env("CARGO_ENCODED_RUSTFLAGS", BPF_RUSTFLAGS);
    if let Some(linker) = &linker {
        if let Some(dir) = linker.parent() {
            let path = env::var_os("PATH").unwrap_or_default();
            let mut dirs = vec![dir.to_path_buf()];
            dirs.extend(env::split_paths(&path));
            cmd.env("PATH", env::join_paths(dirs)?);
        }
    }
    cmd.current_dir(&ebpf).arg("--target-dir").arg(&target_dir);
    let status = cmd.status().with_context(|| format!("running {cmd:?}"))?;
    if !status.success() {
        bail!("building shaper-ebpf failed ({status}); command: {cmd:?}");
    }
    let object = target_dir.join(BPF_TARGET).join("release").join("shaper");
    std::fs::copy(&object, out.join("shaper.bpf.o")).with_context(|| format!("copying {}", object.display()))?;
    Ok(())
}

fn find_bpf_linker() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = env::var_os("PATH").map(|p| env::split_paths(&p).collect()).unwrap_or_default();
    if let Some(home) = env::var_os("CARGO_HOME") {
        dirs.push(Path::new(&home).join("bin"));
    }
    if let Some(home) = env::var_os("HOME") {
        dirs.push(Path::new(&home).join(".cargo/bin"));
    }
    dirs.into_iter().map(|d| d.join("bpf-linker")).find(|p| p.is_file())
}

fn debian_ready() -> Result<(), String> {
    let mut missing = Vec::new();
    if !Path::new("/usr/bin/rustc").is_file() || !Path::new("/usr/bin/cargo").is_file() {
        missing.push("Debian's rustc and cargo (packages rustc-web, cargo-web)");
    }
    if !Path::new("/usr/lib/rustlib/bpfel-unknown-none").is_dir() {
        missing.push("Debian's core library for bpfel-unknown-none (package libstd-rust-web-dev-bpf)");
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(missing.join(", "))
    }
}

fn nightly_ready() -> Result<(), String> {
    let sysroot = Command::new("rustup")
        .args(["run", "nightly", "rustc", "--print", "sysroot"])
        .output()
        .map_err(|e| format!("rustup not runnable ({e})"))?;
    if !sysroot.status.success() {
        return Err("no rustup nightly toolchain".into());
    }
    let sysroot = PathBuf::from(String::from_utf8_lossy(&sysroot.stdout).trim());
    if sysroot.join("lib/rustlib/src/rust/library/core").is_dir() {
        Ok(())
    } else {
        Err("rustup nightly lacks the rust-src component".into())
    }
}

fn choose(linker: Option<&Path>) -> Result<Toolchain> {
    let forced = env::var("SHAPER_BPF_TOOLCHAIN").ok();
    let debian = debian_ready();
    let nightly = nightly_ready();
    let chosen = match forced.as_deref() {
        Some("debian") => debian.clone().map(|()| Toolchain::Debian).ok(),
        Some("nightly") => nightly.clone().map(|()| Toolchain::Nightly).ok(),
        Some(other) => bail!("SHAPER_BPF_TOOLCHAIN={other}: expected `debian` or `nightly`"),
        None => match (&debian, &nightly) {
            (Ok(()), _) => Some(Toolchain::Debian),
            (_, Ok(())) => Some(Toolchain::Nightly),
            _ => None,
        },
    };
    match (chosen, linker) {
        (Some(t), Some(_)) => Ok(t),
        (chosen, linker) => {
            let mut why = Vec::new();
            if chosen.is_none() {
                why.push(format!("debian route: missing {}", debian.err().unwrap_or_default()));
                why.push(format!("nightly route: {}", nightly.err().unwrap_or_default()));
            }
            if linker.is_none() {
                why.push("bpf-linker is not on PATH nor in ~/.cargo/bin".into());
            }
            bail!(
                "no toolchain can build the tc program (shaper-ebpf):\n  - {}\nRun `cargo xtask setup` (Debian/Ubuntu, as root) to install the Debian route, or install rustup nightly with rust-src and bpf-linker.",
                why.join("\n  - ")
            )
        }
    }
}
