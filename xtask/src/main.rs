//! `cargo xtask`: the project's automation, one module per subcommand.
//!
//! - [`setup`]: installs the toolchain, VM and test tools on Debian/Ubuntu (root);
//! - [`vm`]: boots a Debian kernel that has `sch_fq` under QEMU (virtme-ng) and runs commands in it;
//! - [`test`]: every check CI runs, host and VM, with a summary; its static checks are in
//!   [`lint`] (fmt, clippy) and [`deps`] (unused dependencies, cargo-deny);
//! - [`demo`], [`bench`]: the shaping demo and the benchmarks;
//! - [`fuzz`]: the libFuzzer targets of `fuzz/`.

mod bench;
mod demo;
mod deps;
mod fuzz;
mod lint;
mod setup;
mod test;
mod util;
mod vm;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "shaper project automation", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Install (idempotently) every package, tool and the VM kernel the project needs; needs root.
    Setup,
    /// Run a command as root in the test VM (a kernel with the fq qdisc); print its output and exit code.
    Vm(vm::VmArgs),
    /// Run every check: setup, fmt, clippy, dependencies, host tests, VM tests; exits non-zero if any failed.
    Test(test::TestArgs),
    /// Run the shaping demo.
    Demo(demo::DemoArgs),
    /// Run the benchmarks and report figures.
    Bench(bench::BenchArgs),
    /// Run a libFuzzer target of fuzz/ (config, request, classify) for a while.
    Fuzz(fuzz::FuzzArgs),
}

fn main() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
    match cli.command {
        Command::Setup => setup::ensure_all().map(|()| ExitCode::SUCCESS),
        Command::Vm(args) => vm::run(&args),
        Command::Test(args) => Ok(test::run(&args)),
        Command::Demo(args) => demo::run(&args).map(|()| ExitCode::SUCCESS),
        Command::Bench(args) => bench::run(&args).map(|()| ExitCode::SUCCESS),
        Command::Fuzz(args) => fuzz::run(&args).map(|()| ExitCode::SUCCESS),
    }
}
