//! `cargo xtask test`: every check CI runs, in order, each one run whatever happened before.
//!
//! Stages: setup (installs what is missing), fmt and clippy (the workspace, and the tc program for
//! its BPF target; see [`crate::lint`]), dependencies (unused ones, and cargo-deny's licences,
//! bans, sources and advisories; see [`crate::deps`]), host tests (unit tests and kernel tests on
//! the host kernel; need root), bench (`cargo xtask bench --short`: fails if a cost ratio
//! regresses past its bound, in a run and in the one that measures again), VM tests (the `vm`
//! test of `shaper-tests`, built on the host and run in the VM, whose kernel has `sch_fq`):
//! [`TCX_VM_TESTS`] on Debian's 6.12, where shaperd attaches a TCX link, then the whole suite
//! on Debian's 6.1, where it attaches under clsact.
//! Ends with a table of stages, the checks that could not run, and a line `N passed, M failed`;
//! exits non-zero if any stage failed.

use std::io::{BufRead as _, BufReader};
use std::path::PathBuf;
use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use clap::Args;
use serde::Deserialize;

use crate::vm::KernelLine;
use crate::{bench, deps, lint, setup, util, vm};

/// The package, feature and test target of the VM tests.
const VM_TEST_PACKAGE: &str = "shaper-tests";
const VM_TEST_FEATURE: &str = "vm";
const VM_TEST_TARGET: &str = "vm";

/// The VM tests run on the TCX kernel too: a failed start beside a running shaperd (with the
/// class rates it measures before and after), kill -9 + takeover + upgrade, reload, fq's
/// installation, an upgrade to another map layout that also drops an interface, interfaces
/// that come and go, NAT's LAN-ingress program and the IFB's redirect program. Together they
/// attach, adopt, replace and remove the TCX links every way shaperd does, in about 8 minutes
/// (each test 16-82 s on the machine of 2026-11-28). Also the verifier's walk of the egress
/// program, which each kernel's verifier walks its own way (a few seconds). The rest (static
/// pacing, sharing, latency, isolation, seed 001 through the IFB) is the same datapath
/// whatever attaches it, and runs on 6.1.
const TCX_VM_TESTS: &[&str] = &[
    "a_start_that_fails_leaves_the_running_shaper_as_it_was",
    "killed_daemon_keeps_shaping_and_a_new_one_takes_over",
    "operations_runtime_changes_reload_and_prometheus",
    "fq_is_installed_over_the_kernel_default_and_restored",
    "upgrades::the_next_shaperd_takes_over_what_it_shapes_and_gives_back_the_rest",
    "links::interfaces_that_come_and_go_are_shaped_again_within_a_second",
    "nat::behind_a_masquerading_gateway_hosts_are_classified_by_their_own_addresses",
    // The download redirected to an IFB: act_mirred under clsact, a redirect program under
    // TCX; the handover measures the download shaped through it.
    "ifb::the_ifb_is_handed_over_follows_wan0_and_goes_on_stop",
    // Another kernel's verifier walks the same program otherwise.
    "verifier::the_egress_program_leaves_the_verifier_headroom_on_the_vm_kernel",
];

/// Options of `cargo xtask test`.
#[derive(Args, Debug)]
pub struct TestArgs {
    /// Kill the VM running the VM tests after this many seconds (each VM: 6.12, then 6.1).
    #[arg(long, default_value_t = 3600)]
    pub vm_timeout: u64,
    /// Minutes the whole run may take: failed VM tests are run again only if that still
    /// leaves time. CI stops a run after 90.
    #[arg(long, default_value_t = 88)]
    pub minutes: u64,
    /// Run only this stage (repeatable): setup, fmt, clippy, dependencies, "host tests",
    /// "vm tests", "vm tests (6.12, TCX)". CI runs them all.
    #[arg(long, value_name = "STAGE")]
    pub only: Vec<String>,
}

/// What a stage that passed could not check, and why. The summary lists it, so that a check
/// that did not run is never taken for one that passed.
type NotChecked = Vec<String>;

type StageFn<'a> = Box<dyn Fn() -> anyhow::Result<NotChecked> + 'a>;

struct Stage {
    name: &'static str,
    /// What the stage could not check, or why it failed.
    result: anyhow::Result<NotChecked>,
    elapsed: Duration,
}

/// Runs all stages and prints the summary; the exit code is 1 if any stage failed.
pub fn run(args: &TestArgs) -> ExitCode {
    let vm_timeout = Duration::from_secs(args.vm_timeout);
    let deadline = Instant::now() + Duration::from_secs(args.minutes * 60);
    let before_6_1 = deadline.checked_sub(SUITE_6_1).unwrap_or(deadline);
    let plan: Vec<(&'static str, StageFn)> = vec![
        ("setup", complete(setup::ensure_all)),
        ("fmt", complete(lint::fmt)),
        ("clippy", complete(lint::clippy)),
        ("dependencies", Box::new(deps::check)),
        ("host tests", complete(host_tests)),
        ("bench", complete(|| bench::run(&bench::BenchArgs { short: true, forwarding: false }))),
        // The short 6.12 stage first: its reruns leave the 6.1 suite its time
        // (`SUITE_6_1`), and the 6.1 suite's reruns then have all the time that is left.
        ("vm tests (6.12, TCX)", Box::new(move || vm_suite(KernelLine::V6_12, TCX_VM_TESTS, vm_timeout, before_6_1))),
        ("vm tests", Box::new(move || vm_suite(KernelLine::V6_1, &[], vm_timeout, deadline))),
    ];
    if let Some(unknown) = args.only.iter().find(|only| !plan.iter().any(|(name, _)| name == only)) {
        let names: Vec<&str> = plan.iter().map(|(name, _)| *name).collect();
        eprintln!("error: no stage named {unknown:?}; the stages are: {}", names.join(", "));
        return ExitCode::FAILURE;
    }
    let plan: Vec<_> =
        plan.into_iter().filter(|(name, _)| args.only.is_empty() || args.only.iter().any(|o| o == name)).collect();
    let total = plan.len();
    let mut stages = Vec::with_capacity(total);
    for (i, (name, stage)) in plan.into_iter().enumerate() {
        println!("\n==> [{}/{total}] {name}", i + 1);
        let started = Instant::now();
        let result = stage();
        let elapsed = started.elapsed();
        match &result {
            Ok(not_checked) if not_checked.is_empty() => println!("<== {name}: ok ({:.1} s)", elapsed.as_secs_f64()),
            Ok(not_checked) => println!(
                "<== {name}: ok, but NOT everything was checked ({:.1} s): {}",
                elapsed.as_secs_f64(),
                not_checked.join("; ")
            ),
            Err(err) => println!("<== {name}: FAILED ({:.1} s): {err:#}", elapsed.as_secs_f64()),
        }
        stages.push(Stage { name, result, elapsed });
    }
    print_summary(&stages)
}

/// A stage that checks all it is about, or fails.
fn complete<'a>(stage: impl Fn() -> anyhow::Result<()> + 'a) -> StageFn<'a> {
    Box::new(move || stage().map(|()| NotChecked::new()))
}

fn print_summary(stages: &[Stage]) -> ExitCode {
    let width = stages.iter().map(|s| s.name.len()).max().unwrap_or(5).max(5);
    println!("\nSummary");
    println!("{:<width$}  {:<7}  {:>8}", "stage", "result", "seconds");
    for stage in stages {
        let result = match &stage.result {
            Ok(not_checked) if not_checked.is_empty() => "ok",
            Ok(_) => "partial",
            Err(_) => "FAILED",
        };
        println!("{:<width$}  {result:<7}  {:>8.1}", stage.name, stage.elapsed.as_secs_f64());
    }
    let not_checked: Vec<String> = stages
        .iter()
        .filter_map(|s| s.result.as_ref().ok().map(|n| (s.name, n)))
        .flat_map(|(name, n)| n.iter().map(move |what| format!("{name}: {what}")))
        .collect();
    if !not_checked.is_empty() {
        println!("Not checked, or only in part (the stage passed without it):");
        for line in &not_checked {
            println!("  - {line}");
        }
    }
    let failures: Vec<(&str, &anyhow::Error)> =
        stages.iter().filter_map(|s| s.result.as_ref().err().map(|e| (s.name, e))).collect();
    if !failures.is_empty() {
        // Again at the end, where a log cut to its head and tail still shows it.
        println!("Why:");
        for (name, err) in &failures {
            println!("  - {name}: {err:#}");
        }
    }
    let failed = failures.len();
    println!("{} passed, {failed} failed", stages.len() - failed);
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Each failed test's name and the first lines of its panic message, from libtest's output.
fn panic_messages(output: &str) -> Vec<String> {
    const MESSAGE_LINES: usize = 3;
    const MESSAGE_CHARS: usize = 600;
    let lines: Vec<&str> = output.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(rest) = line.strip_prefix("thread '") else { continue };
        let Some((test, tail)) = rest.split_once('\'') else { continue };
        let Some(at) = tail.split_once("panicked at ").map(|(_, at)| at.trim_end_matches(':')) else { continue };
        let message: Vec<&str> = lines[i + 1..]
            .iter()
            .take_while(|l| !l.starts_with("stack backtrace:") && !l.starts_with("note: "))
            .take(MESSAGE_LINES)
            .copied()
            .collect();
        let mut message = message.join(" / ");
        if message.len() > MESSAGE_CHARS {
            let cut = (0..=MESSAGE_CHARS).rev().find(|&k| message.is_char_boundary(k)).unwrap_or(0);
            message.truncate(cut);
            message.push_str(" [...]");
        }
        out.push(format!("{test} ({at}): {message}"));
    }
    out
}

fn cargo(args: &[&str]) -> anyhow::Result<()> {
    util::run(&mut util::cargo_at_root(args))
}

fn host_tests() -> anyhow::Result<()> {
    if !util::is_root() {
        eprintln!("warning: not root: the kernel tests need root and will fail");
    }
    // The integration tests run shaperd and shaperctl, which live in another package: cargo
    // builds a package's binaries only for that package's own integration tests.
    crate::demo::build_bins()?;
    // --no-fail-fast: report every failing test binary, not just the first.
    cargo(&["test", "--workspace", "--no-fail-fast", "--", "--test-threads=1"])
}

/// Builds the VM test binary on the host, runs it in a VM on the kernel of `line` (all its
/// tests, or only those named in `only`) and checks it passed them.
pub fn vm_tests(line: KernelLine, only: &[&str], timeout: Duration) -> anyhow::Result<()> {
    let run = run_vm_tests(line, only, timeout)?;
    check_vm_run(line, only, &run)
}

/// At most this many tests that failed a suite's run are run again, each once, in a new VM.
/// More failures than that are not the emulator's noise.
const RERUN_AT_MOST: usize = 10;

/// What a rerun is reckoned to take: the VM's boot, and each test the time it took in the
/// run that failed, and a tenth more (a test fails at its end, when its figures are in). A
/// test whose time is unknown is reckoned at [`RERUN_PER_TEST`] (the suite's took 30-230 s
/// under TCG with their topologies and daemons, 81 s on average, in one run on a slow host).
/// The rerun's VM is stopped at the deadline should it take longer; a failed test fails the
/// stage either way, so a rerun risks nothing but the time it is given.
const RERUN_BOOT: Duration = Duration::from_secs(45);
const RERUN_PER_TEST: Duration = Duration::from_secs(120);

/// What the 6.1 suite's first run is reckoned to take: 3,218 s in CI's run of 2026-11-28
/// (its 39 tests), and a margin. The 6.12 stage before it reruns its failures only if that
/// leaves this much.
const SUITE_6_1: Duration = Duration::from_secs(3_500);

/// The time a rerun of `failed` is reckoned to take (see [`RERUN_BOOT`]), from the times
/// the tests took in the first run.
fn rerun_time(failed: &[String], times: &[(String, Duration)]) -> Duration {
    failed.iter().fold(RERUN_BOOT, |sum, test| {
        let took = times.iter().find(|(name, _)| name == test).map_or(RERUN_PER_TEST, |(_, t)| *t + *t / 10);
        sum + took
    })
}

/// The `n` tests of a run that took longest, for the log: `name 123 s, ...`.
fn slowest(times: &[(String, Duration)], n: usize) -> String {
    let mut sorted: Vec<&(String, Duration)> = times.iter().collect();
    sorted.sort_by_key(|(_, t)| std::cmp::Reverse(*t));
    sorted.iter().take(n).map(|(name, t)| format!("{name} {} s", t.as_secs())).collect::<Vec<_>>().join(", ")
}

/// A stage of VM tests, as [`vm_tests`], except that if at most [`RERUN_AT_MOST`] tests failed
/// they are run once more in a new VM, if that can end before `deadline`. TCG's guest runs on
/// whatever host CPU is left: in one CI run on a busy host nine tests failed, most of them on
/// timing bounds they meet on a host that keeps up. A test that fails twice fails the stage; one
/// that passes its second run is named with its first failure in the summary, which marks
/// the stage partial.
fn vm_suite(line: KernelLine, only: &[&str], timeout: Duration, deadline: Instant) -> anyhow::Result<NotChecked> {
    let run = run_vm_tests(line, only, timeout)?;
    if !run.test_times.is_empty() {
        let total: Duration = run.test_times.iter().map(|(_, t)| *t).sum();
        println!(
            "vm tests: {} tests on {} in {} s; the longest: {}",
            run.test_times.len(),
            line.name(),
            total.as_secs(),
            slowest(&run.test_times, 8)
        );
    }
    if run.exit_code == 0 {
        return check_vm_run(line, only, &run).map(|()| NotChecked::new());
    }
    let failed = failed_tests(&run.output);
    let first = check_vm_run(line, only, &run).expect_err("a run that exited non-zero");
    if failed.is_empty() {
        return Err(first);
    }
    if failed.len() > RERUN_AT_MOST {
        return Err(first.context(format!(
            "not run again: {} tests failed, more than the {RERUN_AT_MOST} a rerun takes",
            failed.len()
        )));
    }
    let needs = rerun_time(&failed, &run.test_times);
    let left = deadline.saturating_duration_since(Instant::now());
    if needs > left {
        return Err(first.context(format!(
            "not run again: that would take about {} s, and the run has {} s left",
            needs.as_secs(),
            left.as_secs()
        )));
    }
    let names: Vec<&str> = failed.iter().map(String::as_str).collect();
    println!(
        "vm tests: {} failed on {}; running {} once more in a new VM",
        names.join(", "),
        line.name(),
        if names.len() == 1 { "it" } else { "them" }
    );
    let again = run_vm_tests(line, &names, timeout.min(left))?;
    check_vm_run(line, &names, &again)
        .map_err(|second| first.context(format!("and again on a second run: {second:#}")))?;
    let panics = panic_messages(&run.output);
    Ok(failed
        .iter()
        .map(|test| {
            let why = panics.iter().find(|p| p.starts_with(&format!("{test} ("))).map_or("", String::as_str);
            format!("{test} passed only on its second run; its first failed: {why}")
        })
        .collect())
}

/// What a VM test run printed and how it exited.
struct VmTestRun {
    exit_code: i32,
    output: String,
    /// Each test and its time (see [`vm::VmRun::test_times`]).
    test_times: Vec<(String, Duration)>,
}

fn run_vm_tests(line: KernelLine, only: &[&str], timeout: Duration) -> anyhow::Result<VmTestRun> {
    // The daemon under test is the release build, as on a gateway: a debug build's own CPU
    // time under QEMU's emulation would show in the latency and convergence figures.
    let bins = crate::demo::build_release_bins()?;
    let exe = build_vm_tests()?;
    let root = util::workspace_root();
    // `--exact`: a name selects that test only, not every test whose name contains it;
    // `--include-ignored`: a benchmark among them runs too (`cargo xtask bench --forwarding`).
    let selection: String = if only.is_empty() {
        String::new()
    } else {
        std::iter::once(" --exact --include-ignored".to_owned())
            .chain(only.iter().map(|name| format!(" {}", util::shell_quote(name))))
            .collect()
    };
    // The kernel is checked from inside, so that a fallback to another cached kernel (or a
    // metapackage that moved) cannot pass the run off as this line's.
    let script = format!(
        "set -e\n\
         echo \"vm tests: guest kernel $(uname -r)\"\n\
         case \"$(uname -r)\" in {series}.*) ;; *) echo \"vm tests: not a {series} kernel\"; exit 3;; esac\n\
         modprobe sch_fq\n\
         modprobe sch_fq_codel\n\
         modprobe veth\n\
         mount -t bpf bpf /sys/fs/bpf 2>/dev/null || true\n\
         cd {root}\n\
         export SHAPER_IN_VM=1\n\
         export SHAPER_BIN_DIR={bins}\n\
         exec {exe} --test-threads=1 --nocapture{selection}\n",
        series = line.name(),
        root = util::shell_quote_path(&root)?,
        exe = util::shell_quote_path(&exe)?,
        bins = util::shell_quote_path(&bins)?,
    );
    let rwdir = match line {
        KernelLine::V6_1 => vm::vm_dir().join("test-run"),
        KernelLine::V6_12 => vm::vm_dir().join("test-run-6.12"),
    };
    println!("vm tests: running {} in the VM ({}, {})", exe.display(), line.name(), line.attach_mode());
    let run = vm::run_in_vm_live_on(line, &script, &rwdir, timeout)?;
    println!("vm tests: exit code {}", run.exit_code);
    Ok(VmTestRun { exit_code: run.exit_code, output: run.output, test_times: run.test_times })
}

/// Checks a VM test run passed: exit code 0 and as many tests passed as were named in `only`
/// (or some, if none were).
fn check_vm_run(line: KernelLine, only: &[&str], run: &VmTestRun) -> anyhow::Result<()> {
    if run.exit_code != 0 {
        let panics = panic_messages(&run.output);
        bail!(
            "the VM tests on {} exited with code {}{}{}",
            line.name(),
            run.exit_code,
            if panics.is_empty() { "" } else { "; what failed:\n    " },
            panics.join("\n    ")
        );
    }
    match passed_count(&run.output) {
        Some(n) if !only.is_empty() && n != only.len() as u64 => bail!(
            "{n} of the {} VM tests selected for {} passed (is one of {only:?} renamed?)",
            only.len(),
            line.name()
        ),
        Some(n) if n > 0 => Ok(()),
        Some(_) => bail!("the VM tests ran no test (`test result: ok. 0 passed`)"),
        None => {
            bail!("the VM tests' output has no libtest summary line `test result: ok. N passed`")
        }
    }
}

/// The tests libtest lists as failed at the end of its output (`failures:` then one indented
/// name a line).
fn failed_tests(output: &str) -> Vec<String> {
    let Some(at) = output.rfind("\nfailures:\n") else { return Vec::new() };
    output[at..]
        .lines()
        .skip(2)
        .take_while(|line| !line.starts_with("test result:"))
        .filter_map(|line| line.strip_prefix("    "))
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .collect()
}

/// The largest N among libtest summary lines `test result: ok. N passed; ...`.
fn passed_count(output: &str) -> Option<u64> {
    output
        .lines()
        .filter_map(|line| {
            let rest = line.trim().strip_prefix("test result: ok. ")?;
            rest.strip_suffix("passed").or_else(|| rest.split_once(" passed").map(|(n, _)| n))?.trim().parse().ok()
        })
        .max()
}

/// The parts of cargo's JSON messages we read.
#[derive(Deserialize)]
struct CargoMessage {
    reason: String,
    #[serde(default)]
    target: Option<CargoTarget>,
    #[serde(default)]
    profile: Option<CargoProfile>,
    #[serde(default)]
    executable: Option<PathBuf>,
    #[serde(default)]
    message: Option<CompilerMessage>,
}

#[derive(Deserialize)]
struct CargoTarget {
    name: String,
}

#[derive(Deserialize)]
struct CargoProfile {
    test: bool,
}

#[derive(Deserialize)]
struct CompilerMessage {
    rendered: Option<String>,
}

/// `cargo test -p shaper-tests --features vm --test vm --no-run --message-format=json`; returns
/// the test executable.
fn build_vm_tests() -> anyhow::Result<PathBuf> {
    let features = VM_TEST_FEATURE;
    let target = VM_TEST_TARGET;
    let mut cmd = util::cargo_at_root(&[
        "test",
        "-p",
        VM_TEST_PACKAGE,
        "--features",
        features,
        "--test",
        target,
        "--no-run",
        "--message-format=json",
    ]);
    let shown = util::display_command(&cmd);
    eprintln!("+ {shown}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start `{shown}`"))?;
    // cargo's progress and errors go to stderr: show them as they come and keep them to explain
    // a failure.
    let stderr = child.stderr.take().expect("stderr is piped");
    let stderr_thread = std::thread::spawn(move || {
        let mut kept = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("{line}");
            kept.push_str(&line);
            kept.push('\n');
        }
        kept
    });
    let mut executables = Vec::new();
    let stdout = child.stdout.take().expect("stdout is piped");
    for line in BufReader::new(stdout).lines() {
        let line = line.context("cannot read cargo's output")?;
        let Ok(msg) = serde_json::from_str::<CargoMessage>(&line) else {
            continue;
        };
        match msg.reason.as_str() {
            "compiler-message" => {
                if let Some(rendered) = msg.message.and_then(|m| m.rendered) {
                    eprint!("{rendered}");
                }
            }
            "compiler-artifact" => {
                let is_test = msg.profile.is_some_and(|p| p.test);
                let is_vm = msg.target.is_some_and(|t| t.name == target);
                if let (true, true, Some(exe)) = (is_test, is_vm, msg.executable) {
                    executables.push(exe);
                }
            }
            _ => {}
        }
    }
    let status = child.wait().context("cannot wait for cargo")?;
    let stderr = stderr_thread.join().unwrap_or_default();
    if !status.success() {
        if let Some(why) = missing_target_explanation(&stderr) {
            bail!("{why}");
        }
        bail!("building the VM tests failed: `{shown}` {status}");
    }
    match executables.as_slice() {
        [exe] => Ok(exe.clone()),
        [] => bail!("`{shown}` built no test executable for the test target `{target}` of {VM_TEST_PACKAGE}"),
        many => bail!("`{shown}` built several test executables: {many:?}"),
    }
}

/// A clear explanation if cargo failed because the VM test crate, feature or target is missing.
fn missing_target_explanation(stderr: &str) -> Option<String> {
    let missing = [
        "did not match any packages",
        "packages outside of workspace",
        "no test target named",
        "does not contain this feature",
        "does not have the feature",
        "does not have these features",
        "none of the selected packages contains",
    ];
    let said = stderr.lines().find(|line| missing.iter().any(|m| line.contains(m)))?;
    Some(format!(
        "no VM test target: the VM tests are the test target `{VM_TEST_TARGET}` of the package \
         `{VM_TEST_PACKAGE}` (tests/, a workspace member) built with its feature \
         `{VM_TEST_FEATURE}`; cargo said: {}",
        said.trim()
    ))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{
        failed_tests, missing_target_explanation, panic_messages, passed_count, rerun_time, slowest, RERUN_BOOT,
        RERUN_PER_TEST,
    };

    #[test]
    fn a_rerun_is_reckoned_from_the_times_of_the_first_run() {
        let s = Duration::from_secs;
        let times = vec![("a".to_owned(), s(100)), ("b".to_owned(), s(30)), ("c".to_owned(), s(200))];
        assert_eq!(rerun_time(&["a".to_owned(), "b".to_owned()], &times), RERUN_BOOT + s(110) + s(33));
        assert_eq!(rerun_time(&["gone".to_owned()], &times), RERUN_BOOT + RERUN_PER_TEST, "no time: the default");
        assert_eq!(slowest(&times, 2), "c 200 s, a 100 s");
    }

    #[test]
    fn summary_lines() {
        let out = "running 3 tests\n...\ntest result: ok. 3 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 1.00s\n";
        assert_eq!(passed_count(out), Some(3));
        assert_eq!(passed_count("test result: ok. 0 passed; 0 failed"), Some(0));
        assert_eq!(passed_count("test result: FAILED. 2 passed; 1 failed"), None);
        assert_eq!(passed_count("no tests here"), None);
    }

    #[test]
    fn panics_named_with_their_messages() {
        let out =
            "test a ... ok\ntest b::c ... measured 3\n\nthread 'b::c' (182) panicked at tests/tests/vm.rs:1085:5:\n\
                   still shaped: 2134756.6\nstack backtrace:\n   0: x\nFAILED\n\
                   thread 'd' panicked at src/x.rs:1:1:\none\ntwo\nthree\nfour\n";
        assert_eq!(
            panic_messages(out),
            ["b::c (tests/tests/vm.rs:1085:5): still shaped: 2134756.6", "d (src/x.rs:1:1): one / two / three"]
        );
        assert!(panic_messages("test result: ok. 3 passed").is_empty());
    }

    #[test]
    fn failures_listed_at_the_end() {
        let out = "test a ... FAILED\n\nfailures:\n\n---- a stdout ----\nx\n\nfailures:\n    a\n    links::b\n\n\
                   test result: FAILED. 9 passed; 2 failed; 0 ignored\n";
        assert_eq!(failed_tests(out), ["a", "links::b"]);
        assert!(failed_tests("test result: ok. 3 passed").is_empty());
    }

    #[test]
    fn missing_target() {
        let err = "error: no test target named `vm` in `shaper-tests` package\n";
        assert!(missing_target_explanation(err).is_some());
        assert!(missing_target_explanation("error: could not compile `x`").is_none());
    }
}
