//! The `dependencies` stage of `cargo xtask test`: the dependency trees of the workspace and of
//! the tc program (`shaper-ebpf`, with its own lock file).
//!
//! - unused dependencies: cargo-machete, which reads the sources of every crate under the
//!   workspace root (so both trees), with `--with-metadata` so that a library named unlike its
//!   package (`shaper-daemon` is `shaper`) is recognised;
//! - policy: cargo-deny against `deny.toml`: licences, bans and sources always; security
//!   advisories only when their database (`rustsec/advisory-db`) can be fetched from GitHub,
//!   which some machines cannot reach. When it cannot, the stage passes and the summary says
//!   that advisories were not checked, and why: a missing network is no fault of the code, but
//!   an advisory check that did not run is never reported as passed.

use std::io::Read as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;

use crate::{setup, util};

/// Where the advisories come from (cargo-deny's default database).
const ADVISORY_DB: &str = "https://github.com/rustsec/advisory-db";
/// How long fetching the advisory database may take before the advisories are skipped (a
/// network that drops packets rather than refusing them would otherwise hang the stage).
const FETCH_TIMEOUT: Duration = Duration::from_secs(180);

/// Runs every check; returns what could not be checked, and why.
pub fn check() -> anyhow::Result<Vec<String>> {
    let unused = machete().and_then(|mut cmd| util::run(&mut cmd));
    let mut skipped = Vec::new();
    let mut checks = vec!["licenses", "bans", "sources"];
    match fetch_advisories() {
        Ok(()) => checks.push("advisories"),
        Err(why) => {
            let note = format!("security advisories (RustSec): {why}");
            eprintln!("\n*** NOT CHECKED: {note} ***\n");
            skipped.push(note);
        }
    }
    let root = util::workspace_root();
    let ebpf_manifest = root.join("shaper-ebpf").join("Cargo.toml");
    util::all_ok(vec![
        ("unused dependencies", unused),
        ("cargo deny (workspace)", util::run(deny(None).arg("check").args(&checks))),
        (
            "cargo deny (shaper-ebpf)",
            // The licences allowed are the workspace's; the tc program's smaller tree need not
            // use each of them.
            util::run(deny(Some(ebpf_manifest)).args(["check", "-A", "license-not-encountered"]).args(&checks)),
        ),
    ])?;
    Ok(skipped)
}

/// `cargo-machete --with-metadata` over the workspace root. Run as a program, not as
/// `cargo machete`: it takes itself for a cargo subcommand only when `CARGO_PKG_NAME` is unset,
/// and `cargo run` sets it for xtask.
fn machete() -> anyhow::Result<Command> {
    let name = setup::CARGO_MACHETE.name;
    let program =
        util::find_program(name).with_context(|| format!("{name} is missing (`cargo xtask setup` installs it)"))?;
    let mut cmd = util::command(program, &["--with-metadata"]);
    cmd.arg(util::workspace_root()).env("PATH", util::path_with_cargo_bin());
    Ok(cmd)
}

/// `cargo deny` with the workspace's `deny.toml`, for the workspace or for the crate at
/// `manifest`; a subcommand and its arguments follow.
fn deny(manifest: Option<PathBuf>) -> Command {
    let mut cmd = util::cargo_at_root(&["deny", "--config"]);
    cmd.arg(util::workspace_root().join("deny.toml"));
    if let Some(manifest) = manifest {
        cmd.arg("--manifest-path").arg(manifest);
    }
    cmd
}

/// `cargo deny fetch db`, within [`FETCH_TIMEOUT`]; the error says why it failed.
fn fetch_advisories() -> Result<(), String> {
    let mut cmd = deny(None);
    cmd.args(["fetch", "db"]);
    let shown = util::display_command(&cmd);
    eprintln!("+ {shown}");
    match run_captured(&mut cmd, FETCH_TIMEOUT) {
        Ok((true, _)) => Ok(()),
        Ok((false, output)) => {
            Err(format!("the advisory database could not be fetched from {ADVISORY_DB} ({})", last_line(&output)))
        }
        Err(e) => Err(format!("the advisory database could not be fetched from {ADVISORY_DB} ({e:#})")),
    }
}

/// Runs `cmd` with its stderr (where cargo-deny logs) captured and echoed at the end; returns
/// whether it succeeded and that output. Kills it after `timeout`, which is an error.
fn run_captured(cmd: &mut Command, timeout: Duration) -> anyhow::Result<(bool, String)> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start `{}`", util::display_command(cmd)))?;
    let mut stderr = child.stderr.take().context("stderr is piped")?;
    let reader = std::thread::spawn(move || {
        let mut text = Vec::new();
        let _ = stderr.read_to_end(&mut text);
        String::from_utf8_lossy(&text).into_owned()
    });
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().context("cannot wait for the child")? {
            break Some(status);
        }
        if started.elapsed() > timeout {
            // With its children too: a `git` it started would hold the pipe open.
            util::kill_tree(&child);
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let output = reader.join().unwrap_or_default();
    eprint!("{output}");
    match status {
        Some(status) => Ok((status.success(), output)),
        None => anyhow::bail!("timed out after {} s", timeout.as_secs()),
    }
}

/// The last non-empty line of `output`, which is where tools put their final error.
fn last_line(output: &str) -> &str {
    output.lines().map(str::trim).rfind(|line| !line.is_empty()).unwrap_or("no output")
}

#[cfg(test)]
mod tests {
    use std::process::Command;
    use std::time::Duration;

    use super::{last_line, run_captured};

    #[test]
    fn captured_output_and_status() {
        let (ok, output) =
            run_captured(Command::new("sh").args(["-c", "echo why >&2; exit 3"]), Duration::from_secs(30)).unwrap();
        assert!(!ok);
        assert_eq!(output, "why\n");
    }

    #[test]
    fn timeout_kills_the_whole_tree() {
        let started = std::time::Instant::now();
        let err = run_captured(Command::new("sh").args(["-c", "sleep 30 & sleep 30"]), Duration::from_millis(200))
            .unwrap_err();
        assert!(err.to_string().contains("timed out"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(10), "a grandchild kept the pipe open");
    }

    #[test]
    fn last_line_of_output() {
        assert_eq!(last_line("a\nerror: no network\n\n"), "error: no network");
        assert_eq!(last_line(""), "no output");
    }
}
