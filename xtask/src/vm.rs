//! The test VM: a Debian kernel that has `sch_fq`, booted under QEMU by virtme-ng.
//!
//! Why: the host kernel here lacks `sch_fq` (and loadable modules), so EDT timestamps are not
//! enforced on it; pacing can only be tested on another kernel. virtme-ng boots that kernel with
//! the host's root file system (read-only, so host-built binaries run unchanged and the workspace
//! is visible at the same path) plus writable `--rwdir` folders.
//!
//! Two kernels, both Debian 12 packages ([`KernelLine`]): 6.1, the release's own, where shaperd
//! attaches under clsact; and 6.12, which has TCX (6.6 and later), so shaperd attaches a TCX
//! link there. `cargo xtask test` runs the full VM suite on 6.1 and a subset on 6.12.
//!
//! Everything is cached under `target/vm/`:
//! - `debs/`: the downloaded `linux-image-<ver>` packages;
//! - `kernels/<ver>/`: each package extracted (`boot/vmlinuz-<ver>`, `lib/modules/<ver>`, with
//!   the `modules.dep` that `depmod` writes there). virtme-ng finds the modules next to the
//!   image it boots (the image's `../lib/modules/<ver>`) and links them in the guest as
//!   `/lib/modules/<ver>` over a tmpfs, so `modprobe` in the guest loads from there; nothing is
//!   installed in the host's own `/lib/modules`;
//! - `venv/`: a Python venv with virtme-ng (`vng`).
//!
//! vng's own exit status is useless (255 whatever the guest command returned) and the guest's
//! output only reaches vng's stdout with `--verbose`, mixed with the kernel log; so the guest runs
//! a wrapper that writes the script's output and exit code to files in the rwdir.
//!
//! Recipe and measurements: `../shared/KERNEL-AND-TOOLCHAIN.md`.

use std::fmt::Write as _;
use std::fs;
use std::io::{Read as _, Seek as _, SeekFrom, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use clap::Args;

use crate::{setup, util};

/// The virtme-ng release the recipe was verified with.
pub const VIRTME_NG_VERSION: &str = "1.42";

/// A Debian 12 kernel series the VM can boot; each is found through a metapackage that
/// depends on its newest build, so the choice follows Debian's updates and is the same on
/// every machine with the same package lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KernelLine {
    /// Debian 12's own kernel (`linux-image-amd64`): no TCX, so shaperd attaches under clsact.
    #[value(name = "6.1")]
    V6_1,
    /// Debian 12's 6.12 (`linux-image-6.12-amd64`): TCX, so shaperd attaches a TCX link.
    #[value(name = "6.12")]
    V6_12,
}

impl KernelLine {
    /// Every line, the default first.
    pub const ALL: [Self; 2] = [Self::V6_1, Self::V6_12];

    /// The series, as `--kernel` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Self::V6_1 => "6.1",
            Self::V6_12 => "6.12",
        }
    }

    /// How shaperd attaches its program on this kernel (TCX from 6.6 on).
    pub fn attach_mode(self) -> &'static str {
        match self {
            Self::V6_1 => "clsact",
            Self::V6_12 => "TCX",
        }
    }

    /// The metapackage whose dependency names the kernel package to use.
    fn metapackage(self) -> &'static str {
        match self {
            Self::V6_1 => "linux-image-amd64",
            Self::V6_12 => "linux-image-6.12-amd64",
        }
    }

    /// `true` if `release` (`uname -r`) belongs to this series: `6.1.0-56-amd64` to 6.1,
    /// `6.12.117+deb12-amd64` to 6.12 (and neither to the other, nor a `-rt`/`-cloud` flavour).
    fn owns(self, release: &str) -> bool {
        release.strip_prefix(self.name()).is_some_and(|rest| rest.starts_with('.'))
            && release.ends_with("-amd64")
            && !release.ends_with("-rt-amd64")
            && !release.ends_with("-cloud-amd64")
    }
}

/// Memory and CPUs of the guest (the host has 2 cores).
const VM_MEMORY: &str = "2G";
const VM_CPUS: &str = "2";

/// Host environment variables passed on to the guest script when set.
const PASSED_ENV: &[&str] = &["RUST_BACKTRACE", "RUST_LOG", "CI"];

/// The result of [`run_in_vm`].
#[derive(Debug, Clone)]
pub struct VmRun {
    /// The script's exit code (128 + N if signal N killed the shell).
    pub exit_code: i32,
    /// The script's stdout and stderr, interleaved as written.
    pub output: String,
    /// Of a run shown live: each libtest test it started (its line `test NAME ... ` came),
    /// in order, with the time until the next one started or the run ended.
    pub test_times: Vec<(String, Duration)>,
}

/// The VM kernel, ready to boot.
#[derive(Debug, Clone)]
pub struct VmKernel {
    /// The Debian package it came from, e.g. `linux-image-6.1.0-56-amd64`.
    pub package: String,
    /// The kernel release (`uname -r` in the guest), e.g. `6.1.0-56-amd64`.
    pub release: String,
    /// The kernel image to boot.
    pub vmlinuz: PathBuf,
}

/// Everything a VM run needs.
#[derive(Debug, Clone)]
pub struct Vm {
    pub kernel: VmKernel,
    /// The `vng` executable (in the venv).
    pub vng: PathBuf,
}

/// Options of `cargo xtask vm`.
#[derive(Args, Debug)]
pub struct VmArgs {
    /// The kernel to boot: Debian 12's 6.1 (clsact) or its 6.12 (TCX).
    #[arg(long, value_enum, default_value = "6.1")]
    pub kernel: KernelLine,
    /// Kill the VM after this many seconds.
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
    /// A directory writable inside the guest [default: target/vm/run].
    #[arg(long)]
    pub rwdir: Option<PathBuf>,
    /// The command to run in the guest, as root, from the workspace root (put it after `--`).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub command: Vec<String>,
}

/// `cargo xtask vm -- COMMAND...`: runs the command in the VM, prints its output and exit code,
/// and exits with that code.
pub fn run(args: &VmArgs) -> anyhow::Result<ExitCode> {
    let rwdir = args.rwdir.clone().unwrap_or_else(|| vm_dir().join("run"));
    let script = args.command.iter().map(|word| util::shell_quote(word)).collect::<Vec<_>>().join(" ");
    let started = Instant::now();
    let result = run_in_vm(args.kernel, &script, &rwdir, Duration::from_secs(args.timeout))?;
    print!("{}", result.output);
    if !result.output.is_empty() && !result.output.ends_with('\n') {
        println!();
    }
    println!("vm: exit code {} (boot + run took {:.1} s)", result.exit_code, started.elapsed().as_secs_f64());
    Ok(ExitCode::from(u8::try_from(result.exit_code).unwrap_or(u8::MAX)))
}

/// `target/vm`, where the kernel, virtme-ng and run files are kept.
pub fn vm_dir() -> PathBuf {
    util::target_dir().join("vm")
}

/// Makes sure the kernel of `line` and virtme-ng are in place (installing what is missing).
pub fn ensure_vm(line: KernelLine) -> anyhow::Result<Vm> {
    let kernel = ensure_kernel(line)?;
    let vng = ensure_virtme_ng()?;
    Ok(Vm { kernel, vng })
}

/// The kernel package `line`'s metapackage currently depends on, e.g.
/// `linux-image-6.1.0-56-amd64` or `linux-image-6.12.117+deb12-amd64`. Runs `apt-get update`
/// once if apt does not know the metapackage yet (fresh machine).
pub fn kernel_package(line: KernelLine) -> anyhow::Result<String> {
    if let Some(package) = query_kernel_package(line)? {
        return Ok(package);
    }
    setup::require_root("refresh apt's package lists")?;
    setup::apt_get_update()?;
    query_kernel_package(line)?.with_context(|| {
        format!(
            "`apt-cache depends {}` names no linux-image-{}.*-amd64 package: the VM kernel comes \
             from Debian 12's archive (is this Debian 12 with main and bookworm-security enabled?)",
            line.metapackage(),
            line.name()
        )
    })
}

fn query_kernel_package(line: KernelLine) -> anyhow::Result<Option<String>> {
    let out = util::command("apt-cache", &["depends", line.metapackage()])
        .stdin(Stdio::null())
        .output()
        .context("cannot run apt-cache (is this Debian/Ubuntu?)")?;
    Ok(parse_kernel_dependency(&String::from_utf8_lossy(&out.stdout), line))
}

/// Picks `linux-image-<release>` of `line`'s series out of `apt-cache depends <metapackage>`'s
/// output.
fn parse_kernel_dependency(apt_cache_depends: &str, line: KernelLine) -> Option<String> {
    apt_cache_depends.lines().find_map(|text| {
        let name = text.trim().trim_start_matches('|').strip_prefix("Depends:")?.trim();
        let release = name.strip_prefix("linux-image-")?;
        let looks_like_release = line.owns(release) && !release.contains(['<', '>', ' ']);
        looks_like_release.then(|| name.to_owned())
    })
}

/// Downloads and extracts the Debian kernel of `line` (once) and indexes its modules.
pub fn ensure_kernel(line: KernelLine) -> anyhow::Result<VmKernel> {
    let kernels = vm_dir().join("kernels");
    let package = match kernel_package(line) {
        Ok(package) => package,
        Err(err) => {
            // Without apt (or its lists) a kernel fetched earlier is still good.
            let cached = cached_kernels(&kernels, line);
            let Some(kernel) = cached.into_iter().next() else {
                return Err(err);
            };
            eprintln!("vm: cannot resolve the current kernel package ({err:#}); using the cached {}", kernel.release);
            ensure_modules(&kernel)?;
            return Ok(kernel);
        }
    };
    let release =
        package.strip_prefix("linux-image-").expect("parse_kernel_dependency returns linux-image-*").to_owned();
    let extracted = kernels.join(&release);
    let vmlinuz = extracted.join("boot").join(format!("vmlinuz-{release}"));
    let kernel = VmKernel { package: package.clone(), release: release.clone(), vmlinuz: vmlinuz.clone() };
    if vmlinuz.is_file() {
        eprintln!("vm: kernel {release} (from {package}) already there ({})", vmlinuz.display());
    } else {
        let deb = download_deb(&package)?;
        let partial = kernels.join(format!("{release}.partial"));
        if partial.exists() {
            fs::remove_dir_all(&partial).with_context(|| format!("cannot remove {}", partial.display()))?;
        }
        fs::create_dir_all(&partial).with_context(|| format!("cannot create {}", partial.display()))?;
        util::run(Command::new("dpkg").arg("-x").arg(&deb).arg(&partial))?;
        if !partial.join("boot").join(format!("vmlinuz-{release}")).is_file() {
            bail!("{} has no boot/vmlinuz-{release}: not the kernel package expected", deb.display());
        }
        if extracted.exists() {
            fs::remove_dir_all(&extracted).with_context(|| format!("cannot remove {}", extracted.display()))?;
        }
        fs::rename(&partial, &extracted)
            .with_context(|| format!("cannot rename {} to {}", partial.display(), extracted.display()))?;
        eprintln!("vm: extracted kernel {release} ({})", vmlinuz.display());
    }
    ensure_modules(&kernel)?;
    Ok(kernel)
}

/// Kernels of `line` extracted earlier, newest name first.
fn cached_kernels(kernels: &Path, line: KernelLine) -> Vec<VmKernel> {
    let Ok(entries) = fs::read_dir(kernels) else {
        return Vec::new();
    };
    let mut found: Vec<VmKernel> = entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let release = entry.file_name().into_string().ok().filter(|r| line.owns(r))?;
            let vmlinuz = entry.path().join("boot").join(format!("vmlinuz-{release}"));
            vmlinuz.is_file().then(|| VmKernel { package: format!("linux-image-{release}"), release, vmlinuz })
        })
        .collect();
    found.sort_by(|a, b| b.release.cmp(&a.release));
    found
}

/// `apt-get download PACKAGE` into `target/vm/debs` (unless already there); returns the .deb.
fn download_deb(package: &str) -> anyhow::Result<PathBuf> {
    let debs = vm_dir().join("debs");
    fs::create_dir_all(&debs).with_context(|| format!("cannot create {}", debs.display()))?;
    let find = || -> anyhow::Result<Option<PathBuf>> {
        let prefix = format!("{package}_");
        for entry in fs::read_dir(&debs).with_context(|| format!("cannot read {}", debs.display()))? {
            let path = entry?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            if name.starts_with(&prefix) && path.extension().is_some_and(|ext| ext == "deb") {
                return Ok(Some(path));
            }
        }
        Ok(None)
    };
    if let Some(deb) = find()? {
        eprintln!("vm: {} already downloaded", deb.display());
        return Ok(deb);
    }
    eprintln!("vm: downloading {package} (70 to 110 MB)");
    // As root into a root-owned dir; without this apt warns that its `_apt` sandbox user
    // cannot write there (and then downloads unsandboxed anyway).
    let mut cmd = setup::apt_get(&["download", "-q", "-o", "APT::Sandbox::User=root", package]);
    cmd.current_dir(&debs);
    util::run(&mut cmd)?;
    find()?.with_context(|| format!("`apt-get download {package}` left no {package}_*.deb in {}", debs.display()))
}

/// Runs `depmod` over the extracted modules (`lib/modules/<release>` next to `boot/`) unless
/// their `modules.dep` is there. virtme-ng would run it on the first boot too, but silently
/// carries on without modules if that fails; here a failure says what is wrong before a VM
/// run's `modprobe sch_fq` does.
fn ensure_modules(kernel: &VmKernel) -> anyhow::Result<()> {
    let extracted = kernel.vmlinuz.parent().and_then(Path::parent).context("vmlinuz path has no parent")?;
    let modules = extracted.join("lib/modules").join(&kernel.release);
    if modules.join("modules.dep").is_file() {
        eprintln!("vm: modules for {} already indexed ({})", kernel.release, modules.display());
        return Ok(());
    }
    if !modules.join("kernel").is_dir() {
        bail!("{} has no modules: {} is missing (not the kernel package expected)", kernel.package, modules.display());
    }
    let depmod = util::find_program("depmod").unwrap_or_else(|| PathBuf::from("/usr/sbin/depmod"));
    // `-b DIR`: Debian 12's kmod reads DIR/lib/modules/<release>, where dpkg -x put them.
    let mut cmd = Command::new(depmod);
    cmd.arg("-b").arg(extracted).arg(&kernel.release);
    util::run(&mut cmd)?;
    if !modules.join("modules.dep").is_file() {
        bail!(
            "`depmod -b {} {}` wrote no {}/modules.dep (does this kmod read another modules directory?)",
            extracted.display(),
            kernel.release,
            modules.display()
        );
    }
    eprintln!("vm: indexed the modules of {} ({})", kernel.release, modules.display());
    Ok(())
}

/// Installs virtme-ng [`VIRTME_NG_VERSION`] in the venv `target/vm/venv` (once); returns `vng`.
pub fn ensure_virtme_ng() -> anyhow::Result<PathBuf> {
    let venv = vm_dir().join("venv");
    let vng = venv.join("bin").join("vng");
    let pip = venv.join("bin").join("pip");
    if installed_virtme_ng_version(&venv).as_deref() == Some(VIRTME_NG_VERSION) && vng.is_file() {
        eprintln!("vm: virtme-ng {VIRTME_NG_VERSION} already there ({})", vng.display());
        return Ok(vng);
    }
    if !pip.is_file() {
        // A venv made before python3-venv was installed has no pip: start again.
        if venv.exists() {
            fs::remove_dir_all(&venv).with_context(|| format!("cannot remove {}", venv.display()))?;
        }
        eprintln!("vm: creating the Python venv {}", venv.display());
        util::run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
    }
    eprintln!("vm: installing virtme-ng {VIRTME_NG_VERSION} from PyPI");
    util::run(&mut util::command(
        &pip,
        &["install", "--quiet", "--disable-pip-version-check", &format!("virtme-ng=={VIRTME_NG_VERSION}")],
    ))?;
    if !vng.is_file() {
        bail!("pip installed virtme-ng but there is no {}", vng.display());
    }
    eprintln!("vm: installed virtme-ng {VIRTME_NG_VERSION} ({})", vng.display());
    Ok(vng)
}

/// The virtme-ng version installed in `venv`, read from its package metadata (no Python start).
fn installed_virtme_ng_version(venv: &Path) -> Option<String> {
    let lib = fs::read_dir(venv.join("lib")).ok()?;
    for python in lib.filter_map(Result::ok) {
        let site = python.path().join("site-packages");
        let Ok(entries) = fs::read_dir(&site) else {
            continue;
        };
        for entry in entries.filter_map(Result::ok) {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if let Some(version) = name.strip_prefix("virtme_ng-").and_then(|rest| rest.strip_suffix(".dist-info")) {
                return Some(version.to_owned());
            }
        }
    }
    None
}

/// Boots the VM kernel with the host's root fs (read-only), `rwdir` writable, runs `script` (a
/// bash script text) as root inside, returns the script's real exit code and its combined
/// stdout/stderr (passed back through files in rwdir because vng's own exit status is meaningless
/// and its stdout is only available with --verbose). Times out after `timeout`.
///
/// The script starts in the workspace root (visible read-only at the same path in the guest),
/// with the host's `PATH` (plus `~/.cargo/bin`) and `HOME`. It must load the modules it needs
/// (`modprobe sch_fq veth ...`) and mount what it needs (`/sys/fs/bpf`) itself.
pub fn run_in_vm(line: KernelLine, script: &str, rwdir: &Path, timeout: Duration) -> anyhow::Result<VmRun> {
    run_vm(line, script, rwdir, timeout, false)
}

/// Like [`run_in_vm`] on the default kernel (6.1), and also copies the script's output to our
/// stdout while it runs.
pub fn run_in_vm_live(script: &str, rwdir: &Path, timeout: Duration) -> anyhow::Result<VmRun> {
    run_in_vm_live_on(KernelLine::V6_1, script, rwdir, timeout)
}

/// Like [`run_in_vm_live`], on the kernel of `line`.
pub fn run_in_vm_live_on(line: KernelLine, script: &str, rwdir: &Path, timeout: Duration) -> anyhow::Result<VmRun> {
    run_vm(line, script, rwdir, timeout, true)
}

/// The files of one run, in `<rwdir>/.xtask-vm/`.
struct RunFiles {
    dir: PathBuf,
    script: PathBuf,
    wrapper: PathBuf,
    output: PathBuf,
    exit_code: PathBuf,
    console: PathBuf,
}

impl RunFiles {
    fn new(rwdir: &Path) -> Self {
        let dir = rwdir.join(".xtask-vm");
        Self {
            script: dir.join("script.sh"),
            wrapper: dir.join("wrapper.sh"),
            output: dir.join("output.log"),
            exit_code: dir.join("exit-code"),
            console: dir.join("vng-console.log"),
            dir,
        }
    }
}

fn run_vm(kernel: KernelLine, script: &str, rwdir: &Path, timeout: Duration, live: bool) -> anyhow::Result<VmRun> {
    match boot_and_run(kernel, script, rwdir, timeout, live)? {
        Booted::Ran(run) => Ok(run),
        Booted::PanickedAtBoot(first) => {
            // The guest kernel died before it started the script: under TCG, 6.12 panicked
            // once in early boot (an `int3` oops in `sched_clock_cpu`, 2026-11-28). Nothing of
            // ours had run; a second boot decides.
            eprintln!("vm: the guest kernel panicked before the script started; booting it once more");
            match boot_and_run(kernel, script, rwdir, timeout, live)? {
                Booted::Ran(run) => Ok(run),
                Booted::PanickedAtBoot(second) => {
                    bail!("the guest kernel panicked before the script started, twice:\n{first}\n--- and again ---\n{second}")
                }
            }
        }
    }
}

/// What became of one boot of the VM.
enum Booted {
    /// The script ran, and its exit code was recorded.
    Ran(VmRun),
    /// The guest kernel panicked before the wrapper started the script (the script's output
    /// file was never created); the console log's tail.
    PanickedAtBoot(String),
}

fn boot_and_run(
    kernel: KernelLine,
    script: &str,
    rwdir: &Path,
    timeout: Duration,
    live: bool,
) -> anyhow::Result<Booted> {
    let vm = ensure_vm(kernel)?;
    fs::create_dir_all(rwdir).with_context(|| format!("cannot create {}", rwdir.display()))?;
    let rwdir = rwdir.canonicalize().with_context(|| format!("cannot resolve {}", rwdir.display()))?;
    let files = RunFiles::new(&rwdir);
    fs::create_dir_all(&files.dir).with_context(|| format!("cannot create {}", files.dir.display()))?;
    for stale in [&files.output, &files.exit_code, &files.console] {
        match fs::remove_file(stale) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("cannot remove {}", stale.display())),
        }
    }
    fs::write(&files.script, script).with_context(|| format!("cannot write {}", files.script.display()))?;
    fs::write(&files.wrapper, wrapper_script(&files)?)
        .with_context(|| format!("cannot write {}", files.wrapper.display()))?;

    let console =
        fs::File::create(&files.console).with_context(|| format!("cannot create {}", files.console.display()))?;
    let exec = format!("bash {}", util::shell_quote_path(&files.wrapper)?);
    let mut cmd = Command::new(&vm.vng);
    cmd.arg("--run")
        .arg(&vm.kernel.vmlinuz)
        .args(["--disable-kvm", "--force-9p", "--verbose"])
        .args(["--memory", VM_MEMORY, "--cpus", VM_CPUS])
        .arg("--rwdir")
        .arg(&rwdir)
        .arg("--exec")
        .arg(&exec)
        .current_dir(util::workspace_root())
        // vng runs qemu-system-x86_64 from PATH; the venv's bin holds vng's helpers.
        .env("PATH", vng_path(&vm.vng))
        .stdin(Stdio::null())
        .stdout(console.try_clone().context("cannot duplicate a file handle")?)
        .stderr(console);
    eprintln!(
        "vm: booting {} (TCG, {VM_CPUS} CPUs, {VM_MEMORY}), timeout {} s; console log: {}",
        vm.kernel.release,
        timeout.as_secs(),
        files.console.display()
    );
    let shown = util::display_command(&cmd);
    let mut child = cmd.spawn().with_context(|| format!("cannot start `{shown}`"))?;
    let started = Instant::now();
    let mut echo = live.then(|| LiveEcho::new(files.output.clone(), started));
    let status = loop {
        if let Some(echo) = echo.as_mut() {
            echo.pump();
        }
        if let Some(status) = child.try_wait().context("cannot wait for vng")? {
            break status;
        }
        if started.elapsed() > timeout {
            util::kill_tree(&child);
            let _ = child.wait();
            bail!(
                "the VM run timed out after {} s and was killed\n--- script output so far ---\n{}\n--- end of vng console log ---\n{}",
                timeout.as_secs(),
                tail(&read_lossy(&files.output), 60),
                tail(&read_lossy(&files.console), 40)
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    // Nothing of ours may outlive the run (qemu, should vng leave it behind).
    util::kill_tree(&child);
    if let Some(echo) = echo.as_mut() {
        echo.pump();
    }
    let console_log = read_lossy(&files.console);
    if !files.exit_code.exists() && !files.output.exists() && console_log.contains("Kernel panic") {
        return Ok(Booted::PanickedAtBoot(tail(&console_log, 40)));
    }
    let output = read_lossy(&files.output);
    let Ok(code) = fs::read_to_string(&files.exit_code) else {
        bail!(
            "the guest recorded no exit code (vng exited with {status} after {:.1} s: did the kernel \
             boot and the wrapper run?)\n--- script output ---\n{}\n--- end of vng console log ({}) ---\n{}",
            started.elapsed().as_secs_f64(),
            tail(&output, 40),
            files.console.display(),
            tail(&console_log, 60)
        );
    };
    let exit_code =
        code.trim().parse().with_context(|| format!("bad exit code {code:?} in {}", files.exit_code.display()))?;
    let test_times = echo.map(LiveEcho::test_times).unwrap_or_default();
    Ok(Booted::Ran(VmRun { exit_code, output, test_times }))
}

/// The guest-side wrapper: runs the script from the workspace root and records its output and
/// exit code in the rwdir (renamed into place so that a partial write is never read).
fn wrapper_script(files: &RunFiles) -> anyhow::Result<String> {
    let q = util::shell_quote_path;
    let path = util::path_with_cargo_bin();
    let path = path.to_str().context("PATH is not UTF-8")?;
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".to_owned());
    let mut s = String::from("#!/bin/bash\n# Written by `cargo xtask` (xtask/src/vm.rs); runs in the VM guest.\n");
    writeln!(s, "export PATH={}", util::shell_quote(path))?;
    writeln!(s, "export HOME={}", util::shell_quote(&home))?;
    for name in PASSED_ENV {
        if let Ok(value) = std::env::var(name) {
            writeln!(s, "export {name}={}", util::shell_quote(&value))?;
        }
    }
    writeln!(
        s,
        "cd {root} && bash {script} >{output} 2>&1 </dev/null",
        root = q(&util::workspace_root())?,
        script = q(&files.script)?,
        output = q(&files.output)?,
    )?;
    writeln!(s, "rc=$?")?;
    writeln!(
        s,
        "echo \"$rc\" >{tmp} && mv {tmp} {exit}",
        tmp = q(&files.dir.join("exit-code.tmp"))?,
        exit = q(&files.exit_code)?,
    )?;
    writeln!(s, "sync")?;
    Ok(s)
}

/// `PATH` for vng: its venv's bin first, then ours.
fn vng_path(vng: &Path) -> std::ffi::OsString {
    let mut dirs: Vec<PathBuf> = vng.parent().map(Path::to_path_buf).into_iter().collect();
    dirs.extend(std::env::split_paths(&util::path_with_cargo_bin()));
    std::env::join_paths(dirs).unwrap_or_default()
}

/// Copies what the guest appends to the output file to our stdout.
struct LiveEcho {
    path: PathBuf,
    offset: u64,
    started: Instant,
    /// The line being written, as far as it came, and whether it started a test.
    line: Vec<u8>,
    line_seen: bool,
    /// Each test's name and the time its line came, since `started`.
    test_starts: Vec<(String, Duration)>,
}

impl LiveEcho {
    fn new(path: PathBuf, started: Instant) -> Self {
        Self { path, offset: 0, started, line: Vec::new(), line_seen: false, test_starts: Vec::new() }
    }

    fn pump(&mut self) {
        let Ok(mut file) = fs::File::open(&self.path) else {
            return;
        };
        if file.seek(SeekFrom::Start(self.offset)).is_err() {
            return;
        }
        let mut buf = Vec::new();
        if let Ok(n) = file.read_to_end(&mut buf) {
            self.offset += n as u64;
            let mut stdout = std::io::stdout().lock();
            let _ = stdout.write_all(&buf);
            let _ = stdout.flush();
            self.note_tests(&buf);
        }
    }

    /// Notes the tests whose line `test NAME ... ` is in `bytes` (the next bytes of the
    /// output), when the line's start comes: with `--nocapture` a test's own output follows
    /// on the same line, and its `ok` only after it.
    fn note_tests(&mut self, bytes: &[u8]) {
        let now = self.started.elapsed();
        for (i, part) in bytes.split(|&b| b == b'\n').enumerate() {
            if i > 0 {
                self.line.clear();
                self.line_seen = false;
            }
            if self.line_seen {
                continue;
            }
            self.line.extend_from_slice(part);
            let line = String::from_utf8_lossy(&self.line);
            if let Some((name, _)) = line.strip_prefix("test ").and_then(|rest| rest.split_once(" ... ")) {
                self.test_starts.push((name.to_owned(), now));
                self.line_seen = true;
            }
        }
    }

    /// Each test's time: until the next test started, or until now for the last.
    fn test_times(self) -> Vec<(String, Duration)> {
        let end = self.started.elapsed();
        let nexts: Vec<Duration> = self.test_starts.iter().skip(1).map(|(_, at)| *at).chain([end]).collect();
        self.test_starts.into_iter().zip(nexts).map(|((name, at), next)| (name, next.saturating_sub(at))).collect()
    }
}

fn read_lossy(path: &Path) -> String {
    fs::read(path).map(|bytes| String::from_utf8_lossy(&bytes).into_owned()).unwrap_or_default()
}

/// The last `lines` lines of `text`.
fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::{parse_kernel_dependency, tail, KernelLine, LiveEcho};

    #[test]
    fn tests_are_noted_when_their_line_starts() {
        let mut echo = LiveEcho::new("unused".into(), Instant::now());
        // A test's line cut between two reads, its own output on the same line, and a
        // test that printed nothing; libtest's summary is no test.
        echo.note_tests(b"running 2 tests\ntest isolation::a_u");
        assert!(echo.test_starts.is_empty(), "no test before its line has ` ... `");
        echo.note_tests(b"dp_flood ...   shaper's house class: test b ... \nmore\nok\ntest quiet ... ok\n");
        echo.note_tests(b"\ntest result: ok. 2 passed; 0 failed\n");
        let names: Vec<&str> = echo.test_starts.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(names, ["isolation::a_udp_flood", "quiet"]);
        let started = echo.started;
        let times = echo.test_times();
        let names: Vec<&str> = times.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(names, ["isolation::a_udp_flood", "quiet"]);
        assert!(times.iter().map(|(_, t)| *t).sum::<std::time::Duration>() <= started.elapsed(), "each until the next");
    }

    #[test]
    fn kernel_dependency() {
        let out = "linux-image-amd64\n  Depends: linux-image-6.1.0-56-amd64\n";
        assert_eq!(parse_kernel_dependency(out, KernelLine::V6_1).as_deref(), Some("linux-image-6.1.0-56-amd64"));
        assert_eq!(parse_kernel_dependency(out, KernelLine::V6_12), None, "a 6.1 kernel is not a 6.12 one");
        assert_eq!(parse_kernel_dependency("linux-image-amd64\n", KernelLine::V6_1), None);
        assert_eq!(parse_kernel_dependency("x\n  Depends: <linux-image-6.1-virtual>\n", KernelLine::V6_1), None);
        let out = "linux-image-6.12-amd64\n  Depends: linux-image-6.12.117+deb12-amd64\n";
        assert_eq!(
            parse_kernel_dependency(out, KernelLine::V6_12).as_deref(),
            Some("linux-image-6.12.117+deb12-amd64")
        );
        assert_eq!(parse_kernel_dependency(out, KernelLine::V6_1), None, "6.12 does not start with \"6.1.\"");
    }

    #[test]
    fn kernel_lines_own_their_flavour_only() {
        assert!(KernelLine::V6_12.owns("6.12.117+deb12-amd64"));
        assert!(!KernelLine::V6_12.owns("6.12.117+deb12-rt-amd64"));
        assert!(!KernelLine::V6_12.owns("6.12.117+deb12-cloud-amd64"));
        assert!(KernelLine::V6_1.owns("6.1.0-56-amd64"));
        assert!(!KernelLine::V6_1.owns("6.12.117+deb12-amd64"));
        assert!(!KernelLine::V6_1.owns("6.10.1-amd64"));
    }

    #[test]
    fn tails() {
        assert_eq!(tail("a\nb\nc\n", 2), "b\nc");
        assert_eq!(tail("a", 5), "a");
    }
}
