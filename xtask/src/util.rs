//! Helpers shared by the subcommands: where the workspace is, running and stopping commands,
//! shell quoting.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{bail, Context as _};

/// The workspace root: xtask always lives in `<root>/xtask`.
pub fn workspace_root() -> PathBuf {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir.parent().expect("xtask's manifest dir has a parent").to_path_buf()
}

/// The workspace's target dir (`CARGO_TARGET_DIR` if set, as cargo itself does, else `<root>/target`).
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => {
            let dir = PathBuf::from(dir);
            if dir.is_absolute() {
                dir
            } else {
                workspace_root().join(dir)
            }
        }
        _ => workspace_root().join("target"),
    }
}

/// The cargo that runs us (cargo sets `CARGO` for `cargo run`), so host builds use one toolchain.
pub fn cargo() -> PathBuf {
    std::env::var_os("CARGO").map_or_else(|| PathBuf::from("cargo"), PathBuf::from)
}

/// A command of the cargo that runs us, at the workspace root, with `~/.cargo/bin` on `PATH`
/// (where bpf-linker and the cargo subcommands that setup installs are).
pub fn cargo_at_root(args: &[&str]) -> Command {
    let mut cmd = command(cargo(), args);
    cmd.current_dir(workspace_root()).env("PATH", path_with_cargo_bin());
    cmd
}

/// `~/.cargo/bin` (where `cargo install` puts tools), honouring `CARGO_HOME`.
pub fn cargo_bin_dir() -> PathBuf {
    if let Some(home) = std::env::var_os("CARGO_HOME").filter(|h| !h.is_empty()) {
        return PathBuf::from(home).join("bin");
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
    home.join(".cargo").join("bin")
}

/// `PATH` with `~/.cargo/bin` in it (first, if it was missing), for children and the VM guest.
pub fn path_with_cargo_bin() -> std::ffi::OsString {
    let bin = cargo_bin_dir();
    let current = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs: Vec<PathBuf> = std::env::split_paths(&current).collect();
    if !dirs.contains(&bin) {
        dirs.insert(0, bin);
    }
    std::env::join_paths(dirs).unwrap_or(current)
}

/// Finds `name` in `PATH` or in `~/.cargo/bin`.
pub fn find_program(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&path_with_cargo_bin()).map(|dir| dir.join(name)).find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    path.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The command line as a user would type it, for logs and errors.
pub fn display_command(cmd: &Command) -> String {
    let mut parts = Vec::new();
    for (key, value) in cmd.get_envs() {
        // PATH is long and always the same (ours plus ~/.cargo/bin): leave it out.
        if let (Some(value), false) = (value, key == "PATH") {
            parts.push(format!("{}={}", key.to_string_lossy(), shell_quote(&value.to_string_lossy())));
        }
    }
    parts.push(shell_quote(&cmd.get_program().to_string_lossy()));
    parts.extend(cmd.get_args().map(|a| shell_quote(&a.to_string_lossy())));
    parts.join(" ")
}

/// Runs `cmd` with inherited stdio (stdin closed: CI has none); fails unless it exits 0.
pub fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let shown = display_command(cmd);
    eprintln!("+ {shown}");
    let status = cmd.stdin(Stdio::null()).status().with_context(|| format!("cannot start `{shown}`"))?;
    if !status.success() {
        bail!("`{shown}` failed: {status}");
    }
    Ok(())
}

/// Kills `child` and all its descendants (found through /proc), children first seen last.
pub fn kill_tree(child: &Child) {
    let root = i32::try_from(child.id()).expect("pid fits in i32");
    let mut pids = vec![root];
    let mut i = 0;
    while i < pids.len() {
        let parent = pids[i];
        pids.extend(children_of(parent));
        i += 1;
    }
    for pid in pids {
        // SAFETY: kill(2) with a pid we collected from our own child's tree; it has no memory
        // effects, and a pid that has gone away meanwhile just gives ESRCH.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
    }
}

/// The pids whose parent is `parent`.
fn children_of(parent: i32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                // Fields after the command (which may hold spaces) in parentheses: state ppid ...
                stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<i32>().ok())
                    == Some(parent)
            })
        })
        .collect()
}

/// Ok if every check passed; otherwise an error naming each one that failed, with its error.
pub fn all_ok(checks: Vec<(&str, anyhow::Result<()>)>) -> anyhow::Result<()> {
    let failed: Vec<String> =
        checks.into_iter().filter_map(|(name, result)| result.err().map(|e| format!("{name}: {e:#}"))).collect();
    if failed.is_empty() {
        Ok(())
    } else {
        bail!("{}", failed.join("; "))
    }
}

/// Quotes `word` for a POSIX shell (unchanged when it needs no quoting).
pub fn shell_quote(word: &str) -> String {
    let safe = !word.is_empty() && word.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%^".contains(&b));
    if safe {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// Quotes a path for a POSIX shell; errors if it is not UTF-8 (we write it into scripts).
pub fn shell_quote_path(path: &Path) -> anyhow::Result<String> {
    let s = path.to_str().with_context(|| format!("path {} is not UTF-8", path.display()))?;
    Ok(shell_quote(s))
}

/// `true` if we run as root (apt, /lib/modules and the kernel tests need it).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// A `Command` for `program` with `args`.
pub fn command<S: AsRef<OsStr>>(program: impl AsRef<OsStr>, args: &[S]) -> Command {
    let mut cmd = Command::new(program);
    cmd.args(args);
    cmd
}

#[cfg(test)]
mod tests {
    use super::{all_ok, shell_quote};

    #[test]
    fn quoting() {
        assert_eq!(shell_quote("abc/d-e.f"), "abc/d-e.f");
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote("$HOME"), "'$HOME'");
    }

    #[test]
    fn all_ok_reports_every_failure() {
        assert!(all_ok(vec![("a", Ok(())), ("b", Ok(()))]).is_ok());
        let err = all_ok(vec![("a", Err(anyhow::anyhow!("one"))), ("b", Ok(())), ("c", Err(anyhow::anyhow!("two")))])
            .unwrap_err()
            .to_string();
        assert_eq!(err, "a: one; c: two");
    }
}
