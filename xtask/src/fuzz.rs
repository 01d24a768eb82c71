//! `cargo xtask fuzz <target> [--seconds N]`: runs one of the libFuzzer targets of `fuzz/`
//! (`config`, `request`, `classify`; see fuzz/README.md) for a while, and fails if it finds a
//! crash. The corpus grows in `fuzz/corpus/<target>` (not committed) from the seeds: the example
//! configurations for `config`, `fuzz/seeds/request` for `request`.
//!
//! The targets build on the stable toolchain without a sanitizer (`-s none`): the code under
//! test is safe Rust, whose out-of-bounds reads and overflows panic (debug assertions are on in
//! fuzz builds), which libFuzzer reports as crashes.

use clap::{Args, ValueEnum};

use crate::{setup, util};

/// cargo-fuzz, pinned as the other cargo tools are (see [`setup::CargoTool`]).
const CARGO_FUZZ: setup::CargoTool = setup::CargoTool { name: "cargo-fuzz", version: "0.13.2" };

/// Options of `cargo xtask fuzz`.
#[derive(Args, Debug)]
pub struct FuzzArgs {
    /// The target to run.
    #[arg(value_enum)]
    target: Target,
    /// How long to run it.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
}

/// The fuzz targets (`fuzz/fuzz_targets/<name>.rs`).
#[derive(Clone, Copy, Debug, ValueEnum)]
enum Target {
    /// The configuration loader on arbitrary text.
    Config,
    /// The control protocol's request decoder, and rates in tc's spelling.
    Request,
    /// The reference packet parser, and the compiled rule lookup against a linear scan.
    Classify,
}

impl Target {
    fn name(self) -> &'static str {
        match self {
            Target::Config => "config",
            Target::Request => "request",
            Target::Classify => "classify",
        }
    }

    /// Inputs to start from besides the corpus, relative to `fuzz/`.
    fn seeds(self) -> Option<&'static str> {
        match self {
            Target::Config => Some("../config"),
            Target::Request => Some("seeds/request"),
            Target::Classify => None,
        }
    }
}

/// Builds and runs the target; fails if libFuzzer found a crash (its input is then in
/// `fuzz/artifacts/<target>/`).
pub fn run(args: &FuzzArgs) -> anyhow::Result<()> {
    setup::ensure_cargo_tool(&CARGO_FUZZ)?;
    let dir = util::workspace_root().join("fuzz");
    let name = args.target.name();
    let corpus = format!("corpus/{name}");
    std::fs::create_dir_all(dir.join(&corpus))?;
    let time = format!("-max_total_time={}", args.seconds);
    let mut cmd_args = vec!["fuzz", "run", "-s", "none", name, &corpus];
    cmd_args.extend(args.target.seeds());
    cmd_args.extend(["--", &time, "-print_final_stats=1"]);
    let mut cmd = util::command(util::cargo(), &cmd_args);
    cmd.current_dir(&dir).env("PATH", util::path_with_cargo_bin());
    util::run(&mut cmd)
}
